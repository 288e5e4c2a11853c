"""Running a service process until SIGTERM or SIGINT (every service's ``__main__``)."""

from __future__ import annotations

import asyncio
import logging
import signal
from typing import Protocol

logger = logging.getLogger(__name__)


class Service(Protocol):
    async def start(self) -> None: ...

    async def stop(self) -> None: ...


async def serve_until_signal(app: Service) -> None:
    """Start ``app``, wait for SIGTERM or SIGINT, then stop it (also when starting failed midway)."""
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    try:
        await app.start()
        await stop.wait()
        logger.info("signal received; shutting down")
    finally:
        await app.stop()
