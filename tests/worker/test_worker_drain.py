"""A draining worker hands back the requests still waiting in its engine (their Generate calls end
UNAVAILABLE, so the gateway re-places them), finishes the ones it started and refuses new ones."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator, Callable, Sequence
from dataclasses import dataclass

import grpc
import pytest
import torch

from clairvoyant.contracts.v1 import common_pb2, worker_pb2, worker_pb2_grpc
from clairvoyant.core.errors import Unavailable
from clairvoyant.core.grpc_errors import from_rpc_error
from clairvoyant.core.grpcutil import channel, new_server
from clairvoyant.worker.config import WorkerSettings
from clairvoyant.worker.core.engine import EngineConfig, LLMEngine
from clairvoyant.worker.engine_loop import AsyncEngine
from clairvoyant.worker.frontend import WorkerFrontend
from clairvoyant.worker.grpc_api import WorkerServicer
from clairvoyant.worker.heartbeat import Heartbeat
from clairvoyant.worker.runners.base import ForwardItem
from tests.worker.fakes import Collected, FakeRunner, collect, drain, letters, make_engine, request

STEP_S = 0.02  # the paced runner's step: the running request takes about a second


@pytest.mark.unit
def test_withdraw_takes_the_unstarted_waiting_requests_and_keeps_a_preempted_one() -> None:
    engine, _ = make_engine(block_size=4, num_blocks=8, enable_prefix_cache=False)
    results: dict[str, Collected] = {}
    engine.add_request(request("mid", letters(20, 1), max_tokens=8, priority=5.0))
    collect(engine.step(), results)  # mid's first token
    engine.add_request(request("low", letters(16, 2), max_tokens=2, priority=0.0))
    engine.add_request(request("high", letters(16, 3), max_tokens=2, priority=9.0))
    collect(engine.step(), results)  # high preempts mid, which has streamed a token
    assert [s.request_id for s in engine.scheduler.waiting] == ["low", "mid"]
    assert len(results["mid"].token_ids) == 1

    assert engine.withdraw_unstarted() == ["low"]
    engine.check_integrity()
    assert [s.request_id for s in engine.scheduler.waiting] == ["mid"]
    assert engine.stats().waiting == 1
    drain(engine, results)
    assert "low" not in results  # no output at all: its owner is told by the caller
    assert {rid: (len(r.token_ids), r.final.finish_reason) for rid, r in results.items()} == {
        "mid": (8, "length"),
        "high": (2, "length"),
    }
    assert engine.withdraw_unstarted() == []


class PacedRunner(FakeRunner):
    """The fake runner at ``STEP_S`` a step, so that a request stays running while others queue."""

    def forward(self, items: Sequence[ForwardItem]) -> torch.Tensor:
        time.sleep(STEP_S)
        return super().forward(items)


@dataclass
class Running:
    stub: worker_pb2_grpc.WorkerStub
    engine: AsyncEngine
    heartbeat: Heartbeat


@pytest.fixture
async def worker() -> AsyncIterator[Running]:
    runner = PacedRunner()
    engine = AsyncEngine(LLMEngine(runner, EngineConfig(block_size=16, num_blocks=64, max_num_seqs=1)))
    engine.start()
    settings = WorkerSettings(worker_id="w-drain", block_size=16, heartbeat_interval_s=0.5)
    heartbeat = Heartbeat(settings, runner, engine, "127.0.0.1:0", "")
    server = new_server()
    port = server.add_insecure_port("127.0.0.1:0")
    servicer = WorkerServicer(WorkerFrontend(runner, engine, "w-drain"), heartbeat)
    worker_pb2_grpc.add_WorkerServicer_to_server(servicer, server)
    await server.start()
    async with channel(f"127.0.0.1:{port}") as chan:
        yield Running(worker_pb2_grpc.WorkerStub(chan), engine, heartbeat)
    await server.stop(None)
    engine.stop()


def chat(name: str, max_tokens: int) -> worker_pb2.GenerateRequest:
    return worker_pb2.GenerateRequest(
        request_id=name,
        chat=worker_pb2.ChatMessages(messages=[common_pb2.ChatMessage(role="user", content=f"hello {name}")]),
        sampling=common_pb2.SamplingParams(max_tokens=max_tokens, temperature=0.0, ignore_eos=True),
        tenant="acme",
    )


async def until(condition: Callable[[], bool], timeout_s: float = 10.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not condition():
        assert time.monotonic() < deadline, "condition not met in time"
        await asyncio.sleep(0.005)


async def refused(call: grpc.aio.UnaryStreamCall[worker_pb2.GenerateRequest, worker_pb2.GenerateResponse]) -> str:
    """The message of a Generate call that ends UNAVAILABLE with no reply (``Unavailable``)."""
    with pytest.raises(grpc.aio.AioRpcError) as info:
        replies = [reply async for reply in call]
        raise AssertionError(f"answered {len(replies)} messages")
    assert info.value.code() == grpc.StatusCode.UNAVAILABLE
    err = from_rpc_error(info.value)
    assert isinstance(err, Unavailable)
    return err.message


@pytest.mark.integration
@pytest.mark.timeout(60)
async def test_drain_hands_back_the_waiting_requests_and_finishes_the_running_one(worker: Running) -> None:
    started = worker.stub.Generate(chat("started", 40))
    first = await started.read()
    assert first.token_ids  # it runs; with a batch of one, the next two wait behind it
    waiting = [worker.stub.Generate(chat(f"waiting-{i}", 4)) for i in range(2)]
    await until(lambda: worker.engine.stats().waiting == 2)

    reply = await worker.stub.Drain(worker_pb2.WorkerDrainRequest(drain=True))
    assert reply.requeued == 2
    for call in waiting:
        assert await refused(call) == "worker w-drain is draining; re-place the request"
    stats = await worker.stub.Stats(worker_pb2.WorkerStatsRequest())
    assert stats.draining and (stats.running, stats.queued) == (1, 0)
    assert list(stats.held.request_ids) == ["started"]

    assert await refused(worker.stub.Generate(chat("late", 4))) == "worker w-drain is draining; re-place the request"

    rest: list[worker_pb2.GenerateResponse] = []
    while (message := await started.read()) is not grpc.aio.EOF:
        assert isinstance(message, worker_pb2.GenerateResponse)
        rest.append(message)
    assert len(first.token_ids) + sum(len(r.token_ids) for r in rest) == 40
    assert rest[-1].finish_reason == "length" and rest[-1].usage.completion_tokens == 40
    stats = await worker.stub.Stats(worker_pb2.WorkerStatsRequest())
    assert (stats.running, stats.queued, list(stats.held.request_ids)) == (0, 0, [])
    assert (await worker.stub.Drain(worker_pb2.WorkerDrainRequest(drain=True))).requeued == 0


@pytest.mark.integration
@pytest.mark.timeout(60)
async def test_drain_false_takes_work_again(worker: Running) -> None:
    await worker.stub.Drain(worker_pb2.WorkerDrainRequest(drain=True))
    assert worker.heartbeat.snapshot().draining
    assert await refused(worker.stub.Generate(chat("refused", 3)))

    reply = await worker.stub.Drain(worker_pb2.WorkerDrainRequest(drain=False))
    assert reply.requeued == 0
    assert not (await worker.stub.Stats(worker_pb2.WorkerStatsRequest())).draining
    replies = [reply async for reply in worker.stub.Generate(chat("served", 3))]
    assert sum(len(r.token_ids) for r in replies) == 3 and replies[-1].finish_reason == "length"
