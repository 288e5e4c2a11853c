"""The autoscaler service over real gRPC: Status and Plan against a real scheduler, a bad Plan
refused with INVALID_ARGUMENT, and a platform that keeps failing retried with backoff."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

import grpc
import pytest

from clairvoyant.autoscaler.actuators import LocalActuator
from clairvoyant.autoscaler.app import AutoscalerApp
from clairvoyant.autoscaler.config import AutoscalerSettings
from clairvoyant.autoscaler.core import ProfileDefaults
from clairvoyant.autoscaler.scaler import Scaler, ScalerOptions
from clairvoyant.contracts.v1 import autoscaler_pb2, autoscaler_pb2_grpc, scheduler_pb2_grpc
from clairvoyant.core.clock import ManualClock
from clairvoyant.core.grpcutil import channel
from clairvoyant.policy.pythia_scaling import PythiaScaling
from clairvoyant.scheduler.app import SchedulerApp
from clairvoyant.scheduler.config import SchedulerSettings

pytestmark = [pytest.mark.integration, pytest.mark.timeout(120)]

MODEL = "llama-3.1-8b"


async def start_scheduler(nats_url: str) -> SchedulerApp:
    app = SchedulerApp(SchedulerSettings(scheduler_port=0, metrics_port=0, nats_url=nats_url))
    await app.start()
    return app


async def test_status_and_plan_over_grpc(nats_url: str, tmp_path: Path) -> None:
    scheduler = await start_scheduler(nats_url)
    settings = AutoscalerSettings(
        autoscaler_port=0, metrics_port=0, nats_url=nats_url, scheduler_address=scheduler.address,
        models=MODEL, gpu_budget=2, interval_s=3600.0,  # one tick, at start
        profiles=json.dumps({MODEL: {"min_replicas": 1, "startup_s": 5}}),
        actuator_options=json.dumps({"var_dir": str(tmp_path)}),
        worker_env=json.dumps({"CV_RUNNER": "emulated", "CV_NATS_URL": "nats://127.0.0.1:1"}),
    )  # fmt: skip
    app = AutoscalerApp(settings)
    await app.start()
    chan = channel(app.address)
    stub = autoscaler_pb2_grpc.AutoscalerStub(chan)
    try:
        for _ in range(100):
            if app.scaler.last.decision is not None:
                break
            await asyncio.sleep(0.05)
        await app.scaler.settle()
        status = await stub.Status(autoscaler_pb2.AutoscalerStatusRequest(), timeout=5)
        assert (status.policy, status.actuator, status.gpu_budget) == ("pythia", "local", 2)
        assert 0 <= status.last_tick_age_s < 60
        (model,) = status.models
        assert (model.model, model.target, model.current) == (MODEL, 1, 0)  # its floor: starting, not ready
        plan = await stub.Plan(autoscaler_pb2.ScalingPlanRequest(horizon_steps=4), timeout=5)
        (decision,) = plan.decisions
        assert (decision.model, decision.target_replicas) == (MODEL, 1)
        assert "within 4 steps" in decision.reason  # the plan's own horizon; the loop's stays 2
        assert isinstance(app.scaler.policy, PythiaScaling) and app.scaler.policy.horizon_steps == 2
        assert await app.actuator.running() != {}  # the loop started one replica, the Plan none more
        assert len(await app.actuator.running()) == 1
    finally:
        await chan.close()
        await app.stop()
        await scheduler.stop()


async def test_a_plan_option_the_policy_lacks_is_invalid_argument(nats_url: str, tmp_path: Path) -> None:
    scheduler = await start_scheduler(nats_url)
    settings = AutoscalerSettings(
        autoscaler_port=0, metrics_port=0, nats_url=nats_url, scheduler_address=scheduler.address,
        scaling_policy="reactive", interval_s=3600.0, actuator_options=json.dumps({"var_dir": str(tmp_path)}),
    )  # fmt: skip
    app = AutoscalerApp(settings)
    await app.start()
    chan = channel(app.address)
    try:
        with pytest.raises(grpc.aio.AioRpcError) as raised:
            await autoscaler_pb2_grpc.AutoscalerStub(chan).Plan(
                autoscaler_pb2.ScalingPlanRequest(horizon_steps=3), timeout=5
            )
        assert raised.value.code() is grpc.StatusCode.INVALID_ARGUMENT
        assert "horizon_steps" in (raised.value.details() or "")
    finally:
        await chan.close()
        await app.stop()
        await scheduler.stop()


async def test_a_platform_that_keeps_failing_is_retried_then_given_up(nats_url: str, tmp_path: Path) -> None:
    """The local actuator cannot create its log directory (a file is in the way): every start
    fails; the loop retries it with backoff, then gives up and forgets the replica."""
    blocked = tmp_path / "var"
    blocked.write_text("not a directory")
    actuator = LocalActuator(var_dir=blocked)
    scheduler = await start_scheduler(nats_url)
    chan = channel(scheduler.address)
    options = ScalerOptions(gpu_budget=2, interval_s=1.0, configured_models=[MODEL], retries=2, backoff_s=0.01,
                            profile_overrides={MODEL: {"min_replicas": 1}}, defaults=ProfileDefaults(5.0))  # fmt: skip
    scaler = Scaler(PythiaScaling(), actuator, scheduler_pb2_grpc.SchedulerStub(chan), None, ManualClock(), options)
    attempts: list[str] = []
    provision = actuator.provision

    async def counted(model: str) -> str:
        attempts.append(model)
        return await provision(model)

    actuator.provision = counted  # type: ignore[method-assign]
    try:
        decision = await scaler.tick()
        assert decision is not None and decision.targets[MODEL] == 1
        assert len(scaler.book.owned()) == 1  # booked while the platform is tried
        await scaler.settle()
        assert attempts == [MODEL] * 3  # the first try and two retries
        assert scaler.book.owned() == []  # given up: nothing left half-started
        assert await actuator.running() == {}
    finally:
        await scaler.close()
        await chan.close()
        await scheduler.stop()
