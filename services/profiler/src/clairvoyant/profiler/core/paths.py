"""Path models: where a workflow instance stands in its path expression, and what comes next.

A ``PathModel`` is a path expression compiled to an acyclic automaton (``path_automaton.py``)
together with its choice probabilities (``path_fitting.fit_weights``; uniform without them).  It is
immutable after construction and its queries never raise on any sequence of steps.

A *position* is the belief over automaton states after a prefix of steps (forward filtering; a
prefix can be ambiguous, e.g. ``(a){1,3} -> (a)?``).  From it:
* ``future_agents`` -- the next step's agents with probabilities, and the probability the workflow ends;
* ``expected_remaining`` -- E[steps still to come] and, given per-agent service and gap times,
  E[time to the end];
* ``project_steps`` -- expected calls per agent in each of the next H steps (Pythia Alg. 4,
  ProjectGraph), and ``project`` their sum;
* ``residual`` -- the remaining path as expression text.

A prefix that leaves the expression is re-anchored on its last step, and ``Position.on_path``
turns False.  The module-level functions take an expression (compiled with uniform choices and
cached) or a model, and a position or a prefix of steps.  The derivations: docs/profiler.md,
"Path models".
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from functools import lru_cache
from typing import TypeAlias, Union

from clairvoyant.profiler.core.expr import End, Expr, seq, to_text
from clairvoyant.profiler.core.path_automaton import Emit, Weights, compile_paths
from clairvoyant.profiler.core.trace import StepLike, as_step

MAX_BELIEF_STATES = 32  # states a position keeps (the most likely); bounds every query's cost
FLOW_FROM_STATES = 16  # projecting from more states than this pushes mass over epsilon edges


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


class PathModel:
    """A compiled expression with its choice probabilities.  Immutable after construction."""

    def __init__(self, expr: Expr, weights: Weights | None = None) -> None:
        self.expr = expr
        self.weights: Weights = {k: list(v) for k, v in (weights or {}).items()}
        self.automaton = compile_paths(expr, self.weights)
        self.start = self.automaton.start
        self.edges = self.automaton.edges
        self.closure = self.automaton.closure  # state -> ((P, edge or -1 for the end), ...)
        self.remaining_steps = self.state_values(lambda edge: 1.0)
        self._visits = self.automaton.edge_visits()
        self._by_label: dict[
            int, tuple[dict[str, tuple[tuple[float, int], ...]], tuple[tuple[float, int], ...]]
        ] = {}
        self._residual_text: dict[int, str] = {}
        self._edge_presence: list[tuple[tuple[str, float], ...] | None] = [None] * len(self.edges)
        self._edge_calls: list[tuple[tuple[str, float], ...] | None] = [None] * len(self.edges)
        self._projections: dict[tuple[int, int], tuple[dict[str, float], ...]] = {}  # (state, horizon)
        self._ranked_projections: dict[tuple[int, int], tuple[dict[str, float], ...]] = {}

    # ---------------------------------------------------------------------------- tables

    def state_values(self, cost: Callable[[Emit], float]) -> list[float]:
        """V(s) = sum over next steps e of P(e | s) * (cost(e) + V(e.dst)); V = 0 at the end."""
        return self.automaton.state_values(cost)

    def time_values(
        self, service_s: Mapping[str, float], gap_s: Mapping[str, float] | None = None
    ) -> list[float]:
        gaps = gap_s or {}

        def cost(edge: Emit) -> float:
            return max(service_s.get(a, 0.0) + gaps.get(a, 0.0) for a in edge.members)

        return self.state_values(cost)

    # ------------------------------------------------------------------------- positions

    def start_position(self) -> Position:
        return Position(((self.start, 1.0),), 0, True)

    def _step(self, belief: Iterable[tuple[int, float]], like: Callable[[Emit], float]) -> dict[int, float]:
        out: dict[int, float] = {}
        for s, w in belief:
            for p, e in self.closure(s):
                if e < 0:
                    continue
                edge = self.edges[e]
                lk = like(edge)
                if lk > 0.0:
                    out[edge.dst] = out.get(edge.dst, 0.0) + w * p * lk
        return out

    def _labelled(
        self, state: int
    ) -> tuple[dict[str, tuple[tuple[float, int], ...]], tuple[tuple[float, int], ...]]:
        """``closure(state)`` split into one-call edges by agent id and fan-out edges."""
        done = self._by_label.get(state)
        if done is None:
            agents: dict[str, list[tuple[float, int]]] = {}
            fans: list[tuple[float, int]] = []
            for p, e in self.closure(state):
                if e < 0:
                    continue
                if self.edges[e].fan_key:
                    fans.append((p, e))
                else:
                    agents.setdefault(self.edges[e].members[0], []).append((p, e))
            done = self._by_label[state] = ({a: tuple(v) for a, v in agents.items()}, tuple(fans))
        return done

    def _step_on(
        self, belief: Iterable[tuple[int, float]], agent: str | None, like: Callable[[Emit], float]
    ) -> dict[int, float]:
        """``_step`` over the edges that can match a step: the one-call edges of ``agent`` (None:
        none, a parallel step) and the fan-outs; ``like`` decides."""
        out: dict[int, float] = {}
        for s, w in belief:
            agents, fans = self._labelled(s)
            for p, e in (*agents.get(agent, ()), *fans) if agent is not None else fans:
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
        return Position(_belief(new), position.steps + 1, position.on_path), mass

    def advance(
        self, position: Position, step: StepLike | None = None, *, partial_agent: str | None = None
    ) -> Position:
        """The position after one more step: a complete ``step``, or (``partial_agent``) a step
        still in progress of which one call, by that agent, is known."""
        if partial_agent is not None:
            agent: str | None = partial_agent

            def like(edge: Emit) -> float:
                return edge.partial_likelihood(partial_agent)
        else:
            observed = as_step(step)  # type: ignore[arg-type]
            agent = observed.agents[0] if len(observed.agents) == 1 else None

            def like(edge: Emit) -> float:
                return edge.likelihood(observed)

        new = self._step_on(position.belief, agent, like)
        on_path = position.on_path
        if not new:  # off the expression: re-anchor on the step
            on_path = False
            by_agent, fans = self.automaton.edges_by_label()
            for e in (*by_agent.get(agent, ()), *fans) if agent is not None else fans:
                edge = self.edges[e]
                lk = like(edge)
                if lk > 0.0 and self._visits[e] > 0.0:
                    new[edge.dst] = new.get(edge.dst, 0.0) + self._visits[e] * lk
            if not new:  # an agent the expression never mentions: the position does not move
                return Position(position.belief, position.steps + 1, False)
        return Position(_belief(new), position.steps + 1, on_path)

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
            agent = observed.agents[0] if len(observed.agents) == 1 else None
            belief = self._step_on(belief, agent, lambda edge, o=observed: edge.likelihood(o)).items()  # type: ignore[misc]
            if not belief:
                return False
        return any(e < 0 for s, _ in belief for _, e in self.closure(s))

    # ---------------------------------------------------------------------------- queries

    def future_agents(self, position: Position) -> NextAgents:
        agents: dict[str, float] = {}
        end = 0.0
        for s, w in position.belief:
            for p, e in self.closure(s):
                if e < 0:
                    end += w * p
                    continue
                for agent, presence in self._presence(e):
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
        """Expected calls per agent within the next ``horizon`` steps: ``project_steps`` summed."""
        calls: dict[str, float] = {}
        for step in self.project_steps(position, horizon):
            for agent, n in step.items():
                calls[agent] = calls.get(agent, 0.0) + n
        return _most_first(calls)

    def project_steps(self, position: Position, horizon: int) -> list[dict[str, float]]:
        """Expected calls per agent in each of the next ``horizon`` steps: element k is step k + 1
        after ``position`` (empty where the workflow has surely ended), agents most calls first.

        Linear in the belief, so it is the belief-weighted sum of each state's projection,
        which is computed once per (state, horizon) and cached."""
        if len(position.belief) == 1:  # the common case: one state, its ranked projection kept
            state = position.belief[0][0]
            ranked = self._ranked_projections.get((state, horizon))
            if ranked is None:
                ranked = tuple(_most_first(calls) for calls in self._state_projection(state, horizon))
                self._ranked_projections[(state, horizon)] = ranked
            return [dict(calls) for calls in ranked]
        steps: list[dict[str, float]] = [{} for _ in range(max(horizon, 0))]
        for s, w in position.belief:
            for calls, of_state in zip(steps, self._state_projection(s, horizon), strict=True):
                for agent, n in of_state.items():
                    calls[agent] = calls.get(agent, 0.0) + w * n
        return [_most_first(calls) for calls in steps]

    def _state_projection(self, state: int, horizon: int) -> tuple[dict[str, float], ...]:
        """The projection of one state: from a state with few next steps, each step's calls plus
        the (kept) projections of their destinations one step shorter, so neighbouring states
        share the work; from one with many, forward over the frontier (``_next_edges``)."""
        if horizon <= 0:
            return ()
        cached = self._projections.get((state, horizon))
        if cached is not None:
            return cached
        entries = [(p, e) for p, e in self.closure(state) if e >= 0]
        steps: list[dict[str, float]] = [{} for _ in range(horizon)]
        if len(entries) <= FLOW_FROM_STATES:
            for p, e in entries:
                for agent, n in self._calls(e):
                    steps[0][agent] = steps[0].get(agent, 0.0) + p * n
                for calls, later in zip(
                    steps[1:], self._state_projection(self.edges[e].dst, horizon - 1), strict=True
                ):
                    for agent, n in later.items():
                        calls[agent] = calls.get(agent, 0.0) + p * n
        else:
            frontier = {state: 1.0}
            for calls in steps:
                nxt: dict[int, float] = {}
                for e, w in self._next_edges(frontier):
                    for agent, n in self._calls(e):
                        calls[agent] = calls.get(agent, 0.0) + w * n
                    dst = self.edges[e].dst
                    nxt[dst] = nxt.get(dst, 0.0) + w
                frontier = nxt
        projection = self._projections[(state, horizon)] = tuple(steps)
        return projection

    def _next_edges(self, frontier: Mapping[int, float]) -> Iterable[tuple[int, float]]:
        """(edge, probability mass) of the next step from a weighted set of states.  A few states
        read their (kept) closures; many, e.g. every option of a loop over alternatives, are
        pushed through the epsilon edges once (``flow``), which costs the edges rather than
        states x options."""
        if len(frontier) > FLOW_FROM_STATES:
            return self.automaton.flow(frontier)[0].items()
        masses: dict[int, float] = {}
        for s, w in frontier.items():
            for p, e in self.closure(s):
                if e >= 0:
                    masses[e] = masses.get(e, 0.0) + w * p
        return masses.items()

    def _presence(self, edge: int) -> tuple[tuple[str, float], ...]:
        """``Emit.member_presence`` of an edge, computed once."""
        found = self._edge_presence[edge]
        if found is None:
            found = self._edge_presence[edge] = tuple(self.edges[edge].member_presence().items())
        return found

    def _calls(self, edge: int) -> tuple[tuple[str, float], ...]:
        """``Emit.expected_calls`` of an edge, computed once."""
        found = self._edge_calls[edge]
        if found is None:
            found = self._edge_calls[edge] = tuple(self.edges[edge].expected_calls().items())
        return found

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
            rest = seq(*self.automaton.cont.get(state, ()))
            text = "$" if rest is None or isinstance(rest, End) else to_text(rest)
            self._residual_text[state] = text
        return text


def _belief(weights: Mapping[int, float]) -> tuple[tuple[int, float], ...]:
    """The normalised belief, most likely state first, cut to the ``MAX_BELIEF_STATES`` most
    likely (a prefix that left the expression is re-anchored on every place that can emit its
    last step, which in an unrolled loop is one state per count)."""
    ranked = sorted(weights.items(), key=lambda sw: -sw[1])[:MAX_BELIEF_STATES]
    total = sum(w for _, w in ranked)
    return tuple((s, w / total) for s, w in ranked)


def _most_first(calls: Mapping[str, float]) -> dict[str, float]:
    return dict(sorted(calls.items(), key=lambda an: (-an[1], an[0])))


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


def project_steps(
    expr: Model, position: Position | Sequence[StepLike], horizon: int
) -> list[dict[str, float]]:
    model = _model(expr)
    return model.project_steps(_position(model, position), horizon)
