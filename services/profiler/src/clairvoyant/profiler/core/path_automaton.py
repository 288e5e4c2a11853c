"""Compile a bounded path expression into an acyclic probabilistic automaton.

``compile_paths(expr, weights)`` returns a ``PathAutomaton``: states, the step-consuming edges
(``Emit``) and the epsilon edges with their choice probabilities.  The weights table gives the
probabilities of the expression's choice points; a choice it does not cover (or covers with the
wrong size) is uniform.  Raises ``ExpressionError`` when the unrolled expression would exceed
``MAX_STATES`` states.

    (b){1,3}:   s0 --b--> s1 --b--> s2 --b--> s3 ---> exit
                           \\________\\______________/^   stop edges, P(stop after k | reached k)

A loop over alternatives, ``(a | b | ...){m,n}``, whose weights carry transition rows
(``transition_key``) is compiled as a first-order chain: after option i, the next option and the
stop depend on i (``_Builder.chain``).  State ``FINAL`` (0) is the end of the workflow; states are
numbered so that every edge goes from a lower to a higher number (except into ``FINAL``), which is
what lets the passes below run in state order.  What is reachable over epsilon edges from a state
(``closure``, ``moves``) is computed on first use and kept.  How each node compiles, and why:
docs/profiler.md, "Path models".
"""

from __future__ import annotations

import heapq
import math
from collections.abc import Callable, Mapping, Sequence
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
# mem (fan-out members in body order); for a loop over alternatives also next.^ and next.<i> (the
# observed frequencies of the option after the start / after option i, then of the stop) and trust
# (per row, how far to trust it over the option frequencies: n / (n + prior), the start row last).
Weights = dict[str, list[float]]

# An epsilon edge: (probability, destination, weights key or "", choice index; -1 for "go on").
EpsilonEdge = tuple[float, int, str, int]


def choice_key(path: tuple[int, ...], kind: str) -> str:
    """The weights-table key of the choice point of ``kind`` at node ``path``."""
    return ".".join(map(str, path)) + ":" + kind


def transition_key(path: tuple[int, ...], row: int | None) -> str:
    """The key of a loop's transition row: after option ``row``, or after the start (None)."""
    return choice_key(path, "next." + ("^" if row is None else str(row)))


def is_chain(node: Expr) -> bool:
    """Whether ``node`` is a loop over alternatives, which can carry transition rows."""
    return isinstance(node, Repeat) and isinstance(node.body, Alt) and node.hi >= 2


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


class Moves:
    """The next steps from one state over its most likely epsilon paths (for derivations).

    ``by_agent`` maps an agent id to the one-call edges emitting it, ``fans`` holds the fan-out
    edges; each entry is (edge, log probability of the epsilon path, choices made on it, paths),
    where ``paths`` is 2 when two paths with different choices lead to the edge (capped).  ``end``
    is the same for reaching the end of the workflow, or None."""

    __slots__ = ("by_agent", "fans", "end")

    def __init__(self) -> None:
        self.by_agent: dict[str, list[Move]] = {}
        self.fans: list[Move] = []
        self.end: Move | None = None


# (edge index or -1 for the end, log probability, choices in path order, 1 or 2 distinct paths)
Move = tuple[int, float, tuple[tuple[str, int], ...], int]


class PathAutomaton:
    """The compiled automaton.  Built once by ``compile_paths``; its answers never change (what
    ``closure`` and ``moves`` compute is kept on first use)."""

    __slots__ = (
        "start",
        "eps",
        "emits",
        "edges",
        "cont",
        "_closure",
        "_best",
        "_moves",
        "_shared_moves",
        "_by_label",
    )

    def __init__(
        self,
        start: int,
        eps: list[list[EpsilonEdge]],
        emits: list[list[int]],
        edges: list[Emit],
        cont: dict[int, tuple[Expr, ...]],
    ) -> None:
        self.start = start
        self.eps = eps  # per state: its epsilon edges
        self.emits = emits  # per state: indices into ``edges`` of the edges leaving it
        self.edges = edges
        self.cont = cont  # per state: what is left of the expression from there
        self._closure: dict[int, tuple[tuple[float, int], ...]] = {FINAL: ((1.0, -1),)}
        self._best: dict[int, dict[int, Move]] = {FINAL: {-1: (-1, 0.0, (), 1)}}
        self._moves: dict[int, Moves] = {}
        self._shared_moves: dict[int, Moves] = {}  # by id() of a table in _best (kept alive there)
        self._by_label: tuple[dict[str, list[int]], list[int]] | None = None

    @property
    def states(self) -> int:
        return len(self.eps)

    # ------------------------------------------------------------------ over epsilon paths

    def closure(self, state: int) -> tuple[tuple[float, int], ...]:
        """(probability, edge index or -1 for the end) over the epsilon paths from ``state``,
        by edge index.  A state with one sure epsilon edge shares its destination's tuple."""
        done = self._closure.get(state)
        if done is not None:
            return done
        stack = [state]
        while stack:  # children first: destinations are higher-numbered (or FINAL)
            s = stack[-1]
            missing = [d for p, d, _, _ in self.eps[s] if p > 0.0 and d not in self._closure]
            if missing:
                stack.extend(missing)
                continue
            stack.pop()
            if s in self._closure:
                continue
            eps = [(p, d) for p, d, _, _ in self.eps[s] if p > 0.0]
            if not self.emits[s] and len(eps) == 1 and eps[0][0] == 1.0:
                self._closure[s] = self._closure[eps[0][1]]
                continue
            acc: dict[int, float] = {e: 1.0 for e in self.emits[s]}
            for p, d in eps:
                for q, e in self._closure[d]:
                    acc[e] = acc.get(e, 0.0) + p * q
            self._closure[s] = tuple((p, e) for e, p in sorted(acc.items()))
        return self._closure[state]

    def moves(self, state: int) -> Moves:
        """The most likely epsilon path from ``state`` to each next edge (see ``Moves``)."""
        done = self._moves.get(state)
        if done is not None:
            return done
        best = self._best
        stack = [state]
        while stack:  # children first, as in ``closure``
            s = stack[-1]
            missing = [d for p, d, _, _ in self.eps[s] if p > 0.0 and d not in best]
            if missing:
                stack.extend(missing)
                continue
            stack.pop()
            if s in best:
                continue
            eps = [edge for edge in self.eps[s] if edge[0] > 0.0]
            if (
                not self.emits[s]
                and len(eps) == 1
                and eps[0][0] == 1.0
                and not (eps[0][2] and eps[0][3] >= 0)
            ):
                best[s] = best[eps[0][1]]  # a sure step that records no choice: share
                continue
            own: dict[int, Move] = {e: (e, 0.0, (), 1) for e in self.emits[s]}
            for p, d, key, choice in self.eps[s]:
                if p <= 0.0:
                    continue
                made = ((key, choice),) if key and choice >= 0 else ()
                log_p = math.log(p)
                for e, lp, choices, paths in best[d].values():
                    cand = (e, lp + log_p, made + choices, paths)
                    held = own.get(e)
                    if held is None:
                        own[e] = cand
                        continue
                    paths = 2 if held[2] != cand[2] else max(held[3], cand[3])
                    winner = cand if cand[1] > held[1] else held
                    own[e] = (e, winner[1], winner[2], paths)
            best[s] = own
        own = best[state]
        moves = self._shared_moves.get(id(own))  # states sharing one table share its Moves
        if moves is None:
            moves = self._shared_moves[id(own)] = Moves()
            for e, move in sorted(own.items()):
                if e < 0:
                    moves.end = move
                elif self.edges[e].fan_key:
                    moves.fans.append(move)
                else:
                    moves.by_agent.setdefault(self.edges[e].members[0], []).append(move)
        self._moves[state] = moves
        return moves

    def edges_by_label(self) -> tuple[dict[str, list[int]], list[int]]:
        """Every one-call edge by its agent id, and every fan-out edge."""
        if self._by_label is None:
            agents: dict[str, list[int]] = {}
            fans: list[int] = []
            for e, edge in enumerate(self.edges):
                if edge.fan_key:
                    fans.append(e)
                else:
                    agents.setdefault(edge.members[0], []).append(e)
            self._by_label = (agents, fans)
        return self._by_label

    # ------------------------------------------------------------------- whole-automaton passes

    def state_values(self, cost: Callable[[Emit], float]) -> list[float]:
        """V(s) = sum over next steps e of P(e | s) * (cost(e) + V(e.dst)); V = 0 at the end.
        One backward pass over the edges, in state order."""
        n = len(self.eps)
        values = [0.0] * n
        for s in range(n - 1, 0, -1):
            value = 0.0
            for e in self.emits[s]:
                edge = self.edges[e]
                value += cost(edge) + values[edge.dst]
            for p, d, _, _ in self.eps[s]:
                if p > 0.0:
                    value += p * values[d]
            values[s] = value
        return values

    def edge_visits(self) -> list[float]:
        """P(a run uses edge e), by a forward pass in state order."""
        n = len(self.eps)
        reach = [0.0] * n
        reach[self.start] = 1.0
        visits = [0.0] * len(self.edges)
        for s in range(1, n):
            mass = reach[s]
            if mass <= 0.0:
                continue
            for e in self.emits[s]:
                visits[e] += mass
                reach[self.edges[e].dst] += mass
            for p, d, _, _ in self.eps[s]:
                if p > 0.0 and d != FINAL:
                    reach[d] += mass * p
        return visits

    def flow(self, masses: Mapping[int, float]) -> tuple[dict[int, float], float]:
        """Push probability mass from states over their epsilon paths: (mass per next edge, mass
        reaching the end).  Shared epsilon states are visited once, so a loop over n alternatives
        costs O(n) per state rather than the O(n) per option its closures would."""
        out: dict[int, float] = {}
        end = 0.0
        pending: dict[int, float] = {}
        heap: list[int] = []

        def reach(state: int, mass: float) -> None:
            nonlocal end
            if state == FINAL:
                end += mass
            elif not self.eps[state]:  # emits only: no need to queue it
                for e in self.emits[state]:
                    out[e] = out.get(e, 0.0) + mass
            elif state in pending:
                pending[state] += mass
            else:
                pending[state] = mass
                heapq.heappush(heap, state)

        for state, mass in masses.items():
            reach(state, mass)
        while heap:  # states in increasing order: a state's mass is complete when popped
            s = heapq.heappop(heap)
            mass = pending[s]
            for e in self.emits[s]:
                out[e] = out.get(e, 0.0) + mass
            for p, d, _, _ in self.eps[s]:
                if p > 0.0:
                    reach(d, mass * p)
        return out, end


def compile_paths(expr: Expr, weights: Weights) -> PathAutomaton:
    """The automaton of ``expr`` with the choice probabilities of ``weights``."""
    builder = _Builder(weights)
    start = 1
    top_exit = builder.build(expr, (), start, ())
    builder.eps[top_exit].append((1.0, FINAL, "", 0))
    builder.cont[start] = (expr,)
    return PathAutomaton(start, builder.eps, builder.emits, builder.edges, builder.cont)


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
            if is_chain(node) and transition_key(path, None) in self.weights:
                return self.chain(node, path, entry, cont)
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

    def chain(self, node: Repeat, path: tuple[int, ...], entry: int, cont: tuple[Expr, ...]) -> int:
        """``(o_0 | ... | o_n-1){m,n}`` as a first-order chain over its options.

            entry --> pick_0 ==> o_0..o_n-1 --> after(1, i) --> o_j of the next round (row i)
                                                   |       \\--> pick_1 (the option frequencies)
                                                   \\--> exit (P(stop | count, i))

        After option i the next option follows row i of the transitions, interpolated with the
        option frequencies (``trust``); the stop combines the count distribution's hazard with
        row i's stop frequency (odds ratio against the mean stop rate 1 / E[count])."""
        body = node.body
        assert isinstance(body, Alt)
        n = len(body.options)
        rep_key = choice_key(path, "rep")
        alt_key = choice_key((*path, 0), "alt")
        counts = self.dist(rep_key, node.hi - node.lo + 1)
        marginal = self.dist(alt_key, n)
        trust = self.weights.get(choice_key(path, "trust"), [])
        if len(trust) != n + 1:
            trust = [0.0] * (n + 1)
        rows = [self.row(transition_key(path, i), n) for i in range(n)]
        start_row = self.row(transition_key(path, None), n)
        mean = sum((node.lo + i) * p for i, p in enumerate(counts))
        mean_stop = _clamp(1.0 / mean if mean > 0 else 1.0)
        hazard: list[float] = []  # P(stop at k | reached k) for k = 0..hi
        reached = 1.0
        for k in range(node.hi + 1):
            p_k = counts[k - node.lo] if k >= node.lo else 0.0
            hazard.append(min(p_k / reached, 1.0) if reached > 1e-12 else 1.0)
            reached -= p_k
        picks: list[int] = []
        starts: list[list[int]] = []
        afters: list[list[int]] = []
        for k in range(node.hi):
            picks.append(self.state())
            rest = _remaining_repeat(node, k + 1)
            inner = (rest, *cont) if rest is not None else cont
            starts.append([])
            afters.append([])
            for j, option in enumerate(body.options):
                starts[k].append(self.state())
                afters[k].append(self.build(option, (*path, 0, j), starts[k][j], inner))
        exit_ = self.state()
        if node.lo == 0:
            self.eps[entry].append((hazard[0], exit_, rep_key, 0))
        self.eps[entry].append((1.0 - hazard[0] if node.lo == 0 else 1.0, picks[0], rep_key, -1))
        first = [trust[n] * start_row[j] + (1.0 - trust[n]) * marginal[j] for j in range(n)]
        total = sum(first) or 1.0
        for j in range(n):
            self.eps[picks[0]].append((first[j] / total, starts[0][j], alt_key, j))
        for k in range(1, node.hi):
            for j in range(n):
                self.eps[picks[k]].append((marginal[j], starts[k][j], alt_key, j))
        stops = [_clamp(trust[i] * rows[i][n] + (1.0 - trust[i]) * mean_stop) for i in range(n)]
        successors = [[j for j in range(n) if rows[i][j] > 0.0] for i in range(n)]
        last = [p / total for p in first]  # P(last option = i | reached this count)
        for k in range(node.hi):
            done = k + 1
            # The stop rate expected at this count, so that row i's stop only says how much more
            # (or less) likely than the others option i makes a stop here; the count's own hazard
            # already holds the rest (without this a cycle a -> b -> c would be counted twice).
            expected_stop = _clamp(sum(w * s for w, s in zip(last, stops, strict=True)))
            following = [0.0] * n
            spread = 0.0  # mass going on through the option frequencies
            for i in range(n):
                at = afters[k][i]
                if done < node.lo:
                    p_stop = 0.0
                elif done == node.hi:
                    p_stop = 1.0
                else:
                    p_stop = _odds_combine(hazard[done], stops[i], expected_stop)
                if p_stop > 0.0:
                    self.eps[at].append((p_stop, exit_, rep_key, done - node.lo))
                if done == node.hi or p_stop >= 1.0:
                    continue
                go = (1.0 - p_stop) / (1.0 - stops[i])
                for j in successors[i]:
                    p = go * trust[i] * rows[i][j]
                    self.eps[at].append((p, starts[done][j], alt_key, j))
                    following[j] += last[i] * p
                backoff = go * (1.0 - trust[i]) * (1.0 - mean_stop)
                if backoff > 0.0:
                    self.eps[at].append((backoff, picks[done], rep_key, -1))
                    spread += last[i] * backoff
            going = sum(following) + spread
            if going > 0.0:
                last = [(f + spread * m) / going for f, m in zip(following, marginal, strict=True)]
        return exit_

    def row(self, key: str, n: int) -> list[float]:
        """A transition row (n options, then the stop), as given: frequencies, zeros allowed."""
        given = self.weights.get(key)
        if given is None or len(given) != n + 1 or sum(given) <= 0:
            return [0.0] * (n + 1)
        total = sum(given)
        return [g / total for g in given]


def _clamp(p: float) -> float:
    return min(max(p, 1e-6), 1.0 - 1e-6)


def _odds_combine(hazard: float, stop: float, mean_stop: float) -> float:
    """P(stop) from the count hazard, scaled in odds by how much likelier the last option makes a
    stop than the mean stop rate does."""
    if hazard <= 0.0 or hazard >= 1.0:
        return hazard
    odds = hazard / (1.0 - hazard) * (stop / (1.0 - stop)) / (mean_stop / (1.0 - mean_stop))
    return odds / (1.0 + odds)


def _remaining_repeat(node: Repeat, done: int) -> Expr | None:
    hi = node.hi - done
    if hi <= 0:
        return None
    lo = max(node.lo - done, 0)
    return Opt(node.body) if (lo, hi) == (0, 1) else Repeat(node.body, lo, hi)
