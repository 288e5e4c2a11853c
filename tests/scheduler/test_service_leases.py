"""Leaked placements come back, and a worker whose heartbeats stop is asked before it is dropped:
the scheduler service over real gRPC and a real nats-server."""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import AsyncIterator

import grpc
import nats
import pytest
from prometheus_client import REGISTRY

from clairvoyant.contracts.v1 import scheduler_pb2, scheduler_pb2_grpc, worker_pb2, worker_pb2_grpc
from clairvoyant.core.bus import worker_stats_subject
from clairvoyant.core.grpcutil import channel
from clairvoyant.scheduler.app import SchedulerApp
from clairvoyant.scheduler.config import SchedulerSettings
from tests.scheduler.test_service_integration import eventually

pytestmark = pytest.mark.integration

MODEL = "lease-model"


def stats(worker_id: str, address: str, held: list[str] | None, interval_s: float = 0.2) -> worker_pb2.WorkerStats:
    msg = worker_pb2.WorkerStats(
        worker_id=worker_id, model=MODEL, grpc_address=address, max_batch=2, kv_blocks_total=100,
        heartbeat_interval_s=interval_s, timestamp=time.time(),
    )  # fmt: skip
    if held is not None:
        msg.held.CopyFrom(worker_pb2.HeldRequests(request_ids=held))
    return msg


class StatsOnlyWorker(worker_pb2_grpc.WorkerServicer):
    """A worker that answers Stats over gRPC (its heartbeats may be lost)."""

    def __init__(self, worker_id: str) -> None:
        self.worker_id = worker_id
        self.address = ""
        self.probes = 0

    async def Stats(self, request, context):  # noqa: N802
        self.probes += 1
        return stats(self.worker_id, self.address, held=[])


class Beats:
    """Publishes each listed worker's stats every half interval, like a worker's heartbeat loop."""

    def __init__(self, url: str) -> None:
        self.url = url
        self.workers: dict[str, worker_pb2.WorkerStats] = {}
        self._task: asyncio.Task[None] | None = None

    async def __aenter__(self) -> Beats:
        self._nc = await nats.connect(self.url)
        self._task = asyncio.create_task(self._run())
        return self

    async def _run(self) -> None:
        while True:
            for worker_id, msg in list(self.workers.items()):
                msg.timestamp = time.time()
                await self._nc.publish(worker_stats_subject(worker_id), msg.SerializeToString())
            await asyncio.sleep(0.1)

    async def __aexit__(self, *exc: object) -> None:
        assert self._task is not None
        self._task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await self._task
        await self._nc.close()


@contextlib.asynccontextmanager
async def scheduler(nats_url: str, **settings: float) -> AsyncIterator[scheduler_pb2_grpc.SchedulerStub]:
    app = SchedulerApp(
        SchedulerSettings(
            host="127.0.0.1", scheduler_port=0, nats_url=nats_url, metrics_port=0,
            expiry_interval_s=0.1, **settings,
        )  # fmt: skip
    )
    await app.start()
    chan = channel(app.address)
    try:
        yield scheduler_pb2_grpc.SchedulerStub(chan)
    finally:
        await chan.close()
        await app.stop()


async def placed(stub: scheduler_pb2_grpc.SchedulerStub) -> dict[str, int]:
    snap = await stub.Snapshot(scheduler_pb2.SnapshotRequest())
    return {w.worker_id: w.placed for w in snap.workers}


def reclaimed(reason: str) -> float:
    labels = {"model": MODEL, "reason": reason}
    return REGISTRY.get_sample_value("cv_scheduler_placements_reclaimed_total", labels) or 0.0


def schedule(request_id: str, owner: str = "gw-test") -> scheduler_pb2.ScheduleRequest:
    return scheduler_pb2.ScheduleRequest(request_id=request_id, tenant="t", model=MODEL, max_tokens=4, owner=owner)


async def test_placements_a_worker_never_received_are_reclaimed_and_unblock_the_queue(nats_server: str) -> None:
    """A gateway that crashed right after Schedule: its placements fill the worker, the next
    request waits; the worker's reports (holding nothing) bring the capacity back."""
    before = reclaimed("unknown_to_worker")
    async with Beats(nats_server) as beats, scheduler(nats_server, reconcile_grace_s=2.0) as stub:
        beats.workers["w0"] = stats("w0", "127.0.0.1:1", held=[])
        await eventually(lambda: _has_workers(stub, 1))
        first = [await stub.Schedule(schedule(f"lost-{i}")) for i in range(2)]
        assert [p.worker_id for p in first] == ["w0", "w0"] and first[0].lease_s == 30.0
        waiting = asyncio.ensure_future(stub.Schedule(schedule("next"), timeout=20))
        await asyncio.sleep(0.2)
        assert not waiting.done()  # the worker is full of placements nobody will use
        placement = await waiting
        assert placement.worker_id == "w0"
        assert await placed(stub) == {"w0": 1}
    assert reclaimed("unknown_to_worker") - before == 2


async def test_a_placement_the_worker_holds_is_never_reconciled_away(nats_server: str) -> None:
    async with Beats(nats_server) as beats, scheduler(nats_server, reconcile_grace_s=0.2) as stub:
        beats.workers["w0"] = stats("w0", "127.0.0.1:1", held=[])
        await eventually(lambda: _has_workers(stub, 1))
        await stub.Schedule(schedule("busy"))
        beats.workers["w0"] = stats("w0", "127.0.0.1:1", held=["busy"])
        await asyncio.sleep(1.0)  # five grace periods of reports that hold it
        assert await placed(stub) == {"w0": 1}
        reply = await stub.Complete(scheduler_pb2.CompleteRequest(request_id="busy", worker_id="w0"))
        assert reply.released


async def test_leases_expire_unless_renewed_by_their_owner(nats_server: str) -> None:
    before = reclaimed("lease_expired")
    async with Beats(nats_server) as beats, scheduler(nats_server, placement_lease_s=0.6) as stub:
        beats.workers["w0"] = stats("w0", "127.0.0.1:1", held=None)  # reports nothing it holds
        await eventually(lambda: _has_workers(stub, 1))
        await stub.Schedule(schedule("kept", owner="gw-a"))
        await stub.Schedule(schedule("dropped", owner="gw-b"))
        for _ in range(6):  # 1.2 s: twice the lease
            reply = await stub.Renew(scheduler_pb2.RenewRequest(owner="gw-a", request_ids=["kept", "ghost"]))
            assert list(reply.unknown_request_ids) == ["ghost"]
            await asyncio.sleep(0.2)
        assert await placed(stub) == {"w0": 1}
        renewed_by_other = await stub.Renew(scheduler_pb2.RenewRequest(owner="gw-b", request_ids=["kept"]))
        assert list(renewed_by_other.unknown_request_ids) == ["kept"]  # not gw-b's to renew
        released = await stub.Complete(scheduler_pb2.CompleteRequest(request_id="dropped", worker_id="w0"))
        assert not released.released  # already reclaimed
    assert reclaimed("lease_expired") - before == 1


async def test_a_worker_that_answers_stats_survives_lost_heartbeats(nats_server: str) -> None:
    """Heartbeats stop for both workers (as in a NATS outage): the one that answers Stats over
    gRPC stays, and keeps getting placements; the one that does not is expired."""
    alive = StatsOnlyWorker("alive")
    server = grpc.aio.server()
    worker_pb2_grpc.add_WorkerServicer_to_server(alive, server)
    alive.address = f"127.0.0.1:{server.add_insecure_port('127.0.0.1:0')}"
    await server.start()
    try:
        async with Beats(nats_server) as beats, scheduler(nats_server, worker_probe_timeout_s=0.5) as stub:
            beats.workers["alive"] = stats("alive", alive.address, held=None)
            beats.workers["dead"] = stats("dead", "127.0.0.1:1", held=None)
            await eventually(lambda: _has_workers(stub, 2))
            beats.workers.clear()  # no more heartbeats from anyone
            await eventually(lambda: _has_workers(stub, 1))
            await asyncio.sleep(2.0)  # ten 0.2 s heartbeat intervals without one
            snap = await stub.Snapshot(scheduler_pb2.SnapshotRequest())
            assert [w.worker_id for w in snap.workers] == ["alive"]
            assert alive.probes >= 2
            placement = await stub.Schedule(schedule("during-outage"), timeout=5)
            assert placement.worker_id == "alive"
    finally:
        await server.stop(None)


async def _has_workers(stub: scheduler_pb2_grpc.SchedulerStub, count: int) -> bool:
    snap = await stub.Snapshot(scheduler_pb2.SnapshotRequest())
    return len(snap.workers) == count
