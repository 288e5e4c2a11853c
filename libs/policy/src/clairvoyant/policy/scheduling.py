"""The scheduling families: priority and routing policies, the engine's local rule, and the hooks
a policy may declare (``capabilities.py``), with the registries and the baselines FCFS, round robin
and least loaded.

A policy is pure: plain inputs and ``now`` in, a decision out; it never reads a clock or does I/O.
It may keep internal state (the round-robin cursor, an attained-service table), so each scheduler
builds its own instances through the registries.  The hook Protocols below state each hook's
contract; a policy opts in by naming the hook's ``Capability``, never by type probing.
"""

from __future__ import annotations

from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass
from typing import NamedTuple, Protocol

from clairvoyant.policy.capabilities import Capability, PolicyRegistry
from clairvoyant.policy.process_table import ChangeFeed, ProcessTable, ProgramKey
from clairvoyant.policy.types import QueuedRequest, WorkerReport, WorkerView


class PriorityPolicy(Protocol):
    def priority(self, request: QueuedRequest, now: float) -> float:
        """The request's priority at ``now``; larger = more urgent.

        The scheduler orders each model's queue by priority (descending), then arrival time
        (ascending), then submission order, and re-evaluates it on every dispatch, so the value may
        depend on ``now`` (aging); a policy whose values cannot change says so with ``FixedPriority``
        and is evaluated once, at submit, and one whose values change only with known events says
        which requests they touch with ``IncrementalPriority``.  The value of the winning
        evaluation is sent to the worker as the base priority.  Must be cheap and deterministic.
        """
        ...


class RoutingPolicy(Protocol):
    def route(self, request: QueuedRequest, workers: Sequence[WorkerView], now: float) -> str | None:
        """The worker id that gets ``request``, or None for "not yet" (the request keeps waiting).

        ``workers`` is every live worker of the cluster, whatever its model or state; only the
        ones ``eligible_workers`` returns may be chosen (the scheduler checks this).  Called only
        when the scheduler is about to place the request: a policy that keeps state (a cursor)
        may assume a returned id is used.
        """
        ...


class FixedPriority(Protocol):
    def priority_is_fixed(self) -> bool:
        """True when ``priority(request, now)`` is the same at every ``now`` from the request's
        submission until it is placed, whatever else happens meanwhile.  The scheduler then
        evaluates it once, at submit, and dispatch pops a heap instead of ranking the whole queue
        (the order is the same: priority, arrival time, submission order)."""
        ...


class PriorityChanges(NamedTuple):
    """The queued requests whose priority may have changed (``IncrementalPriority``)."""

    everything: bool = False  # every queued request
    programs: Collection[ProgramKey] = ()  # the queued calls of these programs
    requests: Collection[str] = ()  # these request ids (ids no longer queued are ignored)


class IncrementalPriority(Protocol):
    def priority_changes(self, now: float) -> PriorityChanges:
        """The queued requests whose ``priority(request, now)`` may differ from its value at the
        previous call (at the first call: everything).  The contract: a request not named has,
        at ``now``, the value it had at the previous call; naming one whose value did not change
        costs only its re-evaluation.  The scheduler calls this in ``dispatch`` right before it
        ranks a model's queue, then evaluates the named requests and the ones submitted since
        (all of them after ``everything``), keeps the others' keys, and pops a heap: the order is
        the full re-rank's (priority, arrival time, submission order).  The policy may update
        state it keeps here (an epoch's table), as ``priority`` would at its first evaluation."""
        ...


class ProgramRows:
    """``priority_changes`` for a priority that reads only the request and its program's entry in
    the process table (and is the same at every ``now``): the programs whose entry any update
    touched since the previous call (``ProcessTable.subscribe``)."""

    def __init__(self) -> None:
        self._table: ProcessTable | None = None
        self._feed: ChangeFeed | None = None

    def changes(self, table: ProcessTable | None) -> PriorityChanges:
        if table is not self._table:  # first call, or a new table: nothing is known yet
            self._table = table
            self._feed = table.subscribe() if table is not None else None
            return PriorityChanges(everything=True)
        return PriorityChanges(programs=self._feed.take()) if self._feed is not None else PriorityChanges()


class WorkerObserver(Protocol):
    def observe_worker(self, report: WorkerReport, now: float) -> None:
        """Called with every worker report the scheduler receives, after it has recorded it."""
        ...


class ProgramAware(Protocol):
    def bind_programs(self, table: ProcessTable) -> None:
        """Called once by the scheduler that owns ``table``; the policy may keep and read it.  The
        scheduler updates it on submit, complete and expiry; a policy writes only the columns
        documented as its own (``Program.engine_id``, the load balancer's pin)."""
        ...


class EngineQueued(Protocol):
    def engine_queue_factor(self) -> float:
        """Placements the scheduler may hold per worker, as a multiple of its max_batch (>= 1).
        Above 1 the engine's local scheduler, not the global queue, decides who runs."""
        ...


class EngineSequence(Protocol):
    """What an engine-side rule reads of a sequence (the worker's Sequence has all of it)."""

    @property
    def priority(self) -> float: ...  # the base priority the scheduler sent
    @property
    def num_output_tokens(self) -> int: ...
    @property
    def lineage(self) -> _Lineage | None: ...
    @property
    def program_wait_s(self) -> float: ...  # the program's, at the placement (Decision)
    @property
    def program_service_s(self) -> float: ...


class _Lineage(Protocol):
    @property
    def tenant(self) -> str: ...
    @property
    def workflow_id(self) -> str | None: ...


class LocalRule(Protocol):
    def effective_priority(self, seq: EngineSequence, now: float) -> float:
        """The sequence's effective priority at ``now`` on its engine (larger = more urgent).  The
        engine calls it for every live sequence at every scheduling step, with ``now`` never
        decreasing, and breaks ties by earlier arrival."""
        ...


class EngineRanked(Protocol):
    def engine_rule(self) -> LocalRule:
        """A fresh engine-side rule (one per engine) that refines the base priority over a call's
        life there."""
        ...


class SchedulerView(Protocol):
    """What a ``SCHEDULER_AWARE`` policy may read of the scheduler it serves (the global scheduler
    implements it).  Reads only, plus ``watch_queued_programs``, which changes nothing it decides with."""

    def queue_depth(self, model: str) -> int: ...
    def queue_depths(self) -> dict[str, int]: ...
    def queued_requests(self, model: str | None = None) -> list[QueuedRequest]: ...
    def queued_calls(self, key: ProgramKey) -> list[QueuedRequest]: ...
    def queued_programs(self) -> list[ProgramKey]: ...
    def placed_requests(self, worker_id: str) -> list[QueuedRequest]: ...
    def agent_model(self, workflow_type_id: str, agent_id: str) -> str | None: ...
    def workers(self) -> list[WorkerView]: ...
    def watch_queued_programs(self) -> ChangeFeed: ...


class SchedulerAware(Protocol):
    def bind_scheduler(self, scheduler: SchedulerView) -> None:
        """Called once by the scheduler that the policy serves.  The policy may keep it and call its
        read-only methods (``SchedulerView``), never the ones that change it."""
        ...


class Rebalancing(Protocol):
    def rebalance(self, now: float) -> None:
        """Called at the start of every ``dispatch``, before anything is ranked or placed.  A routing
        policy may move queued calls between workers here by rewriting the pins it owns
        (``Program.engine_id``); it must not change the scheduler (SAGA's work stealing)."""
        ...


class MigratesKv(Protocol):
    def kv_source(self, request: QueuedRequest, worker_id: str) -> str | None:
        """Called once per placement, right after ``route`` chose ``worker_id``: the worker whose
        cached KV of the request's session should be moved to ``worker_id`` before the call runs
        there, or None.  The answer is the placement's ``Decision.kv_source``; moving it (or giving
        up and recomputing) is the caller's (SAGA §5.2 step 3)."""
        ...


class KvIndexView(Protocol):
    """What a ``KV_AWARE`` policy may read of the KV blocks the workers report holding (their KV
    events).  The scheduler's index implements it; reads only."""

    def cached_tokens(self, request: QueuedRequest, now: float) -> Mapping[str, float] | None:
        """Worker id -> tokens of ``request``'s context each worker holds, weighted by the tier
        holding them (device memory counts most).  With ``request.prompt_block_hashes``: the
        longest leading run of the prompt's blocks; without, the blocks of its session (tenant,
        workflow_id).  A worker of the model that is absent holds nothing the index can vouch for.
        None when no worker of the request's model reports its blocks: the caller keeps its own
        estimate (the answer is then the same as if the index did not exist)."""
        ...


class KvAware(Protocol):
    def bind_kv_index(self, index: KvIndexView) -> None:
        """Called once by the scheduler that owns ``index``; the policy may keep and read it."""
        ...


class Assignment(NamedTuple):
    """One placement a ``ModelAssigning`` policy makes: the request and the worker that runs it
    (the worker's model is the model the call runs on)."""

    request_id: str
    worker_id: str


class ModelAssigning(Protocol):
    """A routing policy that chooses the model of each call of a *model group* (Aragog's per-stage
    model selection).  Requests whose ``model`` is a group name wait in the group's queue; the
    scheduler never ranks it or calls ``route`` for it, but asks ``assign`` instead."""

    def group_models(self) -> Mapping[str, frozenset[str]]:
        """Group name -> the served models its calls may run on.  Read once, when the scheduler
        binds the policy; a group name must not also be a served model's name."""
        ...

    def queued(self, request: QueuedRequest, now: float) -> None:
        """``request`` (its ``model`` a group name) joined its group's queue at ``now``."""
        ...

    def unqueued(self, request_id: str) -> None:
        """A request of a group queue left it without an assignment (cancelled, or rejected when
        no worker of the group is left)."""
        ...

    def assign(self, group: str, workers: Sequence[WorkerView], now: float) -> list[Assignment]:
        """Placements for calls waiting in ``group``'s queue, in the order they are to be made.

        ``workers`` is every live worker.  Each assignment must name a queued request of the group,
        at most once, and a worker that is eligible for it when the assignment is counted: it
        serves one of the group's models, is not draining nor excluded, and has room (the
        scheduler counts each assignment before checking the next, so two assignments may share a
        worker only while it has room for both).  The scheduler raises on a violation.  The policy
        knows the group's queue from ``queued`` and ``unqueued``, and the assignments it made; an
        assigned call is placed with its ``model`` set to the worker's, so completions, traffic
        counters and the caller see the model that ran."""
        ...


class Waking(Protocol):
    def wake_at(self, now: float) -> float | None:
        """The earliest time after ``now`` at which ``dispatch`` may place something that it cannot
        place at ``now``, although no request, completion or report arrives meanwhile (a call
        whose configuration search is still running, Aragog §3.1); None: no such time.  The
        caller runs ``dispatch`` then."""
        ...


class Admitting(Protocol):
    def admission_limit(self, report: WorkerReport) -> int:
        """The placements the scheduler may hold on the worker that sent ``report`` (>= 1), taken
        at each of its reports; 0: the scheduler's default (max_batch, or the ``EngineQueued``
        factor × it).  Calls beyond the limit wait in the global queue in priority order
        (``admission.py``: late binding at the knee)."""
        ...

    def displaces(self) -> bool:
        """May a call more urgent than the least urgent placement on a worker at its limit be
        placed there beyond it (up to max_batch)?  The placement then carries the limit as the
        engine's seat limit (``Decision.seat_limit``), so the engine preempts for it.  Read once."""
        ...


@dataclass(frozen=True, slots=True)
class Backfill:
    """How far dispatch may pass over calls the routing policy cannot place (``Backfilling``).

    Without it dispatch stops at the first such call of a model, so one call that does not fit
    (a long context on a worker short of KV) holds back every call behind it that would.  With it,
    up to ``depth`` such calls per model and dispatch are passed over, in priority order, while the
    first of them (the model's head) has waited less than ``max_wait_s``; after that the head blocks
    its model again until it is placed, as without it.  So a call is passed over only in its first
    ``max_wait_s`` at the head (the calls placed meanwhile may still hold the room it needs for
    longer).  EASY backfilling's idea (Lifka 1995), with a wait bound in place of a reservation."""

    depth: int = 16
    max_wait_s: float = 30.0

    def __post_init__(self) -> None:
        if self.depth < 0 or self.max_wait_s < 0:
            raise ValueError(f"backfill depth and max_wait_s must be >= 0, got {self.depth}, {self.max_wait_s}")


class Backfilling(Protocol):
    def backfill(self) -> Backfill:
        """The bound on passing over calls that cannot be placed now.  Read once."""
        ...


PRIORITY_POLICIES: PolicyRegistry[PriorityPolicy] = PolicyRegistry("priority policy")
ROUTING_POLICIES: PolicyRegistry[RoutingPolicy] = PolicyRegistry("routing policy")


def eligible_workers(request: QueuedRequest, workers: Sequence[WorkerView]) -> list[WorkerView]:
    """Workers that may take ``request`` now: they serve its model, are not draining, are not in
    its ``exclude_workers``, and have room (outstanding placements < max_batch)."""
    model, excluded = request.model, request.exclude_workers
    return [  # has_room inlined: this runs for every worker at every placement
        w
        for w in workers
        if w.model == model
        and w.placed < (w.admission_limit or w.max_batch)
        and not w.draining
        and w.worker_id not in excluded
    ]


def least_used_eligible(request: QueuedRequest, workers: Sequence[WorkerView]) -> WorkerView | None:
    """The eligible worker (``eligible_workers``) with the fewest outstanding placements, then the
    lowest KV usage, then the smallest id; None when none is eligible.  One pass that builds no
    list and compares a full key only against an equally placed best: the routers that use it run
    at every placement, for every worker."""
    model, excluded = request.model, request.exclude_workers
    best: WorkerView | None = None
    best_key: tuple[int, float, str] | None = None
    for w in workers:
        placed = w.placed
        if (
            w.model != model
            or placed >= (w.admission_limit or w.max_batch)
            or w.draining
            or w.worker_id in excluded
            or (best is not None and placed > best.placed)
        ):
            continue
        key = (placed, w.kv_usage, w.worker_id)
        if best_key is None or key < best_key:
            best, best_key = w, key
    return best


@PRIORITY_POLICIES.register("fcfs")
class FcfsPriority:
    """First come, first served: every request has priority 0, so arrival order decides."""

    capabilities = frozenset({Capability.FIXED_PRIORITY})

    def priority(self, request: QueuedRequest, now: float) -> float:
        return 0.0

    def priority_is_fixed(self) -> bool:
        return True


@ROUTING_POLICIES.register("round-robin")
class RoundRobinRouting:
    """Rotates over the eligible workers in worker-id order, one cursor per model.

    The cursor remembers the last worker chosen, not an index, so workers joining or leaving do
    not reshuffle the rotation: the next pick is the first eligible id after the last one, wrapping.
    """

    capabilities: frozenset[Capability] = frozenset()

    def __init__(self) -> None:
        self._last: dict[str, str] = {}  # model -> worker id chosen last

    def route(self, request: QueuedRequest, workers: Sequence[WorkerView], now: float) -> str | None:
        ids = sorted(w.worker_id for w in eligible_workers(request, workers))
        if not ids:
            return None
        last = self._last.get(request.model)
        chosen = next((i for i in ids if last is not None and i > last), ids[0])
        self._last[request.model] = chosen
        return chosen


@ROUTING_POLICIES.register("least-loaded")
class LeastLoadedRouting:
    """The eligible worker with the lowest (placed + queued) / max_batch, then the lowest KV usage
    fraction, then the smallest worker id (so ties are deterministic)."""

    capabilities: frozenset[Capability] = frozenset()

    def route(self, request: QueuedRequest, workers: Sequence[WorkerView], now: float) -> str | None:
        candidates = eligible_workers(request, workers)
        if not candidates:
            return None
        best = min(candidates, key=lambda w: ((w.placed + w.queued) / w.max_batch, w.kv_usage, w.worker_id))
        return best.worker_id
