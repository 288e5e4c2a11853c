"""Which models are served: read from the scheduler's Snapshot and cached briefly."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Protocol

from clairvoyant.contracts.v1 import scheduler_pb2
from clairvoyant.core.errors import ModelNotFound, NoWorkers


class SnapshotSource(Protocol):
    async def snapshot(self, timeout_s: float = 2.0) -> scheduler_pb2.SchedulerSnapshot: ...


@dataclass(frozen=True)
class ServedModel:
    """A model as the registered workers serve it (not a runner's model description)."""

    name: str
    max_model_len: int  # the smallest context window among its workers; 0 when none reported one
    workers: int


class ModelCatalog:
    """Answers "is this model served, and how long may a request be" without a Snapshot per request.

    A cache of ``ttl_s`` seconds (about one) keeps /v1/models and request admission cheap while a
    newly registered worker still shows up almost at once.  Concurrent misses share one Snapshot.
    """

    def __init__(
        self, scheduler: SnapshotSource, ttl_s: float = 1.0, now: Callable[[], float] = time.monotonic
    ) -> None:
        self._scheduler = scheduler
        self._ttl_s = ttl_s
        self._now = now
        self._lock = asyncio.Lock()
        self._fetched_at = float("-inf")
        self._models: dict[str, ServedModel] = {}

    async def models(self) -> dict[str, ServedModel]:
        """Raises Unavailable when the scheduler cannot be reached."""
        if self._now() - self._fetched_at < self._ttl_s:
            return self._models
        async with self._lock:
            if self._now() - self._fetched_at >= self._ttl_s:
                snapshot = await self._scheduler.snapshot()
                self._models = self._summarise(snapshot)
                self._fetched_at = self._now()
        return self._models

    async def resolve(self, name: str) -> ServedModel:
        models = await self.models()
        if name in models:
            return models[name]
        if not models:
            raise NoWorkers(
                "no worker is registered yet; retry shortly", code="no_workers", retry_after_s=1.0
            )
        raise ModelNotFound(
            f"the model {name!r} does not exist; available: {', '.join(sorted(models))}", param="model"
        )

    @staticmethod
    def _summarise(snapshot: scheduler_pb2.SchedulerSnapshot) -> dict[str, ServedModel]:
        lengths: dict[str, list[int]] = {}
        counts: dict[str, int] = {}
        for worker in snapshot.workers:
            counts[worker.model] = counts.get(worker.model, 0) + 1
            if worker.max_model_len:
                lengths.setdefault(worker.model, []).append(worker.max_model_len)
        for model in snapshot.expected_models:  # an autoscaler is starting a replica: requests wait
            counts.setdefault(model, 0)
        return {
            model: ServedModel(model, min(lengths.get(model, [0])), count)
            for model, count in sorted(counts.items())
        }
