"""The autoscaler's RPCs on the live scheduler service: real gRPC, heartbeats over a real
nats-server, the scheduler's clock a ManualClock so waits are exact."""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import AsyncIterator, Awaitable, Callable

import grpc
import nats
import pytest

from clairvoyant.contracts.v1 import common_pb2, scheduler_pb2, scheduler_pb2_grpc, worker_pb2
from clairvoyant.core.bus import worker_stats_subject
from clairvoyant.core.clock import ManualClock
from clairvoyant.core.grpcutil import channel
from clairvoyant.scheduler.app import SchedulerApp
from clairvoyant.scheduler.config import SchedulerSettings

pytestmark = [pytest.mark.integration, pytest.mark.timeout(60)]

MODEL = "active-tiny"
COLD = "active-cold"


async def eventually(check: Callable[[], Awaitable[bool]], timeout_s: float = 10.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not await check():
        assert time.monotonic() < deadline, "condition not reached in time"
        await asyncio.sleep(0.02)


async def heartbeats(url: str, worker_id: str, model: str) -> None:
    """WorkerStats every 0.1 s, as a worker's heartbeat loop sends them (the scheduler subscribes
    in the background, so the first ones may go unheard)."""
    nc = await nats.connect(url)
    try:
        while True:
            stats = worker_pb2.WorkerStats(
                worker_id=worker_id, model=model, grpc_address="127.0.0.1:7000", max_batch=1,
                kv_blocks_total=100, heartbeat_interval_s=1000.0, timestamp=time.time(),
            )  # fmt: skip
            await nc.publish(worker_stats_subject(worker_id), stats.SerializeToString())
            await asyncio.sleep(0.1)
    finally:
        await nc.close()


@contextlib.asynccontextmanager
async def worker(url: str, worker_id: str, model: str) -> AsyncIterator[None]:
    """A worker that heartbeats while the block runs; it reports a long interval, so it never
    falls silent however far the test moves the scheduler's ManualClock."""
    task = asyncio.create_task(heartbeats(url, worker_id, model))
    try:
        yield
    finally:
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task


@contextlib.asynccontextmanager
async def scheduler(
    nats_url: str, port: int
) -> AsyncIterator[tuple[scheduler_pb2_grpc.SchedulerStub, ManualClock]]:
    clock = ManualClock(100.0)
    settings = SchedulerSettings(nats_url=nats_url, scheduler_port=port, metrics_port=0)
    app = SchedulerApp(settings, clock=clock)
    await app.start()
    try:
        async with channel(f"127.0.0.1:{app.port}") as chan:
            yield scheduler_pb2_grpc.SchedulerStub(chan), clock
    finally:
        await app.stop()


def call(
    request_id: str, model: str = MODEL, *, agent: str = "", prompt_tokens: int = 0
) -> scheduler_pb2.ScheduleRequest:
    msg = scheduler_pb2.ScheduleRequest(
        request_id=request_id, tenant="t", model=model, prompt_tokens=prompt_tokens, max_tokens=32
    )
    if agent:
        msg.app_metadata.CopyFrom(
            common_pb2.AppMetadata(workflow_type_id="coding", workflow_id=f"wf-{request_id}", agent_id=agent)
        )
    return msg


async def workers_known(stub: scheduler_pb2_grpc.SchedulerStub, count: int) -> None:
    async def known() -> bool:
        return len((await stub.Snapshot(scheduler_pb2.SnapshotRequest())).workers) == count

    await eventually(known)


async def test_active_lists_queued_and_placed_calls_and_complete_moves_the_counters(
    nats_server: str, unused_tcp_port: int
) -> None:
    async with scheduler(nats_server, unused_tcp_port) as (stub, clock), contextlib.AsyncExitStack() as stack:
        await stack.enter_async_context(worker(nats_server, "w1", MODEL))
        await workers_known(stub, 1)

        planner = call("r1", agent="planner", prompt_tokens=120)
        planner.annotations.CopyFrom(
            common_pb2.SysAnnotations(
                confidence=common_pb2.CONFIDENCE_HIGH,
                predicted_path_regex="<explorer>{3,3} -> engineer -> $",
                projection=[
                    common_pb2.ProjectedCalls(step=1, agent_id="explorer", expected_calls=3.0),
                    common_pb2.ProjectedCalls(step=2, agent_id="engineer", expected_calls=1.0),
                ],
            )
        )
        first = await stub.Schedule(planner, timeout=5)
        assert first.worker_id == "w1"
        clock.advance(1.0)
        waiting = asyncio.ensure_future(
            stub.Schedule(call("r2", agent="explorer", prompt_tokens=30), timeout=10)
        )

        async def queued() -> bool:
            return len((await stub.Active(scheduler_pb2.ActiveRequest())).calls) == 2

        await eventually(queued)
        clock.advance(2.5)
        snap = await stub.Active(scheduler_pb2.ActiveRequest())
        assert snap.now == 103.5
        assert [(c.request_id, c.queued, c.worker_id, c.wait_s) for c in snap.calls] == [
            ("r2", True, "", 2.5),
            ("r1", False, "w1", 3.5),
        ]
        r2, r1 = snap.calls
        assert (r1.tenant, r1.model, r1.prompt_tokens, r1.max_tokens) == ("t", MODEL, 120, 32)
        assert (r1.app_metadata.workflow_type_id, r1.app_metadata.agent_id) == ("coding", "planner")
        assert r1.annotations.confidence == common_pb2.CONFIDENCE_HIGH
        assert [(p.step, p.agent_id, p.expected_calls) for p in r1.annotations.projection] == [
            (1, "explorer", 3.0),
            (2, "engineer", 1.0),
        ]
        assert not r2.HasField("annotations") and r2.app_metadata.agent_id == "explorer"
        assert sorted((a.workflow_type_id, a.agent_id, a.model) for a in snap.agent_models) == [
            ("coding", "explorer", MODEL),
            ("coding", "planner", MODEL),
        ]
        [traffic] = snap.traffic
        assert (traffic.model, traffic.requests_total, traffic.input_tokens_total) == (MODEL, 2, 150)
        assert (traffic.completed_total, traffic.output_tokens_total) == (0, 0)

        done = await stub.Complete(
            scheduler_pb2.CompleteRequest(request_id="r1", worker_id="w1", output_tokens=17), timeout=5
        )
        assert done.released
        second = await asyncio.wait_for(waiting, 5)
        assert second.worker_id == "w1"
        # A cancelled call leaves without counting as served.
        await stub.Complete(
            scheduler_pb2.CompleteRequest(
                request_id="r2", worker_id="w1", status=common_pb2.REQUEST_STATUS_CANCELLED, output_tokens=5
            ),
            timeout=5,
        )
        snap = await stub.Active(scheduler_pb2.ActiveRequest())
        assert list(snap.calls) == []
        [traffic] = snap.traffic
        assert (traffic.requests_total, traffic.completed_total, traffic.output_tokens_total) == (2, 1, 17)


async def test_expected_model_waits_for_a_worker_and_unexpecting_it_fails_the_wait(
    nats_server: str, unused_tcp_port: int
) -> None:
    async with (
        scheduler(nats_server, unused_tcp_port) as (stub, _clock),
        contextlib.AsyncExitStack() as stack,
    ):
        with pytest.raises(grpc.aio.AioRpcError) as refused:
            await stub.Schedule(call("early", COLD), timeout=5)
        assert refused.value.code() == grpc.StatusCode.UNAVAILABLE

        await stub.ExpectModels(scheduler_pb2.ExpectModelsRequest(models=[COLD]), timeout=5)
        assert list((await stub.Snapshot(scheduler_pb2.SnapshotRequest())).expected_models) == [COLD]
        waiting = asyncio.ensure_future(stub.Schedule(call("c1", COLD), timeout=10))

        async def queued() -> bool:
            calls = (await stub.Active(scheduler_pb2.ActiveRequest())).calls
            return [(c.request_id, c.queued) for c in calls] == [("c1", True)]

        await eventually(queued)
        await stack.enter_async_context(worker(nats_server, "cold-1", COLD))  # the autoscaler started it
        placed = await asyncio.wait_for(waiting, 5)
        assert (placed.request_id, placed.worker_id) == ("c1", "cold-1")

        # Another expected model with no worker: dropping it from the set fails its waiter.
        await stub.ExpectModels(scheduler_pb2.ExpectModelsRequest(models=["active-later"]), timeout=5)
        stranded = asyncio.ensure_future(stub.Schedule(call("l1", "active-later"), timeout=10))

        async def stranded_queued() -> bool:
            return any(c.request_id == "l1" for c in (await stub.Active(scheduler_pb2.ActiveRequest())).calls)

        await eventually(stranded_queued)
        await stub.ExpectModels(scheduler_pb2.ExpectModelsRequest(), timeout=5)
        assert list((await stub.Snapshot(scheduler_pb2.SnapshotRequest())).expected_models) == []
        with pytest.raises(grpc.aio.AioRpcError) as failed:
            await asyncio.wait_for(stranded, 5)
        assert failed.value.code() == grpc.StatusCode.UNAVAILABLE
        # COLD has its worker now, so it schedules without being expected.
        await stub.Complete(scheduler_pb2.CompleteRequest(request_id="c1", worker_id="cold-1"), timeout=5)
        assert (await stub.Schedule(call("c2", COLD), timeout=5)).worker_id == "cold-1"
