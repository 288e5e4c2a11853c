"""Publishes the engine's KV events as ``KvEventBatch``es on ``cv.kv.events.<worker_id>``.

Contract: ``submit`` is called on the engine thread and never blocks; it numbers the batch and
queues it (a full queue drops it and counts the drop, so subscribers see a gap in ``sequence``).
``run`` publishes the queued batches in order on the asyncio loop.  The first batch (sequence 1)
says that L1 and L2 are empty (CLEARED): a subscriber that starts from it and applies every batch
in order holds the worker's per-tier block set.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import queue
import time

from nats.aio.msg import Msg

from clairvoyant.contracts.v1 import cachemgr_pb2, worker_pb2
from clairvoyant.core.bus import KV_RESYNC_SUBJECT, EventBus
from clairvoyant.worker.core.radix_cache import BlockTag
from clairvoyant.worker.core.types import KvEvent
from clairvoyant.worker.engine_loop import AsyncEngine
from clairvoyant.worker.metrics import KV_EVENTS_DROPPED

logger = logging.getLogger(__name__)

KV_EVENTS_PREFIX = "cv.kv.events"
RESYNC_MIN_INTERVAL_S = 1.0  # resync requests closer together than this are answered once
_KINDS = {
    "stored": worker_pb2.KvEvent.STORED,
    "removed": worker_pb2.KvEvent.REMOVED,
    "cleared": worker_pb2.KvEvent.CLEARED,
}
_TIERS = {1: cachemgr_pb2.CACHE_TIER_L1, 2: cachemgr_pb2.CACHE_TIER_L2, 3: cachemgr_pb2.CACHE_TIER_L3}


def subject_token(worker_id: str) -> str:
    """``worker_id`` as one NATS subject token (as ``worker_stats_subject`` writes it)."""
    return "".join("_" if c in ".*>" or c.isspace() else c for c in worker_id) or "_"


def kv_events_subject(worker_id: str) -> str:
    return f"{KV_EVENTS_PREFIX}.{subject_token(worker_id)}"


def event_to_proto(event: KvEvent) -> worker_pb2.KvEvent:
    msg = worker_pb2.KvEvent(
        kind=_KINDS[event.kind],
        tier=_TIERS[event.tier],
        tenant=event.namespace or "",
        block_hashes=event.block_hashes,
    )
    if event.parent_hash is not None:
        msg.parent_hash = event.parent_hash
    tag = event.tag
    if isinstance(tag, BlockTag):
        msg.response = tag.source == "response"
        lineage = tag.lineage
        if lineage is not None:
            msg.lineage.CopyFrom(
                cachemgr_pb2.LineageSelector(
                    tenant=lineage.tenant,
                    workflow_id=lineage.workflow_id or "",
                    agent_id=lineage.agent_id or "",
                    request_id=lineage.request_id or "",
                )
            )
    return msg


class KvEventPublisher:
    """Engine thread -> bounded queue -> NATS.  See the module docstring for the contract."""

    def __init__(self, worker_id: str, model: str, block_size: int, *, max_pending: int = 1024) -> None:
        self.worker_id = worker_id
        self.model = model
        self.block_size = block_size
        self.subject = kv_events_subject(worker_id)
        self._pending: queue.Queue[tuple[int, float, list[KvEvent]]] = queue.Queue(max_pending)
        self._sequence = 0
        self._loop: asyncio.AbstractEventLoop | None = None
        self._wake: asyncio.Event | None = None
        self.submit([KvEvent("cleared", 1, None, ()), KvEvent("cleared", 2, None, ())])

    @property
    def last_sequence(self) -> int:
        """The sequence number of the latest batch submitted (published or dropped)."""
        return self._sequence

    def submit(self, events: list[KvEvent]) -> None:
        """Queue one batch (engine thread; never blocks)."""
        self._sequence += 1
        try:
            self._pending.put_nowait((self._sequence, time.time(), events))
        except queue.Full:
            KV_EVENTS_DROPPED.inc()
            return
        loop, wake = self._loop, self._wake
        if loop is not None and wake is not None:
            with contextlib.suppress(RuntimeError):  # the loop closed during shutdown
                loop.call_soon_threadsafe(wake.set)

    def batch(self, sequence: int, timestamp: float, events: list[KvEvent]) -> worker_pb2.KvEventBatch:
        return worker_pb2.KvEventBatch(
            worker_id=self.worker_id,
            model=self.model,
            block_size=self.block_size,
            sequence=sequence,
            timestamp=timestamp,
            events=[event_to_proto(event) for event in events],
        )

    async def resync_on_request(self, bus: EventBus, engine: AsyncEngine) -> None:
        """Answer ``cv.kv.resync`` (empty: asked of every worker; else the worker id it is asked
        of): queue a snapshot of every tier (taken on the engine thread, so it is numbered in order
        with the step batches)."""
        last = -RESYNC_MIN_INTERVAL_S

        async def handle(msg: Msg) -> None:
            nonlocal last
            if msg.data and msg.data.decode(errors="replace") != self.worker_id:
                return  # a snapshot asked of another worker
            now = time.monotonic()
            if now - last < RESYNC_MIN_INTERVAL_S:
                return
            last = now
            await engine.call(lambda core: self.submit(core.kv_snapshot()))
            logger.info("KV resync requested: published a snapshot of every tier")

        await bus.subscribe(KV_RESYNC_SUBJECT, handle)

    async def run(self, bus: EventBus) -> None:
        """Publish the queued batches, in order, until cancelled."""
        self._loop, self._wake = asyncio.get_running_loop(), asyncio.Event()
        while True:
            self._wake.clear()
            while True:
                try:
                    sequence, timestamp, events = self._pending.get_nowait()
                except queue.Empty:
                    break
                try:
                    await bus.publish(self.subject, self.batch(sequence, timestamp, events).SerializeToString())
                except Exception:  # a bus hiccup loses this batch (a gap), not the publisher
                    logger.exception("KV event publish failed")
            await self._wake.wait()
