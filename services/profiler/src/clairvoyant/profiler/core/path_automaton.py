"""Compile a bounded path expression into an acyclic probabilistic automaton.

``compile_paths(expr, weights)`` returns a ``PathAutomaton``: states, the step-consuming edges
(``Emit``), the epsilon edges with their choice probabilities, and for each state the closure over
epsilon paths.  The weights table gives the probabilities of the expression's choice points; a
choice it does not cover (or covers with the wrong size) is uniform.  Raises ``ExpressionError``
when the unrolled expression would exceed ``MAX_STATES`` states.

    (b){1,3}:   s0 --b--> s1 --b--> s2 --b--> s3 ---> exit
                           \\________\\______________/^   stop edges, P(stop after k | reached k)

State ``FINAL`` (0) is the end of the workflow; states are numbered so that every edge goes from
a lower to a higher number (except into ``FINAL``), which is what lets the passes below run in
state order.  How each node compiles, and why: docs/profiler.md, "Path models".
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

from clairvoyant.profiler.core.expr import (
    Agent,
    Alt,
    End,
    Expr,
    ExpressionError,
    FanOut,
    Opt,
    Repeat,
    Seq,
)
from clairvoyant.profiler.core.trace import Step

MAX_STATES = 50_000
FINAL = 0
END_AGENT = "$"

# A weights table: "<node path>:<kind>" -> a distribution.  Paths are child indices joined by ".",
# the root is "".  Kinds: alt (options), opt (skip, take), rep (counts lo..hi), fan (widths lo..hi),
# mem (fan-out members in body order).
Weights = dict[str, list[float]]

# An epsilon edge: (probability, destination, weights key or "", choice index; -1 for "go on").
EpsilonEdge = tuple[float, int, str, int]


def choice_key(path: tuple[int, ...], kind: str) -> str:
    """The weights-table key of the choice point of ``kind`` at node ``path``."""
    return ".".join(map(str, path)) + ":" + kind


@dataclass(frozen=True, slots=True)
class Emit:
    """An edge that consumes one step."""

    dst: int
    members: tuple[str, ...]  # one agent (an Agent node) or the fan-out's members
    member_probs: tuple[float, ...]
    lo: int = 1  # fan-out width bounds; (1, 1) for an Agent node
    hi: int = 1
    width_probs: tuple[float, ...] = (1.0,)
    fan_key: str = ""  # "" for an Agent node

    def likelihood(self, step: Step) -> float:
        if not self.fan_key:
            return 1.0 if step.agents == self.members else 0.0
        k = len(step.agents)
        if not self.lo <= k <= self.hi:
            return 0.0
        probs = dict(zip(self.members, self.member_probs, strict=True))
        like = self.width_probs[k - self.lo] * math.factorial(k)
        for agent in set(step.agents):
            if agent not in probs:
                return 0.0
            c = step.agents.count(agent)
            like *= probs[agent] ** c / math.factorial(c)
        return like

    def partial_likelihood(self, agent: str) -> float:
        """P(this step includes ``agent``): for a step still in progress."""
        if not self.fan_key:
            return 1.0 if self.members == (agent,) else 0.0
        if agent not in self.members:
            return 0.0
        m = self.member_probs[self.members.index(agent)]
        return 1.0 - sum(p * (1.0 - m) ** (self.lo + i) for i, p in enumerate(self.width_probs))

    def growth_likelihood(self, agents: Sequence[str]) -> float:
        """P(this step is a group holding ``agents`` and at least one more call)."""
        if not self.fan_key or not set(agents) <= set(self.members):
            return 0.0
        need = len(agents) + 1
        return sum(p for i, p in enumerate(self.width_probs) if self.lo + i >= need)

    def expected_calls(self) -> dict[str, float]:
        width = sum((self.lo + i) * p for i, p in enumerate(self.width_probs))
        return {a: width * p for a, p in zip(self.members, self.member_probs, strict=True)}

    def member_presence(self) -> dict[str, float]:
        return {a: self.partial_likelihood(a) for a in self.members}


@dataclass(frozen=True, slots=True)
class PathAutomaton:
    """The compiled automaton.  Built once by ``compile_paths``, never changed afterwards."""

    start: int
    eps: list[list[EpsilonEdge]]  # per state: its epsilon edges
    emits: list[list[int]]  # per state: indices into ``edges`` of the edges leaving it
    edges: list[Emit]
    cont: dict[int, tuple[Expr, ...]]  # per state: what is left of the expression from there
    # closure[s]: (probability, edge index or -1 for the end) over the epsilon paths from s.
    closure: list[tuple[tuple[float, int], ...]]

    def state_values(self, cost: Callable[[Emit], float]) -> list[float]:
        """V(s) = sum over next steps e of P(e | s) * (cost(e) + V(e.dst)); V = 0 at the end."""
        n = len(self.eps)
        values = [0.0] * n
        for s in range(n - 1, 0, -1):
            values[s] = sum(
                p * (cost(self.edges[e]) + values[self.edges[e].dst]) for p, e in self.closure[s] if e >= 0
            )
        return values

    def edge_visits(self) -> list[float]:
        """P(a run uses edge e), by a forward pass in state order."""
        n = len(self.eps)
        reach = [0.0] * n
        reach[self.start] = 1.0
        visits = [0.0] * len(self.edges)
        for s in range(1, n):
            if reach[s] <= 0.0:
                continue
            for p, e in self.closure[s]:
                if e >= 0:
                    visits[e] += reach[s] * p
                    reach[self.edges[e].dst] += reach[s] * p
        return visits


def compile_paths(expr: Expr, weights: Weights) -> PathAutomaton:
    """The automaton of ``expr`` with the choice probabilities of ``weights``."""
    builder = _Builder(weights)
    start = 1
    top_exit = builder.build(expr, (), start, ())
    builder.eps[top_exit].append((1.0, FINAL, "", 0))
    builder.cont[start] = (expr,)
    n = len(builder.eps)
    closure: list[tuple[tuple[float, int], ...]] = [()] * n
    closure[FINAL] = ((1.0, -1),)
    for s in range(n - 1, 0, -1):
        acc: dict[int, float] = {e: 1.0 for e in builder.emits[s]}
        for p, dst, _, _ in builder.eps[s]:
            if p <= 0.0:
                continue
            for q, e in closure[dst]:
                acc[e] = acc.get(e, 0.0) + p * q
        closure[s] = tuple((p, e) for e, p in sorted(acc.items()))
    return PathAutomaton(start, builder.eps, builder.emits, builder.edges, builder.cont, closure)


@dataclass
class _Builder:
    weights: Weights
    eps: list[list[EpsilonEdge]] = field(default_factory=lambda: [[], []])
    emits: list[list[int]] = field(default_factory=lambda: [[], []])
    edges: list[Emit] = field(default_factory=list)
    cont: dict[int, tuple[Expr, ...]] = field(default_factory=dict)

    def state(self) -> int:
        if len(self.eps) >= MAX_STATES:
            raise ExpressionError(
                f"expression too large: more than {MAX_STATES} automaton states once unrolled"
            )
        self.eps.append([])
        self.emits.append([])
        return len(self.eps) - 1

    def dist(self, key: str, n: int) -> list[float]:
        given = self.weights.get(key)
        if given is not None and len(given) == n and sum(given) > 0:
            total = sum(given)
            return [g / total for g in given]
        return [1.0 / n] * n

    def emit(self, src: int, edge: Emit, cont: tuple[Expr, ...]) -> int:
        self.edges.append(edge)
        self.emits[src].append(len(self.edges) - 1)
        self.cont[edge.dst] = cont
        return edge.dst

    def build(self, node: Expr, path: tuple[int, ...], entry: int, cont: tuple[Expr, ...]) -> int:
        if isinstance(node, Agent):
            return self.emit(entry, Emit(self.state(), (node.name,), (1.0,)), cont)
        if isinstance(node, FanOut):
            members = node.members
            edge = Emit(
                self.state(),
                members,
                tuple(self.dist(choice_key(path, "mem"), len(members))),
                node.lo,
                node.hi,
                tuple(self.dist(choice_key(path, "fan"), node.hi - node.lo + 1)),
                choice_key(path, "fan"),
            )
            return self.emit(entry, edge, cont)
        if isinstance(node, End):
            self.eps[entry].append((1.0, FINAL, "", 0))
            return self.state()  # unreachable: nothing follows "$"
        if isinstance(node, Seq):
            at = entry
            for i, item in enumerate(node.items):
                at = self.build(item, (*path, i), at, node.items[i + 1 :] + cont)
            return at
        if isinstance(node, Alt):
            probs = self.dist(choice_key(path, "alt"), len(node.options))
            exits = []
            for i, option in enumerate(node.options):
                start = self.state()
                self.eps[entry].append((probs[i], start, choice_key(path, "alt"), i))
                exits.append(self.build(option, (*path, i), start, cont))
            exit_ = self.state()
            for e in exits:
                self.eps[e].append((1.0, exit_, "", 0))
            return exit_
        if isinstance(node, Opt):
            p_skip, p_take = self.dist(choice_key(path, "opt"), 2)
            start = self.state()
            self.eps[entry].append((p_take, start, choice_key(path, "opt"), 1))
            body_exit = self.build(node.body, (*path, 0), start, cont)
            exit_ = self.state()
            self.eps[entry].append((p_skip, exit_, choice_key(path, "opt"), 0))
            self.eps[body_exit].append((1.0, exit_, "", 0))
            return exit_
        if isinstance(node, Repeat):
            key = choice_key(path, "rep")
            counts = self.dist(key, node.hi - node.lo + 1)
            stops: list[tuple[int, float, int]] = []  # (state, P(stop | reached), count)
            at = entry
            reached = 1.0  # P(count >= k)
            for k in range(node.hi + 1):
                if k >= node.lo:
                    p_k = counts[k - node.lo]
                    stops.append((at, min(p_k / reached, 1.0) if reached > 1e-12 else 1.0, k))
                    reached -= p_k
                if k == node.hi:
                    break
                go = self.state()
                p_go = 1.0 - stops[-1][1] if k >= node.lo else 1.0
                self.eps[at].append((max(p_go, 0.0), go, key, -1))
                rest = _remaining_repeat(node, k + 1)
                at = self.build(node.body, (*path, 0), go, (rest, *cont) if rest is not None else cont)
            exit_ = self.state()
            for state, p_stop, k in stops:
                self.eps[state].append((p_stop, exit_, key, k - node.lo))
            return exit_
        raise ExpressionError(f"not an expression node: {node!r}")


def _remaining_repeat(node: Repeat, done: int) -> Expr | None:
    hi = node.hi - done
    if hi <= 0:
        return None
    lo = max(node.lo - done, 0)
    return Opt(node.body) if (lo, hi) == (0, 1) else Repeat(node.body, lo, hi)
