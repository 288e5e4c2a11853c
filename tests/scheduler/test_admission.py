"""Late binding at the knee (policy/admission.py): the scheduler holds each worker at the batch where
its decode throughput reaches a share of its ceiling, so calls wait in the global queue, ranked."""

from __future__ import annotations

import random

import pytest

from clairvoyant.contracts.v1 import common_pb2
from clairvoyant.core.app_metadata import AppMetadata
from clairvoyant.core.wire import annotations_from_proto
from clairvoyant.policy.admission import KneeConfig, knee_batch
from clairvoyant.policy.clairvoyant import ClairvoyantKneeRouting, ClairvoyantPriority
from clairvoyant.policy.types import WorkerView
from clairvoyant.scheduler.core import PRESETS, GlobalScheduler, QueuedRequest, WorkerReport

pytestmark = pytest.mark.unit


def report(worker_id: str, *, base: float = 0.01, per_seq: float = 0.001, max_batch: int = 64) -> WorkerReport:
    return WorkerReport(
        worker_id, "m", f"{worker_id}:1", max_batch=max_batch, kv_blocks_total=100_000, block_size=16,
        heartbeat_interval_s=1.0, decode_base_s=base, decode_per_seq_s=per_seq,
    )  # fmt: skip


def call(rid: str, workflow: str, remaining: float, arrival: float = 0.0) -> QueuedRequest:
    """A call whose trusted annotations say ``remaining`` steps are left in its workflow."""
    annotations = common_pb2.SysAnnotations(confidence=common_pb2.CONFIDENCE_HIGH, expected_remaining_steps=remaining)
    return QueuedRequest(
        rid, "t", "m", arrival, app_metadata=AppMetadata("type", workflow, "agent"),
        annotations=annotations_from_proto(annotations),
    )  # fmt: skip


def knee_scheduler(fraction: float = 0.5, *, displace: bool = False) -> GlobalScheduler:
    routing = ClairvoyantKneeRouting()
    routing.knee = KneeConfig(fraction, displace=displace)
    return GlobalScheduler(ClairvoyantPriority(), routing, policy_name="clairvoyant")


# ---- the knee ---------------------------------------------------------------------------------


def test_knee_is_where_throughput_reaches_the_fraction_of_its_ceiling() -> None:
    # base / per_seq = 10: b / (0.01 + 0.001 b) reaches φ × 1000 tokens/s at b = φ / (1 − φ) × 10.
    assert knee_batch(report("w", max_batch=256), 0.5) == 10
    assert knee_batch(report("w", max_batch=256), 0.8) == 40
    assert knee_batch(report("w", max_batch=256), 0.9) == 90
    speed = lambda b: b / (0.01 + 0.001 * b)  # noqa: E731
    assert speed(40) >= 0.8 * 1000 > speed(39)


def test_knee_is_clamped_to_the_batch_and_to_one() -> None:
    assert knee_batch(report("w", max_batch=32), 0.9) == 32
    assert knee_batch(report("w", base=0.0001, per_seq=0.01), 0.5) == 1


@pytest.mark.parametrize(
    ("base", "per_seq", "fraction"), [(0.0, 0.0, 0.5), (0.01, 0.0, 0.5), (0.0, 0.001, 0.5), (0.01, 0.001, 1.0)]
)
def test_no_knee_without_a_decode_speed_or_at_fraction_one(base: float, per_seq: float, fraction: float) -> None:
    assert knee_batch(report("w", base=base, per_seq=per_seq), fraction) == 0


@pytest.mark.parametrize("fraction", [0.0, -0.1, 1.5])
def test_fraction_out_of_range_is_refused(fraction: float) -> None:
    with pytest.raises(ValueError, match="throughput_fraction"):
        KneeConfig(fraction)


def test_clairvoyant_routes_with_the_knee_and_unbounded_without() -> None:
    assert PRESETS.create("clairvoyant")[:2] == ("clairvoyant", "clairvoyant-knee")
    assert PRESETS.create("clairvoyant-unbounded")[:2] == ("clairvoyant", "clairvoyant")


# ---- the scheduler holds workers at the knee ----------------------------------------------------


def test_worker_view_carries_the_knee_as_its_admission_limit() -> None:
    sched = knee_scheduler(0.5)
    view = sched.update_worker(report("w1"), 0.0)
    assert view.admission_limit == 10
    # Contexts grew: each sequence costs twice as much, so the knee halves.
    assert sched.update_worker(report("w1", per_seq=0.002), 1.0).admission_limit == 5
    # A worker that reports no speed gets the default (its max_batch).
    assert sched.update_worker(report("w2", base=0.0, per_seq=0.0), 1.0).admission_limit == 0


def test_calls_beyond_the_knee_wait_in_the_global_queue_and_the_most_urgent_go_first() -> None:
    sched = knee_scheduler(0.5)
    sched.update_worker(report("w1", per_seq=0.005), 0.0)  # knee 2
    for i, remaining in enumerate([9, 1, 5, 3]):
        sched.submit(call(f"c{i}", f"wf{i}", remaining), 0.0)
    placed = [d.request_id for d in sched.dispatch(0.0)]
    assert placed == ["c1", "c3"]  # 1 and 3 steps left: the two nearest their end
    assert sched.queue_depth("m") == 2
    sched.complete("c1", now=1.0)
    sched.submit(call("late", "wf-late", 0), 1.0)  # nearer its end than anything queued
    assert [d.request_id for d in sched.dispatch(1.0)] == ["late"]
    sched.complete("c3", now=2.0)
    assert [d.request_id for d in sched.dispatch(2.0)] == ["c2"]


def test_a_waiting_call_is_never_held_back_by_a_less_urgent_one() -> None:
    """Random arrivals, completions and worker speeds.  After every dispatch: each placed call is at
    least as urgent as every call left waiting; a worker with a seat left holds nothing less urgent
    than a waiting call (it would have been placed there, beyond the knee, for the engine to preempt
    the less urgent one); a placement beyond the knee displaces a less urgent one; and while calls
    wait, every worker is at its limit (work conservation)."""
    rng = random.Random(7)
    sched = knee_scheduler(0.5, displace=True)
    priority = sched.priority_policy
    held: dict[str, tuple[str, float]] = {}  # placed call -> (worker, base priority)
    beyond_knee = 0
    for step in range(300):
        now = float(step)
        for w in ("w1", "w2"):
            sched.update_worker(report(w, per_seq=rng.choice([0.001, 0.002, 0.005]), max_batch=12), now)
        for _ in range(rng.randint(0, 3)):
            rid = f"c{step}-{rng.randrange(10**6)}"
            sched.submit(call(rid, f"wf{rng.randrange(20)}", rng.randint(0, 12), now), now)
        for rid in [r for r in held if rng.random() < 0.3]:
            sched.complete(rid, now=now)
            del held[rid]
        decisions = sched.dispatch(now)
        for d in decisions:
            if d.worker.placed > d.worker.admission_limit:  # beyond the knee: it displaced a less urgent call
                beyond_knee += 1
                assert min(p for w, p in held.values() if w == d.worker_id) < d.base_priority
            held[d.request_id] = (d.worker_id, d.base_priority)
        waiting = sched.queued_requests("m")
        if decisions and waiting:
            most_urgent_waiting = max(priority.priority(r, now) for r in waiting)
            assert min(d.base_priority for d in decisions) >= most_urgent_waiting
        for r in waiting:
            urgency = priority.priority(r, now)
            for w in sched.workers():
                if w.placed < w.max_batch:
                    assert all(p >= urgency for worker, p in held.values() if worker == w.worker_id)
        if waiting:
            assert all(not w.has_room for w in sched.workers())
    assert beyond_knee > 0  # the traffic did exercise it


def test_an_urgent_call_goes_beyond_the_knee_only_over_a_less_urgent_one() -> None:
    sched = knee_scheduler(0.5, displace=True)
    sched.update_worker(report("w1", per_seq=0.005, max_batch=3), 0.0)  # knee 2, three seats
    sched.submit(call("far", "wf-far", 9), 0.0)
    sched.submit(call("mid", "wf-mid", 5), 0.0)
    assert [d.request_id for d in sched.dispatch(0.0)] == ["mid", "far"]
    sched.submit(call("farther", "wf-farther", 11), 1.0)  # less urgent than both: it waits
    assert sched.dispatch(1.0) == []
    sched.submit(call("near", "wf-near", 0), 1.0)  # more urgent than "far": placed beyond the knee
    (decision,) = sched.dispatch(1.0)
    assert (decision.request_id, decision.worker.placed, decision.worker.admission_limit) == ("near", 3, 2)
    assert decision.seat_limit == 2  # the engine runs two: it preempts "far" for "near"
    sched.submit(call("nearer", "wf-nearer", 0), 2.0)  # no seat left below max_batch
    assert sched.dispatch(2.0) == []
    assert sched.queue_depth("m") == 2


def test_has_room_reads_the_admission_limit() -> None:
    view = WorkerView("w", "m", "", "", 0, 0, 2, 64, 0, 100, 0, False, 0.0, 1.0, admission_limit=2)
    assert not view.has_room
    assert view.with_placed(1).has_room


def test_the_knee_travels_with_the_placement_to_the_workers_generate_call() -> None:
    """Scheduler -> Placement.seat_limit -> the gateway's Generate message -> the engine's seats."""
    from clairvoyant.contracts.v1 import worker_pb2
    from clairvoyant.gateway.messages import placed_generate_request
    from clairvoyant.scheduler import convert

    for displace, seats in ((True, 2), (False, 0)):  # without displacement the engine needs no limit
        sched = knee_scheduler(0.5, displace=displace)
        sched.update_worker(report("w1", per_seq=0.005), 0.0)  # knee 2
        sched.submit(call("c", "wf", 1), 0.0)
        (decision,) = sched.dispatch(0.0)
        placement = convert.placement(decision, "clairvoyant")
        assert placement.seat_limit == seats
        generate = placed_generate_request(worker_pb2.GenerateRequest(request_id="c"), placement)
        assert generate.seat_limit == seats


def test_without_displacement_an_urgent_call_waits_for_a_seat_at_the_knee() -> None:
    sched = knee_scheduler(0.5)
    assert KneeConfig().displace is False
    sched.update_worker(report("w1", per_seq=0.005, max_batch=3), 0.0)  # knee 2, three seats
    for rid, remaining in (("far", 9), ("mid", 5)):
        sched.submit(call(rid, f"wf-{rid}", remaining), 0.0)
    assert len(sched.dispatch(0.0)) == 2
    sched.submit(call("near", "wf-near", 0), 1.0)
    assert sched.dispatch(1.0) == []  # late binding alone: it is first in line, not on a seat
    sched.complete("far", now=2.0)
    assert [d.request_id for d in sched.dispatch(2.0)] == ["near"]
