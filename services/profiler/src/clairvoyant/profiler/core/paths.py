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
        self.closure = self.automaton.closure
        self.remaining_steps = self.state_values(lambda edge: 1.0)
        self._visits = self.automaton.edge_visits()
        self._residual_text: dict[int, str] = {}
        self._projections: dict[tuple[int, int], tuple[dict[str, float], ...]] = {}  # (state, horizon)

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
        steps: list[dict[str, float]] = [{} for _ in range(max(horizon, 0))]
        for s, w in position.belief:
            for calls, of_state in zip(steps, self._state_projection(s, horizon), strict=True):
                for agent, n in of_state.items():
                    calls[agent] = calls.get(agent, 0.0) + w * n
        return [_most_first(calls) for calls in steps]

    def _state_projection(self, state: int, horizon: int) -> tuple[dict[str, float], ...]:
        cached = self._projections.get((state, horizon))
        if cached is not None:
            return cached
        steps: list[dict[str, float]] = []
        frontier = {state: 1.0}
        for _ in range(max(horizon, 0)):
            calls: dict[str, float] = {}
            nxt: dict[int, float] = {}
            for s, w in frontier.items():
                for p, e in self.closure[s]:
                    if e < 0:
                        continue
                    edge = self.edges[e]
                    for agent, n in edge.expected_calls().items():
                        calls[agent] = calls.get(agent, 0.0) + w * p * n
                    nxt[edge.dst] = nxt.get(edge.dst, 0.0) + w * p
            steps.append(calls)
            frontier = nxt
        projection = self._projections[(state, horizon)] = tuple(steps)
        return projection

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
