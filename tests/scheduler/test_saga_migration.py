"""SAGA §5.2 step 3 in the scheduler core: a stolen session's next placement names where its KV is
(``Decision.kv_source``, through the ``MIGRATES_KV`` hook)."""

from __future__ import annotations

from collections.abc import Sequence

import pytest

from clairvoyant.core.app_metadata import AppMetadata
from clairvoyant.policy import Capability, capabilities_of
from clairvoyant.policy.saga import SagaAffinityRouting, Steal
from clairvoyant.scheduler.core import GlobalScheduler, QueuedRequest, WorkerView
from tests.scheduler.test_saga import report

pytestmark = pytest.mark.unit


def call(rid: str, session: str, t: float) -> QueuedRequest:
    return QueuedRequest(
        rid, "t", "m", t, prompt_tokens=100, max_tokens=8, app_metadata=AppMetadata("wf", session, "a")
    )


def submit(sched: GlobalScheduler, request: QueuedRequest) -> list[tuple[str, str, str | None]]:
    """Submit and dispatch at the request's arrival: (request, worker, kv_source) per placement."""
    sched.submit(request, now=request.arrival_time)
    return dispatch(sched, request.arrival_time)


def dispatch(sched: GlobalScheduler, now: float) -> list[tuple[str, str, str | None]]:
    decisions = sched.dispatch(now)
    sched.check_integrity()
    return [(d.request_id, d.worker_id, d.kv_source) for d in decisions]


def stolen_a() -> tuple[GlobalScheduler, SagaAffinityRouting]:
    """w0 runs sessions A and B (2 seats) with A's and B's next calls waiting for it; w1 runs E
    (1 seat) and its queue has been empty since t=0.  At t=0.11 w1 steals A (the oldest waiting)."""
    sched = GlobalScheduler.from_preset("saga")
    routing = sched.routing_policy
    assert isinstance(routing, SagaAffinityRouting) and Capability.MIGRATES_KV in capabilities_of(routing)
    sched.update_worker(report("w0", max_batch=2), now=0.0)
    sched.update_worker(report("w1", max_batch=1, kv_used=9, kv_total=10), now=0.0)  # load 0.9
    placed = [p for r, s in [("a1", "A"), ("b1", "B"), ("e1", "E")] for p in submit(sched, call(r, s, 0.0))]
    assert placed == [("a1", "w0", None), ("b1", "w0", None), ("e1", "w1", None)]
    assert submit(sched, call("a2", "A", 0.01)) == []
    assert submit(sched, call("b2", "B", 0.02)) == []
    assert submit(sched, call("a3", "A", 0.11)) == []
    assert routing.steals == [Steal("w1", "w0", ("t", "A"))]
    return sched, routing


def test_the_stolen_sessions_next_placement_names_the_victim_once() -> None:
    sched, _ = stolen_a()
    assert sched.complete("e1", now=0.2)
    assert dispatch(sched, 0.2) == [("a2", "w1", "w0")]  # the KV of A is on w0: move it to w1
    assert sched.complete("a1", now=0.3)
    assert dispatch(sched, 0.3) == [("b2", "w0", None)]  # B was not stolen
    assert sched.complete("a2", now=0.4)
    assert dispatch(sched, 0.4) == [("a3", "w1", None)]  # the first placement moved it already


def test_no_move_when_the_call_lands_back_on_the_victim() -> None:
    sched, _ = stolen_a()
    sched.update_worker(report("w1", max_batch=1, kv_used=9, kv_total=10), now=0.15)
    assert sched.drain("w1")  # the thief cannot take it any more: a2 goes where there is room, w0
    assert sched.complete("b1", now=0.2)
    assert dispatch(sched, 0.2) == [("a2", "w0", None)]
    assert sched.complete("a1", now=0.3)
    assert dispatch(sched, 0.3) == [("b2", "w0", None)]  # and the victim is forgotten


def test_a_session_that_ends_before_it_is_placed_again_is_forgotten() -> None:
    sched, routing = stolen_a()
    assert sched.cancel("a2") and sched.cancel("a3") and sched.cancel("b2")
    assert sched.end_workflow("t", "A")
    assert dispatch(sched, 0.12) == []  # the dispatch after the end drops the pending move
    assert sched.complete("e1", now=0.2)
    assert submit(sched, call("a9", "A", 0.2)) == [("a9", "w1", None)]  # a new A: nothing to move
    assert routing.steals == [Steal("w1", "w0", ("t", "A"))]


class FromW0:
    """A routing policy that places on the first worker with room and says the KV is on w0."""

    capabilities = frozenset({Capability.MIGRATES_KV})

    def __init__(self) -> None:
        self.asked: list[tuple[str, str]] = []

    def route(self, request: QueuedRequest, workers: Sequence[WorkerView], now: float) -> str | None:
        return next((w.worker_id for w in workers if w.has_room), None)

    def kv_source(self, request: QueuedRequest, worker_id: str) -> str | None:
        self.asked.append((request.request_id, worker_id))
        return "w0" if worker_id != "w0" else None


def test_an_undeclared_hook_is_refused_rather_than_silently_never_called() -> None:
    class Undeclared(FromW0):
        capabilities = frozenset()

    with pytest.raises(TypeError, match="kv_source"):
        GlobalScheduler(GlobalScheduler.from_preset("fcfs-rr").priority_policy, Undeclared())


def test_the_hook_is_asked_once_per_placement_and_presets_without_it_say_none() -> None:
    hooked = FromW0()
    sched = GlobalScheduler(GlobalScheduler.from_preset("fcfs-rr").priority_policy, hooked)
    for worker in ("w0", "w1"):
        sched.update_worker(report(worker, max_batch=1), now=0.0)
    for rid in ("r1", "r2", "r3"):
        sched.submit(call(rid, "S", 0.0), now=0.0)
    assert dispatch(sched, 0.0) == [("r1", "w0", None), ("r2", "w1", "w0")]
    assert hooked.asked == [("r1", "w0"), ("r2", "w1")]  # r3 found no room: not asked

    plain = GlobalScheduler.from_preset("fcfs-rr")
    assert Capability.MIGRATES_KV not in capabilities_of(plain.routing_policy)
    plain.update_worker(report("w0", max_batch=4), now=0.0)
    assert submit(plain, call("p1", "S", 0.0)) == [("p1", "w0", None)]
