"""The scheduler service end to end: real nats-server, real gRPC, heartbeats over NATS."""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import AsyncIterator, Awaitable, Callable

import grpc
import nats
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from prometheus_client import REGISTRY

from clairvoyant.contracts.v1 import scheduler_pb2, scheduler_pb2_grpc, worker_pb2
from clairvoyant.core.bus import worker_stats_subject
from clairvoyant.core.errors import NoWorkers, QueueFull
from clairvoyant.core.grpc_errors import from_rpc_error
from clairvoyant.core.grpcutil import channel
from clairvoyant.scheduler.app import SERVICE_NAME, SchedulerApp
from clairvoyant.scheduler.config import SchedulerSettings

pytestmark = pytest.mark.integration

MODEL = "integration-tiny"
TRACE_ID = "4bf92f3577b34da6a3ce929d0e0e4736"
PARENT_SPAN = "00f067aa0ba902b7"


async def eventually(check: Callable[[], Awaitable[bool]], timeout_s: float = 10.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not await check():
        assert time.monotonic() < deadline, "condition not reached in time"
        await asyncio.sleep(0.05)


async def beat(url: str, worker_ids: list[str], interval_s: float) -> None:
    """Publish WorkerStats for fake workers, as a worker's heartbeat loop does."""
    nc = await nats.connect(url)
    try:
        while True:
            for i, worker_id in enumerate(worker_ids):
                stats = worker_pb2.WorkerStats(
                    worker_id=worker_id, model=MODEL, grpc_address=f"127.0.0.1:{7000 + i}", max_batch=1,
                    kv_blocks_total=100, heartbeat_interval_s=interval_s, timestamp=time.time(),
                )  # fmt: skip
                await nc.publish(worker_stats_subject(worker_id), stats.SerializeToString())
            await asyncio.sleep(interval_s / 2)
    finally:
        await nc.close()


def counter(status: str) -> float:
    value = REGISTRY.get_sample_value("cv_scheduler_requests_total", {"model": MODEL, "status": status})
    return value or 0.0


def schedule_request(request_id: str) -> scheduler_pb2.ScheduleRequest:
    return scheduler_pb2.ScheduleRequest(request_id=request_id, tenant="t", model=MODEL, max_tokens=8)


@contextlib.asynccontextmanager
async def running(settings: SchedulerSettings, provider: TracerProvider) -> AsyncIterator[SchedulerApp]:
    app = SchedulerApp(settings, tracer=provider.get_tracer("test"))
    await app.start()
    try:
        yield app
    finally:
        await app.stop()


async def test_schedule_complete_expire_over_real_grpc_and_nats(
    nats_server: str, unused_tcp_port: int
) -> None:
    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    settings = SchedulerSettings(
        nats_url=nats_server, scheduler_port=unused_tcp_port, metrics_port=0, expiry_interval_s=0.1,
        max_queue_per_model=2, queue_retry_after_s=0.5,
    )  # fmt: skip
    placed_before, cancelled_before = counter("placed"), counter("cancelled")
    heartbeats = asyncio.create_task(beat(nats_server, ["w1", "w2"], interval_s=0.2))
    async with running(settings, provider) as app, channel(f"127.0.0.1:{app.port}") as chan:
        stub = scheduler_pb2_grpc.SchedulerStub(chan)

        async def workers_known() -> bool:
            return len((await stub.Snapshot(scheduler_pb2.SnapshotRequest())).workers) == 2

        await eventually(workers_known)
        health = await health_pb2_grpc.HealthStub(chan).Check(
            health_pb2.HealthCheckRequest(service=SERVICE_NAME)
        )
        assert health.status == health_pb2.HealthCheckResponse.SERVING

        # Two placements at once, on different workers; the third waits for room.
        traceparent = (("traceparent", f"00-{TRACE_ID}-{PARENT_SPAN}-01"),)
        first = await stub.Schedule(schedule_request("r1"), metadata=traceparent, timeout=5)
        second = await stub.Schedule(schedule_request("r2"), timeout=5)
        assert {first.worker_id, second.worker_id} == {"w1", "w2"}
        assert first.worker_address == ("127.0.0.1:7000" if first.worker_id == "w1" else "127.0.0.1:7001")
        asked_at = time.monotonic()
        third = asyncio.ensure_future(stub.Schedule(schedule_request("r3"), timeout=10))
        await asyncio.sleep(0.3)
        assert not third.done()
        snap = await stub.Snapshot(scheduler_pb2.SnapshotRequest())
        assert snap.policy == "fcfs-rr"
        assert [(q.model, q.depth, q.capacity) for q in snap.queues] == [(MODEL, 1, 2)]
        assert [(w.worker_id, w.placed, w.max_batch) for w in snap.workers] == [("w1", 1, 1), ("w2", 1, 1)]
        assert all(w.last_heartbeat_age_s < 0.6 and w.kv_blocks_total == 100 for w in snap.workers)

        done = await stub.Complete(scheduler_pb2.CompleteRequest(request_id="r1", worker_id=first.worker_id))
        assert done.released
        placed = await asyncio.wait_for(third, 5)
        # It waited through the 0.3 s sleep; the scheduler's clock starts when the call reaches it, so
        # the figure lies between most of the sleep and the whole round trip seen from here.
        assert placed.worker_id == first.worker_id
        assert 0.25 <= placed.queue_wait_s <= time.monotonic() - asked_at
        again = await stub.Complete(scheduler_pb2.CompleteRequest(request_id="r1", worker_id=first.worker_id))
        assert not again.released  # idempotent

        (span,) = [
            s for s in exporter.get_finished_spans() if s.attributes and s.attributes["cv.request_id"] == "r1"
        ]
        assert span.name == "scheduler.queue_wait" and span.parent is not None
        assert (f"{span.context.trace_id:032x}", f"{span.parent.span_id:016x}") == (TRACE_ID, PARENT_SPAN)
        assert span.attributes is not None and span.attributes["cv.worker_id"] == first.worker_id

        # A caller that goes away leaves the queue.
        gone = stub.Schedule(schedule_request("r4"), timeout=10)
        await asyncio.sleep(0.2)
        gone.cancel()

        async def queue_empty() -> bool:
            return (await stub.Snapshot(scheduler_pb2.SnapshotRequest())).queues[0].depth == 0

        await eventually(queue_empty, 5)

        # The queue bound: two wait, the third is turned away with a retry hint.
        waiting = [
            asyncio.ensure_future(stub.Schedule(schedule_request(f"q{i}"), timeout=10)) for i in range(2)
        ]
        await asyncio.sleep(0.2)
        with pytest.raises(grpc.aio.AioRpcError) as full:
            await stub.Schedule(schedule_request("r5"), timeout=5)
        assert full.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
        error = from_rpc_error(full.value)
        assert isinstance(error, QueueFull) and error.retry_after_s == 0.5

        # Workers fall silent: after 3 intervals they expire and the waiters fail with UNAVAILABLE.
        stopped_at = time.monotonic()
        heartbeats.cancel()
        for call in waiting:
            with pytest.raises(grpc.aio.AioRpcError) as lost:
                await asyncio.wait_for(call, 5)
            assert lost.value.code() == grpc.StatusCode.UNAVAILABLE
            assert isinstance(from_rpc_error(lost.value), NoWorkers)
        assert 0.5 <= time.monotonic() - stopped_at < 3.0
        assert not (await stub.Snapshot(scheduler_pb2.SnapshotRequest())).workers
        with pytest.raises(grpc.aio.AioRpcError) as none:
            await stub.Schedule(schedule_request("r6"), timeout=5)
        assert none.value.code() == grpc.StatusCode.UNAVAILABLE
    with contextlib.suppress(asyncio.CancelledError):
        await heartbeats
    assert counter("placed") - placed_before == 3
    assert counter("cancelled") - cancelled_before == 1


async def test_starts_and_stops_without_nats(unused_tcp_port: int) -> None:
    dead = f"nats://127.0.0.1:{unused_tcp_port}"
    settings = SchedulerSettings(nats_url=dead, scheduler_port=0, metrics_port=0, nats_connect_timeout_s=0.5)
    started = time.monotonic()
    async with running(settings, TracerProvider()) as app, channel(f"127.0.0.1:{app.port}") as chan:
        assert time.monotonic() - started < 2.0
        health = await health_pb2_grpc.HealthStub(chan).Check(health_pb2.HealthCheckRequest(service=""))
        assert health.status == health_pb2.HealthCheckResponse.SERVING
        with pytest.raises(grpc.aio.AioRpcError) as err:
            await scheduler_pb2_grpc.SchedulerStub(chan).Schedule(schedule_request("x"), timeout=5)
        assert err.value.code() == grpc.StatusCode.UNAVAILABLE
    assert time.monotonic() - started < 10.0


async def test_heartbeats_reach_a_scheduler_started_before_nats(
    nats_server_factory: Callable[[int], str], unused_tcp_port_factory: Callable[[], int]
) -> None:
    nats_port = unused_tcp_port_factory()
    settings = SchedulerSettings(
        nats_url=f"nats://127.0.0.1:{nats_port}", scheduler_port=0, metrics_port=0, nats_connect_timeout_s=0.5
    )
    async with running(settings, TracerProvider()) as app, channel(f"127.0.0.1:{app.port}") as chan:
        stub = scheduler_pb2_grpc.SchedulerStub(chan)
        await asyncio.sleep(0.5)
        url = await asyncio.to_thread(nats_server_factory, nats_port)  # NATS comes up late
        heartbeats = asyncio.create_task(beat(url, ["late"], interval_s=0.2))

        async def worker_known() -> bool:
            return [w.worker_id for w in (await stub.Snapshot(scheduler_pb2.SnapshotRequest())).workers] == [
                "late"
            ]

        try:
            await eventually(worker_known, 10)
            placed = await stub.Schedule(schedule_request("after-nats"), timeout=5)
            assert placed.worker_id == "late"
        finally:
            heartbeats.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await heartbeats
