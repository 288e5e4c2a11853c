"""The gateway's wiring: the front (``frontend``) and both edges over it, uvicorn (``http_api``)
and the grpc.aio server (``grpc_api``), in one asyncio loop with the event bus.

``GatewayApp`` is what ``python -m clairvoyant.gateway serve`` runs and what the tests start
in-process; ``serve`` adds logging, tracing, NATS and signal handling around it.
"""

from __future__ import annotations

import asyncio
import contextlib
import gc
import logging
import signal
from collections.abc import Coroutine, Iterator
from typing import Any

import grpc
import uvicorn
from sqlalchemy.exc import SQLAlchemyError

from clairvoyant.core import security
from clairvoyant.core.bus import COMPLETIONS_STREAM, COMPLETIONS_SUBJECT, EventBus
from clairvoyant.core.grpcutil import bind, mark_serving
from clairvoyant.core.logs import setup_logging
from clairvoyant.core.telemetry import setup_tracing
from clairvoyant.gateway.config import GatewaySettings
from clairvoyant.gateway.frontend import GatewayFrontend
from clairvoyant.gateway.grpc_api import SERVICE_NAME, create_grpc_server
from clairvoyant.gateway.http_api import create_app
from clairvoyant.gateway.pipeline import RecordSink

logger = logging.getLogger(__name__)


class _Uvicorn(uvicorn.Server):
    @contextlib.contextmanager
    def capture_signals(self) -> Iterator[None]:
        # Signals belong to ``serve`` below, which stops gRPC and the bus too; uvicorn's own
        # handlers would also re-raise the signal once it has stopped.
        yield


class GatewayApp:
    """Both edges over one ``GatewayFrontend``.  Port 0 picks a free port; ``http_port``/``grpc_port``
    say which after ``start``."""

    def __init__(self, settings: GatewaySettings, records: RecordSink) -> None:
        self.settings = settings
        self._tls = security.configure(settings)  # first: the clients open their channels below
        self.frontend = GatewayFrontend(settings, records)
        config = uvicorn.Config(
            create_app(settings, self.frontend),
            host=settings.host,
            port=settings.gateway_port,
            log_config=None,  # keep the JSON logging set up by the service
            access_log=False,
            lifespan="off",
            timeout_graceful_shutdown=int(settings.shutdown_grace_s),
        )
        self._http = _Uvicorn(config)
        self._http_task: asyncio.Task[None] | None = None
        self._grpc, self._health = create_grpc_server(self.frontend)
        self.http_port = settings.gateway_port
        self.grpc_port = settings.gateway_grpc_port

    async def start(self) -> None:
        await self.frontend.start()
        self.grpc_port = bind(self._grpc, f"{self.settings.host}:{self.settings.gateway_grpc_port}", self._tls)
        await self._grpc.start()
        self._http_task = asyncio.create_task(self._http.serve())
        while not self._http.started:
            if self._http_task.done():  # e.g. the port is taken: uvicorn logged why
                await self._grpc.stop(None)
                raise RuntimeError(
                    f"the HTTP server did not start on {self.settings.host}:{self.settings.gateway_port}"
                )
            await asyncio.sleep(0.02)
        self.http_port = self._http.servers[0].sockets[0].getsockname()[1]
        await mark_serving(self._health, [SERVICE_NAME])
        host = self.settings.advertised()
        logger.info("OpenAI-compatible API on http://%s:%d/v1 (metrics on /metrics)", host, self.http_port)
        logger.info("gRPC Gateway service on %s:%d (grpc.health.v1 too)", host, self.grpc_port)

    def request_stop(self, force: bool = False) -> None:
        self._http.should_exit = True
        self._http.force_exit = self._http.force_exit or force

    async def wait(self) -> None:
        if self._http_task is not None:
            with contextlib.suppress(SystemExit):
                await self._http_task

    async def stop(self) -> None:
        """Refuse new work, let in-flight requests finish (up to shutdown_grace_s), then close."""
        await mark_serving(self._health, [SERVICE_NAME], serving=False)
        self.request_stop()
        await asyncio.gather(self.wait(), self._grpc.stop(self.settings.shutdown_grace_s))
        await self.frontend.aclose()


async def serve(settings: GatewaySettings) -> None:
    setup_tracing("gateway")
    bus = EventBus(
        settings.nats_url,
        "gateway",
        connect_timeout_s=settings.nats_connect_timeout_s,
        streams={COMPLETIONS_STREAM: (COMPLETIONS_SUBJECT,)},  # (re)created on every (re)connect
    )
    server = GatewayApp(settings, bus)  # first: a database it cannot open stops it before NATS
    await bus.connect()  # a dead NATS degrades: records wait in the bus outbox
    loop = asyncio.get_running_loop()
    signals = 0

    def on_signal(signum: int) -> None:
        nonlocal signals
        signals += 1
        logger.info(
            "received %s; shutting down%s", signal.Signals(signum).name, " now" if signals > 1 else ""
        )
        server.request_stop(force=signals > 1)

    for signum in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(signum, on_signal, signum)
    try:
        await server.start()
        # What start-up built lives as long as the process: frozen, a full collection no longer
        # walks it (~110,000 objects; ~0.2 s on a 2-core machine, every request in flight stalled).
        gc.freeze()
        await server.wait()
    finally:
        await server.stop()
        await bus.close()
        logger.info("gateway stopped")


def run_loop(main: Coroutine[Any, Any, None]) -> None:
    """``asyncio.run`` on uvloop where it is installed (uvicorn[standard] brings it): the gateway's
    one event loop parses every request, and uvloop roughly halves what a burst of refusals costs."""
    try:
        import uvloop
    except ImportError:
        asyncio.run(main)
    else:
        uvloop.run(main)


def run(settings: GatewaySettings) -> None:
    setup_logging("gateway", settings.log_level, settings.log_json)
    try:
        run_loop(serve(settings))
    except (RuntimeError, OSError, grpc.RpcError, SQLAlchemyError) as exc:  # e.g. port taken, database down
        logger.error("gateway failed: %s", exc)
        raise SystemExit(1) from None
