"""The global scheduler core: per-model bounded queues, placement accounting, worker liveness.

Pure: every call takes ``now`` (monotonic seconds) and nothing here reads a clock, sleeps or does
I/O, so the live service and the simulator drive the same object.  Not thread-safe; the service
calls it from its event loop only.

    submit ──> queue[model] ──dispatch──> placed[worker] ──complete──> (capacity freed)
                  │ cancel                     │ worker silent for factor × interval
                  v                            v
               (gone)               expire_workers: placements failed, orphaned queue rejected

``GlobalScheduler`` composes the queues and their ranking (queues.py), the placements and their
leases (placements.py) and the workers (workers.py), keeps the process table up to date and calls
the policies' declared hooks.  docs/scheduling.md ("The global scheduler") says how the pieces fit.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable
from typing import Any, cast

from clairvoyant.core.errors import NoWorkers
from clairvoyant.core.kv_events import KvBatch
from clairvoyant.policy.capabilities import Capability, capabilities_of, check_capabilities
from clairvoyant.policy.kv_index import KvApplied, KvIndex
from clairvoyant.policy.presets import build_policies, engine_rule_of
from clairvoyant.policy.process_table import ProcessTable, ProgramKey, program_key
from clairvoyant.policy.scheduling import (
    Admitting,
    Backfill,
    Backfilling,
    EngineQueued,
    FixedPriority,
    IncrementalPriority,
    KvAware,
    LocalRule,
    MigratesKv,
    ModelAssigning,
    PriorityPolicy,
    ProgramAware,
    Rebalancing,
    RoutingPolicy,
    SchedulerAware,
    Waking,
    WorkerObserver,
    eligible_workers,
)
from clairvoyant.policy.types import (
    Completion,
    Decision,
    ExpiredWorker,
    QueuedRequest,
    WorkerReport,
    WorkerView,
)
from clairvoyant.scheduler.core.inspection import SchedulerInspection
from clairvoyant.scheduler.core.leases import LeaseBook, Reclaimed
from clairvoyant.scheduler.core.placements import PlacementBook
from clairvoyant.scheduler.core.queues import Entry, GlobalQueues
from clairvoyant.scheduler.core.traffic import TrafficCounters
from clairvoyant.scheduler.core.workers import WorkerRegistry


class GlobalScheduler(SchedulerInspection):
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
        kv_index: KvIndex | None = None,
    ) -> None:
        """``program_idle_ttl_s``: a program with no call in flight leaves the process table after
        this long without an arrival or completion (or at once when a call says workflow_end).
        ``leases``: when given, every placement holds a lease in it (``renew``, ``reclaim`` and
        the workers' reports of what they hold bring back placements nobody released); the
        simulator, which loses no calls, runs without.  ``kv_index``: the workers' reported KV
        blocks (``apply_kv_events``), read by ``KV_AWARE`` policies; a fresh one by default, which
        stays empty, and changes nothing, while no worker reports."""
        if max_queue_per_model < 1:
            raise ValueError("max_queue_per_model must be at least 1")
        self.priority_policy = priority
        self.routing_policy = routing
        self.policy_name = policy_name
        self._agent_models: dict[tuple[str, str], str] = {}  # (workflow type, agent) -> latest model
        self._traffic = TrafficCounters()
        check_capabilities(type(priority))  # a hook it does not declare would never be called
        check_capabilities(type(routing))
        priority_can, routing_can = capabilities_of(priority), capabilities_of(routing)
        fixed = (
            Capability.FIXED_PRIORITY in priority_can and cast(FixedPriority, priority).priority_is_fixed()
        )
        incremental = not fixed and Capability.INCREMENTAL_PRIORITY in priority_can
        self._queues = GlobalQueues(
            priority,
            fixed=fixed,
            incremental=cast(IncrementalPriority, priority) if incremental else None,
            max_per_model=max_queue_per_model,
            retry_after_s=queue_retry_after_s,
        )
        self.programs = ProcessTable(program_idle_ttl_s)
        self._placements = PlacementBook(leases)
        self.kv_index = kv_index or KvIndex()
        for policy, can in ((priority, priority_can), (routing, routing_can)):
            if Capability.PROGRAM_AWARE in can:
                cast(ProgramAware, policy).bind_programs(self.programs)
            if Capability.SCHEDULER_AWARE in can:
                cast(SchedulerAware, policy).bind_scheduler(self)
            if Capability.KV_AWARE in can:
                cast(KvAware, policy).bind_kv_index(self.kv_index)
        queued = Capability.ENGINE_QUEUED in routing_can
        engine_queue_factor = cast(EngineQueued, routing).engine_queue_factor() if queued else 1.0
        if engine_queue_factor < 1:
            raise ValueError("engine_queue_factor must be at least 1")
        self._workers = WorkerRegistry(
            heartbeat_timeout_factor=heartbeat_timeout_factor,
            default_heartbeat_interval_s=default_heartbeat_interval_s,
            engine_queue_factor=engine_queue_factor,
            admission=cast(Admitting, routing).admission_limit if Capability.ADMITS in routing_can else None,
        )
        self._displaces = Capability.ADMITS in routing_can and cast(Admitting, routing).displaces()
        self._rebalancing = cast(Rebalancing, routing) if Capability.REBALANCES in routing_can else None
        self._migrating = cast(MigratesKv, routing) if Capability.MIGRATES_KV in routing_can else None
        self._observer = cast(WorkerObserver, routing) if Capability.OBSERVES_WORKERS in routing_can else None
        self._assigner = cast(ModelAssigning, routing) if Capability.ASSIGNS_MODELS in routing_can else None
        self._waking = cast(Waking, routing) if Capability.WAKES in routing_can else None
        self._backfill: Backfill | None = (
            cast(Backfilling, routing).backfill() if Capability.BACKFILLS in routing_can else None
        )
        if self._assigner is not None:
            self._workers.groups = {g: frozenset(m) for g, m in self._assigner.group_models().items()}
            self._queues.unranked = frozenset(self._workers.groups)

    @classmethod
    def from_preset(cls, preset: str, **options: Any) -> GlobalScheduler:
        """A scheduler with fresh policies of a registered preset; ``options`` as for __init__."""
        priority, routing = build_policies(preset)
        return cls(priority, routing, policy_name=preset, **options)

    # ---- requests -------------------------------------------------------------------------------

    def submit(self, request: QueuedRequest, now: float) -> None:
        """Queue ``request`` (``dispatch`` places it).

        Raises NoWorkers when no live worker serves the model (draining ones count: they may be
        resumed) or every one of them is excluded, unless the model is expected
        (``expect_models``); QueueFull (with retry_after_s) when the model's queue is at capacity;
        InvalidRequest when the id is already queued.  Re-submitting an id that holds a placement
        releases that placement first: the caller has given up on it.
        """
        if not self._workers.can_ever_serve(request):
            raise NoWorkers(f"no live worker serves model {request.model!r}", param="model")
        self._queues.check_room(request)
        self.complete(request.request_id)
        self.programs.on_submit(request, now)  # before ranking: a priority may read the program
        self._queues.add(request, now)
        self._traffic.on_submit(request)
        if self._assigner is not None and request.model in self._workers.groups:
            self._assigner.queued(request, now)
        elif request.app_metadata is not None:
            meta = request.app_metadata
            self._agent_models[(meta.workflow_type_id, meta.agent_id)] = request.model

    def cancel(self, request_id: str) -> bool:
        """Remove a request that is still waiting (its caller went away).  False if not queued."""
        request = self._queues.remove(request_id)
        if request is None:
            return False
        self._left_queue(request)
        return True

    def _left_queue(self, request: QueuedRequest) -> None:
        """``request`` left its queue unplaced (cancelled or rejected)."""
        self.programs.on_cancel(request)
        if self._assigner is not None and request.model in self._workers.groups:
            self._assigner.unqueued(request.request_id)

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
        it, now - dispatch time, and its model's traffic counters its ``output_tokens``.  Without
        ``now`` (an abandoned or re-submitted placement) the call leaves its program's active calls
        and adds nothing.
        """
        held = self._placements.release(request_id, worker_id)
        if held is None:
            return False
        self._workers.add_placed(held.worker_id, -1)
        if now is None:
            self.programs.on_cancel(held.request)
        else:
            service = now - held.dispatch_time if service_s is None else service_s
            self._traffic.on_served(held.request.model, output_tokens)
            self.programs.on_complete(
                Completion(held.request, held.worker_id, held.dispatch_time, now, service, output_tokens)
            )
        return True

    def renew(self, owner: str, request_ids: list[str], now: float) -> list[str]:
        """Extend ``owner``'s leases on these placements; returns the ids it holds none on."""
        return self._placements.renew(owner, request_ids, now)

    def reclaim(self, now: float) -> list[Reclaimed]:
        """Release the placements whose lease ran out (their owner stopped renewing)."""
        return self._release_all(self._placements.expired(now))

    def reconcile(self, worker_id: str, held: frozenset[str], now: float) -> list[Reclaimed]:
        """``worker_id`` holds exactly ``held``: release the placements on it that it has not
        heard of for a while (``LeaseBook.reconcile``)."""
        return self._release_all(self._placements.unknown_to_worker(worker_id, held, now))

    def _release_all(self, reclaimed: list[Reclaimed]) -> list[Reclaimed]:
        for gone in reclaimed:  # as an abandoned placement: the program learns no service
            self.complete(gone.request_id)
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
        A routing policy that ``BACKFILLS`` bounds an exception (``Backfill``): dispatch may pass
        over a few such requests while the model's head has not waited long.
        """
        if self._rebalancing is not None:
            self._rebalancing.rebalance(now)
        decisions: list[Decision] = []
        for model in self._queues.models():
            can_move = self._workers.can_take(model) or (self._displaces and self._workers.can_seat(model))
            if not self._queues.depth(model) or not can_move:
                continue  # nothing can move: skip ranking a long queue
            if self._assigner is not None and model in self._workers.groups:
                self._dispatch_group(model, now, decisions)
                continue
            ranked = self._queues.ranked(model, now)
            passed: list[Entry] = []
            while (top := self._queues.head(model, ranked)) is not None:
                negated, _, _, request = top
                worker_id = self.routing_policy.route(request, self._workers.views(), now)
                if worker_id is not None:
                    chosen = self._workers.get(worker_id)
                    if chosen is None or not eligible_workers(request, [chosen]):
                        raise RuntimeError(f"routing policy chose ineligible worker {worker_id!r}")
                elif self._displaces:
                    worker_id = self._displacing_worker(request, -negated)
                if worker_id is None:
                    if not self._may_pass(passed, request, now):
                        break  # it stays at the top of a fixed-priority heap
                    passed.append(self._queues.pass_over(ranked))
                    continue
                self._queues.take_head(model, ranked)
                decisions.append(self._place(request, worker_id, -negated, now))
            self._queues.restore(ranked, passed)
        return decisions

    def _may_pass(self, passed: list[Entry], request: QueuedRequest, now: float) -> bool:
        """May dispatch pass over ``request``, which cannot be placed now, having passed over
        ``passed`` already?  Only under the routing policy's ``Backfill``: fewer than its depth
        passed, and the model's head (the first passed, else ``request``) waiting less than its
        max wait."""
        bound = self._backfill
        if bound is None or len(passed) >= bound.depth:
            return False
        head = passed[0][3] if passed else request
        return now - head.arrival_time < bound.max_wait_s

    def _displacing_worker(self, request: QueuedRequest, priority: float) -> str | None:
        """Admission at the knee (``Capability.ADMITS``): a worker at its limit where ``request``
        may still go because it holds a less urgent placement, which the engine's seat limit (the
        same knee, sent with the placement) then preempts for it.  The worker whose least urgent
        placement is least urgent, then the smaller id; only one with a seat left (max_batch) and
        otherwise eligible.  None: every placement is at least as urgent, so ``request`` waits."""
        best: tuple[float, str] | None = None
        for worker in self._workers.views():
            if (
                worker.model != request.model
                or worker.draining
                or worker.worker_id in request.exclude_workers
                or worker.placed >= worker.max_batch
                or worker.placed < (worker.admission_limit or worker.max_batch)  # has room: routing said no
            ):
                continue
            lowest = self._placements.least_urgent(worker.worker_id)
            if lowest is not None and lowest < priority and (best is None or (lowest, worker.worker_id) < best):
                best = (lowest, worker.worker_id)
        return None if best is None else best[1]

    def _place(self, request: QueuedRequest, worker_id: str, priority: float, now: float) -> Decision:
        """Count the placement of ``request`` (out of its queue) on ``worker_id``."""
        worker = self._workers.add_placed(worker_id, +1)
        assert worker is not None
        self._placements.place(request, worker_id, now, priority)
        if request.prompt_block_hashes:
            self.kv_index.speculate(worker_id, request, now)
        kv_source = None if self._migrating is None else self._migrating.kv_source(request, worker_id)
        wait = now - request.arrival_time
        program = self.programs.get(program_key(request))
        attained = (program.waiting_s, program.service_s) if program is not None else (0.0, 0.0)
        seat_limit = worker.admission_limit if self._displaces else 0
        return Decision(request.request_id, worker, priority, wait, kv_source, *attained, seat_limit)

    def _dispatch_group(self, group: str, now: float, decisions: list[Decision]) -> None:
        """Place what the model-assigning policy assigns of ``group``'s queue; each call is placed
        as a call of its worker's model."""
        assert self._assigner is not None
        members = self._workers.groups[group]
        queued = self._queues.requests_by_id(group)
        for request_id, worker_id in self._assigner.assign(group, self._workers.views(), now):
            request = queued.get(request_id)
            if request is None:
                raise RuntimeError(f"model-assigning policy assigned {request_id!r}, not queued for group {group!r}")
            chosen = self._workers.get(worker_id)
            concrete = dataclasses.replace(request, model=chosen.model) if chosen is not None else request
            if chosen is None or chosen.model not in members or not eligible_workers(concrete, [chosen]):
                raise RuntimeError(f"model-assigning policy chose ineligible worker {worker_id!r} for {request_id!r}")
            self._queues.remove(request_id)
            if concrete.app_metadata is not None:
                meta = concrete.app_metadata
                self._agent_models[(meta.workflow_type_id, meta.agent_id)] = concrete.model
            decisions.append(self._place(concrete, worker_id, 0.0, now))

    def wake_at(self, now: float) -> float | None:
        """When ``dispatch`` should run next even if nothing happens (``Waking``); None: only
        after the next request, completion or report."""
        return None if self._waking is None else self._waking.wake_at(now)

    # ---- workers --------------------------------------------------------------------------------

    def update_worker(self, report: WorkerReport, now: float) -> WorkerView:
        """Record a heartbeat; a new (or returning) worker joins with no placements."""
        view = self._workers.update(report, now)
        if self._observer is not None:
            self._observer.observe_worker(report, now)
        return view

    def apply_kv_events(self, batch: KvBatch, now: float) -> KvApplied:
        """A worker's KV events, into the index (``KvIndex.apply``).  A batch from a worker that
        is not live (no heartbeat yet, or already expired) is indexed all the same: its
        heartbeat may come next, and ``remove_worker`` drops it when it goes."""
        return self.kv_index.apply(batch, now)

    def silent_workers(self, now: float) -> list[WorkerView]:
        """The workers ``expire_workers`` would remove at ``now``, by id: silent for more than
        heartbeat_timeout_factor × their heartbeat interval.  (The live adapter asks each one
        directly before expiring it, so a heartbeat transport outage costs no worker.)"""
        return self._workers.silent(now)

    def drain(self, worker_id: str, drain: bool = True) -> bool:
        """Stop (or resume) new placements on a worker; existing ones finish.  False if unknown."""
        return self._workers.drain(worker_id, drain)

    def expect_models(self, models: Iterable[str]) -> list[QueuedRequest]:
        """``models`` (replacing the previous set) stay schedulable with no live worker: their
        requests wait in the queue for a worker to register.  Returns the queued requests of a
        model that left the set and that no live worker can serve, removed as rejected (NoWorkers)."""
        expected = frozenset(models)
        left = sorted(self._workers.expected_models - expected)
        self._workers.expect(expected)
        servable = self._workers.can_ever_serve
        models = [*left, *(g for g, members in self._workers.groups.items() if members & set(left))]
        rejected = [request for model in models for request in self._queues.remove_unservable(model, servable)]
        for request in rejected:
            self._left_queue(request)
        return rejected

    def remove_worker(self, worker_id: str) -> ExpiredWorker | None:
        """An autoscaler released a drained, idle worker: it leaves at once, as if expired (a
        placement it still held fails; queued requests stay while a worker, or an expected
        model, can still serve them, and the others are returned as rejected).  None if unknown."""
        worker = self._workers.get(worker_id)
        if worker is None:
            return None
        self._workers.remove(worker_id)
        self.kv_index.remove_worker(worker_id)
        failed = self._placements.fail_worker(worker_id)
        for placement in failed:
            self.programs.on_cancel(placement.request)
        servable = self._workers.can_ever_serve
        groups = [g for g, members in self._workers.groups.items() if worker.model in members]
        rejected = [r for model in (worker.model, *groups) for r in self._queues.remove_unservable(model, servable)]
        for request in rejected:
            self._left_queue(request)
        return ExpiredWorker(
            worker_id,
            worker.model,
            tuple(p.request.request_id for p in failed),
            tuple(r.request_id for r in rejected),
        )

    def expire_workers(self, now: float) -> list[ExpiredWorker]:
        """Remove workers silent for more than heartbeat_timeout_factor × their heartbeat interval.

        Their outstanding placements are dropped and returned as failed; queued requests that no
        remaining worker could ever serve are removed and returned as rejected (NoWorkers), unless
        their model is expected (``expect_models``).
        """
        self.programs.expire(now)
        expired = [self.remove_worker(worker.worker_id) for worker in self._workers.silent(now)]
        return [gone for gone in expired if gone is not None]
