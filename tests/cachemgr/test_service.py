"""The cache manager as a service, in-process, over a real NATS with JetStream and a real gRPC server:
KV events build the index, completion records become directives a worker answers, malformed input
is counted and dropped, a restart rebuilds from new events and resumes the durable consumer, a dead
NATS leaves Stats and health serving, and a bad policy name stops the start."""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path

import grpc
import nats
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc
from nats.aio.client import Client
from nats.aio.msg import Msg
from prometheus_client import REGISTRY
from pydantic import ValidationError

from clairvoyant.cachemgr.app import CacheManagerApp
from clairvoyant.cachemgr.config import CacheManagerSettings
from clairvoyant.contracts.v1 import cachemgr_pb2, cachemgr_pb2_grpc, common_pb2, worker_pb2
from clairvoyant.core.annotations import Confidence
from clairvoyant.core.bus import COMPLETIONS_STREAM, COMPLETIONS_SUBJECT, KV_RESYNC_SUBJECT
from clairvoyant.policy import CACHE_POLICIES, PRESETS
from clairvoyant.policy.cache import BlockUse, CacheDirective, CacheView, CompletedCall
from clairvoyant.stack.natsserver import NatsServer, free_port

pytestmark = [pytest.mark.integration, pytest.mark.timeout(120)]

TRUNCATED = b"\x0a\x05ab"  # field 1, five bytes announced, two sent: no message decodes from it


class EchoPolicy:
    """Directs surely: for an annotated call, retain its prompt blocks on its worker and ask that
    worker to pre-prefill the conversation so far (prompt + output).  Handed to the app directly,
    not registered: tests that run every registered policy must not meet it."""

    def on_completion(self, call: CompletedCall, view: CacheView, now: float) -> list[CacheDirective]:
        if call.annotations is None or call.annotations.confidence is not Confidence.HIGH:
            return []
        workflow_id = call.app_metadata.workflow_id if call.app_metadata is not None else ""
        return [
            CacheDirective("retain", call.worker_id, call.tenant, workflow_id=workflow_id,
                           block_hashes=call.prompt_block_hashes, ttl_s=30.0, target_tier=1),
            CacheDirective("pre_prefill", call.worker_id, call.tenant, workflow_id=workflow_id,
                           token_ids=call.prompt_token_ids + call.output_token_ids, speculative=True),
        ]  # fmt: skip

    def on_tick(self, view: CacheView, now: float) -> list[CacheDirective]:
        return []

    def eviction_rank(self, block: BlockUse, now: float) -> float:
        return block.last_access

    def forget(self, tenant: str, workflow_id: str) -> None:
        return None


def settings(nats_url: str, **overrides: object) -> CacheManagerSettings:
    values: dict[str, object] = {
        "nats_url": nats_url,
        "cachemgr_port": 0,
        "metrics_port": 0,
        "nats_connect_timeout_s": 1.0,
        "cachemgr_fetch_timeout_s": 0.2,
        "cachemgr_retry_interval_s": 0.2,
        "cachemgr_tick_interval_s": 0.05,
        "cachemgr_directive_timeout_s": 1.0,
        "shutdown_grace_s": 0.5,
        **overrides,
    }
    return CacheManagerSettings(**values)  # type: ignore[arg-type]


async def until(condition: Callable[[], bool | Awaitable[bool]], what: str, timeout: float = 20.0) -> None:
    """Poll ``condition`` until it holds; the timeout only stops a hung test."""
    deadline = time.monotonic() + timeout
    while True:
        value = condition()
        if value if isinstance(value, bool) else await value:
            return
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        await asyncio.sleep(0.05)


def sample(name: str, **labels: str) -> float:
    return REGISTRY.get_sample_value(name, labels) or 0.0


class Running:
    """A started CacheManagerApp and a gRPC stub on it."""

    def __init__(self, app: CacheManagerApp) -> None:
        self.app = app
        self.channel = grpc.aio.insecure_channel(f"127.0.0.1:{app.port}")
        self.stub = cachemgr_pb2_grpc.CacheManagerStub(self.channel)

    async def stats(self) -> cachemgr_pb2.CacheStats:
        return await self.stub.Stats(cachemgr_pb2.CacheStatsRequest(), timeout=5)

    async def ready(self) -> None:
        """Connected, subscribed and bound to its durable consumer."""
        await until(lambda: self.app.bus.connected and self.app.consumer.bound, "the consumer to bind")

    async def stop(self) -> None:
        await self.channel.close()
        await self.app.stop()


Start = Callable[..., Awaitable[Running]]


@pytest.fixture
async def start() -> AsyncIterator[Start]:
    started: list[Running] = []

    async def make(config: CacheManagerSettings, *, wait: bool = True) -> Running:
        app = CacheManagerApp(config, policy=EchoPolicy())
        await app.start()
        running = Running(app)
        started.append(running)
        if wait:
            await running.ready()
        return running

    yield make
    for running in reversed(started):
        await running.stop()


@pytest.fixture
async def nc(nats_url: str) -> AsyncIterator[Client]:
    client = await nats.connect(nats_url)
    await client.jetstream().add_stream(name=COMPLETIONS_STREAM, subjects=[COMPLETIONS_SUBJECT])
    yield client
    await client.close()


def kv_batch(worker_id: str, sequence: int, *events: worker_pb2.KvEvent) -> bytes:
    batch = worker_pb2.KvEventBatch(
        worker_id=worker_id, model="m", block_size=16, sequence=sequence, timestamp=time.time(), events=events
    )
    return batch.SerializeToString()


def stored(tier: cachemgr_pb2.CacheTier, hashes: list[int], tenant: str = "acme") -> worker_pb2.KvEvent:
    return worker_pb2.KvEvent(
        kind=worker_pb2.KvEvent.STORED, tier=tier, tenant=tenant, block_hashes=hashes,
        lineage=cachemgr_pb2.LineageSelector(tenant=tenant, workflow_id="wf-1", agent_id="a", request_id="r0"),
    )  # fmt: skip


def cleared(tier: cachemgr_pb2.CacheTier) -> worker_pb2.KvEvent:
    return worker_pb2.KvEvent(kind=worker_pb2.KvEvent.CLEARED, tier=tier)


def heartbeat(worker_id: str, interval_s: float = 1.0, unsupported: tuple[str, ...] = ()) -> bytes:
    stats = worker_pb2.WorkerStats(
        worker_id=worker_id, model="m", heartbeat_interval_s=interval_s, kv_blocks_used=5, kv_blocks_total=64,
        unsupported_directives=unsupported,
        tiers=[
            worker_pb2.TierUsage(tier=cachemgr_pb2.CACHE_TIER_L1, blocks_used=5, blocks_total=64, hit_tokens=32),
            worker_pb2.TierUsage(tier=cachemgr_pb2.CACHE_TIER_L2, blocks_used=2, blocks_total=256, hit_tokens=16),
        ],
    )  # fmt: skip
    return stats.SerializeToString()


def record(request_id: str, worker_id: str = "w1", *, annotated: bool = True) -> bytes:
    now = time.time()
    msg = common_pb2.CompletionRecord(
        request_id=request_id, tenant="acme", model="m", worker_id=worker_id, prompt_tokens=40,
        output_tokens=3, status=common_pb2.REQUEST_STATUS_OK,
        timing=common_pb2.Timing(arrival_time=now - 1.0, end_time=now),
        app_metadata=common_pb2.AppMetadata(workflow_type_id="coding", workflow_id="wf-1", agent_id="planner"),
        prompt_block_hashes=[11, 12], prompt_token_ids=list(range(40)), output_token_ids=[7, 8, 9],
    )  # fmt: skip
    if annotated:
        msg.annotations.CopyFrom(common_pb2.SysAnnotations(confidence=common_pb2.CONFIDENCE_HIGH))
    return msg.SerializeToString()


class FakeWorker:
    """Takes directive batches on a worker's subject and answers ``applied`` (``refuse``: 0)."""

    def __init__(self, refuse: bool = False) -> None:
        self.refuse = refuse
        self.batches: list[worker_pb2.ApplyDirectivesRequest] = []

    async def handle(self, msg: Msg) -> None:
        request = worker_pb2.ApplyDirectivesRequest.FromString(msg.data)
        self.batches.append(request)
        applied = 0 if self.refuse else len(request.directives)
        await msg.respond(worker_pb2.ApplyDirectivesResponse(applied=applied).SerializeToString())


async def test_kv_events_and_heartbeats_build_the_index_and_tiers(
    nats_url: str, nc: Client, start: Start
) -> None:
    service = await start(settings(nats_url))
    await nc.publish("cv.kv.events.w1", kv_batch("w1", 0, cleared(cachemgr_pb2.CACHE_TIER_L1),
                                                  stored(cachemgr_pb2.CACHE_TIER_L1, [1, 2, 3])))  # fmt: skip
    await nc.publish("cv.kv.events.w1", kv_batch("w1", 1, stored(cachemgr_pb2.CACHE_TIER_L3, [3, 4])))
    await nc.publish("cv.workers.w1.stats", heartbeat("w1"))
    await until(lambda: service.app.core.stats().events_seen == 3, "three events applied")
    stats = await service.stats()
    assert (stats.indexed_blocks, stats.events_seen, stats.workers, stats.policy) == (4, 3, 1, "EchoPolicy")
    tiers = {t.tier: (t.blocks_used, t.blocks_total, t.hits) for t in stats.tiers}
    assert tiers[cachemgr_pb2.CACHE_TIER_L1] == (5, 64, 32)  # from the heartbeat
    assert tiers[cachemgr_pb2.CACHE_TIER_L2] == (2, 256, 16)
    assert tiers[cachemgr_pb2.CACHE_TIER_L3][0] == 2  # blocks the index holds in shared storage

    removed = worker_pb2.KvEvent(kind=worker_pb2.KvEvent.REMOVED, tier=cachemgr_pb2.CACHE_TIER_L1,
                                 tenant="acme", block_hashes=[1, 2])  # fmt: skip
    await nc.publish("cv.kv.events.w1", kv_batch("w1", 2, removed))
    await until(lambda: service.app.core.stats().events_seen == 4, "the removal applied")
    assert (await service.stats()).indexed_blocks == 2  # 3 (L1 and L3) and 4 (L3)


async def test_an_annotated_record_becomes_directives_a_worker_applies(
    nats_url: str, nc: Client, start: Start
) -> None:
    worker = FakeWorker()
    await nc.subscribe("cv.cache.directives.w1", cb=worker.handle)
    service = await start(settings(nats_url))
    applied = sample("cv_cachemgr_directive_batches_total", outcome="applied")
    retains = sample("cv_cachemgr_directives_total", kind="retain")
    js = nc.jetstream()
    await js.publish(COMPLETIONS_SUBJECT, record("r1", annotated=False))  # nothing to act on
    await js.publish(COMPLETIONS_SUBJECT, record("r2"))
    await until(lambda: len(worker.batches) == 1, "one batch of directives")
    [batch] = worker.batches
    retain, pre_prefill = batch.directives
    assert retain.kind == cachemgr_pb2.DIRECTIVE_KIND_RETAIN
    assert (retain.lineage.tenant, retain.lineage.workflow_id, retain.worker_id) == ("acme", "wf-1", "w1")
    assert list(retain.block_hashes) == ["11", "12"]  # decimal strings
    assert retain.HasField("ttl_s") and retain.ttl_s == 30.0
    assert retain.target_tier == cachemgr_pb2.CACHE_TIER_L1
    assert pre_prefill.kind == cachemgr_pb2.DIRECTIVE_KIND_PRE_PREFILL
    assert list(pre_prefill.token_ids) == [*range(40), 7, 8, 9]  # the prompt, then the output
    assert not pre_prefill.HasField("ttl_s")

    stats = await service.stats()
    assert (stats.completions_seen, stats.directives_issued, stats.live_workflows) == (2, 2, 1)
    assert stats.history_bytes > 0
    await until(lambda: sample("cv_cachemgr_directive_batches_total", outcome="applied") == applied + 1,
                "the answer counted")  # fmt: skip
    assert sample("cv_cachemgr_directives_total", kind="retain") == retains + 1
    plan = await service.stub.Plan(cachemgr_pb2.PlanRequest(worker_id="w1"), timeout=5)
    assert [d.kind for d in plan.directives] == [cachemgr_pb2.DIRECTIVE_KIND_RETAIN,
                                                 cachemgr_pb2.DIRECTIVE_KIND_PRE_PREFILL]  # fmt: skip
    assert not (await service.stub.Plan(cachemgr_pb2.PlanRequest(worker_id="w2"), timeout=5)).directives


async def test_directives_a_workers_engine_cannot_apply_are_not_sent(nats_url: str, nc: Client, start: Start) -> None:
    """A worker over vLLM lists retain among its unsupported directives: it gets the pre_prefill only."""
    worker = FakeWorker()
    await nc.subscribe("cv.cache.directives.w1", cb=worker.handle)
    service = await start(settings(nats_url))
    withheld = sample("cv_cachemgr_directives_unsupported_total", kind="retain")
    await nc.publish("cv.workers.w1.stats", heartbeat("w1", unsupported=("drop", "retain", "write_back", "promote")))
    await until(lambda: "w1" in service.app.dispatcher.unsupported, "the heartbeat read")
    await nc.jetstream().publish(COMPLETIONS_SUBJECT, record("r2"))
    await until(lambda: len(worker.batches) == 1, "one batch of directives")
    assert [d.kind for d in worker.batches[0].directives] == [cachemgr_pb2.DIRECTIVE_KIND_PRE_PREFILL]
    assert sample("cv_cachemgr_directives_unsupported_total", kind="retain") == withheld + 1
    assert (await service.stats()).directives_issued == 2  # both decided, one withheld


async def test_a_refused_or_unanswered_batch_is_counted_and_not_retried(
    nats_url: str, nc: Client, start: Start
) -> None:
    refusing = FakeWorker(refuse=True)
    await nc.subscribe("cv.cache.directives.w1", cb=refusing.handle)
    service = await start(settings(nats_url, cachemgr_directive_timeout_s=0.3))
    refused = sample("cv_cachemgr_directive_batches_total", outcome="refused")
    unanswered = sample("cv_cachemgr_directive_batches_total", outcome="unanswered")
    js = nc.jetstream()
    await js.publish(COMPLETIONS_SUBJECT, record("r1", worker_id="w1"))
    await js.publish(COMPLETIONS_SUBJECT, record("r2", worker_id="w-nobody"))  # no worker listens
    await until(lambda: sample("cv_cachemgr_directive_batches_total", outcome="refused") == refused + 1
                and sample("cv_cachemgr_directive_batches_total", outcome="unanswered") == unanswered + 1,
                "both outcomes counted")  # fmt: skip
    await asyncio.sleep(0.5)
    assert len(refusing.batches) == 1  # sent once
    assert (await service.stats()).directives_issued == 4


async def test_malformed_input_on_every_source_is_counted_and_dropped(
    nats_url: str, nc: Client, start: Start
) -> None:
    service = await start(settings(nats_url))
    before = {
        s: sample("cv_cachemgr_malformed_total", source=s)
        for s in ("completions", "kv_events", "worker_stats")
    }
    await nc.publish("cv.kv.events.w1", TRUNCATED)
    await nc.publish("cv.kv.events.w1", kv_batch("", 0))  # decodes, but names no worker
    await nc.publish("cv.workers.w1.stats", TRUNCATED)
    await nc.jetstream().publish(COMPLETIONS_SUBJECT, TRUNCATED)
    await until(lambda: service.app.core.stats().malformed_dropped == 4, "four malformed messages")
    after = {s: sample("cv_cachemgr_malformed_total", source=s) for s in before}
    assert {s: after[s] - before[s] for s in before} == {"completions": 1, "kv_events": 2, "worker_stats": 1}

    # Still working: the next good message of each kind is used.
    await nc.publish("cv.kv.events.w1", kv_batch("w1", 0, stored(cachemgr_pb2.CACHE_TIER_L1, [5, 6])))
    await nc.publish("cv.workers.w1.stats", heartbeat("w1"))
    await nc.jetstream().publish(COMPLETIONS_SUBJECT, record("r1", annotated=False))
    await until(lambda: service.app.core.stats().completions_seen == 1, "the good record")
    stats = await service.stats()
    assert (stats.malformed_dropped, stats.indexed_blocks, stats.workers) == (4, 2, 1)
    # The malformed record was acked: a new consumer on the stream has nothing pending.
    info = await nc.jetstream().consumer_info(COMPLETIONS_STREAM, "cachemgr")
    assert (info.num_pending, info.num_ack_pending) == (0, 0)


async def test_a_silent_worker_is_forgotten(nats_url: str, nc: Client, start: Start) -> None:
    service = await start(settings(nats_url))
    await nc.publish("cv.kv.events.w1", kv_batch("w1", 0, stored(cachemgr_pb2.CACHE_TIER_L1, [1, 2])))
    await nc.publish("cv.workers.w1.stats", heartbeat("w1", interval_s=0.1))
    await until(lambda: service.app.core.stats().indexed_blocks == 2, "the blocks indexed")
    await until(lambda: service.app.core.stats().workers == 0, "w1 forgotten after 3 x 0.1 s of silence")
    assert (await service.stats()).indexed_blocks == 0


async def test_a_restart_asks_the_workers_for_their_tiers_and_resumes_the_durable_consumer(
    nats_url: str, nc: Client, start: Start
) -> None:
    resyncs: list[float] = []

    async def worker_answers_resync(_msg: Msg) -> None:  # as a worker does: CLEARED, then what it holds
        resyncs.append(time.monotonic())
        await nc.publish("cv.kv.events.w1", kv_batch("w1", 0, cleared(cachemgr_pb2.CACHE_TIER_L1),
                                                      stored(cachemgr_pb2.CACHE_TIER_L1, [1, 2, 3])))  # fmt: skip

    await nc.subscribe(KV_RESYNC_SUBJECT, cb=worker_answers_resync)
    first = await start(settings(nats_url))
    js = nc.jetstream()
    await js.publish(COMPLETIONS_SUBJECT, record("r1", annotated=False))
    await until(lambda: first.app.core.stats().completions_seen == 1, "the first record")
    await until(lambda: first.app.core.stats().indexed_blocks == 3, "the first snapshot")
    await first.stop()

    await js.publish(COMPLETIONS_SUBJECT, record("r2", annotated=False))  # while nobody consumes
    second = await start(settings(nats_url))
    await until(lambda: second.app.core.stats().completions_seen == 1, "the record published while down")
    # Nothing carried over, and no new block was stored: the index comes back from the snapshot.
    await until(lambda: second.app.core.stats().indexed_blocks == 3, "the index rebuilt")
    await asyncio.sleep(0.5)
    assert len(resyncs) == 2  # once per start (per connect), not once per tick
    assert second.app.core.stats().completions_seen == 1  # r1 was acked by the first: not again


async def test_a_gap_in_a_workers_events_asks_that_worker_for_a_snapshot(
    nats_url: str, nc: Client, start: Start
) -> None:
    asked: list[bytes] = []

    async def record_ask(msg: Msg) -> None:
        asked.append(msg.data)

    await nc.subscribe(KV_RESYNC_SUBJECT, cb=record_ask)
    service = await start(settings(nats_url))
    await until(lambda: asked == [b""], "the start-up snapshot request to every worker")
    await nc.publish("cv.kv.events.w1", kv_batch("w1", 1, cleared(cachemgr_pb2.CACHE_TIER_L1),
                                                  stored(cachemgr_pb2.CACHE_TIER_L1, [1, 2])))  # fmt: skip
    await nc.publish("cv.kv.events.w1", kv_batch("w1", 3, stored(cachemgr_pb2.CACHE_TIER_L1, [5])))  # 2 was lost
    await until(lambda: asked == [b"", b"w1"], "a snapshot asked of w1 alone")
    assert service.app.core.stats().indexed_blocks == 0  # w1's entries are dropped until its snapshot
    await nc.publish("cv.kv.events.w1", kv_batch("w1", 4, stored(cachemgr_pb2.CACHE_TIER_L1, [6])))
    await asyncio.sleep(0.3)
    assert asked == [b"", b"w1"]  # still stale, but asked at most every few seconds
    await nc.publish("cv.kv.events.w1", kv_batch("w1", 5, cleared(cachemgr_pb2.CACHE_TIER_L1),
                                                  stored(cachemgr_pb2.CACHE_TIER_L1, [1, 2, 5, 6])))  # fmt: skip
    await until(lambda: service.app.core.stats().indexed_blocks == 4, "the index rebuilt from w1's snapshot")


async def test_without_nats_it_serves_stats_and_health_and_catches_up(tmp_path: Path, start: Start) -> None:
    port = free_port()
    service = await start(settings(f"nats://127.0.0.1:{port}", cachemgr_retry_interval_s=0.1), wait=False)
    assert (await service.stats()).policy == "EchoPolicy"
    health = health_pb2_grpc.HealthStub(service.channel)
    answer = await health.Check(
        health_pb2.HealthCheckRequest(service="clairvoyant.v1.CacheManager"), timeout=5
    )
    assert answer.status == health_pb2.HealthCheckResponse.SERVING
    assert not service.app.bus.connected
    with pytest.raises(grpc.aio.AioRpcError) as refused:  # hints come with the completion records
        await service.stub.Hint(cachemgr_pb2.HintRequest(tenant="acme"), timeout=5)
    assert refused.value.code() == grpc.StatusCode.UNIMPLEMENTED
    assert "completion records" in (refused.value.details() or "")

    server = NatsServer(tmp_path / "nats", port=port).start()
    try:
        await service.ready()  # the bus reconnected and the consumer bound, by themselves
        client = await nats.connect(server.url)
        await client.publish("cv.kv.events.w1", kv_batch("w1", 0, stored(cachemgr_pb2.CACHE_TIER_L1, [9])))
        await client.jetstream().publish(COMPLETIONS_SUBJECT, record("r1", annotated=False))
        await until(lambda: service.app.core.stats().completions_seen == 1, "the record after NATS came up")
        assert (await service.stats()).indexed_blocks == 1
        await client.close()
    finally:
        await service.stop()
        server.stop()


def test_an_unknown_policy_or_preset_is_refused_at_start() -> None:
    with pytest.raises(ValidationError, match=r"unknown cache policy 'nope'; choose one of: .*lru"):
        CacheManagerSettings(cachemgr_policy="nope")
    with pytest.raises(ValidationError, match=r"unknown preset 'nope'"):
        CacheManagerSettings(cachemgr_preset="nope")
    assert CacheManagerSettings(cachemgr_policy="lru").policy_name() == "lru"
    env = {**os.environ, "CV_CACHEMGR_POLICY": "nope", "CV_METRICS_PORT": "0", "CV_CACHEMGR_PORT": "0"}
    done = subprocess.run([sys.executable, "-m", "clairvoyant.cachemgr"], env=env, capture_output=True,
                          text=True, timeout=60)  # fmt: skip
    assert done.returncode == 1
    assert "CV_CACHEMGR_POLICY: unknown cache policy 'nope'" in done.stderr
    assert "Traceback" not in done.stderr


async def test_the_policy_is_the_presets_unless_one_is_named() -> None:
    saga = CacheManagerApp(CacheManagerSettings(cachemgr_preset="saga"))
    assert saga.policy_name == PRESETS.create("saga").cache
    assert type(saga.core.policy) is type(CACHE_POLICIES.create(saga.policy_name))
    named = CacheManagerApp(CacheManagerSettings(cachemgr_preset="saga", cachemgr_policy="lru"))
    assert (named.policy_name, named.core.stats().policy) == ("lru", "lru")
