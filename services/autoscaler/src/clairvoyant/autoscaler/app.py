"""Wires the autoscaler together: the scaling loop, its actuator, gRPC server + health, NATS."""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
from pathlib import Path

from clairvoyant.autoscaler.actuators import ACTUATORS, Actuator
from clairvoyant.autoscaler.config import AutoscalerSettings
from clairvoyant.autoscaler.core import ProfileDefaults
from clairvoyant.autoscaler.grpc_api import AutoscalerServicer
from clairvoyant.autoscaler.scaler import Scaler, ScalerOptions
from clairvoyant.contracts.v1 import autoscaler_pb2, autoscaler_pb2_grpc, scheduler_pb2_grpc
from clairvoyant.core import security
from clairvoyant.core.bus import EventBus
from clairvoyant.core.clock import Clock, SystemClock
from clairvoyant.core.grpcutil import add_health, bind, channel, mark_serving, new_server
from clairvoyant.policy import SCALING_POLICIES
from clairvoyant.policy.pythia_scaling import PythiaScaling

logger = logging.getLogger(__name__)

SERVICE_NAME = autoscaler_pb2.DESCRIPTOR.services_by_name["Autoscaler"].full_name


def build_actuator(settings: AutoscalerSettings) -> Actuator:
    """The configured actuator, given ``CV_ACTUATOR_OPTIONS`` as keyword options and, for the
    ones that launch workers, ``CV_WORKER_ENV`` as the workers' environment."""
    options = json.loads(settings.actuator_options) if settings.actuator_options.strip() else {}
    worker_env = json.loads(settings.worker_env) if settings.worker_env.strip() else {}
    if settings.actuator in ("local", "docker"):
        base = {"CV_NATS_URL": settings.nats_url, "CV_METRICS_PORT": "0"}  # one metrics port per host
        options["environment"] = {**base, **worker_env, **options.get("environment", {})}
    if "var_dir" in options:
        options["var_dir"] = Path(options["var_dir"])
    return ACTUATORS.create(settings.actuator, **options)


class AutoscalerApp:
    """One autoscaler process.  ``start`` binds, connects and starts the loop; ``stop`` is
    graceful and idempotent (local replicas stop with it; Docker and Kubernetes ones stay)."""

    def __init__(
        self, settings: AutoscalerSettings, *, actuator: Actuator | None = None, clock: Clock | None = None
    ) -> None:
        self.settings = settings
        policy = SCALING_POLICIES.create(settings.scaling_policy)
        if isinstance(policy, PythiaScaling):
            policy.horizon_steps = settings.horizon_steps
        self.actuator = actuator or build_actuator(settings)
        self.bus = EventBus(
            settings.nats_url, "autoscaler", connect_timeout_s=settings.nats_connect_timeout_s
        )
        self._channel = channel(settings.scheduler_address)
        options = ScalerOptions(
            gpu_budget=settings.gpu_budget,
            interval_s=settings.interval_s,
            configured_models=settings.managed_models(),
            profile_overrides={m: o.model_dump() for m, o in settings.profile_overrides().items()},
            defaults=ProfileDefaults(startup_s=settings.default_startup_s),
            startup_allowance_s=settings.startup_allowance_s,
            retries=settings.actuator_retries,
            backoff_s=settings.actuator_backoff_s,
            rpc_timeout_s=settings.rpc_timeout_s,
        )
        self.scaler = Scaler(
            policy, self.actuator, scheduler_pb2_grpc.SchedulerStub(self._channel), self.bus,
            clock or SystemClock(), options,
        )  # fmt: skip
        self.server = new_server()
        servicer = AutoscalerServicer(self.scaler, settings.scaling_policy, settings.actuator)
        autoscaler_pb2_grpc.add_AutoscalerServicer_to_server(servicer, self.server)
        self.health = add_health(self.server, [SERVICE_NAME])
        self.port = 0
        self._loop_task: asyncio.Task[None] | None = None
        self._connect_task: asyncio.Task[bool] | None = None
        self._stopped = False

    @property
    def address(self) -> str:
        return f"{self.settings.advertised()}:{self.port}"

    async def start(self) -> None:
        tls = security.configure(self.settings)
        self.port = bind(self.server, f"{self.settings.host}:{self.settings.autoscaler_port}", tls)
        await self.server.start()
        self._connect_task = asyncio.create_task(self.bus.connect(), name="autoscaler-nats-connect")
        self._loop_task = asyncio.create_task(self.scaler.run_forever(), name="autoscaler-loop")
        await mark_serving(self.health, [SERVICE_NAME])
        logger.info(
            "autoscaler (policy %s, actuator %s, %d GPUs) listening on %s; scheduler at %s",
            self.settings.scaling_policy, self.settings.actuator, self.settings.gpu_budget, self.address,
            self.settings.scheduler_address,
        )  # fmt: skip

    async def stop(self) -> None:
        if self._stopped:
            return
        self._stopped = True
        await mark_serving(self.health, [SERVICE_NAME], serving=False)
        for task in (self._loop_task, self._connect_task):
            if task is not None and not task.done():
                task.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await task
        await self.scaler.close()
        if self.settings.actuator == "local":
            await self.actuator.close()  # its workers are this process's children
        await self.server.stop(2.0)
        await self._channel.close()
        await self.bus.close()
        logger.info("autoscaler stopped")
