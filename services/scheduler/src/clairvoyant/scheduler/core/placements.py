"""Placement accounting: which worker holds each placed request, and the lease on it.

A placement lives from ``place`` until it is released (completed, abandoned, re-submitted),
reclaimed (its lease ran out, or its worker does not hold it; ``leases.py``) or failed with its
worker.  The book changes no worker's placed count and no program: ``GlobalScheduler`` does both
with what each call returns.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import NamedTuple

from clairvoyant.policy.types import QueuedRequest, WorkerView
from clairvoyant.scheduler.core.leases import LeaseBook, Reclaimed


class Placement(NamedTuple):
    worker_id: str
    request: QueuedRequest
    dispatch_time: float
    priority: float = 0.0  # the base priority it was placed with


class PlacementBook:
    def __init__(self, leases: LeaseBook | None = None) -> None:
        """``leases``: when given, every placement holds a lease in it."""
        self.leases = leases
        self._placements: dict[str, Placement] = {}  # request id -> placement
        self._placed_on: dict[str, dict[str, QueuedRequest]] = {}  # worker -> id -> request, in order

    def __contains__(self, request_id: object) -> bool:
        return request_id in self._placements

    def place(self, request: QueuedRequest, worker_id: str, now: float, priority: float = 0.0) -> None:
        """``request`` (holding no placement) is placed on ``worker_id`` at ``now`` with base
        priority ``priority``."""
        self._placements[request.request_id] = Placement(worker_id, request, now, priority)
        if self.leases is not None:
            self.leases.grant(request.request_id, worker_id, request.owner, now)
        self._placed_on.setdefault(worker_id, {})[request.request_id] = request

    def release(self, request_id: str, worker_id: str | None = None) -> Placement | None:
        """End a placement and its lease.  None when unknown or already released, or when
        ``worker_id`` is given and the placement is on another worker (a stale completion)."""
        held = self._placements.get(request_id)
        if held is None or (worker_id and held.worker_id != worker_id):
            return None
        del self._placements[request_id]
        del self._placed_on[held.worker_id][request_id]
        if self.leases is not None:
            self.leases.release(request_id)
        return held

    def renew(self, owner: str, request_ids: list[str], now: float) -> list[str]:
        """Extend ``owner``'s leases on these placements; returns the ids it holds none on."""
        return [] if self.leases is None else self.leases.renew(owner, request_ids, now)

    def expired(self, now: float) -> list[Reclaimed]:
        """The placements whose lease ran out, oldest first; their leases end here, and the
        caller ``release``s each."""
        return [] if self.leases is None else self.leases.expired(now)

    def unknown_to_worker(self, worker_id: str, held: frozenset[str], now: float) -> list[Reclaimed]:
        """``worker_id`` holds exactly ``held``: the placements on it that it has not heard of for
        a while (``LeaseBook.reconcile``); their leases end here, and the caller ``release``s each."""
        return [] if self.leases is None else self.leases.reconcile(worker_id, held, now)

    def fail_worker(self, worker_id: str) -> list[Placement]:
        """The worker is gone: end its placements (in placement order) and drop their leases."""
        placements = [self._placements.pop(rid) for rid in self._placed_on.pop(worker_id, {})]
        if self.leases is not None:
            self.leases.forget_worker(worker_id)
        return placements

    def least_urgent(self, worker_id: str) -> float | None:
        """The lowest base priority among the placements on ``worker_id``; None when it holds none."""
        held = self._placed_on.get(worker_id)
        if not held:
            return None
        return min(self._placements[request_id].priority for request_id in held)

    def worker_of(self, request_id: str) -> str | None:
        held = self._placements.get(request_id)
        return held.worker_id if held is not None else None

    def placements(self) -> list[Placement]:
        """Every placement: worker by worker, each in placement order."""
        return [self._placements[rid] for held in self._placed_on.values() for rid in held]

    def requests_on(self, worker_id: str) -> list[QueuedRequest]:
        """The requests placed on ``worker_id``, in placement order."""
        return list(self._placed_on.get(worker_id, {}).values())

    def check_integrity(self, workers: Iterable[WorkerView]) -> None:
        """Assert that each worker's placed count is its placements and that the indexes agree."""
        counts: dict[str, int] = {}
        for placement in self._placements.values():
            counts[placement.worker_id] = counts.get(placement.worker_id, 0) + 1
        for worker in workers:
            assert worker.placed == counts.pop(worker.worker_id, 0), (
                f"{worker.worker_id}: placed count drifted"
            )
            assert worker.placed >= 0
        assert not counts, f"placements on unknown workers: {counts}"
        by_worker = {(p.worker_id, rid) for rid, p in self._placements.items()}
        assert by_worker == {(w, rid) for w, held in self._placed_on.items() for rid in held}, "placement index"

    def check_leases(self) -> None:
        """Assert that the leases (if any) are exactly the placements."""
        if self.leases is not None:
            self.leases.check_integrity({rid: p.worker_id for rid, p in self._placements.items()})
