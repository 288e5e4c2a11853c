"""KV events over real NATS steer the scheduler's cache-aware routing (the sglang-gw preset)."""

from __future__ import annotations

import asyncio

import nats
import pytest
from opentelemetry.sdk.trace import TracerProvider
from prometheus_client import REGISTRY

from clairvoyant.contracts.v1 import cachemgr_pb2, scheduler_pb2, scheduler_pb2_grpc, worker_pb2
from clairvoyant.core.blockhash import BLOCK_TOKENS, chain_hashes
from clairvoyant.core.grpcutil import channel
from clairvoyant.scheduler.config import SchedulerSettings
from clairvoyant.scheduler.core import KvTier
from tests.scheduler.test_service_integration import MODEL, beat, eventually, running

pytestmark = pytest.mark.integration

PROMPT = chain_hashes(list(range(8 * BLOCK_TOKENS)))
L1 = cachemgr_pb2.CACHE_TIER_L1


def kv_batch(worker_id: str, sequence: int, stored: list[int], *, clear: bool = False) -> bytes:
    events = [worker_pb2.KvEvent(kind=worker_pb2.KvEvent.CLEARED, tier=L1)] if clear else []
    events.append(
        worker_pb2.KvEvent(kind=worker_pb2.KvEvent.STORED, tier=L1, tenant="t", block_hashes=stored)
    )
    msg = worker_pb2.KvEventBatch(worker_id=worker_id, model=MODEL, block_size=BLOCK_TOKENS, sequence=sequence,
                                  events=events)  # fmt: skip
    return msg.SerializeToString()


def dropped(reason: str) -> float:
    value = REGISTRY.get_sample_value("cv_scheduler_kv_event_batches_dropped_total", {"reason": reason})
    return value or 0.0


def prompt_request(request_id: str) -> scheduler_pb2.ScheduleRequest:
    return scheduler_pb2.ScheduleRequest(
        request_id=request_id, tenant="t", model=MODEL, max_tokens=8, prompt_tokens=len(PROMPT) * BLOCK_TOKENS,
        prompt_block_hashes=PROMPT,
    )  # fmt: skip


async def test_routing_follows_the_longest_prefix_the_workers_report(
    nats_server: str, unused_tcp_port: int
) -> None:
    settings = SchedulerSettings(
        nats_url=nats_server, scheduler_port=unused_tcp_port, metrics_port=0, policy="sglang-gw",
        kv_speculative_ttl_s=0.0,  # only what the events say
    )  # fmt: skip
    heartbeats = asyncio.create_task(beat(nats_server, ["w1", "w2"], interval_s=0.2))
    nc = await nats.connect(nats_server)
    undecodable_before = dropped("undecodable")
    try:
        async with running(settings, TracerProvider()) as app, channel(f"127.0.0.1:{app.port}") as chan:
            stub = scheduler_pb2_grpc.SchedulerStub(chan)

            async def workers_known() -> bool:
                return len((await stub.Snapshot(scheduler_pb2.SnapshotRequest())).workers) == 2

            await eventually(workers_known)
            index = app.core.kv_index

            async def subscribed() -> bool:  # the bus subscribes once it has connected
                await nc.publish("cv.kv.events.w1", kv_batch("w1", 1, PROMPT[:2], clear=True))
                await nc.flush()
                await asyncio.sleep(0.05)
                return index.holds("w1", KvTier.L1, "t", PROMPT[1])

            await eventually(subscribed)
            await nc.publish("cv.kv.events.w2", b"\xff not a batch")
            await nc.publish("cv.kv.events.w2", kv_batch("w2", 1, PROMPT[:6], clear=True))
            await nc.flush()

            async def w2_indexed() -> bool:
                return index.holds("w2", KvTier.L1, "t", PROMPT[5])

            await eventually(w2_indexed)
            assert dropped("undecodable") == undecodable_before + 1

            # w1 would win without the events (the smallest tree, then the smaller id).
            first = await stub.Schedule(prompt_request("r1"), timeout=5)
            assert first.worker_id == "w2"  # 6 of 8 blocks beat 2 of 8

            # A lost batch makes w2's index stale: w1, now holding 4 blocks, is the best match.
            await nc.publish("cv.kv.events.w2", kv_batch("w2", 3, PROMPT))
            await nc.publish("cv.kv.events.w1", kv_batch("w1", 2, PROMPT[2:4]))
            await nc.flush()

            async def w2_stale() -> bool:
                return index.is_stale("w2") and index.holds("w1", KvTier.L1, "t", PROMPT[3])

            await eventually(w2_stale)
            second = await stub.Schedule(prompt_request("r2"), timeout=5)
            assert second.worker_id == "w1"
    finally:
        heartbeats.cancel()
        await nc.close()
