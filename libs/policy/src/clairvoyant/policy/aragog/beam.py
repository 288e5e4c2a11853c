"""One scheduling round of Aragog's runtime scheduler: beam search over the meta-queue (seeds/002
§3.2, "Joint optimization across requests and time", Figure 9), on plain values.

    stages (meta-queue order) ──> for each stage, extend every kept partial assignment with each
    model it may still run on that has a free slot ──> rank by (U, F) ──> keep the top B

A *partial assignment* (a state) is: the placements made so far, the calls it added to each replica,
and the configuration set of every workflow it placed a call of, pruned to the configurations that
ran that call's agent on the chosen model (``mask & uses``), so later stages of the same workflow in
the round see the pruned set.  Ranking, best first:

- U, utilization improvement: the sum of the forecast throughput gains of its placements; a call on
  model m goes to m's replica with the highest gain for one more call (``Replica.gains``), ties to
  the smaller worker id;
- F, flexibility preservation (the tie-break): the mean, over the workflows it placed a call of, of
  |set after| / |set before the round|.  No placement: F = 1 (nothing was given up).

Readings where the paper says no more:
- Look-ahead: a stage is skipped in a state only when it cannot be placed there (no model it may
  run on has a free slot, in that state); a stage that can be placed is placed, so an earlier
  request is never passed over for a later one that would use the same slot (FIFO fairness).
- Ties: U and F equal to 1e-9 are equal; then the order candidates were made in decides: the
  parent's rank, then the stage's options in their order (cheapest model first).
- The search stops when every stage has been seen or no kept state has a free slot left.

State is kept as the seed's bit vectors suggest (§4): configuration sets are int masks, the calls
added per replica a tuple, the per-workflow sets a small dict copied on write, and the placements
a linked list shared between a state and its extensions.
"""

from __future__ import annotations

from collections.abc import Hashable, Iterable, Sequence
from typing import NamedTuple

_ROUNDING = 9  # U and F equal to this many decimals rank as a tie: sums of floats differ by order


class StageOption(NamedTuple):
    """A model a stage may run on, and what running it there leaves of its workflow's set."""

    model: str
    uses: int  # configurations that run the stage's agent on ``model``; -1: it prunes nothing


class Stage(NamedTuple):
    """A queued call at its workflow stage, as the round sees it."""

    number: int  # the caller's number for it (``Placement.stage``)
    workflow: Hashable  # stages of one workflow share its configuration set
    mask: int  # the workflow's configuration set before the round (the same for all its stages)
    options: tuple[StageOption, ...]  # the models it may run on, cheapest first
    excluded: frozenset[str] = frozenset()  # worker ids it must not run on


class Replica(NamedTuple):
    """A worker with free slots: ``gains[k]`` is the forecast throughput gain of its (k+1)-th
    additional call, so ``len(gains)`` is its free slots (profiled saturation - occupancy)."""

    worker_id: str
    model: str
    gains: tuple[float, ...]


class Placement(NamedTuple):
    stage: int  # Stage.number
    model: str
    worker_id: str


class RoundPlan(NamedTuple):
    """The best state at the end of a round."""

    placements: tuple[Placement, ...]  # in meta-queue order
    utilization: float  # U
    flexibility: float  # F
    masks: dict[Hashable, int]  # each workflow it placed a call of -> its set after the round

    @property
    def objective(self) -> tuple[float, float]:
        return (self.utilization, self.flexibility)


class _State:
    """One partial assignment.  ``trail`` is a linked list (placement, previous trail) or None;
    ``best`` caches, per model, its best replica for a stage with no excluded worker (a child
    inherits it but for the model of the replica it added a call to)."""

    __slots__ = ("utilization", "flex_sum", "masks", "used", "free", "trail", "rank", "best")

    def __init__(
        self,
        utilization: float,
        flex_sum: float,
        masks: dict[Hashable, int],
        used: tuple[int, ...],
        free: int,
        trail: tuple[Placement, object] | None,
    ) -> None:
        self.utilization = utilization
        self.flex_sum = flex_sum  # sum of |after| / |before| over the workflows in ``masks``
        self.masks = masks
        self.used = used  # calls added per replica, by Replica position
        self.free = free  # free slots left, all replicas together
        self.trail = trail
        self.best: dict[str, tuple[int, float] | None] = {}
        self.rank = (-round(utilization, _ROUNDING), -round(self.flexibility, _ROUNDING))

    @property
    def flexibility(self) -> float:
        return self.flex_sum / len(self.masks) if self.masks else 1.0

    def plan(self) -> RoundPlan:
        placements: list[Placement] = []
        trail = self.trail
        while trail is not None:
            placements.append(trail[0])
            trail = trail[1]  # type: ignore[assignment]
        return RoundPlan(tuple(reversed(placements)), self.utilization, self.flexibility, dict(self.masks))


class _Round:
    """The replicas of one round and how a state is extended with a stage."""

    def __init__(self, replicas: Sequence[Replica]) -> None:
        self.replicas = tuple(replicas)
        by_model: dict[str, list[int]] = {}
        for position in sorted(range(len(self.replicas)), key=lambda p: self.replicas[p].worker_id):
            by_model.setdefault(self.replicas[position].model, []).append(position)
        # model -> (position, worker id, gains) of its replicas, by worker id
        self.rows = {
            model: [(p, self.replicas[p].worker_id, self.replicas[p].gains) for p in positions]
            for model, positions in by_model.items()
        }
        self.sizes: dict[Hashable, int] = {}  # workflow -> |set before the round|

    def start(self) -> _State:
        return _State(0.0, 0.0, {}, (0,) * len(self.replicas), sum(len(r.gains) for r in self.replicas), None)

    def best_replica(self, state: _State, model: str, excluded: frozenset[str]) -> tuple[int, float] | None:
        """The replica of ``model`` with the highest gain for one more call in ``state`` (ties: the
        smaller worker id), and that gain; None when none has a free slot."""
        if not excluded and model in state.best:
            return state.best[model]
        best: tuple[int, float] | None = None
        used = state.used
        for position, worker_id, gains in self.rows.get(model, ()):
            count = used[position]
            if count >= len(gains) or (excluded and worker_id in excluded):
                continue
            if best is None or gains[count] > best[1]:
                best = (position, gains[count])
        if not excluded:
            state.best[model] = best
        return best

    def moves(self, state: _State, stage: Stage) -> list[_Move]:
        """The ways to place ``stage`` in ``state``: one per model it may run on that has a free
        slot, ranked but not yet made (only the ones kept are, ``make``)."""
        if state.free == 0:
            return []
        current = state.masks.get(stage.workflow, stage.mask)
        seen_before = stage.workflow in state.masks
        count = len(state.masks) + (not seen_before)
        out: list[_Move] = []
        for option in stage.options:
            pruned = current & option.uses
            if not pruned:
                continue  # an earlier placement of the workflow in this state ruled the model out
            chosen = self.best_replica(state, option.model, stage.excluded)
            if chosen is None:
                continue
            position, gain = chosen
            before = self.sizes.setdefault(stage.workflow, stage.mask.bit_count())
            flex_sum = state.flex_sum + pruned.bit_count() / before
            if seen_before:
                flex_sum -= current.bit_count() / before
            utilization = state.utilization + gain
            rank = (-round(utilization, _ROUNDING), -round(flex_sum / count, _ROUNDING))
            placement = Placement(stage.number, option.model, self.replicas[position].worker_id)
            out.append(_Move(rank, state, stage.workflow, pruned, flex_sum, position, utilization, placement))
        return out

    @staticmethod
    def make(move: _Move) -> _State:
        parent = move.parent
        used = list(parent.used)
        used[move.position] += 1
        masks = dict(parent.masks)  # copied on write, and only for the states kept
        masks[move.workflow] = move.pruned
        trail = (move.placement, parent.trail)
        child = _State(move.utilization, move.flex_sum, masks, tuple(used), parent.free - 1, trail)
        child.best = dict(parent.best)
        child.best.pop(move.placement.model, None)
        return child


class _Move(NamedTuple):
    """A state extended with one placement, before it is made."""

    rank: tuple[float, float]
    parent: _State
    workflow: Hashable
    pruned: int  # the workflow's set after the placement
    flex_sum: float
    position: int  # the replica's
    utilization: float
    placement: Placement


def _rank(candidate: _State | _Move) -> tuple[float, float]:
    return candidate.rank


def beam_assign(stages: Iterable[Stage], replicas: Sequence[Replica], width: int = 4) -> RoundPlan:
    """The best assignment beam search of ``width`` finds for ``stages`` (in meta-queue order) on
    ``replicas``.  ``stages`` is read lazily and only as far as the search goes: it stops when no
    kept state has a free slot left.  Raises ValueError when ``width`` < 1."""
    if width < 1:
        raise ValueError("beam width must be at least 1")
    search = _Round(replicas)
    beam = [search.start()]
    if beam[0].free == 0:
        return beam[0].plan()
    for stage in stages:
        candidates: list[_State | _Move] = []
        placed_somewhere = False
        for state in beam:
            moves = search.moves(state, stage)
            if moves:
                candidates.extend(moves)
                placed_somewhere = True
            else:
                candidates.append(state)  # look-ahead: skipped here, it keeps its rank for later
        if not placed_somewhere:
            continue
        candidates.sort(key=_rank)  # stable: ties keep the order they were made in
        beam = [c if isinstance(c, _State) else search.make(c) for c in candidates[:width]]
        if all(state.free == 0 for state in beam):
            break
    return beam[0].plan()


def greedy_assign(stages: Iterable[Stage], replicas: Sequence[Replica]) -> RoundPlan:
    """Beam search of width 1: each stage takes its best option given the ones before it."""
    return beam_assign(stages, replicas, width=1)


def exhaustive_assign(stages: Sequence[Stage], replicas: Sequence[Replica]) -> list[RoundPlan]:
    """Every assignment the beam could reach (each stage placed on each model it may run on with a
    free slot, or skipped when it cannot be placed), searched in full: the ones with the best
    (U, F), in depth-first order (options in their order).  For small instances (tests)."""
    search = _Round(replicas)
    best: list[_State] = []

    def visit(state: _State, position: int) -> None:
        nonlocal best
        if position == len(stages):
            if not best or state.rank < best[0].rank:
                best = [state]
            elif state.rank == best[0].rank:
                best.append(state)
            return
        children = [search.make(move) for move in search.moves(state, stages[position])]
        for child in children or [state]:
            visit(child, position + 1)

    visit(search.start(), 0)
    return [state.plan() for state in best]
