"""Placement releases that failed, tried again in the background until the scheduler answers.

The gateway releases a placement (``Scheduler.Complete``) once, off the request's path
(``Pipeline.release``).  A release the scheduler did not answer -- unreachable, timed out, shed --
comes here: ``ReleaseRetries.retry`` returns at once and a task of its own tries again after a
back-off that doubles, up to ``max_attempts`` attempts in all.  Nothing is lost when that fails
too: the gateway stopped renewing the placement's lease before its first attempt, so the
scheduler reclaims the placement once the lease runs out (``CV_PLACEMENT_LEASE_S``).  Retries are
bounded (``max_pending``): beyond that, a release is left to the lease at once.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable
from typing import NamedTuple, Protocol

from clairvoyant.contracts.v1 import common_pb2
from clairvoyant.gateway import metrics

logger = logging.getLogger(__name__)


class Completer(Protocol):
    async def complete(
        self, request_id: str, worker_id: str, status: common_pb2.RequestStatus, output_tokens: int = 0
    ) -> bool:
        """Release one placement; False when the scheduler did not answer and trying again may
        help, True otherwise (released, unknown to it, or refused for good).  Never raises."""
        ...


class Release(NamedTuple):
    request_id: str
    worker_id: str  # "" when the placement's worker is unknown (a Schedule call cut off)
    status: common_pb2.RequestStatus
    output_tokens: int


class ReleaseRetries:
    """Retries of failed releases: ``retry`` never waits; ``aclose`` waits for those under way."""

    def __init__(
        self,
        completer: Completer,
        *,
        max_attempts: int = 5,
        first_backoff_s: float = 0.1,
        max_pending: int = 10_000,
        sleep: Callable[[float], Awaitable[None]] = asyncio.sleep,
    ) -> None:
        """``max_attempts`` counts the first, failed one: with the defaults, retries at 0.1, 0.3,
        0.7 and 1.5 s after it, well inside a placement lease (30 s by default)."""
        if max_attempts < 1:
            raise ValueError(f"max_attempts must be at least 1, not {max_attempts}")
        if first_backoff_s < 0:
            raise ValueError(f"first_backoff_s must not be negative, not {first_backoff_s}")
        self.completer = completer
        self.max_attempts = max_attempts
        self.first_backoff_s = first_backoff_s
        self.max_pending = max_pending
        self._sleep = sleep
        self._tasks: set[asyncio.Task[bool]] = set()

    def __len__(self) -> int:
        """Releases being retried now."""
        return len(self._tasks)

    def retry(self, release: Release) -> asyncio.Task[bool] | None:
        """Try ``release`` again in the background (its first attempt failed).  The task answers
        True once the scheduler has answered, False when it was left to the lease; None: too many
        retries are under way, and this one is left to the lease at once."""
        if len(self._tasks) >= self.max_pending:
            self._abandon(release, "too many releases are being retried")
            return None
        metrics.RELEASE_FAILURES.labels("retried").inc()
        task = asyncio.ensure_future(self._retry(release))
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)
        return task

    async def _retry(self, release: Release) -> bool:
        backoff_s = self.first_backoff_s
        for attempt in range(2, self.max_attempts + 1):
            await self._sleep(backoff_s)
            backoff_s *= 2
            if await self.completer.complete(*release):
                logger.info("released %s on attempt %d", release.request_id, attempt)
                return True
            if attempt < self.max_attempts:
                metrics.RELEASE_FAILURES.labels("retried").inc()
        self._abandon(release, f"{self.max_attempts} attempts failed")
        return False

    @staticmethod
    def _abandon(release: Release, why: str) -> None:
        metrics.RELEASE_FAILURES.labels("abandoned").inc()
        logger.warning(
            "placement of %s on %s left to the scheduler's lease: %s",
            release.request_id,
            release.worker_id or "(unknown worker)",
            why,
        )

    async def aclose(self, timeout_s: float = 5.0) -> None:
        """Wait for the retries under way (at shutdown), then cancel what is left: the lease
        covers it."""
        if self._tasks:
            await asyncio.wait(set(self._tasks), timeout=timeout_s)
        for task in list(self._tasks):
            task.cancel()
