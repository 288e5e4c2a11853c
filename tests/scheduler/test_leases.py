"""Placement leases in the pure core: expiry, renewal, reconciliation against worker reports."""

from __future__ import annotations

import contextlib
import random

import pytest

from clairvoyant.core.errors import ClairvoyantError
from clairvoyant.scheduler.core import GlobalScheduler, LeaseBook, QueuedRequest, Reclaimed, WorkerReport

pytestmark = pytest.mark.unit

MODEL = "m"


def report(worker_id: str, held: frozenset[str] | None = None, max_batch: int = 4) -> WorkerReport:
    return WorkerReport(
        worker_id=worker_id, model=MODEL, address=f"{worker_id}:1", max_batch=max_batch, held_requests=held
    )


def request(request_id: str, owner: str = "gw-1") -> QueuedRequest:
    return QueuedRequest(request_id=request_id, tenant="t", model=MODEL, arrival_time=0.0, owner=owner)


def scheduler(lease_s: float = 10.0, grace_s: float = 2.0, workers: int = 1) -> GlobalScheduler:
    core = GlobalScheduler.from_preset("fcfs-rr", leases=LeaseBook(lease_s, grace_s))
    for i in range(workers):
        core.update_worker(report(f"w{i}"), 0.0)
    return core


def placed(core: GlobalScheduler) -> int:
    return sum(w.placed for w in core.workers())


def test_lease_book_expires_oldest_first_and_renewal_extends() -> None:
    book = LeaseBook(lease_s=10.0, reconcile_grace_s=1.0)
    book.grant("b", "w0", "gw", now=1.0)
    book.grant("a", "w0", "gw", now=2.0)
    book.grant("c", "w1", "other", now=3.0)
    assert book.renew("gw", ["a", "c", "zz"], now=9.0) == ["c", "zz"]  # c is another owner's
    assert book.expired(now=11.0) == [Reclaimed("b", "w0", "gw", "lease_expired")]
    assert book.expired(now=13.0) == [Reclaimed("c", "w1", "other", "lease_expired")]
    assert book.expired(now=18.9) == []  # a was renewed at 9: expires at 19
    assert [r.request_id for r in book.expired(now=19.0)] == ["a"]
    assert len(book) == 0


def test_reconcile_needs_the_grace_period_and_two_reports_in_a_row() -> None:
    book = LeaseBook(lease_s=100.0, reconcile_grace_s=5.0, missing_reports=2)
    book.grant("r1", "w0", "gw", now=0.0)
    book.grant("r2", "w0", "gw", now=0.0)
    assert book.reconcile("w0", [], now=4.9) == []  # within the grace period: not counted
    assert book.reconcile("w0", [], now=5.0) == []  # first report after it
    assert book.reconcile("w0", ["r2"], now=5.5) == [Reclaimed("r1", "w0", "gw", "unknown_to_worker")]
    assert book.reconcile("w0", [], now=6.0) == []  # r2's count restarted when it was reported
    assert book.reconcile("w1", [], now=7.0) == []  # another worker's report says nothing of w0's
    assert [r.request_id for r in book.reconcile("w0", [], now=7.0)] == ["r2"]
    assert len(book) == 0


def test_rejects_nonsense_settings() -> None:
    with pytest.raises(ValueError):
        LeaseBook(lease_s=0)
    with pytest.raises(ValueError):
        LeaseBook(missing_reports=0)


def test_reclaim_returns_capacity_and_a_late_complete_is_stale() -> None:
    core = scheduler(lease_s=10.0)
    for rid in ("r1", "r2"):
        core.submit(request(rid), now=0.0)
    assert [d.request_id for d in core.dispatch(now=0.0)] == ["r1", "r2"]
    assert placed(core) == 2
    assert core.renew("gw-1", ["r2"], now=5.0) == []
    reclaimed = core.reclaim(now=10.0)
    assert [r.request_id for r in reclaimed] == ["r1"]
    assert placed(core) == 1 and core.placement_of("r1") is None
    core.check_integrity()
    assert core.complete("r1", "w0") is False  # the gateway's Complete after the reclaim
    assert core.complete("r2", "w0") is True
    assert core.reclaim(now=100.0) == []  # a released placement has no lease left to expire
    assert placed(core) == 0
    core.check_integrity()


def test_a_full_worker_frees_up_when_its_lost_placements_are_reconciled() -> None:
    """The wedge: every slot held by a placement nobody will release, the queue stuck behind them."""
    core = scheduler(lease_s=1000.0, grace_s=2.0)
    core.update_worker(report("w0", held=frozenset(), max_batch=2), 0.0)
    for rid in ("lost-1", "lost-2", "waiting"):
        core.submit(request(rid), now=0.0)
    assert [d.request_id for d in core.dispatch(now=0.0)] == ["lost-1", "lost-2"]
    assert core.dispatch(now=1.0) == []  # full
    for now in (2.0, 3.0):
        core.update_worker(report("w0", held=frozenset(), max_batch=2), now)
        gone = core.reconcile("w0", frozenset(), now)
    assert [r.request_id for r in gone] == ["lost-1", "lost-2"]
    assert [d.request_id for d in core.dispatch(now=3.0)] == ["waiting"]
    core.check_integrity()


def test_an_expired_worker_takes_its_leases_with_it() -> None:
    core = scheduler(workers=2)
    core.submit(request("r1"), now=0.0)
    (decision,) = core.dispatch(now=0.0)
    core.update_worker(report("w1" if decision.worker_id == "w0" else "w0"), 10.0)
    gone = core.expire_workers(now=10.0)
    assert [g.failed_request_ids for g in gone] == [("r1",)]
    assert core.leases is not None and len(core.leases) == 0
    core.check_integrity()


def test_without_a_lease_book_nothing_is_reclaimed() -> None:
    core = GlobalScheduler.from_preset("fcfs-rr")
    core.update_worker(report("w0"), 0.0)
    core.submit(request("r1"), now=0.0)
    core.dispatch(now=0.0)
    assert core.reclaim(now=1e9) == [] and core.reconcile("w0", frozenset(), now=1e9) == []
    assert core.renew("gw-1", ["r1"], now=1.0) == []
    assert placed(core) == 1


@pytest.mark.parametrize("seed", range(20))
def test_random_operations_keep_leases_equal_to_placements(seed: int) -> None:
    """Whatever mix of submits, completes, renewals, reports and expiries: the leases are exactly
    the placements, and once every owner stops renewing, every placement comes back."""
    rng = random.Random(seed)
    core = scheduler(lease_s=5.0, grace_s=1.0, workers=3)
    now, next_id = 0.0, 0
    for _ in range(300):
        now += rng.choice((0.0, 0.1, 0.5, 1.0))
        op = rng.random()
        if op < 0.35:
            next_id += 1
            with contextlib.suppress(ClairvoyantError):  # a full queue or no workers: refused
                core.submit(request(f"r{next_id}", owner=rng.choice(("gw-1", "gw-2"))), now)
        elif op < 0.5:
            core.dispatch(now)
        elif op < 0.6:
            held = [r.request_id for w in core.workers() for r in core.placed_requests(w.worker_id)]
            if held:
                core.complete(rng.choice(held), now=now)
        elif op < 0.7:
            core.renew(rng.choice(("gw-1", "gw-2")), [f"r{i}" for i in range(next_id + 1)], now)
        elif op < 0.8:
            core.reclaim(now)
        elif op < 0.95:
            worker = rng.choice(core.workers() or [None])
            if worker is not None:
                mine = [r.request_id for r in core.placed_requests(worker.worker_id)]
                held = frozenset(r for r in mine if rng.random() < 0.7)
                core.update_worker(report(worker.worker_id, held=held), now)
                core.reconcile(worker.worker_id, held, now)
        else:
            for i in range(3):
                if rng.random() < 0.5:
                    core.update_worker(report(f"w{i}"), now)
            core.expire_workers(now)
        core.check_integrity()
    for w in core.workers():
        core.update_worker(report(w.worker_id), now + 6.0)
    core.reclaim(now + 6.0)
    assert placed(core) == 0
    core.check_integrity()
