"""Wires the scheduler together: gRPC server + health, NATS subscription, the expiry loop."""

from __future__ import annotations

import asyncio
import contextlib
import logging

from opentelemetry import trace

from clairvoyant.contracts.v1 import scheduler_pb2, scheduler_pb2_grpc
from clairvoyant.core import security
from clairvoyant.core.bus import WORKER_STATS_WILDCARD, EventBus
from clairvoyant.core.clock import Clock, SystemClock
from clairvoyant.core.grpcutil import add_health, bind, mark_serving, new_server
from clairvoyant.scheduler.config import SchedulerSettings
from clairvoyant.scheduler.core import GlobalScheduler, KvIndex, LeaseBook
from clairvoyant.scheduler.grpc_api import SchedulerServicer
from clairvoyant.scheduler.kv_migration import KvMover
from clairvoyant.scheduler.liveness import WorkerProber
from clairvoyant.scheduler.model_groups import SchedulerPolicies, build_scheduler_policies

logger = logging.getLogger(__name__)

# Where workers publish their KV events (worker.proto ``KvEventBatch``): cv.kv.events.<worker_id>.
KV_EVENTS_WILDCARD = "cv.kv.events.*"

SERVICE_NAME = scheduler_pb2.DESCRIPTOR.services_by_name["Scheduler"].full_name


class SchedulerApp:
    """One scheduler process.  ``start`` binds and connects; ``stop`` is graceful and idempotent."""

    def __init__(
        self,
        settings: SchedulerSettings,
        *,
        clock: Clock | None = None,
        tracer: trace.Tracer | None = None,
        policies: SchedulerPolicies | None = None,
    ) -> None:
        """``policies``: built from the settings when not given (``build_scheduler_policies``,
        which raises ModelGroupError for a declaration the preset cannot use)."""
        self.settings = settings
        policies = policies or build_scheduler_policies(settings.policy, settings.model_groups)
        self.core = GlobalScheduler(
            policies.priority,
            policies.routing,
            policy_name=settings.policy,
            max_queue_per_model=settings.max_queue_per_model,
            queue_retry_after_s=settings.queue_retry_after_s,
            heartbeat_timeout_factor=settings.heartbeat_timeout_factor,
            default_heartbeat_interval_s=settings.default_heartbeat_interval_s,
            leases=LeaseBook(settings.placement_lease_s, settings.reconcile_grace_s),
            kv_index=KvIndex(speculative_ttl_s=settings.kv_speculative_ttl_s),
        )
        timeout = settings.kv_migration_timeout_s
        self.kv_mover = KvMover(timeout) if timeout > 0 else None
        probe_s = settings.worker_probe_timeout_s
        self.prober = WorkerProber(probe_s) if probe_s > 0 else None
        self.servicer = SchedulerServicer(
            self.core,
            clock or SystemClock(),
            tracer,
            kv_mover=self.kv_mover,
            prober=self.prober,
            groups=policies.groups,
        )
        self.bus = EventBus(settings.nats_url, "scheduler", connect_timeout_s=settings.nats_connect_timeout_s)
        self.server = new_server()
        scheduler_pb2_grpc.add_SchedulerServicer_to_server(self.servicer, self.server)
        self.health = add_health(self.server, [SERVICE_NAME])
        self.port = 0  # the bound port, known after start (scheduler_port 0 picks a free one)
        self._expiry_task: asyncio.Task[None] | None = None
        self._connect_task: asyncio.Task[bool] | None = None
        self._stopped = False

    @property
    def address(self) -> str:
        return f"{self.settings.advertised()}:{self.port}"

    async def start(self) -> None:
        tls = security.configure(self.settings)  # KV moves' channels and the bus follow it too
        self.port = bind(self.server, f"{self.settings.host}:{self.settings.scheduler_port}", tls)
        await self.server.start()
        # Subscribing first means the bus (re)subscribes on every successful connect, including a
        # late one after NATS comes up: a dead NATS degrades the scheduler instead of stopping it.
        await self.bus.subscribe(WORKER_STATS_WILDCARD, self.servicer.on_worker_stats)
        await self.bus.subscribe(KV_EVENTS_WILDCARD, self.servicer.on_kv_events)
        # In the background: with a dead server, nats-py's initial connect keeps retrying inside
        # EventBus.connect (allow_reconnect with unlimited attempts) and never returns.
        self._connect_task = asyncio.create_task(self.bus.connect(), name="scheduler-nats-connect")
        self._expiry_task = asyncio.create_task(self._expire_forever(), name="scheduler-expiry")
        await mark_serving(self.health, [SERVICE_NAME])
        logger.info("scheduler (policy %s) listening on %s", self.settings.policy, self.address)
        for group in self.servicer.groups.groups.values():
            logger.info("model group %s: %s", group.name, ", ".join(group.models))

    async def stop(self) -> None:
        if self._stopped:
            return
        self._stopped = True
        await mark_serving(self.health, [SERVICE_NAME], serving=False)
        for task in (self._expiry_task, self._connect_task):
            if task is not None and not task.done():
                task.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await task
        self.servicer.close()
        await self.server.stop(self.settings.shutdown_grace_s)
        if self.kv_mover is not None:
            await self.kv_mover.close()
        if self.prober is not None:
            await self.prober.close()
        await self.bus.close()
        logger.info("scheduler stopped")

    async def _expire_forever(self) -> None:
        while True:
            await asyncio.sleep(self.settings.expiry_interval_s)
            try:
                await self.servicer.expire()
            except Exception:  # one bad pass must not end liveness checking for good
                logger.exception("worker expiry failed")
