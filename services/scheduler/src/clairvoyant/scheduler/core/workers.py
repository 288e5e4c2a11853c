"""The workers as the global scheduler sees them: their latest heartbeat, drain state and liveness.

Each worker's ``WorkerView`` is its latest report plus what only the scheduler knows: how many
placements it holds and whether an operator drained it.  A worker silent for more than
``heartbeat_timeout_factor`` × its heartbeat interval is due to expire.  An *expected* model
counts as servable with no worker at all, so its requests wait for one instead of failing.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable, Iterable

from clairvoyant.policy.types import QueuedRequest, WorkerReport, WorkerView


class WorkerRegistry:
    def __init__(
        self,
        *,
        heartbeat_timeout_factor: float,
        default_heartbeat_interval_s: float,
        engine_queue_factor: float,
        admission: Callable[[WorkerReport], int] | None = None,
    ) -> None:
        """``engine_queue_factor``: a worker may hold up to max_batch × this many calls (1: no
        limit beyond its batch; ``WorkerView.admission_limit``).  ``admission``: the routing
        policy's own limit for a reporting worker (``Capability.ADMITS``); its 0 means the default."""
        self.heartbeat_timeout_factor = heartbeat_timeout_factor
        self.default_heartbeat_interval_s = default_heartbeat_interval_s
        self.engine_queue_factor = engine_queue_factor
        self.admission = admission
        self._views: dict[str, WorkerView] = {}  # in order of first report since (re)joining
        self._reported_draining: dict[str, bool] = {}
        self._operator_drained: set[str] = set()  # survives a worker's expiry and return
        self.expected_models: frozenset[str] = frozenset()  # schedulable with no live worker
        # Model groups (a model-choosing routing policy's): group name -> the models it may use.
        self.groups: dict[str, frozenset[str]] = {}

    def update(self, report: WorkerReport, now: float) -> WorkerView:
        """Record a heartbeat; a new (or returning) worker joins with no placements."""
        previous = self._views.get(report.worker_id)
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
            admission_limit=self._admission_limit(report),
            block_size=report.block_size,
        )
        self._views[report.worker_id] = view
        return view

    def drain(self, worker_id: str, drain: bool = True) -> bool:
        """Stop (or resume) new placements on a worker.  False if unknown."""
        worker = self._views.get(worker_id)
        if worker is None:
            return False
        if drain:
            self._operator_drained.add(worker_id)
        else:
            self._operator_drained.discard(worker_id)
        draining = drain or self._reported_draining.get(worker_id, False)
        self._views[worker_id] = dataclasses.replace(worker, draining=draining)
        return True

    def add_placed(self, worker_id: str, delta: int) -> WorkerView | None:
        """Change a worker's placed count by ``delta``; None (and no change) if it is unknown."""
        worker = self._views.get(worker_id)
        if worker is None:
            return None
        worker = self._views[worker_id] = worker.with_placed(worker.placed + delta)
        return worker

    def silent(self, now: float) -> list[WorkerView]:
        """The workers silent for more than heartbeat_timeout_factor × their heartbeat interval, by id."""
        return [
            worker
            for worker in sorted(self._views.values(), key=lambda w: w.worker_id)
            if now - worker.last_heartbeat > self.heartbeat_timeout_factor * worker.heartbeat_interval_s
        ]

    def remove(self, worker_id: str) -> None:
        """The worker expired (an operator's drain stays, for when it returns)."""
        del self._views[worker_id]
        self._reported_draining.pop(worker_id, None)

    def get(self, worker_id: str) -> WorkerView | None:
        return self._views.get(worker_id)

    def views(self) -> list[WorkerView]:
        """Every worker, in the order they joined (what routing policies are given)."""
        return list(self._views.values())

    def by_id(self) -> list[WorkerView]:
        return sorted(self._views.values(), key=lambda w: w.worker_id)

    def models(self) -> set[str]:
        return {w.model for w in self._views.values()}

    def can_take(self, model: str) -> bool:
        """Could some worker of ``model`` (of one of its models, for a group) take a placement
        now (room, and not draining)?"""
        models = self.groups.get(model) or (model,)
        return any(w.model in models and w.has_room and not w.draining for w in self._views.values())

    def can_seat(self, model: str) -> bool:
        """Has some worker of ``model`` a seat left below its max_batch, where a call more urgent
        than one it holds may still go beyond its admission limit?"""
        return any(
            w.model == model and w.placed < w.max_batch and not w.draining for w in self._views.values()
        )

    def expect(self, models: Iterable[str]) -> None:
        """From now on ``models`` (and no others) stay schedulable with no live worker: one is
        on its way (an autoscaler is starting it)."""
        self.expected_models = frozenset(models)

    def can_ever_serve(self, request: QueuedRequest) -> bool:
        """Is the request's model (one of its group's models) expected, or does a live worker
        (draining or not) serve it and is not excluded?"""
        models = self.groups.get(request.model) or (request.model,)
        return any(m in self.expected_models for m in models) or any(
            w.model in models and w.worker_id not in request.exclude_workers for w in self._views.values()
        )

    def _admission_limit(self, report: WorkerReport) -> int:
        limit = self.admission(report) if self.admission is not None else 0
        if limit > 0:
            return limit
        return 0 if self.engine_queue_factor == 1 else math.ceil(report.max_batch * self.engine_queue_factor)
