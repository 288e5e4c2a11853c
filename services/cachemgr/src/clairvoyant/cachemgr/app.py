"""The cache manager's wiring: the core and its cache policy, the gRPC server + health, the
workers' NATS feeds (``subscriptions``), the completion consumer (``consumer``), the directive
sender (``dispatch``) and the tick loop; started and stopped together."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time

from clairvoyant.cachemgr import metrics
from clairvoyant.cachemgr.config import CacheManagerSettings
from clairvoyant.cachemgr.consumer import CompletionConsumer
from clairvoyant.cachemgr.core import CacheManagerCore
from clairvoyant.cachemgr.dispatch import Dispatcher
from clairvoyant.cachemgr.grpc_api import CacheManagerServicer
from clairvoyant.cachemgr.subscriptions import WorkerFeeds
from clairvoyant.contracts.v1 import cachemgr_pb2, cachemgr_pb2_grpc
from clairvoyant.core import security
from clairvoyant.core.bus import COMPLETIONS_STREAM, COMPLETIONS_SUBJECT, KV_RESYNC_SUBJECT, EventBus
from clairvoyant.core.clock import Clock
from clairvoyant.core.grpcutil import add_health, bind, mark_serving, new_server
from clairvoyant.policy import CACHE_POLICIES
from clairvoyant.policy.cache import CachePolicy

logger = logging.getLogger(__name__)

SERVICE_NAME = cachemgr_pb2.DESCRIPTOR.services_by_name["CacheManager"].full_name


class WallClock:
    """Seconds since the epoch: the scale of the completion records' times, which the core
    compares with its own ``now``."""

    def now(self) -> float:
        return time.time()


class CacheManagerApp:
    """One cache manager process.  ``start`` binds and serves without waiting for NATS (the bus
    keeps retrying in the background); ``stop`` is graceful and idempotent.  Nothing else in the
    cluster waits on it: the workers apply its directives when they come."""

    def __init__(
        self, settings: CacheManagerSettings, *, clock: Clock | None = None, policy: CachePolicy | None = None
    ) -> None:
        """``clock``: seconds since the epoch (default: time.time), the records' scale; ``policy``:
        a cache policy object to run instead of the one the settings name (Stats then names its
        class)."""
        self.settings = settings
        self.clock = clock or WallClock()
        if policy is None:
            self.policy_name = settings.policy_name()
            policy = CACHE_POLICIES.create(self.policy_name)
        else:
            self.policy_name = type(policy).__name__
        self.core = CacheManagerCore(policy, settings.core_config(), policy_name=self.policy_name)
        self.server = new_server()
        cachemgr_pb2_grpc.add_CacheManagerServicer_to_server(CacheManagerServicer(self.core), self.server)
        self.health = add_health(self.server, [SERVICE_NAME])
        self.bus = EventBus(
            settings.nats_url,
            "cachemgr",
            connect_timeout_s=settings.nats_connect_timeout_s,
            streams={COMPLETIONS_STREAM: (COMPLETIONS_SUBJECT,)},
        )
        self.dispatcher = Dispatcher(self.bus, settings.cachemgr_directive_timeout_s)
        self.feeds = WorkerFeeds(self.core, self.clock, self.dispatcher.unsupported)
        self.consumer = CompletionConsumer(self.bus, self.core, self.dispatcher, settings, self.clock)
        self.port = 0  # the bound port, known after start (cachemgr_port 0 picks a free one)
        self._tasks: list[asyncio.Task[None]] = []
        self._connect: asyncio.Task[bool] | None = None
        self._stopped = False
        self._synced = False  # the workers were asked for their tiers since the last (re)connect

    @property
    def address(self) -> str:
        return f"{self.settings.advertised()}:{self.port}"

    async def start(self) -> None:
        tls = security.configure(self.settings)  # the bus connects with its credentials too
        self.port = bind(self.server, f"{self.settings.host}:{self.settings.cachemgr_port}", tls)
        await self.server.start()
        await self.feeds.subscribe(self.bus)  # registered now, subscribed on every (re)connect
        self._connect = asyncio.create_task(self.bus.connect(), name="cachemgr-nats-connect")
        self._tasks = [
            asyncio.create_task(self.consumer.run(), name="cachemgr-consumer"),
            asyncio.create_task(self._tick_forever(), name="cachemgr-tick"),
        ]
        await mark_serving(self.health, [SERVICE_NAME])
        logger.info("cache manager (cache policy %s) listening on %s", self.policy_name, self.address)

    def tick(self) -> None:
        """One tick: forget silent workers, then the policy's due directives and the core's expiries."""
        now = self.clock.now()
        self.feeds.sweep(now)
        self.dispatcher.send(self.core.tick(now))
        metrics.observe(self.core.stats())

    async def resync(self) -> None:
        """After every (re)connect, ask the workers for their tiers' contents (``cv.kv.resync``):
        the index then rebuilds from their snapshots instead of waiting for new blocks."""
        connected = self.bus.connected
        if connected and not self._synced:
            await self.bus.publish(KV_RESYNC_SUBJECT, b"")
            logger.info("asked the workers for their KV tiers (%s)", KV_RESYNC_SUBJECT)
        self._synced = connected

    async def _tick_forever(self) -> None:
        while True:
            await asyncio.sleep(self.settings.cachemgr_tick_interval_s)
            try:
                await self.resync()
                self.tick()
            except Exception:  # a policy bug must not stop the loop
                logger.exception("cache manager tick failed")

    async def stop(self) -> None:
        if self._stopped:
            return
        self._stopped = True
        await mark_serving(self.health, [SERVICE_NAME], serving=False)
        self.consumer.stop()
        if self._tasks:  # the consumer's batch in progress is acked first
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(
                    asyncio.shield(self._tasks[0]),
                    self.settings.cachemgr_fetch_timeout_s + self.settings.shutdown_grace_s,
                )
        for task in [*self._tasks, self._connect]:
            if task is not None and not task.done():
                task.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await task
        await self.dispatcher.close()
        await self.consumer.close()
        await self.server.stop(self.settings.shutdown_grace_s)
        await self.bus.close()
        logger.info("cache manager stopped")
