"""A request waiting in the engine queue of a worker that is then drained completes on another
worker: the drained worker hands it back (UNAVAILABLE before its first message) and the gateway
re-places it.  Real gateway, real scheduler (an engine-queued preset), two real workers over a
paced fake runner, heartbeats over a real nats-server."""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import AsyncIterator, Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

import grpc
import httpx
import pytest
import torch

from clairvoyant.contracts.v1 import scheduler_pb2, scheduler_pb2_grpc, worker_pb2, worker_pb2_grpc
from clairvoyant.core.bus import EventBus
from clairvoyant.core.grpcutil import channel, new_server
from clairvoyant.gateway.app import GatewayApp
from clairvoyant.gateway.config import GatewaySettings
from clairvoyant.scheduler.app import SchedulerApp
from clairvoyant.scheduler.config import SchedulerSettings
from clairvoyant.worker.config import WorkerSettings
from clairvoyant.worker.core.engine import EngineConfig, LLMEngine
from clairvoyant.worker.engine_loop import AsyncEngine
from clairvoyant.worker.frontend import WorkerFrontend
from clairvoyant.worker.grpc_api import WorkerServicer
from clairvoyant.worker.heartbeat import Heartbeat
from clairvoyant.worker.runners.base import ForwardItem
from tests.worker.fakes import FakeRunner

pytestmark = [pytest.mark.integration, pytest.mark.timeout(90)]

MODEL = "fake"  # FakeRunner's model name
STEP_S = 0.03  # a step of the paced runner: the running request holds the worker for about 2 s


class PacedRunner(FakeRunner):
    def forward(self, items: Sequence[ForwardItem]) -> torch.Tensor:
        time.sleep(STEP_S)
        return super().forward(items)


@dataclass
class LiveWorker:
    """A worker with a batch of one: its gRPC server, engine thread and heartbeat."""

    worker_id: str
    engine: AsyncEngine
    server: grpc.aio.Server
    bus: EventBus
    beating: asyncio.Task[None]
    address: str

    async def stop(self) -> None:
        self.beating.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await self.beating
        await self.bus.close()
        await self.server.stop(None)
        self.engine.stop()


async def start_worker(worker_id: str, nats_url: str) -> LiveWorker:
    runner = PacedRunner()
    engine = AsyncEngine(LLMEngine(runner, EngineConfig(block_size=16, num_blocks=64, max_num_seqs=1)))
    engine.start()
    server = new_server()
    address = f"127.0.0.1:{server.add_insecure_port('127.0.0.1:0')}"
    settings = WorkerSettings(worker_id=worker_id, block_size=16, heartbeat_interval_s=0.2)
    heartbeat = Heartbeat(settings, runner, engine, address, "")
    servicer = WorkerServicer(WorkerFrontend(runner, engine, worker_id), heartbeat)
    worker_pb2_grpc.add_WorkerServicer_to_server(servicer, server)
    await server.start()
    bus = EventBus(nats_url, f"worker-{worker_id}", connect_timeout_s=1.0)
    assert await bus.connect()
    return LiveWorker(worker_id, engine, server, bus, asyncio.create_task(heartbeat.run(bus)), address)


async def until(condition: Callable[[], bool], what: str, timeout_s: float = 20.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not condition():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        await asyncio.sleep(0.01)


@dataclass
class Cluster:
    scheduler: SchedulerApp
    gateway: GatewayApp
    nats_url: str

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.gateway.http_port}"


@contextlib.asynccontextmanager
async def cluster(nats_url: str, tmp_path: Path) -> AsyncIterator[Cluster]:
    scheduler = SchedulerApp(
        SchedulerSettings(host="127.0.0.1", scheduler_port=0, metrics_port=0, nats_url=nats_url,
                          policy="vllm-prodstack", worker_probe_timeout_s=0)  # fmt: skip
    )
    await scheduler.start()
    bus = EventBus(nats_url, "gateway-drain-test", connect_timeout_s=1.0)
    await bus.connect()
    await bus.ensure_stream()
    gateway = GatewayApp(
        GatewaySettings(
            host="127.0.0.1", gateway_port=0, gateway_grpc_port=0, scheduler_address=scheduler.address,
            nats_url=nats_url, database_url=f"sqlite:///{tmp_path / 'keys.db'}", model_cache_s=0.0,
            shutdown_grace_s=1.0,
        ),  # fmt: skip
        bus,
    )
    await gateway.start()
    try:
        yield Cluster(scheduler, gateway, nats_url)
    finally:
        await gateway.stop()
        await bus.close()
        await scheduler.stop()


async def complete(client: httpx.AsyncClient, url: str, name: str, max_tokens: int) -> httpx.Response:
    body = {"model": MODEL, "messages": [{"role": "user", "content": f"hello {name}"}],
            "max_tokens": max_tokens, "temperature": 0.0}  # fmt: skip
    return await client.post(f"{url}/v1/chat/completions", json=body, timeout=60)


async def test_a_request_queued_on_a_drained_worker_completes_on_another(nats_server: str, tmp_path: Path) -> None:
    async with cluster(nats_server, tmp_path) as c, httpx.AsyncClient() as client:
        w0 = await start_worker("w0", nats_server)
        w1: LiveWorker | None = None
        try:
            await until(lambda: [w.worker_id for w in c.scheduler.core.workers()] == ["w0"], "w0 to register")
            # w0 alone: the long call runs there, the short one waits in its engine queue behind it.
            long_call = asyncio.create_task(complete(client, c.url, "long", 60))
            await until(lambda: w0.engine.stats().running == 1, "the long call to run on w0")
            short_call = asyncio.create_task(complete(client, c.url, "short", 4))
            await until(lambda: w0.engine.stats().waiting == 1, "the short call to queue on w0")
            w1 = await start_worker("w1", nats_server)
            await until(lambda: len(c.scheduler.core.workers()) == 2, "w1 to register")

            # What the autoscaler does to scale w0 in: the scheduler's Drain, then the worker's.
            async with channel(c.scheduler.address) as sched_chan, channel(w0.address) as w0_chan:
                drained = await scheduler_pb2_grpc.SchedulerStub(sched_chan).Drain(
                    scheduler_pb2.DrainRequest(worker_id="w0", drain=True)
                )
                assert drained.found
                reply = await worker_pb2_grpc.WorkerStub(w0_chan).Drain(worker_pb2.WorkerDrainRequest(drain=True))
            assert reply.requeued == 1

            short = await short_call
            assert short.status_code == 200, short.text
            assert short.json()["usage"]["completion_tokens"] == 4
            assert not long_call.done()  # re-placed and served while w0 still runs the long call
            assert w1.engine.stats().generated_tokens_total == 4  # w1 served it, w0 never started it
            long = await long_call
            assert long.status_code == 200, long.text
            assert long.json()["usage"]["completion_tokens"] == 60
            # the engine counts the last token after streaming it: the reply can be a step ahead
            deadline = time.monotonic() + 5.0
            while w0.engine.stats().generated_tokens_total < 60 and time.monotonic() < deadline:
                await asyncio.sleep(0.01)
            assert w0.engine.stats().generated_tokens_total == 60
            # w0 was given both prompts but computed only the long call's
            assert w0.engine.stats().computed_prompt_tokens_total == long.json()["usage"]["prompt_tokens"]
            await until(lambda: sum(w.placed for w in c.scheduler.core.workers()) == 0, "the placements back")
        finally:
            for worker in (w0, w1):
                if worker is not None:
                    await worker.stop()
