"""No failure anywhere on the request path leaks a placement.

The real scheduler (in-process, real gRPC and NATS heartbeats) places requests from the real
gateway onto fake workers.  Each round sends a random mix of requests, each failing at a random
point: refused input, a failed Annotate, a failure right after Schedule answered, a failure
before the worker call opens, a worker that refuses before its first message, a worker that dies
mid-stream, a client that hangs up mid-stream or while queued.  After each round every
placement must be back: the workers report nothing they hold and leases are long, so only the
gateway's own releases can bring the count to zero.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import random
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import nats
import pytest

from clairvoyant.contracts.v1 import common_pb2, profiler_pb2, worker_pb2
from clairvoyant.core.bus import EventBus, worker_stats_subject
from clairvoyant.core.errors import Unavailable
from clairvoyant.core.grpc_errors import abort
from clairvoyant.gateway.app import GatewayApp
from clairvoyant.gateway.config import GatewaySettings
from clairvoyant.scheduler.app import SchedulerApp
from clairvoyant.scheduler.config import SchedulerSettings
from tests.gateway.fakes import MODEL, FakeProfiler, FakeWorker, start_server

pytestmark = [pytest.mark.integration, pytest.mark.slow]

FAULTS = (
    "none",
    "bad-input",  # a lone surrogate: refused before Schedule
    "annotate",  # the profiler fails: the request goes on un-annotated
    "after-schedule",  # the gateway fails right after Schedule answered
    "before-open",  # the gateway fails before the worker call opens
    "worker-refuses",  # UNAVAILABLE before the first message, on every worker it is tried on
    "worker-dies",  # UNAVAILABLE after the first token
    "client-hangs-up",  # a streaming client leaves after its first chunk
    "client-gives-up",  # a non-streaming client times out, often while queued
)


class InjectedFault(RuntimeError):
    pass


class FaultyWorker(FakeWorker):
    """Streams five tokens; fails as the request's agent_id says."""

    async def Generate(self, request, context):  # noqa: N802
        fault = request.app_metadata.agent_id
        if fault == "worker-refuses":
            await abort(context, Unavailable("worker lost its device"))
        for i in range(5):
            await asyncio.sleep(self.delay_s)
            if fault == "worker-dies" and i == 1:
                await abort(context, Unavailable("worker lost its device"))
            reply = worker_pb2.GenerateResponse(request_id=request.request_id, text=f" t{i}", token_ids=[100 + i])
            if i == 0:
                reply.prompt_tokens = 3
            if i == 4:
                reply.finish_reason = "stop"
                reply.usage.CopyFrom(common_pb2.Usage(prompt_tokens=3, completion_tokens=5, total_tokens=8))
            yield reply


class FaultyProfiler(FakeProfiler):
    async def Annotate(self, request, context):  # noqa: N802
        if request.app_metadata.agent_id == "annotate":
            await abort(context, Unavailable("profiler failed"))
        return profiler_pb2.AnnotateResponse()


@dataclass
class Cluster:
    scheduler: SchedulerApp
    gateway: GatewayApp

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.gateway.http_port}"

    def placed(self) -> int:
        return sum(w.placed for w in self.scheduler.core.workers())


async def heartbeats(nats_url: str, workers: dict[str, str]) -> None:
    nc = await nats.connect(nats_url)
    try:
        while True:
            for worker_id, address in workers.items():
                stats = worker_pb2.WorkerStats(
                    worker_id=worker_id, model=MODEL, grpc_address=address, max_batch=2,
                    kv_blocks_total=100, max_model_len=4096, heartbeat_interval_s=0.5, timestamp=time.time(),
                )  # fmt: skip
                await nc.publish(worker_stats_subject(worker_id), stats.SerializeToString())
            await asyncio.sleep(0.25)
    finally:
        await nc.close()


def inject_gateway_faults(gateway: GatewayApp) -> None:
    """Fail the gateway itself at two points of its own code, for the requests that ask for it."""
    pipeline = gateway.frontend.pipeline
    schedule, attempt = pipeline.scheduler.schedule, pipeline._attempt

    async def schedule_then_fail(msg: Any) -> Any:
        placement = await schedule(msg)
        if msg.app_metadata.agent_id == "after-schedule":
            raise InjectedFault("after Schedule")
        return placement

    def attempt_or_fail(request: Any, *args: Any) -> Any:
        if request.app_metadata is not None and request.app_metadata.agent_id == "before-open":
            raise InjectedFault("before the worker call")
        return attempt(request, *args)

    pipeline.scheduler.schedule = schedule_then_fail  # type: ignore[method-assign]
    pipeline._attempt = attempt_or_fail  # type: ignore[method-assign]


@contextlib.asynccontextmanager
async def cluster(nats_url: str, tmp_path: Path) -> AsyncIterator[Cluster]:
    scheduler = SchedulerApp(
        SchedulerSettings(host="127.0.0.1", scheduler_port=0, metrics_port=0, nats_url=nats_url, max_queue_per_model=64)
    )
    await scheduler.start()
    servers, addresses = [], {}
    for worker_id in ("w0", "w1"):
        server, addresses[worker_id] = await start_server(FaultyWorker(worker_id=worker_id, delay_s=0.01))
        servers.append(server)
    profiler_server, profiler_address = await start_server(FaultyProfiler())
    beating = asyncio.create_task(heartbeats(nats_url, addresses))
    bus = EventBus(nats_url, "gateway-leak-test", connect_timeout_s=1.0)
    await bus.connect()
    await bus.ensure_stream()
    gateway = GatewayApp(
        GatewaySettings(
            host="127.0.0.1", gateway_port=0, gateway_grpc_port=0, scheduler_address=scheduler.address,
            profiler_address=profiler_address, profiler_timeout_s=1.0, nats_url=nats_url,
            database_url=f"sqlite:///{tmp_path / 'keys.db'}", model_cache_s=0.0, shutdown_grace_s=1.0,
        ),  # fmt: skip
        bus,
    )
    await gateway.start()
    try:
        while len(scheduler.core.workers()) < 2:
            await asyncio.sleep(0.05)
        yield Cluster(scheduler, gateway)
    finally:
        await gateway.stop()
        await bus.close()
        beating.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await beating
        for server in (*servers, profiler_server):
            await server.stop(None)
        await scheduler.stop()


def body(fault: str, i: int, stream: bool) -> bytes:
    meta = {"workflow_type_id": "leaks", "workflow_id": f"wf-{i}", "agent_id": fault}
    content = "\\ud800" if fault == "bad-input" else f"request {i}"
    text = json.dumps({"model": MODEL, "messages": [{"role": "user", "content": "X"}], "stream": stream,
                       "app_metadata": meta})  # fmt: skip
    return text.replace('"X"', f'"{content}"').encode()  # the escape stays an escape in the JSON


async def send(client: httpx.AsyncClient, url: str, fault: str, i: int, stream: bool) -> int | str:
    """Sends one request; returns its status code (or how the client ended it)."""
    headers = {"content-type": "application/json"}
    data = body(fault, i, stream)
    if fault == "client-gives-up":
        with contextlib.suppress(httpx.TimeoutException):
            await client.post(f"{url}/v1/chat/completions", content=data, headers=headers, timeout=0.03)
        return "gave up"
    if not stream:
        response = await client.post(f"{url}/v1/chat/completions", content=data, headers=headers, timeout=30)
        return response.status_code
    async with client.stream("POST", f"{url}/v1/chat/completions", content=data, headers=headers, timeout=30) as r:
        async for _ in r.aiter_bytes():
            if fault == "client-hangs-up":
                return "hung up"
        return r.status_code


async def eventually_zero(cluster: Cluster, timeout_s: float = 5.0) -> None:
    deadline = time.monotonic() + timeout_s
    while cluster.placed() or any(cluster.scheduler.core.queue_depths().values()):
        assert time.monotonic() < deadline, f"placements leaked: {cluster.placed()} still held"
        await asyncio.sleep(0.05)


@pytest.mark.parametrize("seed", [1, 2])
async def test_random_failure_points_leave_no_placement(nats_server: str, tmp_path: Path, seed: int) -> None:
    rng = random.Random(seed)
    async with cluster(nats_server, tmp_path) as c, httpx.AsyncClient() as client:
        inject_gateway_faults(c.gateway)
        outcomes: dict[str, set[int | str]] = {fault: set() for fault in FAULTS}
        for round_ in range(6):
            faults = [rng.choice(FAULTS) for _ in range(12)]
            results = await asyncio.gather(
                *(send(client, c.url, f, round_ * 100 + i, rng.random() < 0.5) for i, f in enumerate(faults))
            )
            for fault, result in zip(faults, results, strict=True):
                outcomes[fault].add(result)
            await eventually_zero(c)
            c.scheduler.core.check_integrity()
            assert c.scheduler.core.leases is not None and len(c.scheduler.core.leases) == 0
            assert len(c.gateway.frontend.pipeline.held) == 0
        # The failures were real failures, and the requests that should succeed did.
        assert outcomes["none"] <= {200} and outcomes["annotate"] <= {200}
        assert outcomes["bad-input"] <= {400}
        assert outcomes["after-schedule"] <= {500} and outcomes["before-open"] <= {500}
        # Then the cluster serves normally.
        assert await send(client, c.url, "none", 10_000, stream=False) == 200
        await eventually_zero(c)
