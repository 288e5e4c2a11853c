"""What the scheduler core offers an autoscaler, driven directly with explicit times: per-model
traffic counters, the calls it holds, expected models (schedulable with no worker yet) and drain."""

from __future__ import annotations

import pytest

from clairvoyant.core.annotations import Confidence, ProjectedCalls, SysAnnotations
from clairvoyant.core.app_metadata import AppMetadata
from clairvoyant.core.errors import NoWorkers, QueueFull
from clairvoyant.policy.scaling import ActiveCall, ModelTraffic
from clairvoyant.scheduler.core import GlobalScheduler, QueuedRequest, WorkerReport

pytestmark = pytest.mark.unit

MODEL = "tiny"
OTHER = "other"


def report(worker_id: str, *, model: str = MODEL, max_batch: int = 4, **extra: object) -> WorkerReport:
    return WorkerReport(
        worker_id=worker_id,
        model=model,
        address=f"{worker_id}:50061",
        max_batch=max_batch,
        heartbeat_interval_s=1.0,
        **extra,  # type: ignore[arg-type]
    )


def req(
    request_id: str,
    arrival: float = 0.0,
    *,
    model: str = MODEL,
    prompt_tokens: int = 0,
    agent: str | None = None,
    annotations: SysAnnotations | None = None,
) -> QueuedRequest:
    meta = AppMetadata("coding", f"wf-{request_id}", agent) if agent is not None else None
    return QueuedRequest(
        request_id,
        "tenant-a",
        model,
        arrival,
        prompt_tokens=prompt_tokens,
        max_tokens=64,
        app_metadata=meta,
        annotations=annotations,
    )


def placed_on(sched: GlobalScheduler, now: float) -> list[tuple[str, str]]:
    decisions = sched.dispatch(now)
    sched.check_integrity()
    return [(d.request_id, d.worker_id) for d in decisions]


# ---- traffic counters ---------------------------------------------------------------------------


def test_traffic_counts_submissions_and_served_completions_per_model() -> None:
    sched = GlobalScheduler.from_preset("fcfs-rr")
    sched.update_worker(report("w1"), now=0.0)
    sched.update_worker(report("x1", model=OTHER), now=0.0)
    sched.submit(req("a", prompt_tokens=100), now=0.0)
    sched.submit(req("b", prompt_tokens=30), now=0.0)
    sched.submit(req("c", prompt_tokens=7), now=0.0)
    sched.submit(req("o", model=OTHER, prompt_tokens=5), now=0.0)
    assert len(placed_on(sched, 0.0)) == 4
    assert sched.traffic() == {
        OTHER: ModelTraffic(requests_total=1, input_tokens_total=5),
        MODEL: ModelTraffic(requests_total=3, input_tokens_total=137),
    }
    assert sched.complete("a", now=1.0, output_tokens=40)
    assert sched.complete("b", now=1.5, output_tokens=2)
    # Abandoned (no ``now``), stale or repeated completions count nothing.
    assert sched.complete("c", output_tokens=999)
    assert not sched.complete("a", now=2.0, output_tokens=40)
    assert not sched.complete("o", "not-its-worker", now=2.0, output_tokens=9)
    assert sched.traffic()[MODEL] == ModelTraffic(3, 137, 2, 42)
    assert sched.traffic()[OTHER] == ModelTraffic(1, 5, 0, 0)
    sched.check_integrity()


def test_a_refused_submission_counts_nothing() -> None:
    sched = GlobalScheduler.from_preset("fcfs-rr", max_queue_per_model=1)
    with pytest.raises(NoWorkers):
        sched.submit(req("nobody", prompt_tokens=10), now=0.0)
    sched.update_worker(report("w1", max_batch=1), now=0.0)
    sched.submit(req("r1", prompt_tokens=10), now=0.0)
    with pytest.raises(QueueFull):
        sched.submit(req("r2", prompt_tokens=10), now=0.0)
    assert sched.traffic() == {MODEL: ModelTraffic(requests_total=1, input_tokens_total=10)}


# ---- active calls -------------------------------------------------------------------------------


def test_active_calls_list_queued_then_placed_with_their_ids_and_annotations() -> None:
    sched = GlobalScheduler.from_preset("fcfs-rr")
    sched.update_worker(report("w1", max_batch=1), now=0.0)
    projected = SysAnnotations(
        confidence=Confidence.HIGH,
        projection=(ProjectedCalls(1, "explorer", 3.0), ProjectedCalls(2, "engineer", 1.0)),
    )
    sched.submit(req("first", 1.0, agent="planner", annotations=projected), now=1.0)
    sched.submit(req("second", 2.0, agent="explorer"), now=2.0)
    sched.submit(req("plain", 2.5), now=2.5)
    assert placed_on(sched, 3.0) == [("first", "w1")]

    calls = sched.active_calls(now=4.0)
    assert calls == [
        ActiveCall("second", MODEL, True, "coding", "wf-second", "explorer", "tenant-a", 2.0, None),
        ActiveCall("plain", MODEL, True, None, None, None, "tenant-a", 1.5, None),
        ActiveCall("first", MODEL, False, "coding", "wf-first", "planner", "tenant-a", 3.0, projected),
    ]
    held = sched.held_calls(now=4.0)
    assert [(h.request.request_id, h.worker_id) for h in held] == [
        ("second", None),
        ("plain", None),
        ("first", "w1"),
    ]
    assert sched.agent_models() == {("coding", "planner"): MODEL, ("coding", "explorer"): MODEL}

    # A completed call and a cancelled one leave the list.
    assert sched.complete("first", now=5.0)
    assert sched.cancel("plain")
    assert [c.request_id for c in sched.active_calls(now=5.0)] == ["second"]
    assert placed_on(sched, 5.0) == [("second", "w1")]
    assert [(c.request_id, c.queued) for c in sched.active_calls(now=5.0)] == [("second", False)]


def test_agent_models_follow_the_latest_call_of_each_agent() -> None:
    sched = GlobalScheduler.from_preset("fcfs-rr")
    sched.update_worker(report("w1"), now=0.0)
    sched.update_worker(report("x1", model=OTHER), now=0.0)
    sched.submit(req("r1", agent="planner"), now=0.0)
    sched.submit(req("r2", agent="planner", model=OTHER), now=1.0)
    assert sched.agent_models() == {("coding", "planner"): OTHER}
    sched.agent_models().clear()  # a copy: the caller cannot change the table
    assert sched.agent_model("coding", "planner") == OTHER


# ---- expected models ----------------------------------------------------------------------------


def test_an_expected_model_queues_with_no_worker_and_a_new_worker_gets_the_queue() -> None:
    sched = GlobalScheduler.from_preset("fcfs-rr")
    with pytest.raises(NoWorkers):
        sched.submit(req("early"), now=0.0)
    assert sched.expect_models([MODEL]) == []
    assert sched.expected_models() == frozenset({MODEL})
    sched.submit(req("r1", 1.0), now=1.0)
    sched.submit(req("r2", 2.0), now=2.0)
    assert placed_on(sched, 3.0) == []
    assert sched.queue_depth(MODEL) == 2
    assert [(c.request_id, c.queued, c.wait_s) for c in sched.active_calls(now=4.0)] == [
        ("r1", True, 3.0),
        ("r2", True, 2.0),
    ]
    sched.update_worker(report("w-new", max_batch=1), now=10.0)  # the replica the autoscaler started
    assert placed_on(sched, 10.0) == [("r1", "w-new")]
    assert sched.complete("r1", now=11.0)
    assert placed_on(sched, 11.0) == [("r2", "w-new")]


def test_expire_workers_keeps_an_expected_models_queue() -> None:
    sched = GlobalScheduler.from_preset("fcfs-rr")
    sched.update_worker(report("w1", max_batch=1), now=0.0)
    sched.update_worker(report("x1", model=OTHER, max_batch=1), now=0.0)
    sched.expect_models([MODEL])
    for rid, model in (("r1", MODEL), ("r2", MODEL), ("o1", OTHER), ("o2", OTHER)):
        sched.submit(req(rid, model=model), now=0.0)
    assert placed_on(sched, 0.0) == [("r1", "w1"), ("o1", "x1")]
    gone = {g.worker_id: g for g in sched.expire_workers(now=3.5)}
    # Both lose their placement; only the unexpected model's queue is rejected.
    assert (gone["w1"].failed_request_ids, gone["w1"].rejected_request_ids) == (("r1",), ())
    assert (gone["x1"].failed_request_ids, gone["x1"].rejected_request_ids) == (("o1",), ("o2",))
    assert sched.queued_requests() == [req("r2")]
    sched.check_integrity()
    sched.update_worker(report("w2", max_batch=1), now=4.0)
    assert placed_on(sched, 4.0) == [("r2", "w2")]


def test_expect_models_replaces_the_set_and_rejects_what_nothing_can_serve() -> None:
    sched = GlobalScheduler.from_preset("fcfs-rr")
    sched.update_worker(report("x1", model=OTHER, max_batch=1), now=0.0)
    sched.expect_models([MODEL, OTHER])
    sched.submit(req("r1"), now=0.0)
    sched.submit(req("o1", model=OTHER), now=0.0)
    sched.submit(req("o2", model=OTHER), now=0.0)
    assert placed_on(sched, 0.0) == [("o1", "x1")]
    # Neither is expected any more: MODEL has no worker, so its queue goes; OTHER's worker stays.
    rejected = sched.expect_models(["third"])
    assert [r.request_id for r in rejected] == ["r1"]
    assert sched.expected_models() == frozenset({"third"})
    assert [r.request_id for r in sched.queued_requests()] == ["o2"]
    with pytest.raises(NoWorkers):
        sched.submit(req("r2"), now=1.0)
    assert sched.expect_models([]) == [] and sched.expected_models() == frozenset()
    sched.check_integrity()


# ---- drain --------------------------------------------------------------------------------------


def test_a_drained_worker_gets_nothing_and_a_new_worker_is_used_once_it_reports() -> None:
    sched = GlobalScheduler.from_preset("fcfs-rr")
    sched.update_worker(report("old", max_batch=2), now=0.0)
    sched.submit(req("r1"), now=0.0)
    assert placed_on(sched, 0.0) == [("r1", "old")]
    assert sched.drain("old")
    for i in range(3):
        sched.submit(req(f"q{i}", 1.0 + i), now=1.0 + i)
    assert placed_on(sched, 4.0) == []  # room on "old", but it is draining
    assert [c.request_id for c in sched.active_calls(4.0) if c.queued] == ["q0", "q1", "q2"]
    sched.update_worker(report("new", max_batch=2), now=5.0)
    assert placed_on(sched, 5.0) == [("q0", "new"), ("q1", "new")]
    assert sched.complete("r1", now=6.0)  # what the drained worker held finishes normally
    assert placed_on(sched, 6.0) == []  # and it still takes nothing new
    assert [(w.worker_id, w.placed, w.draining) for w in sched.workers()] == [
        ("new", 2, False),
        ("old", 0, True),
    ]


def test_releasing_the_last_worker_of_an_expected_model_keeps_its_queue() -> None:
    sched = GlobalScheduler.from_preset("fcfs-rr")
    sched.update_worker(report("w1", max_batch=1), now=0.0)
    sched.expect_models([MODEL])
    sched.submit(req("r1"), now=0.0)
    sched.submit(req("r2"), now=0.0)
    assert placed_on(sched, 0.0) == [("r1", "w1")]
    gone = sched.remove_worker("w1")
    assert gone is not None and (gone.failed_request_ids, gone.rejected_request_ids) == (("r1",), ())
    assert [r.request_id for r in sched.queued_requests()] == ["r2"]
    sched.check_integrity()
