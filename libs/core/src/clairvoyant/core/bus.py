"""The NATS event bus, with JetStream for what must not be lost.

A dead or absent NATS server degrades service instead of hanging it: ``connect`` returns after
``connect_timeout`` and keeps retrying in the background; while disconnected, plain events are
dropped (and counted) and JetStream records wait in a bounded outbox that is flushed, in order,
once the server is back.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections import deque
from collections.abc import Awaitable, Callable

import nats
from nats.aio.client import Client
from nats.aio.msg import Msg
from nats.js.api import StorageType, StreamConfig
from prometheus_client import Counter, Gauge

from clairvoyant.core.telemetry import inject_headers

logger = logging.getLogger(__name__)

COMPLETIONS_STREAM = "CV_REQUESTS"
COMPLETIONS_SUBJECT = "cv.requests.completed"
WORKER_STATS_WILDCARD = "cv.workers.*.stats"


def worker_stats_subject(worker_id: str) -> str:
    """The subject a worker's heartbeats go to.  The id becomes one subject token, so the
    characters NATS reads as separators or wildcards ('.', '*', '>', whitespace; a hostname such as
    ``node1.example.com`` has dots) are replaced by '_'.  Subscribers read the id from the message."""
    token = "".join("_" if c in ".*>" or c.isspace() else c for c in worker_id) or "_"
    return f"cv.workers.{token}.stats"


EVENTS_DROPPED = Counter("cv_bus_events_dropped_total", "Events dropped because NATS was unreachable", ["subject"])
OUTBOX_DEPTH = Gauge("cv_bus_outbox_depth", "JetStream records waiting for NATS to come back")

Handler = Callable[[Msg], Awaitable[None]]


class EventBus:
    """One NATS connection per process.  Safe to use before (or without) a server."""

    def __init__(
        self,
        url: str,
        name: str,
        *,
        connect_timeout_s: float = 2.0,
        outbox_limit: int = 10_000,
        streams: dict[str, tuple[str, ...]] | None = None,
    ) -> None:
        """``streams``: JetStream streams (name -> subjects) this process publishes to; they are
        created if missing on every (re)connect, before the outbox is flushed."""
        self.url = url
        self.streams = dict(streams or {})
        self.name = name
        self.connect_timeout_s = connect_timeout_s
        self._nc: Client | None = None
        self._outbox: deque[tuple[str, bytes, dict[str, str]]] = deque(maxlen=outbox_limit)
        self._subscriptions: list[tuple[str, Handler]] = []
        self._retry_task: asyncio.Task[None] | None = None
        self._flusher: asyncio.Task[None] | None = None
        self._flush_lock = asyncio.Lock()

    @property
    def connected(self) -> bool:
        return self._nc is not None and self._nc.is_connected

    async def connect(self) -> bool:
        """Try once; on failure keep retrying in the background.  Returns whether connected now."""
        self._flusher = asyncio.create_task(self._flush_forever())
        if await self._try_connect():
            return True
        logger.warning("NATS at %s unreachable; running degraded and retrying", self.url)
        self._retry_task = asyncio.create_task(self._retry_forever())
        return False

    async def _try_connect(self) -> bool:
        try:
            # nats-py retries a failing *first* connect forever when reconnects are allowed, so
            # the first attempt gets a hard deadline of its own.
            self._nc = await asyncio.wait_for(
                nats.connect(
                    self.url,
                    name=self.name,
                    connect_timeout=max(1, int(self.connect_timeout_s)),
                    allow_reconnect=True,
                    max_reconnect_attempts=-1,
                    reconnect_time_wait=1,
                    reconnected_cb=self._on_reconnect,
                    disconnected_cb=self._on_disconnect,
                    error_cb=self._on_error,
                ),
                timeout=self.connect_timeout_s,
            )
        except (OSError, TimeoutError, nats.errors.Error) as exc:
            logger.debug("NATS connect failed: %s", exc)
            return False
        logger.info("connected to NATS at %s", self.url)
        for subject, handler in self._subscriptions:
            await self._nc.subscribe(subject, cb=handler)
        await self._ensure_streams()
        await self._flush_outbox()
        return True

    async def _ensure_streams(self) -> None:
        for name, subjects in self.streams.items():
            try:
                await self.ensure_stream(name, subjects)
            except (nats.errors.Error, TimeoutError) as exc:
                logger.warning("could not create JetStream stream %s: %s", name, exc)

    async def _flush_forever(self) -> None:
        """Records that failed (e.g. the stream was briefly missing) are retried every second."""
        while True:
            await asyncio.sleep(1.0)
            if self._outbox and self.connected:
                await self._ensure_streams()
                await self._flush_outbox()

    async def _retry_forever(self) -> None:
        while not await self._try_connect():
            await asyncio.sleep(1.0)

    async def _on_error(self, exc: Exception) -> None:
        logger.debug("NATS error: %s", exc)

    async def _on_disconnect(self) -> None:
        logger.warning("disconnected from NATS")

    async def _on_reconnect(self) -> None:
        logger.info("reconnected to NATS")
        await self._ensure_streams()
        await self._flush_outbox()

    async def ensure_stream(self, name: str = COMPLETIONS_STREAM, subjects: tuple[str, ...] = (COMPLETIONS_SUBJECT,)) -> None:
        """Create the JetStream stream if it does not exist (idempotent)."""
        if not self.connected or self._nc is None:
            return
        js = self._nc.jetstream()
        config = StreamConfig(name=name, subjects=list(subjects), storage=StorageType.FILE)
        try:
            await js.add_stream(config)
        except nats.js.errors.BadRequestError:
            await js.update_stream(config)

    async def publish(self, subject: str, data: bytes) -> None:
        """Fire-and-forget event (heartbeats, directives).  Dropped while disconnected."""
        if not self.connected or self._nc is None:
            EVENTS_DROPPED.labels(subject.split(".")[1] if "." in subject else subject).inc()
            return
        await self._nc.publish(subject, data, headers=inject_headers() or None)

    async def publish_durable(self, subject: str, data: bytes) -> bool:
        """Publish to JetStream and wait for the ack; queue in the outbox when that fails."""
        headers = inject_headers()
        if self.connected and not self._outbox and await self._js_publish(subject, data, headers):
            return True
        self._outbox.append((subject, data, headers))
        OUTBOX_DEPTH.set(len(self._outbox))
        if self.connected:
            asyncio.create_task(self._flush_outbox())
        return False

    async def _js_publish(self, subject: str, data: bytes, headers: dict[str, str]) -> bool:
        assert self._nc is not None
        try:
            await self._nc.jetstream().publish(subject, data, headers=headers or None, timeout=2.0)
        except (nats.errors.Error, TimeoutError, OSError) as exc:
            logger.warning("JetStream publish to %s failed: %s", subject, exc)
            return False
        return True

    async def _flush_outbox(self) -> None:
        async with self._flush_lock:
            while self._outbox and self.connected:
                subject, data, headers = self._outbox[0]
                if not await self._js_publish(subject, data, headers):
                    return
                self._outbox.popleft()
                OUTBOX_DEPTH.set(len(self._outbox))

    async def subscribe(self, subject: str, handler: Handler) -> None:
        """Subscribe now if connected, and again after every (re)connect."""
        self._subscriptions.append((subject, handler))
        if self.connected and self._nc is not None:
            await self._nc.subscribe(subject, cb=handler)

    @property
    def client(self) -> Client | None:
        return self._nc

    async def close(self) -> None:
        for task in (self._retry_task, self._flusher):
            if task is not None:
                task.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await task
        if self._nc is not None and not self._nc.is_closed:
            with contextlib.suppress(Exception):
                await self._nc.drain()
