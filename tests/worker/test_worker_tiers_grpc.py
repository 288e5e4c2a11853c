"""A worker with KV tiers (tiny-random, L2 and an in-process L3) over a real grpc.aio server and a
real NATS server: cache directives over gRPC and NATS change what the engine holds, the KV events
on NATS rebuild the engine's per-tier block sets, and Stats reports the tiers with their hits."""

from __future__ import annotations

import asyncio
import random
import threading
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field

import grpc
import nats
import pytest
from nats.aio.client import Client
from nats.aio.msg import Msg
from prometheus_client import REGISTRY

from clairvoyant.contracts.v1 import cachemgr_pb2, common_pb2, worker_pb2, worker_pb2_grpc
from clairvoyant.core.bus import KV_RESYNC_SUBJECT, EventBus
from clairvoyant.core.grpcutil import channel, new_server
from clairvoyant.worker.app import engine_config
from clairvoyant.worker.config import WorkerSettings
from clairvoyant.worker.core.engine import EngineConfig, EngineRequest, LLMEngine, RequestOutput
from clairvoyant.worker.core.l3 import MemoryL3, page_key
from clairvoyant.worker.core.sampling import SamplingParams
from clairvoyant.worker.core.tiers import TierConfig
from clairvoyant.worker.core.types import Lineage
from clairvoyant.worker.directives import DirectiveSubscriber, directives_subject
from clairvoyant.worker.engine_loop import STALL_WAIT_S, AsyncEngine
from clairvoyant.worker.frontend import WorkerFrontend
from clairvoyant.worker.grpc_api import WorkerServicer
from clairvoyant.worker.heartbeat import Heartbeat
from clairvoyant.worker.kv_events import KvEventPublisher, kv_events_subject
from clairvoyant.worker.runners.loader import load_runner

pytestmark = [pytest.mark.integration, pytest.mark.timeout(120)]
BS = 16
WORKER_ID = "w-tiers"
Block = tuple[str, int]  # (tenant, block hash)


@dataclass
class Worker:
    stub: worker_pb2_grpc.WorkerStub
    engine: AsyncEngine
    store: MemoryL3
    publisher: KvEventPublisher
    nc: Client  # a plain NATS client: the cache manager's side
    batches: list[worker_pb2.KvEventBatch] = field(default_factory=list)

    async def on_engine(self, fn: Callable[[LLMEngine], object]) -> object:
        return await self.engine.call(fn)

    async def settled(self) -> None:
        """Until the engine has no work and no transfers, and every batch has arrived."""
        for _ in range(400):
            busy = await self.engine.call(lambda e: e.has_unfinished() or e.has_pending_transfers())
            last = self.batches[-1].sequence if self.batches else 0
            if not busy and last == self.publisher.last_sequence:
                return
            await asyncio.sleep(0.01)
        raise AssertionError("the worker did not settle")


@pytest.fixture
async def worker(nats_server: str) -> AsyncIterator[Worker]:
    runner = load_runner("tiny-random", max_model_len=512)
    store = MemoryL3()
    executor = ThreadPoolExecutor(1, thread_name_prefix="kv-l3")
    tiers = TierConfig(num_host_blocks=24, write_policy="write_back", prefetch_threshold_tokens=BS)
    config = EngineConfig(block_size=BS, num_blocks=16, max_num_seqs=4, tiers=tiers)
    publisher = KvEventPublisher(WORKER_ID, runner.info.name, BS)
    engine = AsyncEngine(
        LLMEngine(runner, config, l3=store, executor=executor, kv_events=True), on_kv_events=publisher.submit
    )
    engine.start()
    settings = WorkerSettings(worker_id=WORKER_ID, block_size=BS)
    server = new_server()
    port = server.add_insecure_port("127.0.0.1:0")
    heartbeat = Heartbeat(settings, runner, engine, "127.0.0.1:0", "")
    frontend = WorkerFrontend(runner, engine, WORKER_ID)
    worker_pb2_grpc.add_WorkerServicer_to_server(WorkerServicer(frontend, heartbeat), server)
    await server.start()
    bus = EventBus(nats_server, "worker-tiers-test", connect_timeout_s=2.0)
    assert await bus.connect(), f"the test NATS server at {nats_server} is down"
    await DirectiveSubscriber(frontend.apply_directives, WORKER_ID).subscribe(bus)
    await publisher.resync_on_request(bus, engine)
    nc = await nats.connect(nats_server)
    batches: list[worker_pb2.KvEventBatch] = []

    async def collect(msg: Msg) -> None:
        batches.append(worker_pb2.KvEventBatch.FromString(msg.data))

    await nc.subscribe(kv_events_subject(WORKER_ID), cb=collect)
    await nc.flush()
    publishing = asyncio.create_task(publisher.run(bus))
    try:
        async with channel(f"127.0.0.1:{port}") as chan:
            yield Worker(worker_pb2_grpc.WorkerStub(chan), engine, store, publisher, nc, batches)
    finally:
        publishing.cancel()
        await nc.close()
        await bus.close()
        await server.stop(None)
        engine.stop()
        executor.shutdown(cancel_futures=True)


def prompt(seed: int, length: int) -> list[int]:
    return [(seed * 131 + 7 * i) % 250 + 1 for i in range(length)]


async def generate(w: Worker, request_id: str, ids: list[int], workflow: str, tenant: str = "acme") -> int:
    """Runs the request; its cached prompt tokens."""
    request = worker_pb2.GenerateRequest(
        request_id=request_id,
        token_ids=worker_pb2.TokenIds(ids=ids),
        sampling=common_pb2.SamplingParams(max_tokens=4, temperature=0.0, ignore_eos=True),
        tenant=tenant,
        app_metadata=common_pb2.AppMetadata(workflow_type_id="t", workflow_id=workflow, agent_id="a"),
    )
    replies = [reply async for reply in w.stub.Generate(request)]
    return replies[-1].usage.cached_tokens


def directive(kind: int, tenant: str = "acme", workflow: str = "", **fields: object) -> cachemgr_pb2.CacheDirective:
    lineage = cachemgr_pb2.LineageSelector(tenant=tenant, workflow_id=workflow)
    return cachemgr_pb2.CacheDirective(kind=kind, lineage=lineage, **fields)  # type: ignore[arg-type]


def apply(w: Worker, *directives: cachemgr_pb2.CacheDirective) -> Awaitable[worker_pb2.ApplyDirectivesResponse]:
    return w.stub.ApplyDirectives(worker_pb2.ApplyDirectivesRequest(directives=directives))


def l1_blocks(engine: LLMEngine, workflow: str | None = None) -> set[Block]:
    """(tenant, hash) of the L1 prefix cache's blocks, of one workflow or all."""
    cache = engine.kv.cache
    assert cache is not None
    return {
        (ns or "", node.block_hash)
        for ns in cache.namespaces()
        for node in cache.nodes(ns)
        if workflow is None or (node.tag is not None and node.tag.lineage is not None
                                and node.tag.lineage.workflow_id == workflow)
    }  # fmt: skip


def resident(engine: LLMEngine, tier: int) -> set[Block]:
    assert engine.tiers is not None
    return {(ns or "", h) for ns, h in engine.tiers.resident(tier)}


DROP, RETAIN = cachemgr_pb2.DIRECTIVE_KIND_DROP, cachemgr_pb2.DIRECTIVE_KIND_RETAIN
WRITE_BACK, PRE_PREFILL = cachemgr_pb2.DIRECTIVE_KIND_WRITE_BACK, cachemgr_pb2.DIRECTIVE_KIND_PRE_PREFILL


async def test_drop_forgets_a_workflow_in_every_tier_and_other_tenants_are_untouched(worker: Worker) -> None:
    ids = prompt(1, 72)
    assert await generate(worker, "a1", ids, "wf-1") == 0
    assert await generate(worker, "a2", ids, "wf-1") == 64
    # Another tenant naming the same workflow, or acme's very block hashes, touches nothing of acme's
    hashes = [str(h) for _, h in await worker.on_engine(lambda e: l1_blocks(e, "wf-1"))]  # type: ignore[attr-defined]
    assert len(hashes) >= 4
    reply = await apply(
        worker, directive(DROP, "globex", "wf-1"), directive(DROP, "globex", block_hashes=hashes)
    )
    assert reply.applied == 2
    assert await generate(worker, "a3", ids, "wf-1") == 64
    assert (await apply(worker, directive(DROP, "acme", "wf-1"))).applied == 1
    assert await worker.on_engine(lambda e: l1_blocks(e, "wf-1") | resident(e, 2)) == set()
    assert await generate(worker, "a4", ids, "wf-1") == 0


async def test_retained_blocks_survive_pressure_that_evicts_the_others(worker: Worker) -> None:
    kept, evicted = prompt(2, 64), prompt(3, 64)
    await generate(worker, "k", kept, "wf-keep")
    await generate(worker, "e", evicted, "wf-other")
    kept_blocks = await worker.on_engine(lambda e: l1_blocks(e, "wf-keep"))
    assert (await apply(worker, directive(RETAIN, "acme", "wf-keep", ttl_s=60.0))).applied == 1
    await generate(worker, "p", prompt(4, 180), "wf-pressure")  # 12 of the 16 L1 blocks
    in_l1 = await worker.on_engine(l1_blocks)
    assert kept_blocks and kept_blocks <= in_l1  # type: ignore[operator]
    assert not await worker.on_engine(lambda e: l1_blocks(e, "wf-other"))
    stats_before = await worker.stub.Stats(worker_pb2.WorkerStatsRequest())
    assert await generate(worker, "k2", kept, "wf-keep") == 48
    stats = await worker.stub.Stats(worker_pb2.WorkerStatsRequest())
    assert stats.tiers[0].hit_tokens - stats_before.tiers[0].hit_tokens == 48  # from L1, not L2


async def test_pre_prefill_computes_a_prefix_a_later_request_hits(worker: Worker) -> None:
    ids = prompt(5, 72)
    reply = await apply(worker, directive(PRE_PREFILL, "acme", "wf-pre", token_ids=ids))
    assert reply.applied == 1
    await worker.settled()
    assert len(await worker.on_engine(lambda e: l1_blocks(e, "wf-pre"))) == 4  # type: ignore[arg-type]
    assert await generate(worker, "after", ids, "wf-pre") == 64


async def test_write_back_puts_the_workflows_pages_in_l3(worker: Worker) -> None:
    await generate(worker, "w", prompt(6, 72), "wf-wb")
    blocks = await worker.on_engine(lambda e: l1_blocks(e, "wf-wb"))
    assert len(worker.store) == 0  # write_back policy: nothing is written before L2 evicts
    assert (await apply(worker, directive(WRITE_BACK, "acme", "wf-wb"))).applied == 1
    await worker.settled()
    keys = [page_key("tiny-random", tenant, h) for tenant, h in blocks]  # type: ignore[attr-defined]
    assert len(keys) >= 4 and all(worker.store.exists([key]) == 1 for key in keys)
    assert blocks <= await worker.on_engine(lambda e: resident(e, 3))  # type: ignore[operator]


async def test_a_bad_batch_is_refused_whole_and_changes_nothing(worker: Worker) -> None:
    ids = prompt(7, 72)
    await generate(worker, "b1", ids, "wf-b")
    cases = [
        (directive(RETAIN, "acme", "wf-b"), grpc.StatusCode.INVALID_ARGUMENT, "ttl_s"),
        (cachemgr_pb2.CacheDirective(), grpc.StatusCode.INVALID_ARGUMENT, "unspecified"),
        (directive(DROP, "acme", "wf-b", worker_id="w-elsewhere"), grpc.StatusCode.INVALID_ARGUMENT, "w-elsewhere"),
        (directive(DROP, "acme", block_hashes=["0xnot-a-hash"]), grpc.StatusCode.INVALID_ARGUMENT, "hashes"),
        (directive(PRE_PREFILL, "acme", token_ids=[1, 2]), grpc.StatusCode.INVALID_ARGUMENT, "pre_prefill"),
    ]
    for bad, code, words in cases:
        with pytest.raises(grpc.aio.AioRpcError) as info:
            await apply(worker, directive(DROP, "acme", "wf-b"), bad)
        assert info.value.code() == code and "directive 1" in (info.value.details() or "")
        assert words in (info.value.details() or "")
    assert await generate(worker, "b2", ids, "wf-b") == 64  # the drop before each bad one never ran
    named = directive(DROP, "acme", "wf-b", worker_id=WORKER_ID)
    assert (await apply(worker, named)).applied == 1
    assert await generate(worker, "b3", ids, "wf-b") == 0


async def test_directives_over_nats_apply_and_malformed_ones_are_counted(worker: Worker) -> None:
    ids = prompt(8, 72)
    await generate(worker, "n1", ids, "wf-n")
    invalid = "cv_worker_directive_messages_invalid_total"
    before = REGISTRY.get_sample_value(invalid) or 0.0
    subject = directives_subject(WORKER_ID)
    await worker.nc.publish(subject, b"\xff\xff\xff")  # not a protobuf message
    other = worker_pb2.ApplyDirectivesRequest(directives=[directive(DROP, "globex", "wf-n")])
    reply = await worker.nc.request(subject, other.SerializeToString(), timeout=5)
    assert worker_pb2.ApplyDirectivesResponse.FromString(reply.data).applied == 1
    assert REGISTRY.get_sample_value(invalid) == before + 1
    assert await generate(worker, "n2", ids, "wf-n") == 64  # another tenant's drop: untouched
    refused = worker_pb2.ApplyDirectivesRequest(directives=[directive(DROP, "acme", "wf-n"), directive(RETAIN)])
    reply = await worker.nc.request(subject, refused.SerializeToString(), timeout=5)
    assert worker_pb2.ApplyDirectivesResponse.FromString(reply.data).applied == 0
    assert await generate(worker, "n3", ids, "wf-n") == 64
    drop = worker_pb2.ApplyDirectivesRequest(directives=[directive(DROP, "acme", "wf-n")])
    reply = await worker.nc.request(subject, drop.SerializeToString(), timeout=5)
    assert worker_pb2.ApplyDirectivesResponse.FromString(reply.data).applied == 1
    assert await generate(worker, "n4", ids, "wf-n") == 0


def rebuild(batches: list[worker_pb2.KvEventBatch]) -> dict[int, set[Block]]:
    """Each tier's blocks, from the events alone."""
    held: dict[int, set[Block]] = {1: set(), 2: set(), 3: set()}
    for batch in batches:
        for event in batch.events:
            blocks = {(event.tenant, h) for h in event.block_hashes}
            if event.kind == worker_pb2.KvEvent.CLEARED:
                held[event.tier].clear()
            elif event.kind == worker_pb2.KvEvent.STORED:
                held[event.tier] |= blocks
            else:
                held[event.tier] -= blocks
    return held


async def test_kv_events_rebuild_every_tier_after_a_random_workload(worker: Worker) -> None:
    rng = random.Random(11)
    shared = {wf: prompt(20 + n, 48) for n, wf in enumerate(("wf-a", "wf-b", "wf-c"))}
    for round_ in range(6):
        calls = []
        for n in range(3):
            wf = rng.choice(sorted(shared))
            ids = shared[wf] + prompt(rng.randrange(1000), rng.randrange(8, 60))
            calls.append(generate(worker, f"r{round_}-{n}", ids, wf, tenant=rng.choice(("acme", "globex"))))
        await asyncio.gather(*calls)
        if round_ == 3:
            await apply(worker, directive(DROP, "acme", "wf-a"))
    await apply(worker, directive(WRITE_BACK, "globex"))
    await worker.settled()
    stats = await worker.stub.Stats(worker_pb2.WorkerStatsRequest())
    engine_stats = worker.engine.stats()
    assert engine_stats.demoted_blocks_total > 0 and engine_stats.l3_written_blocks_total > 0
    sequences = [batch.sequence for batch in worker.batches]
    assert sequences == list(range(1, len(sequences) + 1))
    first = worker.batches[0].events
    assert [(e.kind, e.tier) for e in first] == [(worker_pb2.KvEvent.CLEARED, 1), (worker_pb2.KvEvent.CLEARED, 2)]
    held = rebuild(worker.batches)
    assert held[1] == await worker.on_engine(l1_blocks)
    assert held[2] == await worker.on_engine(lambda e: resident(e, 2))
    assert held[3] == await worker.on_engine(lambda e: resident(e, 3))
    assert held[1] and held[2] and held[3]
    assert {(t.tier, t.blocks_total) for t in stats.tiers} == {
        (cachemgr_pb2.CACHE_TIER_L1, 16), (cachemgr_pb2.CACHE_TIER_L2, 24), (cachemgr_pb2.CACHE_TIER_L3, 0)
    }


async def test_a_resync_request_gets_a_snapshot_that_alone_rebuilds_every_tier(worker: Worker) -> None:
    for n, wf in enumerate(("wf-a", "wf-b", "wf-a", "wf-c")):
        await generate(worker, f"r{n}", prompt(40 + n % 2, 48) + prompt(n, 40), wf)
    await apply(worker, directive(WRITE_BACK, "acme"))
    await worker.settled()
    before = len(worker.batches)
    await worker.nc.publish(KV_RESYNC_SUBJECT, b"another-worker")  # asked of someone else: no answer
    await worker.nc.publish(KV_RESYNC_SUBJECT, WORKER_ID.encode())
    await worker.nc.flush()
    for _ in range(200):
        if len(worker.batches) > before:
            break
        await asyncio.sleep(0.01)
    await asyncio.sleep(0.2)
    (snapshot,) = worker.batches[before:]  # one answer, numbered after the step batches
    assert snapshot.sequence == worker.batches[before - 1].sequence + 1
    held = rebuild([snapshot])  # a subscriber that starts from the snapshot alone
    assert held[1] == await worker.on_engine(l1_blocks)
    assert held[2] == await worker.on_engine(lambda e: resident(e, 2))
    assert held[3] == await worker.on_engine(lambda e: resident(e, 3))
    assert held[1] and held[3]


async def test_stats_reports_each_tiers_hits(worker: Worker) -> None:
    ids = prompt(9, 72)
    await generate(worker, "s1", ids, "wf-s")
    assert await generate(worker, "s2", ids, "wf-s") == 64  # from L1
    for n in range(2):  # push it out of L1 into L2
        await generate(worker, f"push{n}", prompt(40 + n, 180), "wf-push")
    assert await generate(worker, "s3", ids, "wf-s") == 64  # from L2
    stats = await worker.stub.Stats(worker_pb2.WorkerStatsRequest())
    hits = {t.tier: t.hit_tokens for t in stats.tiers}
    assert hits[cachemgr_pb2.CACHE_TIER_L1] >= 64 and hits[cachemgr_pb2.CACHE_TIER_L2] == 64
    assert hits[cachemgr_pb2.CACHE_TIER_L3] == 0
    l2 = next(t for t in stats.tiers if t.tier == cachemgr_pb2.CACHE_TIER_L2)
    assert 0 < l2.blocks_used <= l2.blocks_total == 24


@pytest.mark.parametrize(
    ("settings", "host_blocks"),
    [
        ({}, 2 * 64),  # the default ratio, 2 x L1
        ({"host_cache_ratio": 0.5}, 32),
        ({"host_cache_gb": 1.0}, None),  # overrides the ratio: 1 GiB of blocks
        ({"host_cache_ratio": 0.0}, 0),
        ({"enable_prefix_cache": False}, 0),  # tiers index blocks by the prefix cache
    ],
)
def test_the_host_cache_size_follows_the_settings(settings: dict[str, object], host_blocks: int | None) -> None:
    runner = load_runner("tiny-random", max_model_len=512)
    config = engine_config(WorkerSettings(num_blocks=64, block_size=BS, **settings), runner)  # type: ignore[arg-type]
    if host_blocks is None:
        host_blocks = (1 << 30) // (runner.kv_bytes_per_token() * BS)
    assert config.tiers.num_host_blocks == host_blocks


@pytest.mark.parametrize(
    ("settings", "words"),
    [
        ({"l3_url": "s3://bucket"}, "CV_L3_URL must start with"),
        ({"l3_url": "file:///tmp/l3", "host_cache_ratio": 0.0}, "needs an L2"),
        ({"l3_write_policy": "sometimes"}, "write_through"),
        ({"host_cache_ratio": -1.0}, "greater than or equal"),
    ],
)
def test_bad_tier_settings_are_refused_with_a_clear_error(settings: dict[str, object], words: str) -> None:
    with pytest.raises(ValueError, match=words):
        WorkerSettings(**settings)  # type: ignore[arg-type]


class GatedL3(MemoryL3):
    """A ``MemoryL3`` whose reads wait until the test opens the gate: a slow store."""

    def __init__(self) -> None:
        super().__init__()
        self.gate = threading.Event()

    def get(self, keys: Sequence[str]) -> list[bytes | None]:
        self.gate.wait(10)
        return super().get(keys)


async def test_a_request_waiting_on_its_l3_prefetch_does_not_spin_the_engine_thread() -> None:
    runner = load_runner("tiny-random", max_model_len=512)
    store = GatedL3()
    tiers = TierConfig(num_host_blocks=32, prefetch_policy="wait_complete", prefetch_threshold_tokens=BS)
    config = EngineConfig(block_size=BS, num_blocks=32, max_num_seqs=4, tiers=tiers)
    ids = prompt(10, 72)
    writer = LLMEngine(runner, config, l3=store)  # inline executor: the pages are there on return
    writer.add_request(EngineRequest("w", ids, SamplingParams(max_tokens=2), lineage=Lineage("acme")))
    while writer.has_unfinished():
        writer.step()
    executor = ThreadPoolExecutor(1, thread_name_prefix="kv-l3")
    core = LLMEngine(load_runner("tiny-random", max_model_len=512), config, l3=store, executor=executor)
    steps = 0
    step = core.step

    def counted() -> list[RequestOutput]:
        nonlocal steps
        steps += 1
        return step()

    core.step = counted  # type: ignore[method-assign]
    engine = AsyncEngine(core)
    engine.start()
    try:
        request = EngineRequest("r", ids, SamplingParams(max_tokens=2), lineage=Lineage("acme"))
        outputs = asyncio.create_task(collect_outputs(engine, request))
        await asyncio.sleep(0.3)
        stalled_steps = steps
        store.gate.set()
        final = (await outputs)[-1]
    finally:
        engine.stop()
        executor.shutdown(cancel_futures=True)
    assert 0 < stalled_steps <= 0.3 / STALL_WAIT_S * 1.5  # a few ms apart, not a busy loop
    assert final.cached_tokens == 64 and core.stats().hit_tokens == (0, 0, 64)


async def collect_outputs(engine: AsyncEngine, request: EngineRequest) -> list[RequestOutput]:
    return [out async for out in engine.generate(request)]
