"""The profiler's wiring: database -> store, the gRPC server (``grpc_api``) + health and the
JetStream consumer (``consumer``); started and stopped together."""

from __future__ import annotations

import asyncio
import contextlib
import logging
from dataclasses import replace

from clairvoyant.contracts.v1 import profiler_pb2, profiler_pb2_grpc
from clairvoyant.core import security
from clairvoyant.core.bus import COMPLETIONS_STREAM, COMPLETIONS_SUBJECT, EventBus
from clairvoyant.core.clock import Clock
from clairvoyant.core.grpcutil import add_health, bind, mark_serving, new_server
from clairvoyant.profiler import metrics
from clairvoyant.profiler.config import ProfilerSettings
from clairvoyant.profiler.consumer import CompletionConsumer, Learner, WallClock
from clairvoyant.profiler.core import ProfileStore
from clairvoyant.profiler.grpc_api import ProfilerServicer
from clairvoyant.profiler.persistence import ProfileRepository

logger = logging.getLogger(__name__)

SERVICE_NAME = profiler_pb2.DESCRIPTOR.services_by_name["Profiler"].full_name


class ProfilerApp:
    """One profiler process.  ``start`` restores the profiles from the database, binds and starts
    consuming (without waiting for NATS); ``stop`` is graceful and idempotent."""

    def __init__(
        self,
        settings: ProfilerSettings,
        *,
        clock: Clock | None = None,
        repository: ProfileRepository | None = None,
    ) -> None:
        """``clock``: wall-clock seconds for closing idle instances (default: time.time);
        ``repository``: where profiles persist (default: one on ``settings.database_url``)."""
        self.settings = settings
        self.clock = clock
        self.repository = repository
        self.store = ProfileStore(settings.profile_config())
        self.servicer = ProfilerServicer(self.store)
        self.server = new_server()
        profiler_pb2_grpc.add_ProfilerServicer_to_server(self.servicer, self.server)
        self.health = add_health(self.server, [SERVICE_NAME])
        self.bus = EventBus(
            settings.nats_url,
            "profiler",
            connect_timeout_s=settings.nats_connect_timeout_s,
            streams={COMPLETIONS_STREAM: (COMPLETIONS_SUBJECT,)},
        )
        self.consumer: CompletionConsumer | None = None
        self.port = 0  # the bound port, known after start (profiler_port 0 picks a free one)
        self._tasks: list[asyncio.Task[object]] = []
        self._stopped = False

    @property
    def address(self) -> str:
        return f"{self.settings.advertised()}:{self.port}"

    async def start(self) -> None:
        if self.repository is None:
            self.repository = await asyncio.to_thread(
                ProfileRepository, self.settings.database_url, config=self.store.config
            )
        # Each profile: its latest snapshot, then the log entries after it, re-applied in order.
        restored = await asyncio.to_thread(self.repository.restore)
        learner = Learner(self.store)
        learner.adopt(restored, (self.clock or WallClock()).now())
        for item in restored.profiles:
            profile = item.profile
            # How far annotations project is a serving setting, not a learned one: it follows ours.
            profile.config = replace(profile.config, projection_steps=self.store.config.projection_steps)
            if profile.config != self.store.config:
                # The state carries its own config (window sizes shape the stored deques).
                logger.warning(
                    "profile %s/%s keeps the settings it was learned with; changed CV_* model settings "
                    "apply to new profiles only", profile.tenant, profile.workflow_type_id,
                )
        metrics.PROFILES.set(len(self.store.profiles))
        logger.info(
            "restored %d profile(s) from the database, replaying %d log entries",
            len(restored.profiles), sum(item.replayed for item in restored.profiles),
        )
        self.consumer = CompletionConsumer(self.bus, learner, self.repository, self.settings, self.clock)
        tls = security.configure(self.settings)  # the bus connects with its credentials too
        self.port = bind(self.server, f"{self.settings.host}:{self.settings.profiler_port}", tls)
        await self.server.start()
        # In the background: with a dead server, the first connect keeps retrying; the consumer
        # waits for the bus, and Annotate answers from memory meanwhile.
        self._tasks = [
            asyncio.create_task(self.bus.connect(), name="profiler-nats-connect"),
            asyncio.create_task(self.consumer.run(), name="profiler-consumer"),
        ]
        await mark_serving(self.health, [SERVICE_NAME])
        logger.info("profiler listening on %s", self.address)

    async def stop(self) -> None:
        if self._stopped:
            return
        self._stopped = True
        await mark_serving(self.health, [SERVICE_NAME], serving=False)
        if self.consumer is not None:
            self.consumer.stop()  # the step in progress settles its batch first
            consumer_task = self._tasks[1]
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(
                    asyncio.shield(consumer_task), self.settings.fetch_timeout_s + self.settings.shutdown_grace_s
                )
        for task in self._tasks:
            if not task.done():
                task.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await task
        if self.consumer is not None:
            # Log what a last tick changed, and snapshot every changed profile: a restart then
            # replays nothing.  Records a failed write left unacked come back as duplicates.
            await self.consumer.persist(final=True)
            await self.consumer.close()
        await self.server.stop(self.settings.shutdown_grace_s)
        await self.bus.close()
        if self.repository is not None:
            self.repository.close()
        logger.info("profiler stopped")
