"""The NATS event bus, with JetStream for what must not be lost.

A dead or absent NATS server degrades service instead of hanging it: ``connect`` returns after
``connect_timeout`` and keeps retrying in the background; while disconnected, plain events are
dropped (and counted) and JetStream records wait in a bounded outbox that is flushed, in order,
once the server is back.  Credentials the server refuses degrade the same way, with an error in
the log (and ``EventBus.last_error``) that says so.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import ssl
from collections import deque
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import nats
from nats.aio.client import Client
from nats.aio.msg import Msg
from nats.js.api import StorageType, StreamConfig
from prometheus_client import Counter, Gauge

from clairvoyant.core.config import ServiceSettings
from clairvoyant.core.logs import mask_url
from clairvoyant.core.telemetry import inject_headers

logger = logging.getLogger(__name__)

COMPLETIONS_STREAM = "CV_REQUESTS"
COMPLETIONS_SUBJECT = "cv.requests.completed"
WORKER_STATS_WILDCARD = "cv.workers.*.stats"
# A (re)started KV-event subscriber asks every worker for its tiers' contents here (an empty
# message; or a worker id, to ask one worker whose events had a gap); each worker asked answers on
# its own cv.kv.events.<worker> subject with a CLEARED + STORED snapshot, in sequence.
KV_RESYNC_SUBJECT = "cv.kv.resync"


def worker_stats_subject(worker_id: str) -> str:
    """The subject a worker's heartbeats go to.  The id becomes one subject token, so the
    characters NATS reads as separators or wildcards ('.', '*', '>', whitespace; a hostname such as
    ``node1.example.com`` has dots) are replaced by '_'.  Subscribers read the id from the message."""
    token = "".join("_" if c in ".*>" or c.isspace() else c for c in worker_id) or "_"
    return f"cv.workers.{token}.stats"


EVENTS_DROPPED = Counter(
    "cv_bus_events_dropped_total", "Events dropped because NATS was unreachable", ["subject"]
)
OUTBOX_DEPTH = Gauge("cv_bus_outbox_depth", "JetStream records waiting for NATS to come back")

Handler = Callable[[Msg], Awaitable[None]]


@dataclass(frozen=True)
class NatsSecurity:
    """Credentials and TLS for a NATS connection; ``NatsSecurity()`` adds none (a user and password
    in the URL still apply).  Files are read by nats-py when it connects (and reconnects)."""

    user: str = ""
    password: str = field(default="", repr=False)
    token: str = field(default="", repr=False)
    nkey_seed_file: str = ""  # an nkeys user seed (SU...): the server knows the public key
    creds_file: str = ""  # a user JWT and its seed (decentralised auth)
    tls_ca: str = ""  # verifies the server; empty: system roots
    tls_cert: str = ""  # client certificate, for servers that verify clients
    tls_key: str = ""
    tls_server_name: str = ""  # expected in the server's certificate instead of the URL's host

    @classmethod
    def from_settings(cls, settings: ServiceSettings) -> NatsSecurity:
        return cls(
            user=settings.nats_user,
            password=settings.nats_password.get_secret_value() if settings.nats_password else "",
            token=settings.nats_token.get_secret_value() if settings.nats_token else "",
            nkey_seed_file=settings.nats_nkey_seed_file,
            creds_file=settings.nats_creds_file,
            tls_ca=settings.nats_tls_ca,
            tls_cert=settings.nats_tls_cert,
            tls_key=settings.nats_tls_key,
            tls_server_name=settings.nats_tls_server_name,
        )

    def uses_tls(self, url: str) -> bool:
        return url.startswith("tls://") or bool(self.tls_ca or self.tls_cert)

    def connect_options(self, url: str) -> dict[str, Any]:
        """Keyword arguments for ``nats.connect(url, ...)``."""
        options: dict[str, Any] = {}
        if self.user:
            options.update(user=self.user, password=self.password)
        if self.token:
            options["token"] = self.token
        if self.creds_file:
            options["user_credentials"] = self.creds_file
        elif self.nkey_seed_file:
            options["nkeys_seed"] = self.nkey_seed_file
        if self.uses_tls(url):
            context = ssl.create_default_context(cafile=self.tls_ca or None)
            if self.tls_cert:
                context.load_cert_chain(self.tls_cert, self.tls_key)
            options["tls"] = context
            if self.tls_server_name:
                options["tls_hostname"] = self.tls_server_name
        return options

    def secrets(self) -> list[str]:
        """What must never be logged: the password, the token and the nkeys seeds."""
        seeds = []
        for path in (self.nkey_seed_file, self.creds_file):
            if path:
                text = Path(path).read_text()
                seeds += [line.strip() for line in text.splitlines() if line.strip().startswith("SU")]
        return [value for value in (self.password, self.token, *seeds) if value]


_process_security = NatsSecurity()


def configure_nats(security: NatsSecurity) -> NatsSecurity:
    """Make ``security`` what an ``EventBus`` given none uses; returns it.  Called once at a
    service's start (``clairvoyant.core.security.configure``)."""
    global _process_security
    _process_security = security
    return security


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
        security: NatsSecurity | None = None,
    ) -> None:
        """``streams``: JetStream streams (name -> subjects) this process publishes to; they are
        created if missing on every (re)connect, before the outbox is flushed.  ``security``:
        credentials and TLS (default: the process's, as set by ``configure_nats`` when the bus
        connects)."""
        self.url = url
        self.security = security
        self.last_error = ""  # why the last connection attempt failed, for operators and tests
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

    @property
    def outbox_depth(self) -> int:
        """Records waiting for NATS (what ``cv_bus_outbox_depth`` shows for this process's bus)."""
        return len(self._outbox)

    async def connect(self) -> bool:
        """Try once; on failure keep retrying in the background.  Returns whether connected now."""
        self._flusher = asyncio.create_task(self._flush_forever())
        if await self._try_connect():
            return True
        logger.warning("NATS at %s unreachable; running degraded and retrying", mask_url(self.url))
        self._retry_task = asyncio.create_task(self._retry_forever())
        return False

    async def _try_connect(self) -> bool:
        security = self.security if self.security is not None else _process_security
        try:
            options = security.connect_options(self.url)
        except (OSError, ValueError) as exc:  # e.g. a TLS file that cannot be read
            self._fail(f"NATS TLS settings unusable: {exc}")
            return False
        try:
            # nats-py retries a failing *first* connect forever when reconnects are allowed, so
            # the first attempt gets a hard deadline of its own.
            self._nc = await asyncio.wait_for(
                nats.connect(
                    self.url,
                    **options,
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
        self.last_error = ""
        logger.info("connected to NATS at %s", mask_url(self.url))
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
        if isinstance(exc, nats.errors.AuthorizationError) or "authorization" in str(exc).lower():
            self._fail(
                f"NATS at {mask_url(self.url)} refused this service's credentials (authorization "
                "violation): check CV_NATS_USER/CV_NATS_PASSWORD, CV_NATS_TOKEN, CV_NATS_NKEY_SEED_FILE "
                "or CV_NATS_CREDS_FILE and the server's authorization block"
            )
        elif isinstance(exc, ssl.SSLError):
            self._fail(f"TLS with NATS at {mask_url(self.url)} failed: {exc}")
        else:
            logger.debug("NATS error: %s", exc)

    def _fail(self, reason: str) -> None:
        """Log a connection failure an operator must act on, once until it changes."""
        if reason != self.last_error:
            logger.error("%s", reason)
        self.last_error = reason

    async def _on_disconnect(self) -> None:
        logger.warning("disconnected from NATS")

    async def _on_reconnect(self) -> None:
        self.last_error = ""
        logger.info("reconnected to NATS")
        await self._ensure_streams()
        await self._flush_outbox()

    async def ensure_stream(
        self, name: str = COMPLETIONS_STREAM, subjects: tuple[str, ...] = (COMPLETIONS_SUBJECT,)
    ) -> None:
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
