"""The scaling loop's background work: actuator calls retried with backoff, run as tasks that a
tick does not wait for."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable

from clairvoyant.autoscaler import metrics
from clairvoyant.autoscaler.actuators.base import ActuatorError

logger = logging.getLogger(__name__)

MAX_BACKOFF_S = 30.0


class Background:
    def __init__(self, retries: int, backoff_s: float) -> None:
        self.retries = retries
        self.backoff_s = backoff_s
        self._tasks: set[asyncio.Task[None]] = set()

    async def retry(self, what: str, action: Callable[[], Awaitable[str | None]]) -> str:
        """``action``'s result, after up to ``retries`` retries of an ActuatorError, waiting
        ``backoff_s`` doubling to 30 s between them; the last error is raised."""
        delay = self.backoff_s
        for attempt in range(self.retries + 1):
            try:
                return await action() or ""
            except ActuatorError as exc:
                if attempt == self.retries:
                    logger.error("gave up trying to %s after %d attempts: %s", what, attempt + 1, exc)
                    raise
                logger.warning("could not %s (%s); retrying in %.1f s", what, exc, delay)
                metrics.ACTUATOR_RETRIES.inc()
                await asyncio.sleep(delay)
                delay = min(delay * 2, MAX_BACKOFF_S)
        raise AssertionError("unreachable")

    def spawn(self, work: Awaitable[None]) -> None:
        task: asyncio.Task[None] = asyncio.ensure_future(work)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def settle(self) -> None:
        """Until every task (and any it started) is done."""
        while self._tasks:
            await asyncio.gather(*list(self._tasks), return_exceptions=True)

    async def close(self) -> None:
        for task in list(self._tasks):
            task.cancel()
        await asyncio.gather(*list(self._tasks), return_exceptions=True)
