"""Two whole workers (``WorkerApp``, tiny-random) sharing one L3 store: what worker A computed,
worker B serves from L3, with the tokens a worker computing from scratch produces."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

import pytest

from clairvoyant.contracts.v1 import cachemgr_pb2, common_pb2, worker_pb2, worker_pb2_grpc
from clairvoyant.core.blockhash import chain_hashes
from clairvoyant.core.grpcutil import channel
from clairvoyant.worker.app import WorkerApp
from clairvoyant.worker.config import WorkerSettings
from clairvoyant.worker.core.l3 import page_key
from clairvoyant.worker.l3 import open_l3
from tests.worker.l3.conftest import file_url, mooncake_available, mooncake_master, mooncake_url, redis_url

__all__ = ["file_url", "mooncake_available", "mooncake_master", "mooncake_url", "redis_url"]  # L3 test fixtures

pytestmark = [pytest.mark.integration, pytest.mark.timeout(180)]
BS = 16
PREFIX = [(13 * i + 5) % 250 + 1 for i in range(124 * BS)]  # 1,984 tokens: 124 whole blocks
SUFFIX_A = [(3 * i + 1) % 250 + 1 for i in range(30)]
SUFFIX_B = [(5 * i + 2) % 250 + 1 for i in range(40)]


@pytest.fixture(params=["file", "redis", "mooncake"])
def l3_url(request: pytest.FixtureRequest) -> str:
    """Each shared backend in turn, from the L3 tests' fixtures (``memory://`` is not shared)."""
    url: str = request.getfixturevalue(f"{request.param}_url")
    return url


@asynccontextmanager
async def worker(name: str, nats_url: str, **settings: object) -> AsyncIterator[worker_pb2_grpc.WorkerStub]:
    app = WorkerApp(
        WorkerSettings(  # type: ignore[call-arg]
            worker_id=name, model="tiny-random", runner="torch", worker_grpc_port=0, worker_http_port=0,
            num_blocks=160, block_size=BS, nats_url=nats_url, host="127.0.0.1", **settings,
        )  # fmt: skip
    )
    await app.start()
    try:
        async with channel(app.heartbeat.grpc_address) as chan:
            yield worker_pb2_grpc.WorkerStub(chan)
    finally:
        await app.stop()


async def generate(stub: worker_pb2_grpc.WorkerStub, request_id: str, ids: list[int]) -> tuple[list[int], int]:
    """The output tokens and the cached prompt tokens."""
    request = worker_pb2.GenerateRequest(
        request_id=request_id,
        token_ids=worker_pb2.TokenIds(ids=ids),
        sampling=common_pb2.SamplingParams(max_tokens=8, temperature=0.0, ignore_eos=True),
        tenant="acme",
    )
    replies = [reply async for reply in stub.Generate(request)]
    return [t for reply in replies for t in reply.token_ids], replies[-1].usage.cached_tokens


async def written(l3_url: str, tokens: list[int]) -> None:
    """Until the store holds every whole block of ``tokens`` (the writer's puts run on its L3 thread)."""
    keys = [page_key("tiny-random", "acme", h) for h in chain_hashes(tokens, 0, BS)]
    store = open_l3(l3_url)
    try:
        for _ in range(500):
            if await asyncio.to_thread(store.exists, keys) == len(keys):
                return
            await asyncio.sleep(0.01)
    finally:
        store.close()
    raise AssertionError(f"the store never held all {len(keys)} pages")


def hits(stats: worker_pb2.WorkerStats) -> dict[int, int]:
    return {tier.tier: tier.hit_tokens for tier in stats.tiers}


async def test_a_prefix_one_worker_computed_serves_another_from_l3(l3_url: str, nats_server: str) -> None:
    shared = {"l3_url": l3_url, "l3_write_policy": "write_through", "l3_prefetch_policy": "wait_complete"}
    async with worker("scratch", nats_server, host_cache_ratio=0.0) as scratch:
        expected, cached = await generate(scratch, "s", PREFIX + SUFFIX_B)
        assert cached == 0
    # A stays up while B reads: a Mooncake page lives in the memory its writer lends the store
    async with worker("shared-a", nats_server, **shared) as a:
        _, cached = await generate(a, "a", PREFIX + SUFFIX_A)
        assert cached == 0
        assert cachemgr_pb2.CACHE_TIER_L3 in hits(await a.Stats(worker_pb2.WorkerStatsRequest()))
        await written(l3_url, PREFIX + SUFFIX_A)
        async with worker("shared-b", nats_server, **shared) as b:
            tokens, cached = await generate(b, "b", PREFIX + SUFFIX_B)
            stats_b = await b.Stats(worker_pb2.WorkerStatsRequest())
    assert cached == len(PREFIX)  # the shared prefix's whole blocks, none computed on B
    assert tokens == expected
    assert hits(stats_b) == {
        cachemgr_pb2.CACHE_TIER_L1: 0, cachemgr_pb2.CACHE_TIER_L2: 0, cachemgr_pb2.CACHE_TIER_L3: len(PREFIX)
    }  # fmt: skip


async def test_a_worker_whose_l3_is_down_serves_without_it(nats_server: str, unused_port: int) -> None:
    down = f"redis://127.0.0.1:{unused_port}/0"  # nothing listens there
    async with worker("no-l3", nats_server, l3_url=down, l3_timeout_s=0.5) as stub:
        tokens, cached = await generate(stub, "x", PREFIX[:100])
        stats = await stub.Stats(worker_pb2.WorkerStatsRequest())
    assert len(tokens) == 8 and cached == 0
    assert [t.tier for t in stats.tiers] == [cachemgr_pb2.CACHE_TIER_L1, cachemgr_pb2.CACHE_TIER_L2]
