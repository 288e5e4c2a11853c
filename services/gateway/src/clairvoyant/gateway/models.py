"""Which models are served, and which model groups are declared: read from the scheduler's Snapshot
and cached briefly.

A *model group* (``CV_MODEL_GROUPS`` at the scheduler) is a name a request may send as its model;
the scheduler then picks the served model of each call among the group's (Aragog, seeds/002).
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Protocol

from clairvoyant.contracts.v1 import scheduler_pb2
from clairvoyant.core.errors import ClairvoyantError, ModelNotFound, NoWorkers

logger = logging.getLogger(__name__)


class SnapshotSource(Protocol):
    async def snapshot(self, timeout_s: float = 2.0) -> scheduler_pb2.SchedulerSnapshot: ...


@dataclass(frozen=True)
class ServedModel:
    """A model as the registered workers serve it (not a runner's model description)."""

    name: str
    max_model_len: int  # the smallest context window among its workers; 0 when none reported one
    workers: int


@dataclass(frozen=True)
class ServedGroup:
    """A declared model group, with what the registered workers of its models serve."""

    name: str
    models: tuple[str, ...]  # the served models its calls may run on, cheapest first
    # The smallest context window among its models' workers, so a call fits whichever model runs
    # it; 0 when none reported one.
    max_model_len: int
    workers: int  # live workers serving one of its models


class ModelCatalog:
    """Answers "is this model served (or a model group), and how long may a request be" without a
    Snapshot per request.

    A cache of ``ttl_s`` seconds (about one) keeps /v1/models and request admission cheap while a
    newly registered worker still shows up almost at once.  Concurrent misses share one Snapshot.
    Once half the TTL has passed, the next call answers from the cache and starts the Snapshot in
    the background, so under steady traffic no request waits for one; only a call that finds the
    cache older than ``ttl_s`` (idle for a while, or ``ttl_s`` 0) waits.
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
        self._groups: dict[str, ServedGroup] = {}
        self._ahead: asyncio.Task[None] | None = None  # the background refresh, while one runs

    async def models(self) -> dict[str, ServedModel]:
        """The served models.  Raises Unavailable when the scheduler cannot be reached."""
        await self._refresh()
        return self._models

    async def groups(self) -> dict[str, ServedGroup]:
        """The declared model groups.  Raises Unavailable when the scheduler cannot be reached."""
        await self._refresh()
        return self._groups

    async def _refresh(self) -> None:
        age = self._now() - self._fetched_at
        if age < self._ttl_s:
            if age >= self._ttl_s / 2 and self._ahead is None:
                self._ahead = asyncio.ensure_future(self._refresh_ahead())
            return
        await self._fetch(self._ttl_s)

    async def _fetch(self, older_than_s: float) -> None:
        """One Snapshot, unless another call fetched one meanwhile (younger than ``older_than_s``)."""
        async with self._lock:
            if self._now() - self._fetched_at >= older_than_s:
                snapshot = await self._scheduler.snapshot()
                self._models = self._summarise(snapshot)
                self._groups = self._summarise_groups(snapshot, self._models)
                self._fetched_at = self._now()

    async def _refresh_ahead(self) -> None:
        try:
            await self._fetch(self._ttl_s / 2)
        except ClairvoyantError as err:  # the cache stays; a call past the TTL asks again and raises
            logger.debug("background Snapshot failed: %s", err.message)
        finally:
            self._ahead = None

    async def resolve(self, name: str) -> ServedModel | ServedGroup:
        """The served model or model group ``name``.  Raises ModelNotFound (naming both kinds of
        choice) for neither, NoWorkers while nothing at all is registered."""
        models = await self.models()
        if name in models:
            return models[name]
        if name in self._groups:
            return self._groups[name]
        if not models and not self._groups:
            raise NoWorkers(
                "no worker is registered yet; retry shortly", code="no_workers", retry_after_s=1.0
            )
        groups = f"; model groups: {', '.join(sorted(self._groups))}" if self._groups else ""
        raise ModelNotFound(
            f"the model {name!r} does not exist; available: {', '.join(sorted(models)) or 'none'}{groups}",
            param="model",
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

    @staticmethod
    def _summarise_groups(
        snapshot: scheduler_pb2.SchedulerSnapshot, models: dict[str, ServedModel]
    ) -> dict[str, ServedGroup]:
        groups = {}
        for group in snapshot.groups:
            served = [models[m] for m in group.models if m in models]
            lengths = [m.max_model_len for m in served if m.max_model_len]
            groups[group.name] = ServedGroup(
                group.name, tuple(group.models), min(lengths, default=0), sum(m.workers for m in served)
            )
        return groups
