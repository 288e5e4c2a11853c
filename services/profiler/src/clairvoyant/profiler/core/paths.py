"""Path expressions as probabilistic automata: acceptance, positions and look-ahead.

Every bounded path expression (``expr.py``) denotes a finite language of step sequences, so it
compiles to an *acyclic* automaton: ``(x){m,n}`` is unrolled into n copies of x with a "stop here"
edge after each copy from the m-th on, ``(x)?`` is a skip edge, ``(a | b)`` a fork, ``<x>{m,n}``
one edge that matches a whole parallel step, ``$`` an edge to the final state.

    (b){1,3}:   s0 --b--> s1 --b--> s2 --b--> s3 ---> exit
                           \\________\\______________/^   stop edges, P(stop after k | reached k)

The choice points carry probabilities (``Weights``): option frequencies of an alternative, the
taken-rate of an optional, the distribution of repetition counts (exact per count, not geometric)
and of fan-out widths.  ``fit_weights`` estimates them from traces (each accepted trace is parsed
by its most likely derivation, Viterbi-style, and the choices it makes are counted, with an add-0.5
prior so no admitted path gets probability 0); without traces the choices are uniform.

A *position* is the belief over automaton states after a prefix of steps (forward filtering; a
prefix can be ambiguous, e.g. ``(a){1,3} -> (a)?``).  From it:
* ``future_agents`` — the next step's agents with probabilities, and the probability the workflow ends;
* ``expected_remaining`` — E[steps still to come] by the backward recursion
  R(s) = sum over next steps e of P(e | s) * (1 + R(e.dst)), the same number the fundamental matrix
  of the absorbing Markov chain gives; E[time] the same with each step costing its agent's mean
  service time plus the mean gap after it (a parallel step costs its slowest member);
* ``project`` — expected calls per agent within the next H steps (Pythia Alg. 4, ProjectGraph);
* ``residual`` — the remaining path as an expression (Pythia's annotated ``predicted_path_regex``).

When a prefix leaves the expression (the < 5% of traces pruned as outliers), the position is
re-anchored on the last step: every place in the automaton that can emit it, weighted by how often
runs pass there.  ``Position.on_path`` records that this happened.
"""

from __future__ import annotations

import heapq
import math
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from functools import lru_cache
from typing import TypeAlias, Union

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
    seq,
    to_text,
)
from clairvoyant.profiler.core.trace import Step, StepLike, as_step

MAX_STATES = 50_000
FINAL = 0
END_AGENT = "$"
PRIOR_COUNT = 0.5

# A weights table: "<node path>:<kind>" -> a distribution.  Paths are child indices joined by ".",
# the root is "".  Kinds: alt (options), opt (skip, take), rep (counts lo..hi), fan (widths lo..hi),
# mem (fan-out members in body order).
Weights = dict[str, list[float]]


def _key(path: tuple[int, ...], kind: str) -> str:
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
class Position:
    """Where a workflow instance stands: a belief over automaton states after ``steps`` steps."""

    belief: tuple[tuple[int, float], ...]
    steps: int = 0
    on_path: bool = True  # False once some step was outside the expression (re-anchored)


@dataclass(frozen=True, slots=True)
class NextAgents:
    agents: tuple[tuple[str, float], ...]  # (agent id, P(next step includes it)), most likely first
    end_probability: float  # P(the workflow ends after this position)


@dataclass(frozen=True, slots=True)
class Remaining:
    steps: float
    time_s: float | None  # None when no service times were given


@dataclass
class _Builder:
    weights: Weights
    eps: list[list[tuple[float, int, str, int]]] = field(
        default_factory=lambda: [[], []]
    )  # p, dst, key, choice
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
                tuple(self.dist(_key(path, "mem"), len(members))),
                node.lo,
                node.hi,
                tuple(self.dist(_key(path, "fan"), node.hi - node.lo + 1)),
                _key(path, "fan"),
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
            probs = self.dist(_key(path, "alt"), len(node.options))
            exits = []
            for i, option in enumerate(node.options):
                start = self.state()
                self.eps[entry].append((probs[i], start, _key(path, "alt"), i))
                exits.append(self.build(option, (*path, i), start, cont))
            exit_ = self.state()
            for e in exits:
                self.eps[e].append((1.0, exit_, "", 0))
            return exit_
        if isinstance(node, Opt):
            p_skip, p_take = self.dist(_key(path, "opt"), 2)
            start = self.state()
            self.eps[entry].append((p_take, start, _key(path, "opt"), 1))
            body_exit = self.build(node.body, (*path, 0), start, cont)
            exit_ = self.state()
            self.eps[entry].append((p_skip, exit_, _key(path, "opt"), 0))
            self.eps[body_exit].append((1.0, exit_, "", 0))
            return exit_
        if isinstance(node, Repeat):
            key = _key(path, "rep")
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


class PathModel:
    """A compiled expression with its choice probabilities.  Immutable after construction."""

    def __init__(self, expr: Expr, weights: Weights | None = None) -> None:
        self.expr = expr
        self.weights: Weights = {k: list(v) for k, v in (weights or {}).items()}
        builder = _Builder(self.weights)
        self.start = 1
        top_exit = builder.build(expr, (), self.start, ())
        builder.eps[top_exit].append((1.0, FINAL, "", 0))
        self._eps = builder.eps
        self._edge_emits = builder.emits
        self.edges = builder.edges
        self._cont = builder.cont
        self._cont[self.start] = (expr,)
        # closure[s]: (probability, edge index or -1 for the end) over the epsilon paths from s.
        n = len(self._eps)
        self.closure: list[tuple[tuple[float, int], ...]] = [()] * n
        self.closure[FINAL] = ((1.0, -1),)
        for s in range(n - 1, 0, -1):
            acc: dict[int, float] = {e: 1.0 for e in self._edge_emits[s]}
            for p, dst, _, _ in self._eps[s]:
                if p <= 0.0:
                    continue
                for q, e in self.closure[dst]:
                    acc[e] = acc.get(e, 0.0) + p * q
            self.closure[s] = tuple((p, e) for e, p in sorted(acc.items()))
        self.remaining_steps = self.state_values(lambda edge: 1.0)
        self._visits = self._edge_visits()
        self._residual_text: dict[int, str] = {}

    # ---------------------------------------------------------------------------- tables

    def state_values(self, cost: Callable[[Emit], float]) -> list[float]:
        """V(s) = sum over next steps e of P(e | s) * (cost(e) + V(e.dst)); V = 0 at the end."""
        n = len(self._eps)
        values = [0.0] * n
        for s in range(n - 1, 0, -1):
            values[s] = sum(
                p * (cost(self.edges[e]) + values[self.edges[e].dst]) for p, e in self.closure[s] if e >= 0
            )
        return values

    def time_values(
        self, service_s: Mapping[str, float], gap_s: Mapping[str, float] | None = None
    ) -> list[float]:
        gaps = gap_s or {}

        def cost(edge: Emit) -> float:
            return max(service_s.get(a, 0.0) + gaps.get(a, 0.0) for a in edge.members)

        return self.state_values(cost)

    def _edge_visits(self) -> list[float]:
        """P(a run uses edge e), by a forward pass in state order."""
        n = len(self._eps)
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

    # ------------------------------------------------------------------------- positions

    def start_position(self) -> Position:
        return Position(((self.start, 1.0),), 0, True)

    def _step(self, belief: Iterable[tuple[int, float]], like: Callable[[Emit], float]) -> dict[int, float]:
        out: dict[int, float] = {}
        for s, w in belief:
            for p, e in self.closure[s]:
                if e < 0:
                    continue
                edge = self.edges[e]
                lk = like(edge)
                if lk > 0.0:
                    out[edge.dst] = out.get(edge.dst, 0.0) + w * p * lk
        return out

    def advance_by(self, position: Position, like: Callable[[Emit], float]) -> tuple[Position | None, float]:
        """Advance with a custom step likelihood; returns (position or None off-path, probability mass)."""
        new = self._step(position.belief, like)
        mass = sum(new.values())
        if mass <= 0.0:
            return None, 0.0
        belief = tuple(sorted(((s, w / mass) for s, w in new.items()), key=lambda sw: -sw[1]))
        return Position(belief, position.steps + 1, position.on_path), mass

    def advance(
        self, position: Position, step: StepLike | None = None, *, partial_agent: str | None = None
    ) -> Position:
        """The position after one more step: a complete ``step``, or (``partial_agent``) a step
        still in progress of which one call, by that agent, is known."""
        if partial_agent is not None:
            agent = partial_agent

            def like(edge: Emit) -> float:
                return edge.partial_likelihood(agent)
        else:
            observed = as_step(step)  # type: ignore[arg-type]

            def like(edge: Emit) -> float:
                return edge.likelihood(observed)

        new = self._step(position.belief, like)
        on_path = position.on_path
        if not new:  # off the expression: re-anchor on the step
            on_path = False
            for e, edge in enumerate(self.edges):
                lk = like(edge)
                if lk > 0.0 and self._visits[e] > 0.0:
                    new[edge.dst] = new.get(edge.dst, 0.0) + self._visits[e] * lk
            if not new:  # an agent the expression never mentions: the position does not move
                return Position(position.belief, position.steps + 1, False)
        total = sum(new.values())
        belief = tuple(sorted(((s, w / total) for s, w in new.items()), key=lambda sw: -sw[1]))
        return Position(belief, position.steps + 1, on_path)

    def position(self, prefix: Sequence[StepLike], partial_agent: str | None = None) -> Position:
        at = self.start_position()
        for step in prefix:
            at = self.advance(at, step)
        if partial_agent is not None:
            at = self.advance(at, partial_agent=partial_agent)
        return at

    def accepts(self, steps: Sequence[StepLike]) -> bool:
        belief: Iterable[tuple[int, float]] = ((self.start, 1.0),)
        for step in steps:
            observed = as_step(step)
            belief = self._step(belief, lambda edge, o=observed: edge.likelihood(o)).items()  # type: ignore[misc]
            if not belief:
                return False
        return any(e < 0 for s, _ in belief for _, e in self.closure[s])

    # ---------------------------------------------------------------------------- queries

    def future_agents(self, position: Position) -> NextAgents:
        agents: dict[str, float] = {}
        end = 0.0
        for s, w in position.belief:
            for p, e in self.closure[s]:
                if e < 0:
                    end += w * p
                    continue
                for agent, presence in self.edges[e].member_presence().items():
                    agents[agent] = agents.get(agent, 0.0) + w * p * presence
        ranked = tuple(
            sorted(((a, min(p, 1.0)) for a, p in agents.items() if p > 0.0), key=lambda ap: (-ap[1], ap[0]))
        )
        return NextAgents(ranked, min(end, 1.0))

    def expected_remaining(
        self,
        position: Position,
        service_s: Mapping[str, float] | None = None,
        gap_s: Mapping[str, float] | None = None,
        *,
        time_values: Sequence[float] | None = None,
    ) -> Remaining:
        steps = sum(w * self.remaining_steps[s] for s, w in position.belief)
        if time_values is None and service_s is not None:
            time_values = self.time_values(service_s, gap_s)
        time = None if time_values is None else sum(w * time_values[s] for s, w in position.belief)
        return Remaining(steps, time)

    def project(self, position: Position, horizon: int) -> dict[str, float]:
        """Expected calls per agent within the next ``horizon`` steps."""
        calls: dict[str, float] = {}
        frontier = dict(position.belief)
        for _ in range(max(horizon, 0)):
            nxt: dict[int, float] = {}
            for s, w in frontier.items():
                for p, e in self.closure[s]:
                    if e < 0:
                        continue
                    edge = self.edges[e]
                    for agent, n in edge.expected_calls().items():
                        calls[agent] = calls.get(agent, 0.0) + w * p * n
                    nxt[edge.dst] = nxt.get(edge.dst, 0.0) + w * p
            if not nxt:
                break
            frontier = nxt
        return dict(sorted(calls.items(), key=lambda an: (-an[1], an[0])))

    def residual(self, position: Position, min_share: float = 0.05) -> str:
        """The rest of the workflow as expression text: the alternative of the residuals of the
        states holding at least ``min_share`` of the belief (most likely first); ``$`` at the end."""
        texts: list[str] = []
        for s, w in position.belief:
            if w < min_share and texts:
                continue
            text = self._residual_of(s)
            if text not in texts:
                texts.append(text)
        if len(texts) == 1:
            return texts[0]
        return "(" + " | ".join(texts) + ")"

    def _residual_of(self, state: int) -> str:
        text = self._residual_text.get(state)
        if text is None:
            rest = seq(*self._cont.get(state, ()))
            text = "$" if rest is None or isinstance(rest, End) else to_text(rest)
            self._residual_text[state] = text
        return text

    # ------------------------------------------------------------------------------ fitting

    def derivation(self, steps: Sequence[StepLike]) -> list[tuple[str, int]] | None:
        """The choices of the most likely derivation of ``steps`` (None if not accepted)."""
        observed = [as_step(s) for s in steps]
        # layer[t]: state -> (log score, back pointer); back pointer = (t', state', choices)
        layer: dict[int, tuple[float, tuple | None]] = {self.start: (0.0, None)}
        for t in range(len(observed) + 1):
            best = self._eps_closure_viterbi(layer)
            if t == len(observed):
                if FINAL in best:
                    return _unwind(best[FINAL][1])
                return None
            nxt: dict[int, tuple[float, tuple | None]] = {}
            for s, (score, back) in best.items():
                for e in self._edge_emits[s]:
                    edge = self.edges[e]
                    lk = edge.likelihood(observed[t])
                    if lk <= 0.0:
                        continue
                    choice = [(edge.fan_key, len(observed[t].agents) - edge.lo)] if edge.fan_key else []
                    if edge.fan_key:
                        choice += [
                            (edge.fan_key[:-3] + "mem", edge.members.index(a)) for a in observed[t].agents
                        ]
                    cand = score + math.log(lk)
                    if edge.dst not in nxt or cand > nxt[edge.dst][0]:
                        nxt[edge.dst] = (cand, (back, choice))
            if not nxt:
                return None
            layer = nxt
        return None

    def _eps_closure_viterbi(
        self, layer: dict[int, tuple[float, tuple | None]]
    ) -> dict[int, tuple[float, tuple | None]]:
        best = dict(layer)
        heap = list(best)
        heapq.heapify(heap)
        done: set[int] = set()
        while heap:
            s = heapq.heappop(heap)
            if s in done:
                continue
            done.add(s)
            score, back = best[s]
            for p, dst, key, choice in self._eps[s]:
                if p <= 0.0:
                    continue
                cand = score + math.log(p)
                if dst not in best or cand > best[dst][0]:
                    best[dst] = (cand, (back, [(key, choice)] if key and choice >= 0 else []))
                    if dst != FINAL:
                        heapq.heappush(heap, dst)
        return best


def _unwind(back: tuple | None) -> list[tuple[str, int]]:
    choices: list[tuple[str, int]] = []
    while back is not None:
        back, made = back
        choices.extend(made)
    return choices


def fit_weights(expr: Expr, traces: Iterable[Sequence[StepLike]], rounds: int = 2) -> Weights:
    """Choice probabilities of ``expr`` estimated from the traces it accepts (see module doc)."""
    data = [list(t) for t in traces]
    weights: Weights = {}
    for _ in range(max(rounds, 1)):
        model = PathModel(expr, weights)
        counts: dict[str, dict[int, float]] = {}
        for steps in data:
            choices = model.derivation(steps)
            for key, choice in choices or ():
                row = counts.setdefault(key, {})
                row[choice] = row.get(choice, 0.0) + 1.0
        weights = {}
        for key, size in _choice_sizes(expr).items():
            row = counts.get(key, {})
            weights[key] = [row.get(i, 0.0) + PRIOR_COUNT for i in range(size)]
            total = sum(weights[key])
            weights[key] = [w / total for w in weights[key]]
    return weights


def _choice_sizes(expr: Expr, path: tuple[int, ...] = ()) -> dict[str, int]:
    sizes: dict[str, int] = {}
    if isinstance(expr, Alt):
        sizes[_key(path, "alt")] = len(expr.options)
        for i, o in enumerate(expr.options):
            sizes.update(_choice_sizes(o, (*path, i)))
    elif isinstance(expr, Seq):
        for i, o in enumerate(expr.items):
            sizes.update(_choice_sizes(o, (*path, i)))
    elif isinstance(expr, Opt):
        sizes[_key(path, "opt")] = 2
        sizes.update(_choice_sizes(expr.body, (*path, 0)))
    elif isinstance(expr, Repeat):
        sizes[_key(path, "rep")] = expr.hi - expr.lo + 1
        sizes.update(_choice_sizes(expr.body, (*path, 0)))
    elif isinstance(expr, FanOut):
        sizes[_key(path, "fan")] = expr.hi - expr.lo + 1
        sizes[_key(path, "mem")] = len(expr.members)
    return sizes


# ------------------------------------------------------------------- module-level convenience


@lru_cache(maxsize=256)
def compile_expr(expr: Expr) -> PathModel:
    """The model of ``expr`` with uniform choices (cached: expressions are immutable)."""
    return PathModel(expr)


Model: TypeAlias = Union[Expr, PathModel]  # noqa: UP007


def _model(expr: Model) -> PathModel:
    return expr if isinstance(expr, PathModel) else compile_expr(expr)


def _position(model: PathModel, position: Position | Sequence[StepLike]) -> Position:
    return position if isinstance(position, Position) else model.position(position)


def accepts(expr: Model, trace: Sequence[StepLike]) -> bool:
    """Whether the whole trace (a sequence of steps) is a word of the expression."""
    return _model(expr).accepts(trace)


def future_agents(expr: Model, position: Position | Sequence[StepLike]) -> NextAgents:
    model = _model(expr)
    return model.future_agents(_position(model, position))


def expected_remaining(
    expr: Model,
    position: Position | Sequence[StepLike],
    service_s: Mapping[str, float] | None = None,
    gap_s: Mapping[str, float] | None = None,
) -> Remaining:
    model = _model(expr)
    return model.expected_remaining(_position(model, position), service_s, gap_s)


def project(expr: Model, position: Position | Sequence[StepLike], horizon: int) -> dict[str, float]:
    model = _model(expr)
    return model.project(_position(model, position), horizon)
