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


def knee_scheduler(fraction: float = 0.5) -> GlobalScheduler:
    routing = ClairvoyantKneeRouting()
    routing.knee = KneeConfig(fraction)
    return GlobalScheduler(ClairvoyantPriority(), routing, policy_name="clairvoyant-knee")


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


def test_preset_routes_with_the_knee_and_keeps_clairvoyants_priority() -> None:
    assert PRESETS.create("clairvoyant-knee")[:2] == ("clairvoyant", "clairvoyant-knee")


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


def test_a_call_is_never_placed_while_a_more_urgent_call_of_its_model_waits() -> None:
    """Random arrivals, completions and worker speeds: at every dispatch, each placed call is at
    least as urgent as every call left waiting, and no worker below its knee idles while calls wait."""
    rng = random.Random(7)
    sched = knee_scheduler(0.5)
    priority = sched.priority_policy
    live: list[str] = []
    for step in range(300):
        now = float(step)
        for w in ("w1", "w2"):
            sched.update_worker(report(w, per_seq=rng.choice([0.001, 0.002, 0.005])), now)
        for _ in range(rng.randint(0, 3)):
            rid = f"c{step}-{rng.randrange(10**6)}"
            sched.submit(call(rid, f"wf{rng.randrange(20)}", rng.randint(0, 12), now), now)
        for rid in [r for r in live if rng.random() < 0.3]:
            sched.complete(rid, now=now)
            live.remove(rid)
        decisions = sched.dispatch(now)
        live += [d.request_id for d in decisions]
        waiting = sched.queued_requests("m")
        if decisions and waiting:
            most_urgent_waiting = max(priority.priority(r, now) for r in waiting)
            assert min(d.base_priority for d in decisions) >= most_urgent_waiting
        if waiting:  # work conservation: every worker is at its limit
            assert all(not w.has_room for w in sched.workers())
        # A placement never takes a worker past its knee (one that fell below what it holds as its
        # contexts grew keeps its placements, and gets no more).
        assert all(d.worker.placed <= d.worker.admission_limit for d in decisions)


def test_has_room_reads_the_admission_limit() -> None:
    view = WorkerView("w", "m", "", "", 0, 0, 2, 64, 0, 100, 0, False, 0.0, 1.0, admission_limit=2)
    assert not view.has_room
    assert view.with_placed(1).has_room
