"""The global scheduler core: per-model bounded queues, placement accounting, worker liveness.

Pure: every call takes ``now`` (monotonic seconds) and nothing here reads a clock, sleeps or does
I/O, so the live service and the simulator drive the same object.  Not thread-safe; the service
calls it from its event loop only.

    submit ──> queue[model] ──dispatch──> placed[worker] ──complete──> (capacity freed)
                  │ cancel                     │ worker silent for factor × interval
                  v                            v
               (gone)               expire_workers: placements failed, orphaned queue rejected

Alongside, the process table (``clairvoyant.policy.process_table``) follows each program (tenant,
workflow_id): submit opens its entry and records the call, a completion reported with its time adds
the call's service, and an idle or ended program is dropped.  The policies' declared capabilities
(``clairvoyant.policy.capabilities``) say which hooks the scheduler calls: reading the process table
or the scheduler itself (``SchedulerView``), queueing at the engines, re-pinning queued calls before
each dispatch, naming where a placed call's KV should come from.

Ranking: each model's queue is ordered by priority, then arrival, then submission.  A priority
policy with neither ``FIXED_PRIORITY`` nor ``INCREMENTAL_PRIORITY`` is evaluated for the whole queue
at every dispatch; with one of them the queue is a heap whose keys are kept equal to what that
full re-rank would compute (evaluated at submit, or re-evaluated where ``priority_changes`` says),
so dispatch pops only as far as it places.
"""

from __future__ import annotations

import dataclasses
import heapq
import math
from typing import Any, NamedTuple, cast

from clairvoyant.core.errors import InvalidRequest, NoWorkers, QueueFull
from clairvoyant.policy.capabilities import Capability, capabilities_of, check_capabilities
from clairvoyant.policy.presets import build_policies, engine_rule_of
from clairvoyant.policy.process_table import ChangeFeed, ProcessTable, ProgramKey, program_key
from clairvoyant.policy.scheduling import (
    EngineQueued,
    FixedPriority,
    IncrementalPriority,
    LocalRule,
    MigratesKv,
    PriorityPolicy,
    ProgramAware,
    Rebalancing,
    RoutingPolicy,
    SchedulerAware,
    WorkerObserver,
    eligible_workers,
)
from clairvoyant.policy.types import (
    Completion,
    Decision,
    ExpiredWorker,
    QueuedRequest,
    QueueState,
    SchedulerSnapshot,
    WorkerReport,
    WorkerView,
)
from clairvoyant.scheduler.core.leases import LeaseBook, Reclaimed

_Entry = tuple[float, float, int, QueuedRequest]  # (-priority, arrival time, submission number, request)


class _Placement(NamedTuple):
    worker_id: str
    request: QueuedRequest
    dispatch_time: float


class GlobalScheduler:
    def __init__(
        self,
        priority: PriorityPolicy,
        routing: RoutingPolicy,
        *,
        policy_name: str = "",
        max_queue_per_model: int = 1024,
        queue_retry_after_s: float = 1.0,
        heartbeat_timeout_factor: float = 3.0,
        default_heartbeat_interval_s: float = 1.0,
        program_idle_ttl_s: float = 600.0,
        leases: LeaseBook | None = None,
    ) -> None:
        """``program_idle_ttl_s``: a program with no call in flight leaves the process table after
        this long without an arrival or completion (or at once when a call says workflow_end).
        ``leases``: when given, every placement holds a lease in it (``renew``, ``reclaim`` and
        the workers' reports of what they hold bring back placements nobody released); the
        simulator, which loses no calls, runs without."""
        if max_queue_per_model < 1:
            raise ValueError("max_queue_per_model must be at least 1")
        self.priority_policy = priority
        self.routing_policy = routing
        self.policy_name = policy_name
        self.max_queue_per_model = max_queue_per_model
        self.queue_retry_after_s = queue_retry_after_s
        self.heartbeat_timeout_factor = heartbeat_timeout_factor
        self.default_heartbeat_interval_s = default_heartbeat_interval_s
        # model -> request id -> request; dicts keep submission order, the last tie-break.
        self._queues: dict[str, dict[str, QueuedRequest]] = {}
        self._workers: dict[str, WorkerView] = {}
        self._reported_draining: dict[str, bool] = {}
        self._operator_drained: set[str] = set()  # survives a worker's expiry and return
        self._placements: dict[str, _Placement] = {}  # request id -> placement
        self._placed_on: dict[str, dict[str, QueuedRequest]] = {}  # worker -> id -> request, in order
        self._agent_models: dict[tuple[str, str], str] = {}  # (workflow type, agent) -> latest model
        # Fixed priorities (``FixedPriority``): per model, a heap of (-priority, arrival, submission
        # number, request) built at submit; entries of requests no longer queued are skipped.
        check_capabilities(type(priority))  # a hook it does not declare would never be called
        check_capabilities(type(routing))
        priority_can, routing_can = capabilities_of(priority), capabilities_of(routing)
        self._fixed = Capability.FIXED_PRIORITY in priority_can and cast(FixedPriority, priority).priority_is_fixed()
        self._heaps: dict[str, list[_Entry]] = {}
        self._submitted = 0
        # Incremental priorities (``IncrementalPriority``): per model a heap too; a request is
        # (re-)evaluated at its model's next ranking when it is new or named by priority_changes.
        # With either kind of heap, a queued request's live entry is ``_entries[id]`` (others are
        # stale and skipped).
        incremental = not self._fixed and Capability.INCREMENTAL_PRIORITY in priority_can
        self._incremental = cast(IncrementalPriority, priority) if incremental else None
        self._entries: dict[str, _Entry] = {}
        self._order: dict[str, int] = {}  # queued request id -> submission number
        self._to_evaluate: dict[str, dict[str, None]] = {}  # model -> ids, an ordered set
        self._evaluate_all: set[str] = set()  # models whose every queued request is to evaluate
        self._queued_by_program: dict[ProgramKey, dict[str, QueuedRequest]] = {}  # in submission order
        self._queue_feeds: list[ChangeFeed] = []  # ``watch_queued_programs``
        self.programs = ProcessTable(program_idle_ttl_s)
        self.leases = leases
        for policy, can in ((priority, priority_can), (routing, routing_can)):
            if Capability.PROGRAM_AWARE in can:
                cast(ProgramAware, policy).bind_programs(self.programs)
            if Capability.SCHEDULER_AWARE in can:
                cast(SchedulerAware, policy).bind_scheduler(self)
        queued = Capability.ENGINE_QUEUED in routing_can
        self.engine_queue_factor = cast(EngineQueued, routing).engine_queue_factor() if queued else 1.0
        if self.engine_queue_factor < 1:
            raise ValueError("engine_queue_factor must be at least 1")
        self._rebalancing = cast(Rebalancing, routing) if Capability.REBALANCES in routing_can else None
        self._migrating = cast(MigratesKv, routing) if Capability.MIGRATES_KV in routing_can else None
        self._observer = cast(WorkerObserver, routing) if Capability.OBSERVES_WORKERS in routing_can else None

    @classmethod
    def from_preset(cls, preset: str, **options: Any) -> GlobalScheduler:
        """A scheduler with fresh policies of a registered preset; ``options`` as for __init__."""
        priority, routing = build_policies(preset)
        return cls(priority, routing, policy_name=preset, **options)

    # ---- requests -------------------------------------------------------------------------------

    def submit(self, request: QueuedRequest, now: float) -> None:
        """Queue ``request`` (``dispatch`` places it).

        Raises NoWorkers when no live worker serves the model (draining ones count: they may be
        resumed) or every one of them is excluded; QueueFull (with retry_after_s) when the model's
        queue is at capacity; InvalidRequest when the id is already queued.  Re-submitting an id
        that holds a placement releases that placement first: the caller has given up on it.
        """
        if not self._can_ever_serve(request):
            raise NoWorkers(f"no live worker serves model {request.model!r}", param="model")
        queue = self._queues.setdefault(request.model, {})
        if request.request_id in queue:
            raise InvalidRequest(f"request {request.request_id!r} is already queued", param="request_id")
        if len(queue) >= self.max_queue_per_model:
            raise QueueFull(
                f"the queue for model {request.model!r} is full ({self.max_queue_per_model} requests)",
                retry_after_s=self.queue_retry_after_s,
            )
        self.complete(request.request_id)
        queue[request.request_id] = request
        self.programs.on_submit(request, now)
        if self._fixed:
            self._submitted += 1
            heap = self._heaps.setdefault(request.model, [])
            entry = (-self.priority_policy.priority(request, now), request.arrival_time, self._submitted, request)
            self._entries[request.request_id] = entry
            heapq.heappush(heap, entry)
            if len(heap) > 2 * len(queue) + 64:  # cancelled requests' entries: drop them
                heap[:] = [e for e in heap if self._entries.get(e[3].request_id) is e]
                heapq.heapify(heap)
        elif self._incremental is not None:
            self._submitted += 1
            self._order[request.request_id] = self._submitted
            self._to_evaluate.setdefault(request.model, {})[request.request_id] = None
        key = program_key(request)
        if key is not None:
            self._queued_by_program.setdefault(key, {})[request.request_id] = request
            for feed in self._queue_feeds:
                feed.add(key)
        if request.app_metadata is not None:
            meta = request.app_metadata
            self._agent_models[(meta.workflow_type_id, meta.agent_id)] = request.model

    def cancel(self, request_id: str) -> bool:
        """Remove a request that is still waiting (its caller went away).  False if not queued."""
        queue = next((q for q in self._queues.values() if request_id in q), None)
        if queue is None:
            return False
        request = queue.pop(request_id)
        self._unqueued(request)
        self.programs.on_cancel(request)
        return True

    def complete(
        self,
        request_id: str,
        worker_id: str | None = None,
        *,
        now: float | None = None,
        service_s: float | None = None,
        output_tokens: int = 0,
    ) -> bool:
        """Release a placement.  Idempotent: False when unknown or already released, or when
        ``worker_id`` is given and the placement is on another worker (a stale completion).

        With ``now`` the call counts as served: its program's entry in the process table learns
        its service, ``service_s`` (the model execution time) or, when the caller cannot measure
        it, now - dispatch time.  Without ``now`` (an abandoned or re-submitted placement) the
        call leaves its program's active calls and adds nothing.
        """
        held = self._placements.get(request_id)
        if held is None or (worker_id and held.worker_id != worker_id):
            return False
        del self._placements[request_id]
        del self._placed_on[held.worker_id][request_id]
        if self.leases is not None:
            self.leases.release(request_id)
        worker = self._workers.get(held.worker_id)
        if worker is not None:
            self._workers[worker.worker_id] = worker.with_placed(worker.placed - 1)
        if now is None:
            self.programs.on_cancel(held.request)
        else:
            service = now - held.dispatch_time if service_s is None else service_s
            self.programs.on_complete(
                Completion(held.request, held.worker_id, held.dispatch_time, now, service, output_tokens)
            )
        return True

    def renew(self, owner: str, request_ids: list[str], now: float) -> list[str]:
        """Extend ``owner``'s leases on these placements; returns the ids it holds none on."""
        return [] if self.leases is None else self.leases.renew(owner, request_ids, now)

    def reclaim(self, now: float) -> list[Reclaimed]:
        """Release the placements whose lease ran out (their owner stopped renewing)."""
        return self._release_reclaimed([] if self.leases is None else self.leases.expired(now))

    def reconcile(self, worker_id: str, held: frozenset[str], now: float) -> list[Reclaimed]:
        """``worker_id`` holds exactly ``held``: release the placements on it that it has not
        heard of for a while (``LeaseBook.reconcile``)."""
        return self._release_reclaimed([] if self.leases is None else self.leases.reconcile(worker_id, held, now))

    def _release_reclaimed(self, reclaimed: list[Reclaimed]) -> list[Reclaimed]:
        for gone in reclaimed:  # the lease is already released; the placement follows
            held = self._placements.pop(gone.request_id)
            del self._placed_on[held.worker_id][gone.request_id]
            worker = self._workers.get(held.worker_id)
            if worker is not None:
                self._workers[worker.worker_id] = worker.with_placed(worker.placed - 1)
            self.programs.on_cancel(held.request)
        return reclaimed

    def end_workflow(self, tenant: str, workflow_id: str) -> bool:
        """The application says the workflow is over: drop its process-table entry."""
        return self.programs.end((tenant, workflow_id))

    def expire_programs(self, now: float) -> list[ProgramKey]:
        """Drop programs idle for longer than program_idle_ttl_s (expire_workers also does)."""
        return self.programs.expire(now)

    def engine_rule(self) -> LocalRule | None:
        """A fresh engine-side rule for one engine, when the priority policy has one."""
        return engine_rule_of(self.priority_policy)

    def dispatch(self, now: float) -> list[Decision]:
        """Place queued requests, highest priority first, while the routing policy finds room.

        Models are independent: one model's stuck queue never holds back another.  Within a model,
        dispatch stops at the first request the policy answers None for, even if a lower-priority
        request could be placed; skipping ahead would let small or unconstrained requests starve
        the head of the queue, and priority order is the contract the policies are written for.
        """
        if self._rebalancing is not None:
            self._rebalancing.rebalance(now)
        decisions: list[Decision] = []
        for model, queue in self._queues.items():
            if not queue or not any(
                w.model == model and w.has_room and not w.draining for w in self._workers.values()
            ):
                continue  # nothing can move: skip ranking a long queue
            # Highest priority first, then earliest arrival, then queue order: a heap, popped only
            # as far as placements go (usually a few of a long queue), instead of a full sort.
            if self._fixed:
                ranked = self._heaps.setdefault(model, [])
            elif self._incremental is not None:
                ranked = self._rank_incrementally(model, queue, now)
            else:
                priority_of = self.priority_policy.priority
                ranked = [(-priority_of(r, now), r.arrival_time, i, r) for i, r in enumerate(queue.values())]
                heapq.heapify(ranked)
            # A heap's live entry for a queued request is ``_entries[id]``; a request cancelled and
            # submitted again (even the same object) or re-keyed has a new one.
            live = self._entries if self._fixed or self._incremental is not None else None
            while ranked:
                top = ranked[0]
                negated, _, _, request = top
                if queue.get(request.request_id) is not request or (
                    live is not None and live.get(request.request_id) is not top
                ):
                    heapq.heappop(ranked)  # cancelled, re-submitted or re-keyed since: a stale entry
                    continue
                priority = -negated
                workers = list(self._workers.values())
                worker_id = self.routing_policy.route(request, workers, now)
                if worker_id is None:
                    break  # it stays at the top of a fixed-priority heap
                chosen = self._workers.get(worker_id)
                if chosen is None or not eligible_workers(request, [chosen]):
                    raise RuntimeError(f"routing policy chose ineligible worker {worker_id!r}")
                heapq.heappop(ranked)
                del queue[request.request_id]
                self._unqueued(request)
                worker = self._workers[worker_id]
                worker = self._workers[worker_id] = worker.with_placed(worker.placed + 1)
                self._placements[request.request_id] = _Placement(worker_id, request, now)
                if self.leases is not None:
                    self.leases.grant(request.request_id, worker_id, request.owner, now)
                self._placed_on.setdefault(worker_id, {})[request.request_id] = request
                kv_source = None if self._migrating is None else self._migrating.kv_source(request, worker_id)
                wait = now - request.arrival_time
                program = self.programs.get(program_key(request))
                attained = (program.waiting_s, program.service_s) if program is not None else (0.0, 0.0)
                decisions.append(Decision(request.request_id, worker, priority, wait, kv_source, *attained))
        return decisions

    def _rank_incrementally(self, model: str, queue: dict[str, QueuedRequest], now: float) -> list[_Entry]:
        """``model``'s heap with every live entry's key equal to the priority at ``now``: asks the
        policy what changed, then evaluates only those requests and the ones submitted since."""
        assert self._incremental is not None
        changes = self._incremental.priority_changes(now)
        if changes.everything:
            self._evaluate_all.update(self._queues)
        for key in changes.programs:
            for rid, held in self._queued_by_program.get(key, {}).items():
                self._to_evaluate.setdefault(held.model, {})[rid] = None
        for rid in changes.requests:
            held_model = next((m for m, q in self._queues.items() if rid in q), None)
            if held_model is not None:
                self._to_evaluate.setdefault(held_model, {})[rid] = None
        heap = self._heaps.setdefault(model, [])
        priority_of = self.priority_policy.priority
        if model in self._evaluate_all:
            self._evaluate_all.discard(model)
            self._to_evaluate.pop(model, None)
            heap[:] = []
            for rid, request in queue.items():
                entry = self._entries[rid] = (-priority_of(request, now), request.arrival_time, self._order[rid], request)
                heap.append(entry)
            heapq.heapify(heap)
            return heap
        for rid in self._to_evaluate.pop(model, {}):
            request = queue[rid]
            negated = -priority_of(request, now)
            keyed = self._entries.get(rid)
            if keyed is None or keyed[0] != negated:
                entry = self._entries[rid] = (negated, request.arrival_time, self._order[rid], request)
                heapq.heappush(heap, entry)
        if len(heap) > 2 * len(queue) + 64:  # re-keyed and placed requests' entries: drop them
            heap[:] = [self._entries[rid] for rid in queue]
            heapq.heapify(heap)
        return heap

    def _unqueued(self, request: QueuedRequest) -> None:
        """``request`` left its queue (placed, cancelled or rejected): forget its ranking state."""
        rid = request.request_id
        key = program_key(request)
        held = self._queued_by_program.get(key) if key is not None else None
        if held is not None:
            held.pop(rid, None)
            if not held:
                del self._queued_by_program[key]  # type: ignore[arg-type]
            for feed in self._queue_feeds:
                feed.add(key)  # type: ignore[arg-type]
        self._entries.pop(rid, None)
        if self._incremental is not None:
            self._order.pop(rid, None)
            self._to_evaluate.get(request.model, {}).pop(rid, None)

    # ---- workers --------------------------------------------------------------------------------

    def update_worker(self, report: WorkerReport, now: float) -> WorkerView:
        """Record a heartbeat; a new (or returning) worker joins with no placements."""
        previous = self._workers.get(report.worker_id)
        self._reported_draining[report.worker_id] = report.draining
        view = WorkerView(
            worker_id=report.worker_id,
            model=report.model,
            address=report.address,
            http_address=report.http_address,
            running=report.running,
            queued=report.queued,
            placed=previous.placed if previous is not None else 0,
            max_batch=report.max_batch,
            kv_blocks_used=report.kv_blocks_used,
            kv_blocks_total=report.kv_blocks_total,
            max_model_len=report.max_model_len,
            draining=report.draining or report.worker_id in self._operator_drained,
            last_heartbeat=now,
            heartbeat_interval_s=report.heartbeat_interval_s or self.default_heartbeat_interval_s,
            admission_limit=self._admission_limit(report.max_batch),
            block_size=report.block_size,
        )
        self._workers[report.worker_id] = view
        if self._observer is not None:
            self._observer.observe_worker(report, now)
        return view

    def silent_workers(self, now: float) -> list[WorkerView]:
        """The workers ``expire_workers`` would remove at ``now``, by id: silent for more than
        heartbeat_timeout_factor × their heartbeat interval.  (The live adapter asks each one
        directly before expiring it, so a heartbeat transport outage costs no worker.)"""
        return [
            worker
            for worker in sorted(self._workers.values(), key=lambda w: w.worker_id)
            if now - worker.last_heartbeat > self.heartbeat_timeout_factor * worker.heartbeat_interval_s
        ]

    def drain(self, worker_id: str, drain: bool = True) -> bool:
        """Stop (or resume) new placements on a worker; existing ones finish.  False if unknown."""
        worker = self._workers.get(worker_id)
        if worker is None:
            return False
        if drain:
            self._operator_drained.add(worker_id)
        else:
            self._operator_drained.discard(worker_id)
        draining = drain or self._reported_draining.get(worker_id, False)
        self._workers[worker_id] = dataclasses.replace(worker, draining=draining)
        return True

    def expire_workers(self, now: float) -> list[ExpiredWorker]:
        """Remove workers silent for more than heartbeat_timeout_factor × their heartbeat interval.

        Their outstanding placements are dropped and returned as failed; queued requests that no
        remaining worker could ever serve are removed and returned as rejected (NoWorkers).
        """
        self.programs.expire(now)
        expired: list[ExpiredWorker] = []
        for worker in self.silent_workers(now):
            del self._workers[worker.worker_id]
            self._reported_draining.pop(worker.worker_id, None)
            failed = tuple(rid for rid, p in self._placements.items() if p.worker_id == worker.worker_id)
            for rid in failed:
                self.programs.on_cancel(self._placements.pop(rid).request)
            self._placed_on.pop(worker.worker_id, None)
            if self.leases is not None:
                self.leases.forget_worker(worker.worker_id)
            queue = self._queues.get(worker.model, {})
            rejected = tuple(rid for rid, r in queue.items() if not self._can_ever_serve(r))
            for rid in rejected:
                request = queue.pop(rid)
                self._unqueued(request)
                self.programs.on_cancel(request)
            expired.append(ExpiredWorker(worker.worker_id, worker.model, failed, rejected))
        return expired

    # ---- inspection -----------------------------------------------------------------------------

    def workers(self) -> list[WorkerView]:
        return sorted(self._workers.values(), key=lambda w: w.worker_id)

    def queue_depths(self) -> dict[str, int]:
        """Depth per model, for every model with a queue or a worker."""
        models = sorted({*self._queues, *(w.model for w in self._workers.values())})
        return {m: len(self._queues.get(m, ())) for m in models}

    def queue_depth(self, model: str) -> int:
        """Requests waiting in ``model``'s global queue."""
        return len(self._queues.get(model, ()))

    def queued_requests(self, model: str | None = None) -> list[QueuedRequest]:
        """The requests waiting in ``model``'s global queue (every model's when None), in
        submission order."""
        queues = self._queues.values() if model is None else [self._queues.get(model, {})]
        return [request for queue in queues for request in queue.values()]

    def queued_calls(self, key: ProgramKey) -> list[QueuedRequest]:
        """The calls of program ``key`` waiting in the global queues, in submission order."""
        return list(self._queued_by_program.get(key, {}).values())

    def queued_programs(self) -> list[ProgramKey]:
        """The programs with at least one call waiting in the global queues."""
        return list(self._queued_by_program)

    def watch_queued_programs(self) -> ChangeFeed:
        """A feed of the programs whose waiting calls change from now on (a call of theirs is
        queued, placed, cancelled or rejected); the one call a ``SchedulerAware`` policy may make
        that is not a pure read, as it changes nothing the scheduler decides with."""
        feed = ChangeFeed()
        self._queue_feeds.append(feed)
        return feed

    def placed_requests(self, worker_id: str) -> list[QueuedRequest]:
        """The requests holding a placement on ``worker_id``, in placement order."""
        return list(self._placed_on.get(worker_id, {}).values())

    def agent_model(self, workflow_type_id: str, agent_id: str) -> str | None:
        """The model of the latest submitted call of this agent; None if none was seen."""
        return self._agent_models.get((workflow_type_id, agent_id))

    def placement_of(self, request_id: str) -> str | None:
        held = self._placements.get(request_id)
        return held.worker_id if held is not None else None

    def is_queued(self, request_id: str) -> bool:
        return any(request_id in q for q in self._queues.values())

    def snapshot(self, now: float) -> SchedulerSnapshot:
        queues = tuple(QueueState(m, d, self.max_queue_per_model) for m, d in self.queue_depths().items())
        return SchedulerSnapshot(self.policy_name, now, queues, tuple(self.workers()))

    def check_integrity(self) -> None:
        """Assert the accounting invariants (tests call this after every step)."""
        counts: dict[str, int] = {}
        for placement in self._placements.values():
            counts[placement.worker_id] = counts.get(placement.worker_id, 0) + 1
        for worker in self._workers.values():
            assert worker.placed == counts.pop(worker.worker_id, 0), (
                f"{worker.worker_id}: placed count drifted"
            )
            assert worker.placed >= 0
        assert not counts, f"placements on unknown workers: {counts}"
        by_worker = {(p.worker_id, rid) for rid, p in self._placements.items()}
        assert by_worker == {(w, rid) for w, held in self._placed_on.items() for rid in held}, "placement index"
        for model, queue in self._queues.items():
            assert len(queue) <= self.max_queue_per_model, f"queue {model} over capacity"
            for rid, request in queue.items():
                assert request.model == model and rid not in self._placements, f"{rid} queued twice"
        by_program = {(k, rid) for k, held in self._queued_by_program.items() for rid in held}
        expected = {(k, r.request_id) for q in self._queues.values() for r in q.values() if (k := program_key(r))}
        assert by_program == expected, "program index drifted"
        if self._fixed:
            queued = {rid for q in self._queues.values() for rid in q}
            assert set(self._entries) == queued, "a queued request without its heap entry"
        if self._incremental is not None:
            self._check_incremental()
        if self.leases is not None:
            self.leases.check_integrity({rid: p.worker_id for rid, p in self._placements.items()})
        self.programs.check_integrity()

    def _check_incremental(self) -> None:
        queued = {rid: r for q in self._queues.values() for rid, r in q.items()}
        assert set(self._order) == set(queued), "submission numbers drifted"
        assert set(self._entries) <= set(queued), "an entry of a request no longer queued"
        for model, queue in self._queues.items():
            heap_ids = {id(entry) for entry in self._heaps.get(model, ())}
            pending = self._to_evaluate.get(model, {})
            for rid in queue:
                if model in self._evaluate_all or rid in pending:
                    continue
                assert id(self._entries[rid]) in heap_ids, f"{rid}: neither ranked nor to evaluate"

    def _admission_limit(self, max_batch: int) -> int:
        return 0 if self.engine_queue_factor == 1 else math.ceil(max_batch * self.engine_queue_factor)

    def _can_ever_serve(self, request: QueuedRequest) -> bool:
        return any(
            w.model == request.model and w.worker_id not in request.exclude_workers
            for w in self._workers.values()
        )
