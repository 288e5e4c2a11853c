"""Gateway test fixtures: free ports, a real NATS server, a JetStream reader of CompletionRecords,
and the gateway itself served in-process against fake scheduler/worker gRPC servers."""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import nats
import pytest
from nats.js.api import DeliverPolicy, StorageType, StreamConfig
from openai import AsyncOpenAI

from clairvoyant.contracts.v1 import common_pb2
from clairvoyant.core.bus import COMPLETIONS_STREAM, COMPLETIONS_SUBJECT, EventBus
from clairvoyant.gateway.app import GatewayApp
from clairvoyant.gateway.config import GatewaySettings
from clairvoyant.stack.natsserver import free_port as pick_free_port
from tests.gateway.fakes import FakeProfiler, FakeScheduler, FakeWorker, WorkerEntry, start_server


@pytest.fixture
def free_port() -> int:
    return pick_free_port()


async def add_completions_stream(nc: Any) -> None:
    """The stream EventBus.ensure_stream creates (same config, so creating it twice is harmless)."""
    config = StreamConfig(name=COMPLETIONS_STREAM, subjects=[COMPLETIONS_SUBJECT], storage=StorageType.FILE)
    await nc.jetstream().add_stream(config)


class RecordReader:
    """Reads CompletionRecords published after it was opened (an ordered, ephemeral consumer)."""

    def __init__(self, sub: Any) -> None:
        self._sub = sub

    async def next(self, timeout: float = 5.0) -> common_pb2.CompletionRecord:
        msg = await self._sub.next_msg(timeout=timeout)
        return common_pb2.CompletionRecord.FromString(msg.data)

    async def assert_none(self, within: float = 0.3) -> None:
        with pytest.raises(nats.errors.TimeoutError):
            msg = await self._sub.next_msg(timeout=within)
            pytest.fail(f"unexpected record: {common_pb2.CompletionRecord.FromString(msg.data)}")


@dataclass
class Stack:
    """A gateway served on free ports, its fakes and a reader of what it published."""

    server: GatewayApp
    scheduler: FakeScheduler
    workers: list[FakeWorker]
    records: RecordReader
    cleanups: list[Callable[[], Awaitable[Any]]] = field(default_factory=list)

    @property
    def worker(self) -> FakeWorker:
        return self.workers[0]

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.server.http_port}"

    @property
    def grpc_address(self) -> str:
        return f"127.0.0.1:{self.server.grpc_port}"

    def openai(self, api_key: str = "not-needed") -> AsyncOpenAI:
        client = AsyncOpenAI(base_url=f"{self.url}/v1", api_key=api_key, max_retries=0, timeout=10)
        self.cleanups.append(client.close)
        return client


StackFactory = Callable[..., Awaitable[Stack]]


@pytest.fixture
async def make_stack(nats_server: str, tmp_path: Path) -> AsyncIterator[StackFactory]:
    """``await make_stack(workers=[FakeWorker(...)], **settings)``; everything stops at teardown."""
    cleanups: list[Callable[[], Awaitable[Any]]] = []

    async def make(
        workers: list[FakeWorker] | None = None,
        extra_entries: list[WorkerEntry] | None = None,
        profiler: FakeProfiler | None = None,
        bus_url: str | None = None,
        **settings: Any,
    ) -> Stack:
        """``bus_url``: where the gateway publishes (default: the test NATS server, which must be up)."""
        scheduler = FakeScheduler()
        sched_server, sched_address = await start_server(scheduler)
        cleanups.append(lambda: sched_server.stop(None))
        workers = workers if workers is not None else [FakeWorker()]
        scheduler.workers.extend(extra_entries or [])
        for worker in workers:
            server, address = await start_server(worker)
            cleanups.append(lambda server=server: server.stop(None))
            scheduler.workers.append(WorkerEntry(worker.worker_id, address))
        if profiler is not None:
            prof_server, settings["profiler_address"] = await start_server(profiler)
            cleanups.append(lambda: prof_server.stop(None))
        bus = EventBus(bus_url or nats_server, "gateway-test", connect_timeout_s=0.5)
        if await bus.connect():
            await bus.ensure_stream()
        else:
            assert bus_url is not None, f"the test NATS server at {nats_server} is down"
        cleanups.append(bus.close)
        reader = await nats.connect(nats_server)  # reads from the test server, whatever bus_url says
        cleanups.append(reader.close)
        await add_completions_stream(reader)
        sub = await reader.jetstream().subscribe(
            COMPLETIONS_SUBJECT, ordered_consumer=True, deliver_policy=DeliverPolicy.NEW
        )
        config: dict[str, Any] = {
            "host": "127.0.0.1",
            "gateway_port": 0,
            "gateway_grpc_port": 0,
            "scheduler_address": sched_address,
            "database_url": f"sqlite:///{tmp_path / 'gateway.db'}",
            "nats_url": nats_server,
            "model_cache_s": 0.0,
            "shutdown_grace_s": 1.0,
            **settings,
        }
        server = GatewayApp(GatewaySettings(**config), bus)
        await server.start()
        cleanups.append(server.stop)
        stack = Stack(server, scheduler, workers, RecordReader(sub))
        cleanups.append(lambda: _run_all(stack.cleanups))
        return stack

    yield make
    await _run_all(cleanups)


async def _run_all(cleanups: list[Callable[[], Awaitable[Any]]]) -> None:
    for cleanup in reversed(cleanups):
        with contextlib.suppress(Exception):
            await cleanup()


@pytest.fixture
async def stack(make_stack: StackFactory) -> Stack:
    return await make_stack()
