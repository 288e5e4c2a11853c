"""The clairvoyant preset: Pythia's completion score with program-start aging, Kairos' time-slot fit
with SAGA's session affinity."""

from __future__ import annotations

import pytest

from clairvoyant.contracts.v1 import common_pb2
from clairvoyant.core.app_metadata import AppMetadata
from clairvoyant.core.wire import annotations_from_proto
from clairvoyant.policy.clairvoyant import (
    RANK_TIE_BREAK,
    ClairvoyantGittinsPriority,
    ClairvoyantPriority,
    ClairvoyantPriorityConfig,
    ClairvoyantRouting,
    ClairvoyantRoutingConfig,
    gittins_score,
)
from clairvoyant.policy.pythia import PythiaAgingRule
from clairvoyant.scheduler.core import (
    PRESETS,
    GlobalScheduler,
    ProcessTable,
    QueuedRequest,
    WorkerReport,
    WorkerView,
)

pytestmark = pytest.mark.unit

HIGH = common_pb2.CONFIDENCE_HIGH


def call(
    rid: str,
    workflow: str | None = "w1",
    *,
    arrival: float = 0.0,
    remaining: float | None = None,
    confidence: int = HIGH,
    prompt_tokens: int = 0,
    predicted_output: float | None = None,
) -> QueuedRequest:
    meta = None if workflow is None else AppMetadata("type", workflow, "agent")
    annotations = None
    if remaining is not None or predicted_output is not None:
        annotations = common_pb2.SysAnnotations(confidence=confidence)  # type: ignore[arg-type]
        if remaining is not None:
            annotations.expected_remaining_steps = remaining
        if predicted_output is not None:
            annotations.predicted_output_len.CopyFrom(common_pb2.LengthInterval(p50=predicted_output, p99=0))
    return QueuedRequest(
        rid, "t", "m", arrival, prompt_tokens=prompt_tokens, app_metadata=meta,
        annotations=annotations_from_proto(annotations) if annotations is not None else None,
    )


def view(worker_id: str, *, placed: int = 0, blocks: int = 100) -> WorkerView:
    return WorkerView(
        worker_id, "m", "", "", running=placed, queued=0, placed=placed, max_batch=8,
        kv_blocks_used=0, kv_blocks_total=blocks, max_model_len=0, draining=False,
        last_heartbeat=0.0, heartbeat_interval_s=1.0,
    )  # fmt: skip


def test_preset_is_registered() -> None:
    assert PRESETS.create("clairvoyant")[:2] == ("clairvoyant", "clairvoyant-knee")


# ---- priority ---------------------------------------------------------------------------------


def test_priority_is_completion_score_minus_aged_program_start() -> None:
    policy = ClairvoyantPriority()
    table = ProcessTable()
    policy.bind_programs(table)
    first = call("a", arrival=10.0, remaining=3)
    table.on_submit(first, 10.0)
    # S = 1 / (1 + 3) = 0.25; start 10 s; aging 0.0001 per second.
    assert policy.priority(first, 10.0) == pytest.approx(0.25 - 0.001)
    later = call("b", arrival=50.0, remaining=0)
    table.on_submit(later, 50.0)
    # Same program, so the start is still its first call's arrival: 1.0 - 0.001.
    assert policy.priority(later, 50.0) == pytest.approx(0.999)
    # The value does not depend on when it is asked, only on the program's entry.
    assert policy.priority(later, 500.0) == policy.priority(later, 50.0)


@pytest.mark.parametrize("confidence", [common_pb2.CONFIDENCE_NONE, common_pb2.CONFIDENCE_SHADOW])
def test_untrusted_or_missing_annotations_score_zero(confidence: int) -> None:
    policy = ClairvoyantPriority()
    assert policy.priority(call("a", arrival=20.0, remaining=0, confidence=confidence), 20.0) == pytest.approx(-0.002)
    assert policy.priority(call("b", None, arrival=30.0), 30.0) == pytest.approx(-0.003)


def test_engine_rule_is_pythia_aging() -> None:
    rule = ClairvoyantPriority(ClairvoyantPriorityConfig(engine_aging_rate=0.5)).engine_rule()
    assert isinstance(rule, PythiaAgingRule) and rule.aging_rate == 0.5


def test_config_rejects_bad_values() -> None:
    with pytest.raises(ValueError, match="aging_rate"):
        ClairvoyantPriorityConfig(aging_rate=0.0)
    with pytest.raises(ValueError, match="affinity_load"):
        ClairvoyantRoutingConfig(affinity_load=1.5)


def _dispatch_order(requests: list[QueuedRequest], times: list[float]) -> list[str]:
    """Submit each request at its time, then place them one at a time on one seat."""
    scheduler = GlobalScheduler.from_preset("clairvoyant")
    scheduler.update_worker(WorkerReport("w", "m", "", max_batch=1), 0.0)
    for request, t in zip(requests, times, strict=True):
        scheduler.submit(request, t)
    order: list[str] = []
    now = max(times)
    while True:
        decisions = scheduler.dispatch(now)
        if not decisions:
            return order
        order.append(decisions[0].request_id)
        scheduler.complete(decisions[0].request_id, now=now + 1.0)
        now += 1.0


def test_dispatch_order_score_then_program_start_then_bounded_overtaking() -> None:
    requests = [
        call("old-far", "p1", arrival=0.0, remaining=9),  # 0.1 - 0.0000 = 0.1000
        call("new-near", "p2", arrival=200.0, remaining=0),  # 1.0 - 0.0200 = 0.9800
        call("new-far", "p3", arrival=300.0, remaining=9),  # 0.1 - 0.0300 = 0.0700
        call("very-new-near", "p4", arrival=12_000.0, remaining=0),  # 1.0 - 1.2000 = -0.2000
        call("unannotated", "p5", arrival=50.0),  # 0.0 - 0.0050 = -0.0050
    ]
    order = _dispatch_order(requests, [r.arrival_time for r in requests])
    # A near-finished workflow goes first; inside equal scores the older program; a program started
    # more than ω / aging = 10,000 s later no longer overtakes, even at S = 1.
    assert order == ["new-near", "old-far", "new-far", "unannotated", "very-new-near"]


# ---- routing ----------------------------------------------------------------------------------


def _routing_with_booking() -> tuple[ClairvoyantRouting, ProcessTable]:
    """Worker b already holds a call of another program: prompt 800, 100 predicted tokens (its
    expected KV per 0.5 s slot at 50 tok/s: 825, 850, 875, 900)."""
    routing = ClairvoyantRouting()
    table = ProcessTable()
    routing.bind_programs(table)
    big = call("big", "other", prompt_tokens=800, predicted_output=100)
    table.on_submit(big, 0.0)
    assert routing.route(big, [view("b")], 0.0) == "b"
    return routing, table


@pytest.mark.parametrize(
    ("prompt_tokens", "chosen"),
    [
        # On b the expected peak would be 900 + 300 = 1200 < 0.8 x 1600: b, though a is emptier.
        (200, "b"),
        # 900 + 400 = 1300 >= 1280: the lowest expected peak (a, 400) wins and becomes the pin.
        (300, "a"),
    ],
)
def test_session_worker_kept_below_the_affinity_load_only(prompt_tokens: int, chosen: str) -> None:
    routing, table = _routing_with_booking()
    request = call("r", "w1", prompt_tokens=prompt_tokens, predicted_output=100)
    table.on_submit(request, 0.0)
    program = table.of(request)
    assert program is not None
    program.engine_id = "b"
    assert routing.route(request, [view("a"), view("b", placed=1)], 0.0) == chosen
    assert program.engine_id == chosen


def test_waits_when_no_worker_fits() -> None:
    routing, table = _routing_with_booking()
    request = call("r", "w1", prompt_tokens=800, predicted_output=100)
    table.on_submit(request, 0.0)
    # 900 + 900 > 1600 on b, the only worker: the call waits.
    assert routing.route(request, [view("b", placed=1)], 0.0) is None
    assert routing.route(request, [view("a"), view("b", placed=1)], 0.0) == "a"


# ---- the Gittins-ranked variant ---------------------------------------------------------------


def gittins_call(rid: str, workflow: str, index: float | None, *, arrival: float = 0.0,
                 confidence: int = HIGH) -> QueuedRequest:
    annotations = common_pb2.SysAnnotations(confidence=confidence)  # type: ignore[arg-type]
    if index is not None:
        annotations.remaining_gittins_index = index
    return QueuedRequest(
        rid, "t", "m", arrival, app_metadata=AppMetadata("type", workflow, "agent"),
        annotations=annotations_from_proto(annotations),
    )


def test_gittins_variant_ranks_by_the_index_of_the_remaining_work() -> None:
    assert PRESETS.create("clairvoyant-gittins")[:2] == ("clairvoyant-gittins", "clairvoyant")
    policy = ClairvoyantGittinsPriority()
    table = ProcessTable()
    policy.bind_programs(table)
    near_end = gittins_call("a", "w1", 1 / 10.0)  # ranks like 10 s of work left: S = 1/2
    far = gittins_call("b", "w2", 1 / 990.0)  # S = 1/100
    untrusted = gittins_call("c", "w3", 1.0, confidence=common_pb2.CONFIDENCE_SHADOW)
    unranked = gittins_call("d", "w4", None)
    for r in (near_end, far, untrusted, unranked):
        table.on_submit(r, 0.0)
    assert policy.priority(near_end, 0.0) == pytest.approx(0.5)
    assert policy.priority(far, 0.0) == pytest.approx(0.01)
    # No score: only the program order is left (programs opened third and fourth).
    assert policy.priority(untrusted, 0.0) == pytest.approx(-2 * RANK_TIE_BREAK, abs=1e-15)
    assert policy.priority(unranked, 0.0) == pytest.approx(-3 * RANK_TIE_BREAK, abs=1e-15)
    assert gittins_score(None, 10.0) == 0.0
    # the aging term is clairvoyant's: a program started 5,000 s earlier makes up 0.5
    old = gittins_call("e", "w5", None, arrival=-5000.0)
    table.on_submit(old, -5000.0)
    assert policy.priority(old, 0.0) == pytest.approx(policy.priority(near_end, 0.0))


def test_programs_started_at_the_same_instant_keep_the_order_they_were_opened_in() -> None:
    """A cron batch: every program starts at t = 0 and every call has the same score.  The calls of
    the program opened first go first whenever they arrive, instead of all programs in lock-step."""
    sched = GlobalScheduler.from_preset("clairvoyant")
    sched.update_worker(
        WorkerReport("w", "m", "w:1", max_batch=1, kv_blocks_total=10_000, block_size=16, heartbeat_interval_s=1.0),
        0.0,
    )
    for workflow in ("wf-a", "wf-b", "wf-c"):
        sched.submit(call(f"{workflow}-1", workflow, arrival=0.0, remaining=2), 0.0)
    assert [d.request_id for d in sched.dispatch(0.0)] == ["wf-a-1"]
    sched.complete("wf-a-1", now=5.0)
    sched.submit(call("wf-a-2", "wf-a", arrival=5.0, remaining=2), 5.0)  # its next call, later
    assert [d.request_id for d in sched.dispatch(5.0)] == ["wf-a-2"]
