"""What can be read of the global scheduler: its queues, workers and placements, unchanged.

``SchedulerInspection`` is the read-only half of ``GlobalScheduler`` (which derives from it): the
``SchedulerView`` that scheduler-aware policies are given, the service's status reads, what an
autoscaler reads (``held_calls``/``active_calls``, ``agent_models``, ``traffic``) and
``check_integrity``.  Nothing here changes what the scheduler decides with.
"""

from __future__ import annotations

from typing import NamedTuple

from clairvoyant.policy.process_table import ChangeFeed, ProcessTable, ProgramKey
from clairvoyant.policy.scaling import ActiveCall, ModelTraffic
from clairvoyant.policy.types import QueuedRequest, QueueState, SchedulerSnapshot, WorkerView
from clairvoyant.scheduler.core.leases import LeaseBook
from clairvoyant.scheduler.core.placements import PlacementBook
from clairvoyant.scheduler.core.queues import GlobalQueues
from clairvoyant.scheduler.core.traffic import TrafficCounters
from clairvoyant.scheduler.core.workers import WorkerRegistry


class HeldCall(NamedTuple):
    """A request the scheduler holds: waiting in a global queue, or placed on ``worker_id``."""

    request: QueuedRequest
    worker_id: str | None  # None: queued
    wait_s: float  # since it joined the global queue (placed calls keep counting)

    def active_call(self) -> ActiveCall:
        """The autoscaler's view of it."""
        meta = self.request.app_metadata
        return ActiveCall(
            request_id=self.request.request_id,
            model=self.request.model,
            queued=self.worker_id is None,
            workflow_type_id=meta.workflow_type_id if meta is not None else None,
            workflow_id=meta.workflow_id if meta is not None else None,
            agent_id=meta.agent_id if meta is not None else None,
            tenant=self.request.tenant,
            wait_s=self.wait_s,
            annotations=self.request.annotations,
            workflow_end=bool(meta is not None and meta.workflow_end),
        )


class SchedulerInspection:
    policy_name: str
    programs: ProcessTable
    _queues: GlobalQueues
    _placements: PlacementBook
    _workers: WorkerRegistry
    _agent_models: dict[tuple[str, str], str]  # (workflow type, agent) -> latest model
    _traffic: TrafficCounters

    @property
    def leases(self) -> LeaseBook | None:
        return self._placements.leases

    @property
    def max_queue_per_model(self) -> int:
        return self._queues.max_per_model

    @property
    def queue_retry_after_s(self) -> float:
        return self._queues.retry_after_s

    @property
    def heartbeat_timeout_factor(self) -> float:
        return self._workers.heartbeat_timeout_factor

    @property
    def default_heartbeat_interval_s(self) -> float:
        return self._workers.default_heartbeat_interval_s

    @property
    def engine_queue_factor(self) -> float:
        return self._workers.engine_queue_factor

    def workers(self) -> list[WorkerView]:
        return self._workers.by_id()

    def queue_depths(self) -> dict[str, int]:
        """Depth per model, for every model with a queue or a worker."""
        models = sorted({*self._queues.models(), *self._workers.models()})
        return {m: self._queues.depth(m) for m in models}

    def queue_depth(self, model: str) -> int:
        """Requests waiting in ``model``'s global queue."""
        return self._queues.depth(model)

    def queued_requests(self, model: str | None = None) -> list[QueuedRequest]:
        """The requests waiting in ``model``'s global queue (every model's when None), in
        submission order."""
        return self._queues.requests(model)

    def queued_calls(self, key: ProgramKey) -> list[QueuedRequest]:
        """The calls of program ``key`` waiting in the global queues, in submission order."""
        return self._queues.calls_of(key)

    def queued_programs(self) -> list[ProgramKey]:
        """The programs with at least one call waiting in the global queues."""
        return self._queues.programs()

    def watch_queued_programs(self) -> ChangeFeed:
        """A feed of the programs whose waiting calls change from now on (a call of theirs is
        queued, placed, cancelled or rejected); the one call a ``SchedulerAware`` policy may make
        that is not a pure read, as it changes nothing the scheduler decides with."""
        return self._queues.watch_programs()

    def placed_requests(self, worker_id: str) -> list[QueuedRequest]:
        """The requests holding a placement on ``worker_id``, in placement order."""
        return self._placements.requests_on(worker_id)

    def agent_model(self, workflow_type_id: str, agent_id: str) -> str | None:
        """The model of the latest submitted call of this agent; None if none was seen."""
        return self._agent_models.get((workflow_type_id, agent_id))

    def agent_models(self) -> dict[tuple[str, str], str]:
        """(workflow type, agent) -> the model of that agent's latest submitted call."""
        return dict(self._agent_models)

    def held_calls(self, now: float) -> list[HeldCall]:
        """Every request queued (in submission order) then every one placed (worker by worker,
        in placement order)."""
        queued = [HeldCall(r, None, now - r.arrival_time) for r in self._queues.requests()]
        placed = [
            HeldCall(held.request, held.worker_id, now - held.request.arrival_time)
            for held in self._placements.placements()
        ]
        return queued + placed

    def active_calls(self, now: float) -> list[ActiveCall]:
        """``held_calls`` as the scaling policies read them."""
        return [held.active_call() for held in self.held_calls(now)]

    def traffic(self) -> dict[str, ModelTraffic]:
        """Per model, cumulative: requests submitted and their prompt tokens, calls completed as
        served and the tokens they generated."""
        return self._traffic.by_model()

    def expected_models(self) -> frozenset[str]:
        """The models that stay schedulable with no live worker (``expect_models``)."""
        return self._workers.expected_models

    def placement_of(self, request_id: str) -> str | None:
        return self._placements.worker_of(request_id)

    def is_queued(self, request_id: str) -> bool:
        return self._queues.is_queued(request_id)

    def snapshot(self, now: float) -> SchedulerSnapshot:
        queues = tuple(QueueState(m, d, self.max_queue_per_model) for m, d in self.queue_depths().items())
        return SchedulerSnapshot(self.policy_name, now, queues, tuple(self.workers()))

    def check_integrity(self) -> None:
        """Assert the accounting invariants (tests call this after every step)."""
        self._placements.check_integrity(self._workers.views())
        self._queues.check_integrity(self._placements)
        self._placements.check_leases()
        self.programs.check_integrity()
        for request in self._queues.requests():  # none waits for a worker that cannot come
            assert self._workers.can_ever_serve(request), f"{request.request_id} queued with no worker to come"
