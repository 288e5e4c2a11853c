"""Placement leases: every placement has an owner and an expiry, and is checked against its worker.

Pure, like the rest of the core: every call takes ``now`` (monotonic seconds).  The scheduler's
adapter grants a lease for each placement it hands out and releases it with the placement; two
things reclaim a placement nobody released:

* its lease ran out (the owner, e.g. a gateway, stopped renewing: it crashed or lost the call);
* its worker, past a grace period after the placement, reported ``missing_reports`` times in a row
  that it does not hold the request (the call never reached the worker, or ended without Complete).

Either way the placement's capacity comes back, so a lost Complete can cost seconds, never a
wedged cluster.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from typing import Literal

ReclaimReason = Literal["lease_expired", "unknown_to_worker"]


@dataclass
class Lease:
    request_id: str
    worker_id: str
    owner: str
    placed_at: float
    expires_at: float
    missing: int = 0  # consecutive worker reports (after the grace period) without this request


@dataclass(frozen=True, slots=True)
class Reclaimed:
    """A placement to release because nobody else will."""

    request_id: str
    worker_id: str
    owner: str
    reason: ReclaimReason


class LeaseBook:
    def __init__(self, lease_s: float = 30.0, reconcile_grace_s: float = 5.0, missing_reports: int = 2) -> None:
        """``lease_s``: how long a placement lives without a renewal.  ``reconcile_grace_s``: how
        old a placement must be before its worker's silence about it counts (the gateway opens the
        call, or a KV move finishes, within it).  ``missing_reports``: how many such reports in a
        row reclaim it (one report may have been taken before the call arrived)."""
        if lease_s <= 0 or reconcile_grace_s < 0 or missing_reports < 1:
            raise ValueError("lease_s must be positive, reconcile_grace_s >= 0, missing_reports >= 1")
        self.lease_s = lease_s
        self.reconcile_grace_s = reconcile_grace_s
        self.missing_reports = missing_reports
        self._leases: dict[str, Lease] = {}
        self._on_worker: dict[str, set[str]] = {}

    def __len__(self) -> int:
        return len(self._leases)

    def grant(self, request_id: str, worker_id: str, owner: str, now: float) -> Lease:
        """A new placement (replacing any lease the id held)."""
        self.release(request_id)
        lease = Lease(request_id, worker_id, owner, placed_at=now, expires_at=now + self.lease_s)
        self._leases[request_id] = lease
        self._on_worker.setdefault(worker_id, set()).add(request_id)
        return lease

    def release(self, request_id: str) -> Lease | None:
        """The placement ended (completed, cancelled or reclaimed); None if it held no lease."""
        lease = self._leases.pop(request_id, None)
        if lease is not None:
            held = self._on_worker[lease.worker_id]
            held.discard(request_id)
            if not held:
                del self._on_worker[lease.worker_id]
        return lease

    def renew(self, owner: str, request_ids: Iterable[str], now: float) -> list[str]:
        """Extend ``owner``'s leases on ``request_ids``; returns the ids it holds no lease on."""
        unknown = []
        for request_id in request_ids:
            lease = self._leases.get(request_id)
            if lease is None or lease.owner != owner:
                unknown.append(request_id)
            else:
                lease.expires_at = now + self.lease_s
        return unknown

    def expired(self, now: float) -> list[Reclaimed]:
        """Remove and return the leases that ran out, oldest placement first."""
        gone = sorted((lease for lease in self._leases.values() if lease.expires_at <= now), key=_age_order)
        for lease in gone:
            self.release(lease.request_id)
        return [Reclaimed(lease.request_id, lease.worker_id, lease.owner, "lease_expired") for lease in gone]

    def reconcile(self, worker_id: str, held: Iterable[str], now: float) -> list[Reclaimed]:
        """A report of the requests ``worker_id`` holds: remove and return the placements on it
        that are past the grace period and were missing from ``missing_reports`` reports in a row."""
        held_ids = set(held)
        reclaimed = []
        for request_id in sorted(self._on_worker.get(worker_id, ())):
            lease = self._leases[request_id]
            if request_id in held_ids:
                lease.missing = 0
            elif now - lease.placed_at >= self.reconcile_grace_s:
                lease.missing += 1
                if lease.missing >= self.missing_reports:
                    reclaimed.append(lease)
        reclaimed.sort(key=_age_order)
        for lease in reclaimed:
            self.release(lease.request_id)
        return [Reclaimed(lease.request_id, lease.worker_id, lease.owner, "unknown_to_worker") for lease in reclaimed]

    def forget_worker(self, worker_id: str) -> list[str]:
        """The worker is gone (its placements were failed with it): drop their leases."""
        request_ids = sorted(self._on_worker.pop(worker_id, ()))
        for request_id in request_ids:
            del self._leases[request_id]
        return request_ids

    def lease_of(self, request_id: str) -> Lease | None:
        return self._leases.get(request_id)

    def check_integrity(self, placements: dict[str, str]) -> None:
        """Assert that the leases are exactly the scheduler's placements (request id -> worker id)."""
        assert {rid: lease.worker_id for rid, lease in self._leases.items()} == placements, "leases drifted"
        indexed = {(w, rid) for w, held in self._on_worker.items() for rid in held}
        assert indexed == {(lease.worker_id, rid) for rid, lease in self._leases.items()}, "worker index"
        assert all(self._on_worker.values()), "an empty worker entry"


def _age_order(lease: Lease) -> tuple[float, str]:
    return (lease.placed_at, lease.request_id)
