"""SAGA's KV migration in the live scheduler service: a stolen session's placement is answered after
its KV moved from the victim worker to the thief (real gRPC scheduler, two real tiny-random workers),
and a dead victim costs at most the move's timeout."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass

import pytest
from prometheus_client import REGISTRY

from clairvoyant.contracts.v1 import (
    common_pb2,
    scheduler_pb2,
    scheduler_pb2_grpc,
    worker_pb2,
    worker_pb2_grpc,
)
from clairvoyant.core.clock import ManualClock
from clairvoyant.core.grpcutil import channel, new_server
from clairvoyant.policy.saga import SagaAffinityRouting, Steal
from clairvoyant.scheduler.core import GlobalScheduler, WorkerReport
from clairvoyant.scheduler.grpc_api import SchedulerServicer
from clairvoyant.scheduler.kv_migration import KvMover
from clairvoyant.worker.config import WorkerSettings
from clairvoyant.worker.core.engine import EngineConfig, LLMEngine
from clairvoyant.worker.engine_loop import AsyncEngine
from clairvoyant.worker.frontend import WorkerFrontend
from clairvoyant.worker.grpc_api import WorkerServicer
from clairvoyant.worker.heartbeat import Heartbeat
from clairvoyant.worker.runners.loader import load_runner

pytestmark = [pytest.mark.integration, pytest.mark.timeout(120)]
MODEL = "tiny-random"
PROMPT = [(7 * i + 3) % 200 for i in range(40)]  # 2 whole blocks of 16 + 8 tokens


@asynccontextmanager
async def worker(worker_id: str) -> AsyncIterator[tuple[str, worker_pb2_grpc.WorkerStub]]:
    """A real worker on a free port: (its address, a stub)."""
    runner = load_runner(MODEL, max_model_len=256)
    engine = AsyncEngine(LLMEngine(runner, EngineConfig(block_size=16, num_blocks=32, max_num_seqs=4)))
    engine.start()
    heartbeat = Heartbeat(
        WorkerSettings(worker_id=worker_id, block_size=16), runner, engine, "127.0.0.1:0", ""
    )
    server = new_server()
    port = server.add_insecure_port("127.0.0.1:0")
    worker_pb2_grpc.add_WorkerServicer_to_server(
        WorkerServicer(WorkerFrontend(runner, engine, worker_id), heartbeat), server
    )
    await server.start()
    try:
        async with channel(f"127.0.0.1:{port}") as chan:
            yield f"127.0.0.1:{port}", worker_pb2_grpc.WorkerStub(chan)
    finally:
        await server.stop(None)
        engine.stop()


@asynccontextmanager
async def black_hole() -> AsyncIterator[str]:
    """An address that accepts connections and never answers: a hung worker."""
    held: list[asyncio.StreamWriter] = []

    async def hold(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        held.append(writer)

    server = await asyncio.start_server(hold, "127.0.0.1", 0)
    try:
        yield f"127.0.0.1:{server.sockets[0].getsockname()[1]}"
    finally:
        for writer in held:
            writer.close()
        server.close()


@dataclass
class Scheduler:
    stub: scheduler_pb2_grpc.SchedulerStub
    core: GlobalScheduler
    clock: ManualClock


@asynccontextmanager
async def scheduler(victim: str, thief: str, timeout_s: float) -> AsyncIterator[Scheduler]:
    """saga over two workers: w0 (the victim-to-be, 2 seats) and w1 (1 seat, KV 90 % used)."""
    core = GlobalScheduler.from_preset("saga")
    clock = ManualClock()
    core.update_worker(WorkerReport("w0", MODEL, victim, max_batch=2), 0.0)
    core.update_worker(
        WorkerReport("w1", MODEL, thief, max_batch=1, kv_blocks_used=9, kv_blocks_total=10), 0.0
    )
    mover = KvMover(timeout_s)
    server = new_server()
    port = server.add_insecure_port("127.0.0.1:0")
    scheduler_pb2_grpc.add_SchedulerServicer_to_server(SchedulerServicer(core, clock, kv_mover=mover), server)
    await server.start()
    try:
        async with channel(f"127.0.0.1:{port}") as chan:
            yield Scheduler(scheduler_pb2_grpc.SchedulerStub(chan), core, clock)
    finally:
        await server.stop(None)
        await mover.close()


def call(request_id: str, session: str) -> scheduler_pb2.ScheduleRequest:
    meta = common_pb2.AppMetadata(workflow_type_id="wf", workflow_id=session, agent_id="a")
    return scheduler_pb2.ScheduleRequest(request_id=request_id, tenant="t", model=MODEL, app_metadata=meta)


def generate(request_id: str) -> worker_pb2.GenerateRequest:
    return worker_pb2.GenerateRequest(
        request_id=request_id,
        token_ids=worker_pb2.TokenIds(ids=PROMPT),
        sampling=common_pb2.SamplingParams(max_tokens=4, temperature=0.0, ignore_eos=True),
        tenant="t",
        app_metadata=common_pb2.AppMetadata(workflow_type_id="wf", workflow_id="A", agent_id="a"),
    )


async def cached_tokens(stub: worker_pb2_grpc.WorkerStub, request_id: str) -> int:
    replies = [reply async for reply in stub.Generate(generate(request_id))]
    return replies[-1].usage.cached_tokens


def moves(outcome: str) -> float:
    return REGISTRY.get_sample_value("cv_scheduler_kv_migrations_total", {"outcome": outcome}) or 0.0


async def steal_a(sched: Scheduler) -> asyncio.Future[scheduler_pb2.Placement]:
    """A1, B1 on w0 and E1 on w1; A2 and B2 wait for w0; at 0.11 s w1 steals A (A2 is the oldest).
    Returns A2's pending Schedule call."""
    placed = [await sched.stub.Schedule(call(rid, s)) for rid, s in [("a1", "A"), ("b1", "B"), ("e1", "E")]]
    assert [p.worker_id for p in placed] == ["w0", "w0", "w1"]
    waiting = []
    for rid, session, at in [("a2", "A", 0.01), ("b2", "B", 0.02), ("a3", "A", 0.11)]:
        sched.clock.advance(at - sched.clock.now())
        waiting.append(asyncio.ensure_future(sched.stub.Schedule(call(rid, session))))
        while not sched.core.is_queued(rid):
            await asyncio.sleep(0.01)
    routing = sched.core.routing_policy
    assert isinstance(routing, SagaAffinityRouting) and routing.steals == [Steal("w1", "w0", ("t", "A"))]
    for task in waiting[1:]:
        task.cancel()  # B2 and A3 are not part of this story
    sched.clock.advance(0.09)
    assert (
        await sched.stub.Complete(scheduler_pb2.CompleteRequest(request_id="e1", worker_id="w1"))
    ).released
    return waiting[0]


async def test_the_stolen_sessions_placement_comes_after_its_kv_reached_the_thief() -> None:
    async with worker("w0") as (victim, victim_stub), worker("w1") as (thief, thief_stub):
        assert await cached_tokens(victim_stub, "on-victim") == 0  # A's prefix is now cached on w0
        async with scheduler(victim, thief, timeout_s=10.0) as sched:
            before = moves("moved")
            a2 = await steal_a(sched)
            placement = await asyncio.wait_for(a2, 10)
            assert placement.worker_id == "w1" and placement.worker_address == thief
            assert moves("moved") == before + 1
        assert await cached_tokens(thief_stub, "on-thief") == 32  # the thief hits the moved prefix


@pytest.mark.parametrize("victim_kind", ["hung", "gone"])
async def test_a_dead_victim_costs_the_timeout_at_most_and_the_call_recomputes(victim_kind: str) -> None:
    async with worker("w1") as (thief, thief_stub), black_hole() as hung:
        victim = hung if victim_kind == "hung" else "127.0.0.1:1"  # nothing listens on port 1
        async with scheduler(victim, thief, timeout_s=0.5) as sched:
            outcome = "timeout" if victim_kind == "hung" else "failed"
            before = moves(outcome)
            placement = await asyncio.wait_for(await steal_a(sched), 5)
            assert placement.worker_id == "w1"
            assert moves(outcome) == before + 1
        assert await cached_tokens(thief_stub, "on-thief") == 0
