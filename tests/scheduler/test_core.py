"""The pure scheduler core, driven directly with explicit time values (no clock, no mocks)."""

from __future__ import annotations

from collections.abc import Sequence

import pytest

from clairvoyant.contracts.v1 import worker_pb2
from clairvoyant.core.errors import InvalidRequest, NoWorkers, QueueFull
from clairvoyant.policy.capabilities import Capability
from clairvoyant.policy.scheduling import Backfill, FcfsPriority, RoundRobinRouting
from clairvoyant.scheduler import convert
from clairvoyant.scheduler.core import (
    GlobalScheduler,
    QueuedRequest,
    WorkerReport,
    WorkerView,
)

pytestmark = pytest.mark.unit

MODEL = "tiny"


def report(
    worker_id: str, *, model: str = MODEL, max_batch: int = 4, interval: float = 1.0, **extra: object
) -> WorkerReport:
    return WorkerReport(
        worker_id=worker_id,
        model=model,
        address=f"{worker_id}:50061",
        max_batch=max_batch,
        heartbeat_interval_s=interval,
        **extra,  # type: ignore[arg-type]
    )


def req(
    request_id: str, arrival: float = 0.0, *, model: str = MODEL, exclude: Sequence[str] = ()
) -> QueuedRequest:
    return QueuedRequest(request_id, "tenant-a", model, arrival, exclude_workers=frozenset(exclude))


def scheduler(preset: str = "fcfs-rr", **options: float) -> GlobalScheduler:
    return GlobalScheduler.from_preset(preset, **options)


def placed_on(sched: GlobalScheduler, now: float) -> list[tuple[str, str]]:
    decisions = sched.dispatch(now)
    sched.check_integrity()
    return [(d.request_id, d.worker_id) for d in decisions]


def test_fcfs_places_in_arrival_order_not_submission_order() -> None:
    sched = scheduler()
    sched.update_worker(report("w1", max_batch=1), now=0.0)
    for rid, arrival in [("late", 3.0), ("first", 1.0), ("second", 2.0)]:
        sched.submit(req(rid, arrival), now=arrival)
    order = [rid for rid, _ in placed_on(sched, 3.0)]
    for _ in range(2):
        assert sched.complete(order[-1])
        order += [r for r, _ in placed_on(sched, 3.5)]
    assert order == ["first", "second", "late"]


def test_decision_reports_queue_wait_and_base_priority() -> None:
    sched = scheduler()
    sched.update_worker(report("w1"), now=0.0)
    sched.submit(req("r1", 1.0), now=1.0)
    (decision,) = sched.dispatch(now=1.25)
    assert decision.queue_wait_s == pytest.approx(0.25)
    assert decision.base_priority == 0.0
    assert decision.worker.placed == 1 and decision.worker.address == "w1:50061"


def test_round_robin_spreads_six_requests_two_per_worker() -> None:
    sched = scheduler("fcfs-rr")
    for wid in ("w3", "w1", "w2"):
        sched.update_worker(report(wid, max_batch=4), now=0.0)
    for i in range(6):
        sched.submit(req(f"r{i}", float(i)), now=float(i))
    placements = placed_on(sched, 6.0)
    assert [w for _, w in placements] == ["w1", "w2", "w3", "w1", "w2", "w3"]
    assert {w.worker_id: w.placed for w in sched.workers()} == {"w1": 2, "w2": 2, "w3": 2}


def test_round_robin_skips_full_workers_and_keeps_rotating() -> None:
    sched = scheduler("fcfs-rr")
    sched.update_worker(report("w1", max_batch=1), now=0.0)
    sched.update_worker(report("w2", max_batch=3), now=0.0)
    for i in range(4):
        sched.submit(req(f"r{i}", float(i)), now=0.0)
    assert [w for _, w in placed_on(sched, 0.0)] == ["w1", "w2", "w2", "w2"]


def test_least_loaded_picks_the_emptiest_then_lowest_kv_usage() -> None:
    sched = scheduler("least-loaded")
    sched.update_worker(report("w1", max_batch=4, queued=3), now=0.0)
    sched.update_worker(report("w2", max_batch=4, queued=1, kv_blocks_used=90, kv_blocks_total=100), now=0.0)
    sched.update_worker(report("w3", max_batch=4, queued=1, kv_blocks_used=10, kv_blocks_total=100), now=0.0)
    sched.submit(req("r1"), now=0.0)
    assert placed_on(sched, 0.0) == [("r1", "w3")]  # w2 ties on load (1/4) but holds more KV
    sched.submit(req("r2"), now=0.0)
    assert placed_on(sched, 0.0) == [("r2", "w2")]  # w3 now at 2/4, w2 at 1/4


def test_least_loaded_respects_max_batch_and_places_waiters_as_room_frees() -> None:
    sched = scheduler("least-loaded")
    sched.update_worker(report("w1", max_batch=1), now=0.0)
    sched.update_worker(report("w2", max_batch=1), now=0.0)
    for i in range(4):
        sched.submit(req(f"r{i}", float(i)), now=float(i))
    assert placed_on(sched, 4.0) == [("r0", "w1"), ("r1", "w2")]
    assert sched.queue_depths() == {MODEL: 2}
    assert placed_on(sched, 5.0) == []  # all full: requests wait
    assert sched.complete("r1")
    assert placed_on(sched, 6.0) == [("r2", "w2")]
    assert sched.complete("r0")
    assert placed_on(sched, 7.0) == [("r3", "w1")]
    assert all(w.placed == w.max_batch for w in sched.workers())


def test_queue_bound_raises_queue_full_with_retry_after() -> None:
    sched = scheduler(max_queue_per_model=2, queue_retry_after_s=2.5)
    sched.update_worker(report("w1"), now=0.0)
    sched.submit(req("r1"), now=0.0)
    sched.submit(req("r2"), now=0.0)
    with pytest.raises(QueueFull) as info:
        sched.submit(req("r3"), now=0.0)
    assert info.value.retry_after_s == 2.5 and info.value.code == "queue_full"
    assert sched.queue_depths() == {MODEL: 2}
    placed_on(sched, 0.0)
    sched.submit(req("r3"), now=0.0)  # room again once the queue drained into placements


def test_no_worker_for_the_model_raises_no_workers() -> None:
    sched = scheduler()
    with pytest.raises(NoWorkers):
        sched.submit(req("r1"), now=0.0)
    sched.update_worker(report("w1", model="other"), now=0.0)
    with pytest.raises(NoWorkers):
        sched.submit(req("r1"), now=0.0)
    sched.update_worker(report("w2"), now=0.0)
    with pytest.raises(NoWorkers):  # its only worker is excluded: it could never be placed
        sched.submit(req("r1", exclude=["w2"]), now=0.0)
    assert sched.queue_depths() == {"other": 0, MODEL: 0}


def test_duplicate_queued_id_is_rejected_and_resubmitting_a_placed_id_releases_it() -> None:
    sched = scheduler()
    sched.update_worker(report("w1", max_batch=1), now=0.0)
    sched.submit(req("r1"), now=0.0)
    with pytest.raises(InvalidRequest):
        sched.submit(req("r1"), now=0.0)
    assert placed_on(sched, 0.0) == [("r1", "w1")]
    sched.submit(req("r1", 1.0, exclude=["w9"]), now=1.0)  # a retry of the same request
    assert placed_on(sched, 1.0) == [("r1", "w1")]


def test_cancel_removes_a_waiting_request_only() -> None:
    sched = scheduler()
    sched.update_worker(report("w1", max_batch=1), now=0.0)
    sched.submit(req("r1"), now=0.0)
    sched.submit(req("r2"), now=0.0)
    placed_on(sched, 0.0)
    assert sched.cancel("r2") and not sched.is_queued("r2")
    assert not sched.cancel("r2")
    assert not sched.cancel("r1")  # placed, not queued: complete releases it
    assert sched.complete("r1")
    assert placed_on(sched, 1.0) == []


def test_complete_is_idempotent_and_ignores_a_stale_worker_id() -> None:
    sched = scheduler()
    sched.update_worker(report("w1"), now=0.0)
    sched.submit(req("r1"), now=0.0)
    placed_on(sched, 0.0)
    assert not sched.complete("r1", worker_id="w2")
    assert sched.complete("r1", worker_id="w1")
    assert not sched.complete("r1")
    assert not sched.complete("never-seen")
    sched.check_integrity()


def test_heartbeat_expiry_after_three_intervals_fails_its_placements() -> None:
    sched = scheduler(heartbeat_timeout_factor=3.0)
    sched.update_worker(report("w1", interval=1.0), now=0.0)
    sched.update_worker(report("w2", interval=1.0), now=0.0)
    for i in range(4):
        sched.submit(req(f"r{i}"), now=0.0)
    placements = placed_on(sched, 0.0)
    on_w1 = tuple(rid for rid, wid in placements if wid == "w1")
    for t in (1.0, 2.0, 3.0):  # w2 keeps beating; w1 is silent but not yet past 3 intervals
        sched.update_worker(report("w2", interval=1.0), now=t)
        assert sched.expire_workers(now=t) == []
    (gone,) = sched.expire_workers(now=3.01)
    assert (gone.worker_id, gone.model, gone.failed_request_ids, gone.rejected_request_ids) == (
        "w1",
        MODEL,
        on_w1,
        (),
    )
    assert [w.worker_id for w in sched.workers()] == ["w2"]
    assert not sched.complete(on_w1[0])  # already failed
    sched.check_integrity()


def test_the_workers_own_heartbeat_interval_sets_its_timeout() -> None:
    sched = scheduler(heartbeat_timeout_factor=3.0, default_heartbeat_interval_s=10.0)
    sched.update_worker(report("fast", interval=0.2), now=0.0)
    sched.update_worker(report("default", interval=0.0), now=0.0)
    assert [g.worker_id for g in sched.expire_workers(now=0.7)] == ["fast"]
    assert sched.expire_workers(now=29.0) == []
    assert [g.worker_id for g in sched.expire_workers(now=30.5)] == ["default"]


def test_a_returning_worker_starts_with_no_placements() -> None:
    sched = scheduler()
    sched.update_worker(report("w1"), now=0.0)
    sched.submit(req("r1"), now=0.0)
    placed_on(sched, 0.0)
    sched.update_worker(report("w1", running=1), now=0.5)  # a heartbeat keeps the accounting
    assert sched.workers()[0].placed == 1 and sched.workers()[0].running == 1
    sched.expire_workers(now=10.0)
    sched.update_worker(report("w1"), now=11.0)
    assert sched.workers()[0].placed == 0
    sched.check_integrity()


def test_queued_request_fails_when_the_last_worker_of_its_model_expires() -> None:
    sched = scheduler()
    sched.update_worker(report("w1", max_batch=1), now=0.0)
    sched.update_worker(report("x1", model="other"), now=0.0)
    sched.submit(req("r1"), now=0.0)
    sched.submit(req("r2"), now=0.0)
    sched.submit(req("o1", model="other"), now=0.0)
    placed_on(sched, 0.0)
    sched.update_worker(report("x1", model="other"), now=3.5)
    (gone,) = sched.expire_workers(now=3.5)
    assert gone.failed_request_ids == ("r1",) and gone.rejected_request_ids == ("r2",)
    assert sched.queue_depths() == {"other": 0, MODEL: 0}
    with pytest.raises(NoWorkers):
        sched.submit(req("r3"), now=3.5)


def test_drain_stops_new_placements_and_keeps_existing_ones() -> None:
    sched = scheduler()
    sched.update_worker(report("w1", max_batch=2), now=0.0)
    sched.submit(req("r1"), now=0.0)
    placed_on(sched, 0.0)
    assert sched.drain("w1", True)
    sched.update_worker(report("w1", max_batch=2), now=0.5)  # a heartbeat does not undo the drain
    sched.submit(req("r2"), now=1.0)  # a draining worker still counts as serving: r2 waits
    assert placed_on(sched, 1.0) == []
    assert sched.workers()[0].placed == 1 and sched.workers()[0].draining
    assert sched.complete("r1")
    assert sched.drain("w1", False)
    assert placed_on(sched, 2.0) == [("r2", "w1")]
    assert not sched.drain("unknown", True)


def test_a_worker_reporting_draining_gets_nothing_new() -> None:
    sched = scheduler()
    sched.update_worker(report("w1", draining=True), now=0.0)
    sched.update_worker(report("w2"), now=0.0)
    for i in range(3):
        sched.submit(req(f"r{i}"), now=0.0)
    assert {w for _, w in placed_on(sched, 0.0)} == {"w2"}
    assert sched.drain("w1", False)  # resuming by the operator cannot override the worker itself
    assert sched.workers()[0].draining


def test_exclude_workers_is_honoured() -> None:
    sched = scheduler()
    sched.update_worker(report("w1"), now=0.0)
    sched.update_worker(report("w2"), now=0.0)
    for i in range(3):
        sched.submit(req(f"r{i}", float(i), exclude=["w1"]), now=0.0)
    assert [w for _, w in placed_on(sched, 0.0)] == ["w2", "w2", "w2"]


def test_head_of_line_blocks_within_a_model_but_not_across_models() -> None:
    sched = scheduler()
    sched.update_worker(report("w1", max_batch=1), now=0.0)
    sched.update_worker(report("w2", max_batch=1), now=0.0)
    sched.update_worker(report("x1", model="other", max_batch=1), now=0.0)
    sched.submit(req("fill", 0.0), now=0.0)
    placed_on(sched, 0.0)  # w1 busy
    sched.submit(req("head", 1.0, exclude=["w2"]), now=1.0)
    sched.submit(req("next", 2.0), now=2.0)
    sched.submit(req("o1", 2.0, model="other"), now=2.0)
    # "head" can only use w1 (full), so "next" waits behind it although w2 is free.
    assert placed_on(sched, 2.0) == [("o1", "x1")]
    assert sched.complete("fill")
    assert placed_on(sched, 3.0) == [("head", "w1"), ("next", "w2")]


class BackfillingRoundRobin(RoundRobinRouting):
    capabilities = frozenset({Capability.BACKFILLS})

    def __init__(self, bound: Backfill) -> None:
        super().__init__()
        self.bound = bound

    def backfill(self) -> Backfill:
        return self.bound


def _blocked_head(bound: Backfill, heads: int = 1) -> GlobalScheduler:
    """w1 busy, w2 free; ``heads`` calls that only w1 may take, then "next" and "last", which fit."""
    sched = GlobalScheduler(FcfsPriority(), BackfillingRoundRobin(bound), policy_name="test")
    sched.update_worker(report("w1", max_batch=1), now=0.0)
    sched.update_worker(report("w2", max_batch=2), now=0.0)
    sched.submit(req("fill", 0.0), now=0.0)
    assert placed_on(sched, 0.0) == [("fill", "w1")]
    for i in range(heads):
        sched.submit(req(f"head{i}", 1.0 + i / 10, exclude=["w2"]), now=1.0)
    sched.submit(req("next", 2.0), now=2.0)
    sched.submit(req("last", 3.0), now=3.0)
    return sched


def test_a_backfilling_policy_passes_over_a_call_that_does_not_fit_and_keeps_its_place() -> None:
    sched = _blocked_head(Backfill(depth=1, max_wait_s=30.0))
    assert placed_on(sched, 3.0) == [("next", "w2"), ("last", "w2")]
    assert sched.complete("fill")
    assert placed_on(sched, 4.0) == [("head0", "w1")]  # still first in line for w1


def test_backfill_stops_at_its_depth_and_at_its_wait_bound() -> None:
    # Two calls in front that do not fit, depth 1: the second one blocks as before.
    assert placed_on(_blocked_head(Backfill(depth=1, max_wait_s=30.0), heads=2), 3.0) == []
    assert placed_on(_blocked_head(Backfill(depth=2, max_wait_s=30.0), heads=2), 3.0) == [("next", "w2"), ("last", "w2")]
    # The head has waited 30 s (it arrived at 1.0): strict order again, nothing passes it.
    assert placed_on(_blocked_head(Backfill(depth=1, max_wait_s=30.0)), 31.0) == []
    assert placed_on(_blocked_head(Backfill(depth=1, max_wait_s=30.0)), 30.9) == [("next", "w2"), ("last", "w2")]
    # Depth 0 is the default rule.
    assert placed_on(_blocked_head(Backfill(depth=0)), 3.0) == []
    with pytest.raises(ValueError, match="depth and max_wait_s must be >= 0"):
        Backfill(depth=-1)


def test_heartbeat_proto_and_snapshot_numbers() -> None:
    sched = scheduler(max_queue_per_model=8)
    stats = worker_pb2.WorkerStats(
        worker_id="w1",
        model=MODEL,
        grpc_address="h:1",
        http_address="http://h:2",
        running=1,
        queued=2,
        max_batch=1,
        kv_blocks_used=5,
        kv_blocks_total=50,
        max_model_len=2048,
        heartbeat_interval_s=0.5,
    )
    sched.update_worker(convert.worker_report(stats), now=1.0)
    sched.submit(req("r1"), now=1.0)
    sched.submit(req("r2"), now=1.0)
    placed_on(sched, 1.0)
    snap = sched.snapshot(now=1.75)
    assert snap.policy == "fcfs-rr" and snap.taken_at == 1.75
    assert [(q.model, q.depth, q.capacity) for q in snap.queues] == [(MODEL, 1, 8)]
    (w,) = snap.workers
    assert isinstance(w, WorkerView)
    assert (w.placed, w.running, w.queued, w.kv_usage, w.max_model_len) == (1, 1, 2, 0.1, 2048)
    assert (w.http_address, w.heartbeat_interval_s, snap.taken_at - w.last_heartbeat) == (
        "http://h:2",
        0.5,
        0.75,
    )


def test_a_policy_choosing_an_ineligible_worker_is_a_bug() -> None:
    class Rogue:
        def route(self, request: QueuedRequest, workers: Sequence[WorkerView], now: float) -> str | None:
            return "w1"

    sched = GlobalScheduler(FcfsPriority(), Rogue())
    sched.update_worker(report("w1", max_batch=1), now=0.0)
    sched.submit(req("r1"), now=0.0)
    sched.submit(req("r2"), now=0.0)
    with pytest.raises(RuntimeError, match="ineligible"):
        sched.dispatch(now=0.0)
