"""Publishes ``WorkerStats`` on ``cv.workers.<id>.stats`` every heartbeat interval.

The scheduler learns of workers only from these: a worker that stops publishing is removed after
three intervals.
"""

from __future__ import annotations

import asyncio
import logging
import time
from typing import Protocol

from clairvoyant.contracts.v1 import cachemgr_pb2, worker_pb2
from clairvoyant.core.bus import EventBus, worker_stats_subject
from clairvoyant.worker.config import WorkerSettings
from clairvoyant.worker.core.types import EngineStats
from clairvoyant.worker.runners.base import ModelInfo

logger = logging.getLogger(__name__)


def tier_usage(stats: EngineStats) -> list[worker_pb2.TierUsage]:
    """L1 always; L2 and L3 when the worker has them (L3's size is the store's: unknown here, 0)."""
    l1_hits, l2_hits, l3_hits = stats.hit_tokens
    tiers = [
        worker_pb2.TierUsage(
            tier=cachemgr_pb2.CACHE_TIER_L1,
            blocks_used=stats.kv_blocks_used,
            blocks_total=stats.kv_blocks_total,
            hit_tokens=l1_hits,
        )
    ]
    if stats.l2_blocks_total:
        tiers.append(
            worker_pb2.TierUsage(
                tier=cachemgr_pb2.CACHE_TIER_L2,
                blocks_used=stats.l2_blocks_used,
                blocks_total=stats.l2_blocks_total,
                hit_tokens=l2_hits,
            )
        )
    if stats.l3_backend:
        tiers.append(worker_pb2.TierUsage(tier=cachemgr_pb2.CACHE_TIER_L3, hit_tokens=l3_hits))
    return tiers


class HasModelInfo(Protocol):
    @property
    def info(self) -> ModelInfo: ...


class HasStats(Protocol):
    def stats(self) -> EngineStats: ...


class Heartbeat:
    """``runner`` names the model; ``engine`` counts (our engine loop, or a peer engine's
    frontend, whose ``stats`` are its last metrics).  ``engine_name`` and
    ``unsupported_directives`` describe a peer engine (``engines/``)."""

    def __init__(
        self,
        settings: WorkerSettings,
        runner: HasModelInfo,
        engine: HasStats,
        grpc_address: str,
        http_address: str,
        *,
        engine_name: str = "clairvoyant",
        unsupported_directives: tuple[str, ...] = (),
        block_size: int | None = None,
    ) -> None:
        self.settings = settings
        self.worker_id = settings.resolved_worker_id()
        self.runner = runner
        self.engine = engine
        self.grpc_address = grpc_address
        self.http_address = http_address
        self.engine_name = engine_name
        self.unsupported_directives = unsupported_directives
        self.block_size = block_size or settings.block_size  # the unit of the kv_blocks_* counts
        self.draining = False
        # Generate calls in progress (the gRPC edge adds and removes them): the scheduler releases
        # a placement its worker has not heard of for a while.
        self.held_requests: set[str] = set()

    def snapshot(self) -> worker_pb2.WorkerStats:
        stats = self.engine.stats()
        speed = stats.decode_speed
        return worker_pb2.WorkerStats(
            worker_id=self.worker_id,
            model=self.runner.info.name,
            grpc_address=self.grpc_address,
            http_address=self.http_address,
            running=stats.running,
            queued=stats.waiting,
            max_batch=stats.max_num_seqs,
            kv_blocks_used=stats.kv_blocks_used,
            kv_blocks_total=stats.kv_blocks_total,
            kv_blocks_cached=stats.kv_blocks_cached,
            block_size=self.block_size,
            max_model_len=self.runner.info.max_model_len,
            preemptions_total=stats.preemptions_total,
            heartbeat_interval_s=self.settings.heartbeat_interval_s,
            timestamp=time.time(),
            draining=self.draining,
            held=worker_pb2.HeldRequests(request_ids=sorted(self.held_requests)),
            tiers=tier_usage(stats),
            engine=self.engine_name,
            unsupported_directives=self.unsupported_directives,
            decode_base_s=speed.base_s if speed is not None else 0.0,
            decode_per_seq_s=speed.per_seq_s if speed is not None else 0.0,
        )

    async def run(self, bus: EventBus) -> None:
        subject = worker_stats_subject(self.worker_id)
        while True:
            try:
                await bus.publish(subject, self.snapshot().SerializeToString())
            except Exception:  # a bus hiccup must not stop the heartbeat loop
                logger.exception("heartbeat publish failed")
            await asyncio.sleep(self.settings.heartbeat_interval_s)
