"""The placements this gateway holds, and the loop that keeps their leases alive.

A placement is held from the moment ``Schedule`` answers until the gateway calls ``Complete`` for
it.  While held, its lease is renewed (every third of its length), so the scheduler reclaims a
placement only when this process stops renewing it: it crashed, hung or lost the request.
"""

from __future__ import annotations

import asyncio
import logging
import os
import socket
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from typing import Protocol

logger = logging.getLogger(__name__)


class LeaseRenewer(Protocol):
    async def renew(self, owner: str, request_ids: list[str]) -> list[str] | None:
        """Extend the leases; returns the ids the scheduler does not know, None when it failed."""
        ...


@dataclass
class _Held:
    lease_s: float  # 0: the placement has no lease (an older scheduler)
    renewed_at: float


def new_owner_id() -> str:
    """Unique per gateway process, and readable in the scheduler's logs."""
    return f"gateway-{socket.gethostname()}-{os.getpid()}-{uuid.uuid4().hex[:6]}"


class HeldPlacements:
    def __init__(self, owner: str | None = None, now: Callable[[], float] = time.monotonic) -> None:
        self.owner = owner or new_owner_id()
        self._now = now
        self._held: dict[str, _Held] = {}

    def __len__(self) -> int:
        return len(self._held)

    def __contains__(self, request_id: str) -> bool:
        return request_id in self._held

    def hold(self, request_id: str, lease_s: float) -> None:
        self._held[request_id] = _Held(lease_s, self._now())

    def drop(self, request_id: str) -> None:
        self._held.pop(request_id, None)

    def due(self) -> list[str]:
        """The held placements whose lease is a third spent since its last renewal."""
        now = self._now()
        return [rid for rid, held in self._held.items() if held.lease_s and now - held.renewed_at >= held.lease_s / 3]

    async def renew_due(self, renewer: LeaseRenewer) -> int:
        """Renew what is due; returns how many leases were extended."""
        due = self.due()
        if not due:
            return 0
        started = self._now()
        unknown = await renewer.renew(self.owner, due)
        if unknown is None:
            return 0  # the scheduler is unreachable: try again next tick, the leases are long
        gone = set(unknown)
        for rid in due:
            held = self._held.get(rid)
            if held is None:
                continue  # released while the call was in flight
            if rid in gone:
                # The scheduler no longer has it (restarted, or reclaimed it): nothing to renew.
                logger.info("placement of %s is unknown to the scheduler; no longer renewed", rid)
                del self._held[rid]
            else:
                held.renewed_at = started
        return len(due) - len(gone)

    async def renew_forever(self, renewer: LeaseRenewer, tick_s: float = 1.0) -> None:
        while True:
            await asyncio.sleep(tick_s)
            try:
                await self.renew_due(renewer)
            except Exception:  # one failed pass must not end renewal for good
                logger.exception("renewing placement leases failed")
