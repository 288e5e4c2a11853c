"""Kairos (seeds/004 §5-6): agent-rank priority, time-slot packing, and a Fig. 7-like worked example."""

from __future__ import annotations

import heapq
import itertools
from dataclasses import dataclass

import pytest

from clairvoyant.contracts.v1 import common_pb2
from clairvoyant.core.app_metadata import AppMetadata
from clairvoyant.core.wire import annotations_from_proto
from clairvoyant.policy.kairos import (
    RANK_SPAN_S,
    Booking,
    KairosPriority,
    KairosTimeSlotRouting,
    SlotPlan,
    TimeSlotConfig,
)
from clairvoyant.profiler.core import kairos_ranking
from clairvoyant.scheduler.core import (
    PRESETS,
    ROUTING_POLICIES,
    Completion,
    GlobalScheduler,
    ProcessTable,
    QueuedRequest,
    WorkerReport,
    WorkerView,
)

pytestmark = pytest.mark.unit


def call(
    rid: str,
    workflow: str | None = "w1",
    *,
    rank: float | None = None,
    arrival: float = 0.0,
    prompt_tokens: int = 0,
    max_tokens: int = 0,
    predicted_output: float | None = None,
    parents: tuple[str, ...] = (),
    end: bool | None = None,
    agent: str = "agent",
) -> QueuedRequest:
    meta = (
        None
        if workflow is None
        else AppMetadata("type", workflow, agent, parent_request_ids=parents, workflow_end=end)
    )
    annotations = None
    if rank is not None or predicted_output is not None:
        annotations = common_pb2.SysAnnotations()
        if rank is not None:
            annotations.kairos_rank = rank
        if predicted_output is not None:
            annotations.predicted_output_len.CopyFrom(common_pb2.LengthInterval(p50=predicted_output, p99=0))
    return QueuedRequest(
        rid, "t", "m", arrival, prompt_tokens=prompt_tokens, max_tokens=max_tokens,
        app_metadata=meta, annotations=annotations_from_proto(annotations) if annotations is not None else None,
    )  # fmt: skip


def view(worker_id: str, *, placed: int = 0, blocks: int = 0, used: int = 0, queued: int = 0) -> WorkerView:
    return WorkerView(
        worker_id, "m", "", "", running=placed, queued=queued, placed=placed, max_batch=8,
        kv_blocks_used=used, kv_blocks_total=blocks, max_model_len=0, draining=False,
        last_heartbeat=0.0, heartbeat_interval_s=1.0,
    )  # fmt: skip


def test_presets_are_registered() -> None:
    assert {"kairos", "topo-depth"} <= set(PRESETS.names())
    assert PRESETS.create("kairos")[:2] == ("kairos", "kairos-timeslot")


# ---- priority (§5) ------------------------------------------------------------------------------


def test_lower_rank_first_then_earlier_workflow_start_and_unranked_is_fcfs() -> None:
    sched = GlobalScheduler.from_preset("kairos")
    sched.update_worker(WorkerReport("w0", "m", "a", max_batch=1), 0.0)
    policy = sched.priority_policy
    # Program "old" started at t=1 (its first call); "new" at t=2.
    sched.submit(call("old/0", "old", rank=3, arrival=1.0), 1.0)
    sched.submit(call("new/0", "new", rank=3, arrival=2.0), 2.0)
    sched.submit(call("old/1", "old", rank=1, arrival=5.0), 5.0)
    sched.submit(call("new/1", "new", rank=1, arrival=4.0), 4.0)
    sched.submit(call("free", None, arrival=6.0), 6.0)  # no app_metadata, no rank
    sched.submit(call("plain", "p", arrival=3.0), 3.0)  # a program, but unranked
    values = {r.request_id: policy.priority(r, 9.0) for r in sched.queued_requests("m")}
    assert values == {
        "old/0": -(4 * RANK_SPAN_S + 1.0),
        "new/0": -(4 * RANK_SPAN_S + 2.0),
        "old/1": -(2 * RANK_SPAN_S + 1.0),  # its program started at 1.0, not its own arrival 5.0
        "new/1": -(2 * RANK_SPAN_S + 2.0),
        "free": 0.0,
        "plain": 0.0,
    }
    order = []
    for t in range(6):
        order += [d.request_id for d in sched.dispatch(10.0 + t)]
        sched.complete(order[-1], now=10.5 + t)
    # Unranked first in arrival order (FCFS), then rank 1 (older program first), then rank 3.
    assert order == ["plain", "free", "old/1", "new/1", "old/0", "new/0"]


def test_workflow_start_survives_the_first_call_completing() -> None:
    table = ProcessTable()
    policy = KairosPriority()
    policy.bind_programs(table)
    first = call("a/0", "a", rank=0, arrival=1.0)
    table.on_submit(first, 1.0)
    assert policy.priority(first, 1.0) == -(RANK_SPAN_S + 1.0)
    table.on_complete(Completion(first, "w0", 1.0, 3.0, 2.0))
    second = call("a/1", "a", rank=0, arrival=3.0, parents=("a/0",))
    table.on_submit(second, 3.0)
    assert policy.priority(second, 3.0) == -(RANK_SPAN_S + 1.0)  # the program's start, 1.0


# ---- time-slot packing (§6) ---------------------------------------------------------------------

RATE10 = TimeSlotConfig(slot_s=0.5, decode_tokens_per_s=10.0, block_size=1)


def booking(rid: str, start: float, prompt: int, output: int, rate: float = 10.0) -> Booking:
    return Booking(rid, None, start, start + output / rate, prompt, output)


def test_slot_usage_is_each_booking_peak_within_the_slot() -> None:
    # A: 10 prompt tokens at t=0, +10 tok/s for 1 s.  B: 4 + 2 tokens over 0.2 s, from t=0.3.
    plan = SlotPlan([booking("A", 0.0, 10, 10)], 0.3, RATE10)
    assert plan.usage() == [15.0, 20.0]  # slots [0, 0.5) and [0.5, 1.0): at their ends
    assert plan.usage(booking("B", 0.3, 4, 2)) == [21.0, 20.0]  # B ends at 0.5, inside slot 0
    assert plan.usage(booking("C", 0.3, 0, 10)) == [17.0, 27.0, 10.0]  # C: 2, 7, then 10 until 1.3
    # Later, A has overrun its expected end (1.0): it counts at its final size in the current slot only.
    assert SlotPlan([booking("A", 0.0, 10, 10)], 1.7, RATE10).usage() == [20.0]


def test_lowest_expected_peak_wins_and_the_call_is_booked_there() -> None:
    router = KairosTimeSlotRouting(RATE10)
    router._bookings = {"w0": [booking("A", 0.0, 10, 10)], "w1": [booking("B", 0.0, 30, 0)]}
    workers = [view("w0", placed=1, blocks=100), view("w1", placed=1, blocks=100)]
    new = call("n", None, prompt_tokens=5, max_tokens=5)  # 5 tokens, +5 over 0.5 s
    assert router.fit(workers[0], router.booking_for(new, 0.0), 0.0) == (True, 25.0)  # slots 15+10, 20
    assert router.fit(workers[1], router.booking_for(new, 0.0), 0.0) == (True, 40.0)  # 30+10
    assert router.route(new, workers, 0.0) == "w0"
    assert [b.request_id for b in router.bookings(workers[0])] == ["A", "n"]


def test_a_call_waits_when_no_slot_plan_fits_and_goes_when_one_does() -> None:
    router = KairosTimeSlotRouting(RATE10)
    router._bookings = {"w0": [booking("A", 0.0, 10, 10)]}
    worker = view("w0", placed=1, blocks=20)  # 20 tokens of KV
    new = call("n", None, prompt_tokens=4, predicted_output=2)  # the prediction wins over max_tokens
    assert router.booking_for(new, 0.0).output_tokens == 2
    assert router.fit(worker, router.booking_for(new, 0.0), 0.0) == (False, 21.0)  # 15 + 6 > 20
    assert router.route(new, [worker], 0.0) is None
    # A completed (the placed count drops to 0): the call goes.
    assert router.route(new, [view("w0", placed=0, blocks=20)], 0.3) == "w0"
    # Only the slots the new call spans are checked: A2 will outgrow 22 tokens after the new call
    # ends, which counts in the peak but does not make the instance unavailable.
    router._bookings = {"w0": [booking("A2", 0.0, 10, 20)]}  # 15, 20, 25, 30 at the slot ends
    assert router.fit(view("w0", placed=1, blocks=22), router.booking_for(new, 0.0), 0.0) == (True, 30.0)


def test_completed_calls_leave_the_bookings() -> None:
    sched = GlobalScheduler(KairosPriority(), KairosTimeSlotRouting(RATE10))
    router = sched.routing_policy
    assert isinstance(router, KairosTimeSlotRouting)
    sched.update_worker(WorkerReport("w0", "m", "a", max_batch=4, kv_blocks_total=30), 0.0)
    sched.submit(call("a", "wa", prompt_tokens=10, max_tokens=10), 0.0)
    sched.submit(call("b", "wb", prompt_tokens=10, max_tokens=10), 0.0)
    assert [d.request_id for d in sched.dispatch(0.0)] == ["a"]  # b would need 40 > 30 at t=1
    sched.complete("a", now=0.2)  # faster than expected: its slots are freed at once
    assert [d.request_id for d in sched.dispatch(0.2)] == ["b"]
    # A call outside any program is found gone by the placed count.
    sched.submit(call("c", None, prompt_tokens=10, max_tokens=0), 0.3)
    sched.complete("b")  # abandoned: no program update either way; placed drops to 0
    assert [d.request_id for d in sched.dispatch(0.3)] == ["c"]
    assert [b.request_id for b in router.bookings(sched.workers()[0])] == ["c"]


def test_preemptions_suspend_dispatch_to_the_instance() -> None:
    router = KairosTimeSlotRouting(RATE10)
    router._bookings = {"w0": [booking("A", 0.0, 1, 0)]}
    workers = [view("w0", placed=1, blocks=100), view("w1", placed=1, blocks=100)]
    router._bookings["w1"] = [booking("B", 0.0, 50, 0)]
    new = call("n", None, prompt_tokens=1, max_tokens=1)
    assert router.report_preemptions("w0", 3, 0.0) is False  # the first report is the baseline
    assert router.report_preemptions("w0", 5, 1.0) is True
    assert router.route(new, workers, 1.2) == "w1"  # w0 suspended until 1.5
    assert router.route(new, workers, 1.5) == "w0"
    # A full pool with calls waiting for it is an OOM in progress; an idle instance is never suspended.
    full = view("w0", placed=1, blocks=100, used=100, queued=1)
    assert router.suspended(full, 2.0) and not router.suspended(
        view("w0", blocks=100, used=100, queued=1), 2.0
    )
    assert not router.suspended(view("w0", placed=1, blocks=100, used=100), 2.0)  # full, nobody waiting


def test_a_call_too_large_for_any_instance_goes_to_an_empty_one() -> None:
    router = KairosTimeSlotRouting(RATE10)
    router._bookings = {"w0": [booking("A", 0.0, 1, 0)]}
    huge = call("h", None, prompt_tokens=500, max_tokens=1)
    workers = [view("w0", placed=1, blocks=100), view("w1", blocks=100)]
    assert router.route(huge, workers[:1], 0.0) is None
    assert router.route(huge, workers, 0.0) == "w1"


def test_unknown_capacity_always_fits() -> None:
    router = ROUTING_POLICIES.create("kairos-timeslot")
    assert router.route(call("n", None, prompt_tokens=10**6), [view("w0")], 0.0) == "w0"


# ---- a Fig. 7-like worked example in exact virtual time -----------------------------------------


@dataclass(frozen=True)
class Stage:
    agent: str
    service: int  # time units on the one server


# Three workflows on one server that runs one call at a time.  A code workflow has been running
# since t=0; at t=2 two QA workflows arrive, whose routers look alike but lead to a short math
# agent or a long history agent.
WORKFLOWS: dict[str, tuple[int, tuple[Stage, ...]]] = {
    "code": (0, (Stage("coder", 3), Stage("tester", 1))),
    "hist": (2, (Stage("router", 1), Stage("history", 4))),
    "math": (2, (Stage("router", 1), Stage("math", 1))),
}


class OraclePriority:
    """Knows each call's exact remaining latency (its own service and everything after it)."""

    def priority(self, request: QueuedRequest, now: float) -> float:
        assert request.annotations is not None
        return -(request.max_tokens + request.annotations.expected_remaining_time_s)


def agent_ranks() -> dict[str, int]:
    """What the profiler's Kairos ranking makes of the workflows' remaining latencies per agent."""
    remaining: dict[str, list[float]] = {}
    for _, stages in WORKFLOWS.values():
        for i, stage in enumerate(stages):
            remaining.setdefault(stage.agent, []).append(float(sum(s.service for s in stages[i:])))
    return kairos_ranking(remaining).rank


def run_example(policy: str) -> tuple[dict[str, float], dict[str, float]]:
    """(waiting per call, completion time per workflow) with one server of batch 1."""
    if policy == "oracle":
        sched = GlobalScheduler(OraclePriority(), ROUTING_POLICIES.create("round-robin"))
    else:
        sched = GlobalScheduler.from_preset(policy)
    sched.update_worker(WorkerReport("w0", "m", "w0:1", max_batch=1), 0.0)
    ranks = agent_ranks()
    order = itertools.count()
    events: list[tuple[float, int, str, str, int]] = [
        (start, next(order), "ready", name, 0) for name, (start, _) in WORKFLOWS.items()
    ]
    heapq.heapify(events)
    ready: dict[str, float] = {}
    waiting: dict[str, float] = {}
    completion: dict[str, float] = {}
    while events:
        now = events[0][0]
        while events and events[0][0] == now:
            _, _, kind, name, i = heapq.heappop(events)
            start, stages = WORKFLOWS[name]
            rid = f"{name}/{i}"
            if kind == "done":
                sched.complete(rid, now=now)
                if i + 1 < len(stages):
                    heapq.heappush(events, (now, next(order), "ready", name, i + 1))
                else:
                    completion[name] = now - start
                continue
            annotations = common_pb2.SysAnnotations(
                kairos_rank=ranks[stages[i].agent],
                expected_remaining_time_s=sum(s.service for s in stages[i + 1 :]),
            )
            meta = AppMetadata(
                "app", name, stages[i].agent, parent_request_ids=(f"{name}/{i - 1}",) if i else (),
                workflow_end=i == len(stages) - 1,
            )  # fmt: skip
            ready[rid] = now
            sched.submit(
                QueuedRequest(
                    rid,
                    "t",
                    "m",
                    now,
                    max_tokens=stages[i].service,
                    app_metadata=meta,
                    annotations=annotations_from_proto(annotations) if annotations is not None else None,
                ),
                now,
            )
        for decision in sched.dispatch(now):
            name, index = decision.request_id.split("/")
            waiting[decision.request_id] = now - ready[decision.request_id]
            service = WORKFLOWS[name][1][int(index)].service
            heapq.heappush(events, (now + service, next(order), "done", name, int(index)))
        sched.check_integrity()
    return waiting, completion


def test_the_example_ranks_agents_by_remaining_latency() -> None:
    # The router's remaining latency is 5 or 2 depending on the branch: its rank sits between.
    # Equal distributions (math and tester: 1; coder and history: 4) tie, and ties go by name.
    assert agent_ranks() == {"math": 0, "tester": 1, "router": 2, "coder": 3, "history": 4}


@pytest.mark.parametrize(
    ("policy", "total_wait", "waits", "completions"),
    [
        # 3-4 hist router, 4-5 math router, 5-6 tester, 6-10 history, 10-11 math.
        ("fcfs-rr", 12, {"hist/0": 1, "math/0": 2, "code/1": 2, "hist/1": 2, "math/1": 5}, (6, 8, 9)),
        # The deeper calls first: tester 3-4, hist router 4-5, history 5-9, math router 9-10, math.
        ("topo-depth", 9, {"hist/0": 2, "math/0": 7}, (4, 7, 9)),
        # Ranks: tester 3-4, hist router 4-5, math router 5-6 (rank 2 beats history's 3), math 6-7.
        ("kairos", 7, {"hist/0": 2, "math/0": 3, "hist/1": 2}, (4, 9, 5)),
        # Knows the math router leads to 1 more unit, the hist router to 4: math first.
        ("oracle", 6, {"math/0": 2, "hist/0": 4}, (4, 9, 4)),
    ],
)
def test_fig7_like_example_waiting_and_completion(
    policy: str, total_wait: int, waits: dict[str, int], completions: tuple[int, int, int]
) -> None:
    waiting, completion = run_example(policy)
    assert sum(waiting.values()) == total_wait
    assert {rid: w for rid, w in waiting.items() if w} == waits
    assert (completion["code"], completion["hist"], completion["math"]) == completions


def test_fig7_like_example_orders_the_policies_strictly() -> None:
    results = {p: run_example(p) for p in ("fcfs-rr", "topo-depth", "kairos", "oracle")}
    waits = [sum(w.values()) for w, _ in results.values()]
    completions = [sum(c.values()) for _, c in results.values()]
    assert waits == [12, 9, 7, 6]  # FCFS > topology depth > Kairos rank > oracle
    assert completions == [23, 20, 18, 17]  # average completion 7.67 > 6.67 > 6 > 5.67


def view_of(sched: GlobalScheduler, worker_id: str) -> WorkerView:
    return next(w for w in sched.workers() if w.worker_id == worker_id)


def test_heartbeats_feed_the_preemption_suspension_through_the_scheduler() -> None:
    """The scheduler hands every heartbeat to the routing policy (OBSERVES_WORKERS): a rise in a
    worker's preemption count suspends it while it holds placements."""
    sched = GlobalScheduler.from_preset("kairos")
    router = sched.routing_policy
    assert isinstance(router, KairosTimeSlotRouting)

    def beat(worker_id: str, preemptions: int, now: float) -> None:
        report = WorkerReport(worker_id, "m", "x", max_batch=4, kv_blocks_total=1000, preemptions_total=preemptions)
        sched.update_worker(report, now)

    beat("w0", 2, 0.0)
    beat("w1", 0, 0.0)
    sched.submit(QueuedRequest("a", "t", "m", 0.0, prompt_tokens=16, max_tokens=4), 0.0)
    (placed,) = sched.dispatch(0.0)
    busy = placed.worker.worker_id
    beat(busy, 2 if busy == "w0" else 0, 1.0)  # no rise: nothing happens
    assert not router.suspended(view_of(sched, busy), 1.0)
    beat(busy, 7, 1.1)  # a rise: suspended for suspend_s
    assert router.suspended(view_of(sched, busy), 1.1 + router.config.suspend_s - 1e-6)
    assert not router.suspended(view_of(sched, busy), 1.1 + router.config.suspend_s)
    sched.submit(QueuedRequest("b", "t", "m", 1.2, prompt_tokens=16, max_tokens=4), 1.2)
    (second,) = sched.dispatch(1.2)
    assert second.worker.worker_id != busy
