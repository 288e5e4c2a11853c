"""The scaling loop against a real scheduler service (gRPC, heartbeats over a real nats-server)
and the real local actuator: what it starts, drains and tears down, and what it leaves alone."""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from clairvoyant.autoscaler.actuators import LocalActuator
from clairvoyant.autoscaler.core import ProfileDefaults
from clairvoyant.autoscaler.scaler import Scaler, ScalerOptions
from clairvoyant.contracts.v1 import scheduler_pb2, scheduler_pb2_grpc, worker_pb2, worker_pb2_grpc
from clairvoyant.core.clock import ManualClock
from clairvoyant.core.grpcutil import channel
from clairvoyant.policy.pythia_scaling import PythiaScaling
from clairvoyant.policy.scaling import ReplicaPhase, ScalingDecision, ScalingInput
from clairvoyant.scheduler.app import SchedulerApp
from clairvoyant.scheduler.config import SchedulerSettings
from clairvoyant.stack.natsserver import free_port

pytestmark = [pytest.mark.integration, pytest.mark.timeout(120)]

MODEL = "llama-3.1-8b"


@contextlib.asynccontextmanager
async def scheduler(nats_url: str) -> AsyncIterator[tuple[SchedulerApp, scheduler_pb2_grpc.SchedulerStub]]:
    settings = SchedulerSettings(scheduler_port=0, metrics_port=0, nats_url=nats_url, worker_probe_timeout_s=0)
    app = SchedulerApp(settings)
    await app.start()
    chan = channel(app.address)
    try:
        yield app, scheduler_pb2_grpc.SchedulerStub(chan)
    finally:
        await chan.close()
        await app.stop()


async def start_one_registered(scaler: Scaler, actuator: LocalActuator, app: SchedulerApp) -> str:
    """A tick starts the one replica the floor asks for; its id, once its worker has registered."""
    await scaler.tick()
    await scaler.settle()
    (replica_id,) = (await actuator.running()).keys()
    deadline = time.monotonic() + 60
    while not any(w.worker_id == replica_id for w in app.core.workers()):
        assert time.monotonic() < deadline, "the started worker never registered"
        await asyncio.sleep(0.2)
    return replica_id


def options(**overrides: object) -> ScalerOptions:
    base = ScalerOptions(gpu_budget=2, interval_s=0.1, configured_models=[MODEL], retries=0,
                         defaults=ProfileDefaults(startup_s=1.0), rpc_timeout_s=1.0)  # fmt: skip
    for name, value in overrides.items():
        setattr(base, name, value)
    return base


async def test_an_unreadable_scheduler_leaves_the_cluster_as_it_is(tmp_path: Path) -> None:
    actuator = LocalActuator(var_dir=tmp_path)
    chan = channel(f"127.0.0.1:{free_port()}")  # nothing listens
    scaler = Scaler(PythiaScaling(), actuator, scheduler_pb2_grpc.SchedulerStub(chan), None, ManualClock(),
                    options(profile_overrides={MODEL: {"min_replicas": 1}}))  # fmt: skip
    try:
        assert await scaler.tick() is None
        await scaler.settle()
        assert await actuator.running() == {}
        assert "scheduler unreadable" in scaler.last.error
    finally:
        await chan.close()
        await actuator.close()


async def test_a_replica_that_never_registers_is_torn_down_and_counted(nats_url: str, tmp_path: Path) -> None:
    """The worker is pointed at a NATS server that is not there, so it never heartbeats: past its
    start-up allowance the loop stops it and counts a failed start, and then starts another."""
    dead_nats = f"nats://127.0.0.1:{free_port()}"
    actuator = LocalActuator(var_dir=tmp_path, environment={"CV_NATS_URL": dead_nats, "CV_RUNNER": "emulated",
                                                            "CV_METRICS_PORT": "0"})  # fmt: skip
    clock = ManualClock()
    async with scheduler(nats_url) as (app, stub):
        scaler = Scaler(PythiaScaling(), actuator, stub, None, clock,
                        options(profile_overrides={MODEL: {"min_replicas": 1}}, startup_allowance_s=30.0))  # fmt: skip
        try:
            decision = await scaler.tick()
            assert decision is not None and decision.targets[MODEL] == 1
            await scaler.settle()
            (first,) = (await actuator.running()).keys()
            assert [r.phase for r in scaler.book.owned()] == [ReplicaPhase.STARTING]
            assert app.core.expected_models() == frozenset({MODEL})  # its requests may wait meanwhile
            clock.advance(31.0)
            await scaler.tick()  # overdue: torn down; the target still wants one, so another starts
            await scaler.settle()
            assert scaler.failed_starts_total == 1
            assert first not in await actuator.running()
            (second,) = scaler.book.owned()
            assert second.replica_id != first and second.phase is ReplicaPhase.STARTING
        finally:
            await scaler.close()
            await actuator.close()


async def test_a_registered_replica_is_ready_and_drained_before_it_is_released(nats_url: str, tmp_path: Path) -> None:
    """A worker registers under the id the actuator gave: the replica is ready.  When the demand
    is gone the loop drains it in the scheduler first and stops it once it is idle."""
    actuator = LocalActuator(var_dir=tmp_path, environment={"CV_NATS_URL": nats_url, "CV_RUNNER": "emulated",
                                                            "CV_METRICS_PORT": "0", "CV_TORCH_THREADS": "1"})  # fmt: skip
    clock = ManualClock()
    async with scheduler(nats_url) as (app, stub):
        scaler = Scaler(PythiaScaling(), actuator, stub, None, clock,
                        options(profile_overrides={MODEL: {"min_replicas": 1}}))  # fmt: skip
        try:
            replica_id = await start_one_registered(scaler, actuator, app)
            await scaler.tick()
            assert [(r.replica_id, r.phase) for r in scaler.book.owned()] == [(replica_id, ReplicaPhase.READY)]
            # No demand and no floor: it drains (routing exclusion first), then, idle, is released.
            scaler.options.profile_overrides = {}
            await scaler.tick()
            await scaler.settle()
            worker = next(w for w in app.core.workers() if w.worker_id == replica_id)
            assert worker.draining
            assert await actuator.running() == {}
            assert scaler.book.owned() == []
        finally:
            await scaler.close()
            await actuator.close()



class DrainEverything:
    """A scaling policy that wants no replica of any model (drives a drain on demand)."""

    def tick(self, state: ScalingInput, now: float) -> ScalingDecision:
        return ScalingDecision(targets={model: 0 for model in state.models})


async def test_a_drained_replica_is_told_to_drain_and_released_once_its_placement_completes(
    nats_url: str, tmp_path: Path
) -> None:
    """The loop drains a replica that still holds a placement: the scheduler excludes it, the
    worker itself reports draining (Worker.Drain), and it is released only after the placement ends."""
    actuator = LocalActuator(var_dir=tmp_path, environment={"CV_NATS_URL": nats_url, "CV_RUNNER": "emulated",
                                                            "CV_METRICS_PORT": "0", "CV_TORCH_THREADS": "1"})  # fmt: skip
    async with scheduler(nats_url) as (app, stub):
        scaler = Scaler(PythiaScaling(), actuator, stub, None, ManualClock(),
                        options(profile_overrides={MODEL: {"min_replicas": 1}}))  # fmt: skip
        try:
            replica_id = await start_one_registered(scaler, actuator, app)
            placement = await stub.Schedule(
                scheduler_pb2.ScheduleRequest(request_id="held-1", tenant="t", model=MODEL, prompt_tokens=8,
                                              max_tokens=8, owner="test"), timeout=10)  # fmt: skip
            assert placement.worker_id == replica_id
            scaler.policy = DrainEverything()
            await scaler.tick()
            await scaler.settle()
            view = next(w for w in app.core.workers() if w.worker_id == replica_id)
            assert view.draining
            stats = await worker_pb2_grpc.WorkerStub(channel(placement.worker_address)).Stats(
                worker_pb2.WorkerStatsRequest(), timeout=5
            )
            assert stats.draining  # the worker itself was told
            assert replica_id in await actuator.running()  # it still holds a placement
            await stub.Complete(scheduler_pb2.CompleteRequest(request_id="held-1", worker_id=replica_id), timeout=5)
            await scaler.tick()
            await scaler.settle()
            assert await actuator.running() == {}
        finally:
            await scaler.close()
            await actuator.close()
