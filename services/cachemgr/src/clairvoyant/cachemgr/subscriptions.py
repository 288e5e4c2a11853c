"""The workers' plain NATS subjects into the core: KV events (``cv.kv.events.*``) build the index,
heartbeats (``cv.workers.*.stats``) the load; a worker silent for ``SILENT_INTERVALS`` heartbeat
intervals is gone (``sweep``).

Every handler is safe against any message: one that cannot be decoded or used is counted
(``cv_cachemgr_malformed_total`` by source, and the core's ``malformed_dropped``) and dropped.  A
dropped KV batch then shows as a sequence gap, from which the index recovers at the worker's next
CLEARED.
"""

from __future__ import annotations

import logging
import math
import time

from google.protobuf.message import DecodeError
from nats.aio.msg import Msg

from clairvoyant.cachemgr import convert, metrics
from clairvoyant.cachemgr.core import CacheManagerCore
from clairvoyant.cachemgr.core.index import batch_problem
from clairvoyant.contracts.v1 import worker_pb2
from clairvoyant.core.bus import KV_RESYNC_SUBJECT, WORKER_STATS_WILDCARD, EventBus
from clairvoyant.core.clock import Clock
from clairvoyant.core.errors import InvalidRequest
from clairvoyant.core.wire import kv_batch

logger = logging.getLogger(__name__)

KV_EVENTS_WILDCARD = "cv.kv.events.*"
SILENT_INTERVALS = 3  # heartbeats missed before a worker is taken as gone
DEFAULT_HEARTBEAT_S = 1.0  # the workers' default, for a heartbeat that states none
RESYNC_EVERY_S = 5.0  # a stale worker is asked for a snapshot at most this often


class Liveness:
    """When each worker was last heard from, and how often it said it would report."""

    def __init__(self) -> None:
        self._deadlines: dict[str, float] = {}  # worker id -> when it counts as gone

    def heard(self, worker_id: str, heartbeat_interval_s: float, now: float) -> None:
        interval = heartbeat_interval_s if heartbeat_interval_s > 0 else DEFAULT_HEARTBEAT_S
        self._deadlines[worker_id] = now + SILENT_INTERVALS * interval

    def sweep(self, now: float) -> list[str]:
        """The workers past their deadline, sorted; they are forgotten here too."""
        gone = sorted(worker for worker, deadline in self._deadlines.items() if now > deadline)
        for worker in gone:
            del self._deadlines[worker]
        return gone


class WorkerFeeds:
    """The NATS handlers of the workers' KV events and heartbeats, over one core."""

    def __init__(
        self, core: CacheManagerCore, clock: Clock, unsupported: dict[str, frozenset[str]] | None = None
    ) -> None:
        """``unsupported``: filled from the heartbeats, worker -> the directive kinds its engine
        cannot apply (the dispatcher's, which withholds them)."""
        self.core = core
        self.clock = clock
        self.unsupported = unsupported if unsupported is not None else {}
        self.liveness = Liveness()
        self._bus: EventBus | None = None
        self._resync_asked: dict[str, float] = {}  # worker -> when (monotonic) a snapshot was asked for

    async def subscribe(self, bus: EventBus) -> None:
        """Subscribe now when connected, and again on every reconnect (the bus remembers)."""
        self._bus = bus
        await bus.subscribe(KV_EVENTS_WILDCARD, self.on_kv_events)
        await bus.subscribe(WORKER_STATS_WILDCARD, self.on_worker_stats)

    async def on_kv_events(self, msg: Msg) -> None:
        try:
            batch = kv_batch(worker_pb2.KvEventBatch.FromString(msg.data))
        except (DecodeError, InvalidRequest) as exc:
            self._malformed("kv_events", msg.subject, str(exc))
            return
        problem = batch_problem(batch)
        if problem:
            self._malformed("kv_events", msg.subject, problem)
            return
        try:
            stale = self.core.on_kv_batch(batch, self.clock.now())
        except Exception:  # a bug in the index must not end the subscription
            logger.exception("applying KV events of %s failed", batch.worker_id)
            return
        now = time.monotonic()
        if stale and now - self._resync_asked.get(batch.worker_id, -math.inf) >= RESYNC_EVERY_S:
            self._resync_asked[batch.worker_id] = now  # a gap: ask that worker for its tiers
            logger.info("KV events of %s lost (sequence gap): asking it for a snapshot", batch.worker_id)
            if self._bus is not None:
                await self._bus.publish(KV_RESYNC_SUBJECT, batch.worker_id.encode())

    async def on_worker_stats(self, msg: Msg) -> None:
        try:
            stats = worker_pb2.WorkerStats.FromString(msg.data)
            load = convert.worker_load(stats)
        except (DecodeError, InvalidRequest) as exc:
            self._malformed("worker_stats", msg.subject, str(exc))
            return
        now = self.clock.now()
        self.liveness.heard(load.worker_id, stats.heartbeat_interval_s, now)
        self.unsupported[load.worker_id] = frozenset(stats.unsupported_directives)
        try:
            self.core.on_worker_load(load, now)
        except Exception:
            logger.exception("applying the heartbeat of %s failed", load.worker_id)

    def sweep(self, now: float) -> list[str]:
        """Tell the core about the workers that fell silent; returns them."""
        gone = self.liveness.sweep(now)
        for worker_id in gone:
            logger.info("worker %s is silent for %d heartbeats: forgotten", worker_id, SILENT_INTERVALS)
            self.core.on_worker_gone(worker_id)
            self.unsupported.pop(worker_id, None)
            metrics.WORKERS_GONE.inc()
        return gone

    def _malformed(self, source: str, subject: str, problem: str) -> None:
        metrics.MALFORMED.labels(source).inc()
        self.core.note_malformed(source)
        logger.warning("dropped a malformed message on %s: %s", subject, problem or "undecodable")
