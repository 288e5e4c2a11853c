"""SAGA (seeds/003 §5–6): session affinity under the 0.8 load threshold, work stealing's triggers
and choices, Agent Fair Share's allocation and epochs."""

from __future__ import annotations

import random

import pytest

from clairvoyant.contracts.v1 import common_pb2
from clairvoyant.core.app_metadata import AppMetadata
from clairvoyant.core.wire import annotations_from_proto
from clairvoyant.policy.saga import (
    AgentFairShare,
    PendingSession,
    SagaAffinityRouting,
    SagaConfig,
    Steal,
    TaskWork,
    WorkerQueue,
    agent_fair_shares,
    epoch_of,
    plan_steals,
    worker_load,
)
from clairvoyant.scheduler.core import PRESETS, GlobalScheduler, QueuedRequest, WorkerReport, WorkerView

pytestmark = pytest.mark.unit


def call(
    rid: str, session: str | None, t: float, *, tenant: str = "t", remaining_s: float | None = None
) -> QueuedRequest:
    meta = None if session is None else AppMetadata("wf", session, "agent")
    annotations = (
        None
        if remaining_s is None
        else common_pb2.SysAnnotations(
            expected_remaining_time_s=remaining_s, confidence=common_pb2.CONFIDENCE_HIGH
        )
    )
    return QueuedRequest(
        rid, tenant, "m", t, prompt_tokens=100, max_tokens=8, app_metadata=meta,
        annotations=annotations_from_proto(annotations) if annotations is not None else None,
    )


def report(worker_id: str, max_batch: int, kv_used: int = 0, kv_total: int = 0) -> WorkerReport:
    return WorkerReport(
        worker_id,
        "m",
        f"{worker_id}:1",
        max_batch=max_batch,
        kv_blocks_used=kv_used,
        kv_blocks_total=kv_total,
    )


def place(sched: GlobalScheduler, request: QueuedRequest) -> str | None:
    sched.submit(request, now=request.arrival_time)
    decisions = sched.dispatch(request.arrival_time)
    sched.check_integrity()
    return decisions[0].worker_id if decisions else None


def view(
    worker_id: str, placed: int = 0, *, max_batch: int = 10, kv_used: int = 0, draining: bool = False
) -> WorkerView:
    return WorkerView(
        worker_id=worker_id, model="m", address="", http_address="", running=0, queued=0, placed=placed,
        max_batch=max_batch, kv_blocks_used=kv_used, kv_blocks_total=1000, max_model_len=0, draining=draining,
        last_heartbeat=0.0, heartbeat_interval_s=1.0,
    )  # fmt: skip


def session(
    name: str, oldest: float, calls: int = 1, excluded: frozenset[str] = frozenset()
) -> PendingSession:
    return PendingSession(("t", name), oldest, calls, excluded)


def test_saga_preset_pairs_afs_with_affinity_routing() -> None:
    assert PRESETS.create("saga")[:2] == ("saga-afs", "saga-affinity")
    sched = GlobalScheduler.from_preset("saga")
    assert isinstance(sched.priority_policy, AgentFairShare)
    assert isinstance(sched.routing_policy, SagaAffinityRouting)
    assert SagaConfig() == SagaConfig(0.8, 0.1, 2.0, 0.1, 0)  # the paper's Table 9 / §6.2 values


# ---- §5.1 affinity ---------------------------------------------------------------------------------


def test_a_session_stays_below_load_0_8_and_moves_at_it() -> None:
    sched = GlobalScheduler.from_preset("saga")
    for wid in ("w0", "w1"):
        sched.update_worker(report(wid, max_batch=5), now=0.0)
    # w0's load before each placement: 0, 0.2, 0.4, 0.6 (all < 0.8), then 0.8: the session moves.
    assert [place(sched, call(f"a{i}", "A", 0.01 * i)) for i in range(1, 6)] == ["w0", "w0", "w0", "w0", "w1"]
    assert sched.programs.get(("t", "A")) is not None
    assert sched.programs.get(("t", "A")).engine_id == "w1"  # type: ignore[union-attr]
    assert place(sched, call("a6", "A", 0.1)) == "w1"  # the new worker keeps it (load 0.2)


def test_reported_kv_use_counts_as_load() -> None:
    sched = GlobalScheduler.from_preset("saga")
    sched.update_worker(report("w0", max_batch=10), now=0.0)
    sched.update_worker(report("w1", max_batch=10), now=0.0)
    assert place(sched, call("a1", "A", 0.0)) == "w0"
    sched.update_worker(report("w0", max_batch=10, kv_used=79, kv_total=100), now=0.01)
    assert place(sched, call("a2", "A", 0.02)) == "w0"  # max(0.1 seats, 0.79 KV) < 0.8
    sched.update_worker(report("w0", max_batch=10, kv_used=80, kv_total=100), now=0.03)
    assert place(sched, call("a3", "A", 0.04)) == "w1"  # 0.80 KV: moved


def test_new_sessions_and_sessionless_calls_go_to_the_least_loaded_worker() -> None:
    sched = GlobalScheduler.from_preset("saga")
    sched.update_worker(report("w0", max_batch=10, kv_used=30, kv_total=100), now=0.0)
    sched.update_worker(report("w1", max_batch=10), now=0.0)
    sched.update_worker(report("w2", max_batch=10), now=0.0)
    assert place(sched, call("a1", "A", 0.0)) == "w1"  # loads 0.3, 0, 0: lowest, then smallest id
    assert place(sched, call("b1", "B", 0.01)) == "w2"  # 0.3, 0.1, 0
    assert place(sched, call("n1", None, 0.02)) == "w1"  # 0.3, 0.1, 0.1: fewer placements tie -> id
    assert place(sched, call("c1", "C", 0.03)) == "w2"  # 0.3, 0.2, 0.1
    assert sched.programs.get(("t", "B")).engine_id == "w2"  # type: ignore[union-attr]


def test_worker_load_is_the_larger_of_seats_and_kv() -> None:
    assert worker_load(view("w", placed=2, max_batch=10)) == 0.2
    assert worker_load(view("w", placed=2, max_batch=10), pending=3) == 0.5
    assert worker_load(view("w", placed=2, max_batch=10, kv_used=700)) == 0.7


# ---- §5.2 work stealing, pure -------------------------------------------------------------------------


def busy_victim(victim: str = "w1", *sessions: PendingSession) -> WorkerQueue:
    return WorkerQueue(view(victim, placed=4), sessions or (session("S", 0.5),), None)


@pytest.mark.parametrize(("now", "steals"), [(1.099, 0), (1.1, 1)])
def test_a_queue_must_be_empty_for_100_ms(now: float, steals: int) -> None:
    queues = [WorkerQueue(view("w0"), (), 1.0), busy_victim()]
    assert len(plan_steals(queues, now, random.Random(0), SagaConfig())) == steals


@pytest.mark.parametrize(("victim_kv", "steals"), [(200, 0), (201, 1)])
def test_the_victim_must_be_loaded_above_twice_the_thief(victim_kv: int, steals: int) -> None:
    thief = WorkerQueue(view("w0", placed=1), (), 0.0)  # load 0.1
    # victim: 1 placement + 1 pending call = 0.2 seats; KV 0.200 (ratio 2.0) or 0.201 (2.01).
    victim = WorkerQueue(view("w1", placed=1, kv_used=victim_kv), (session("S", 0.5),), None)
    assert len(plan_steals([thief, victim], 1.0, random.Random(0), SagaConfig())) == steals


def test_the_oldest_session_the_thief_may_take_is_stolen_and_the_thief_steals_once() -> None:
    sessions = (
        session("new", 5.0),
        session("excluded", 2.0, excluded=frozenset({"w0"})),
        session("oldest", 3.0, calls=2),
        session("middle", 4.0),
    )
    queues = [WorkerQueue(view("w0"), (), 0.0), busy_victim("w1", *sessions)]
    assert plan_steals(queues, 1.0, random.Random(0), SagaConfig()) == [Steal("w0", "w1", ("t", "oldest"))]


def test_two_thieves_take_two_sessions_and_draining_or_busy_workers_do_not_steal() -> None:
    queues = [
        WorkerQueue(view("w0"), (), 0.0),
        WorkerQueue(view("w2"), (), 0.0),
        WorkerQueue(view("w3", draining=True), (), 0.0),
        WorkerQueue(view("w4"), (), None),  # calls queued at its engine: not empty, no thief
        busy_victim("w1", session("A", 1.0), session("B", 2.0)),
    ]
    steals = plan_steals(queues, 1.0, random.Random(0), SagaConfig())
    assert [(s.thief, s.session[1]) for s in steals] == [("w0", "A"), ("w2", "B")]
    assert {s.victim for s in steals} == {"w1"}  # the only worker with a pending session


def test_the_victim_is_drawn_from_the_injected_generator() -> None:
    queues = [WorkerQueue(view("w0"), (), 0.0)] + [busy_victim(f"w{i}") for i in (3, 1, 2)]
    for seed in range(20):
        expected = random.Random(seed).choice(["w1", "w2", "w3"])  # overloaded victims, in id order
        first = plan_steals(queues, 1.0, random.Random(seed), SagaConfig())
        assert first == plan_steals(queues, 1.0, random.Random(seed), SagaConfig())  # reproducible
        assert first == [Steal("w0", expected, ("t", "S"))]
    assert len({plan_steals(queues, 1.0, random.Random(s), SagaConfig())[0].victim for s in range(20)}) == 3


# ---- §5.2 in the scheduler: the steal re-pins the session -------------------------------------------------


def test_a_stolen_session_is_re_pinned_to_the_thief_at_dispatch() -> None:
    sched = GlobalScheduler.from_preset("saga")
    routing = sched.routing_policy
    assert isinstance(routing, SagaAffinityRouting)
    sched.update_worker(report("w0", max_batch=2), now=0.0)
    sched.update_worker(report("w1", max_batch=1, kv_used=9, kv_total=10), now=0.0)  # load 0.9
    assert [place(sched, call(r, s, 0.0)) for r, s in [("a1", "A"), ("b1", "B"), ("e1", "E")]] == [
        "w0",
        "w0",
        "w1",
    ]
    # Every seat is taken: A's and B's next calls wait, pinned to w0.  w1's queue is empty since t=0.
    assert place(sched, call("a2", "A", 0.01)) is None
    assert place(sched, call("b2", "B", 0.02)) is None
    assert sched.dispatch(0.1) == [] and routing.steals == []  # w0 (2 + 2) / 2 = 2.0 = 2 × w1's 1.0
    assert place(sched, call("a3", "A", 0.11)) is None  # 0.11 - 0 >= 0.1 and (2 + 3) / 2 = 2.5 > 2.0
    assert routing.steals == [Steal("w1", "w0", ("t", "A"))]  # A's calls are the oldest (a2)
    assert sched.programs.get(("t", "A")).engine_id == "w1"  # type: ignore[union-attr]
    assert sched.programs.get(("t", "B")).engine_id == "w0"  # type: ignore[union-attr]
    assert sched.complete("e1", now=0.2)
    assert [d.request_id for d in sched.dispatch(0.2)] == ["a2"]  # the seat on w1 goes to A
    assert sched.placement_of("a2") == "w1"
    sched.check_integrity()


# ---- §6 Agent Fair Share --------------------------------------------------------------------------------


def test_shares_are_proportional_to_remaining_work() -> None:
    shares = agent_fair_shares([TaskWork("X", 10.0), TaskWork("X", 20.0), TaskWork("Y", 10.0)])
    assert shares == {"X": 0.75, "Y": 0.25}
    # An unannotated task counts as the mean annotated one: (10 + 20) / 2 = 15.
    assert agent_fair_shares([TaskWork("X", 10.0), TaskWork("X", 20.0), TaskWork("Y", None)]) == {
        "X": pytest.approx(30 / 45),
        "Y": pytest.approx(15 / 45),
    }
    assert agent_fair_shares([TaskWork("X", None), TaskWork("Y", None), TaskWork("Y", None)]) == {
        "X": pytest.approx(1 / 3),
        "Y": pytest.approx(2 / 3),
    }
    assert agent_fair_shares([TaskWork("X", 0.0), TaskWork("Y", 0.0)]) == {"X": 0.5, "Y": 0.5}


def test_epochs_are_100_ms_wide() -> None:
    assert [epoch_of(t, 0.1) for t in (0.0, 0.099, 0.1, 0.3, 0.31)] == [0, 0, 1, 3, 3]


def test_afs_priority_is_share_minus_use_and_fixed_within_an_epoch() -> None:
    sched = GlobalScheduler.from_preset("saga")
    afs = sched.priority_policy
    assert isinstance(afs, AgentFairShare)
    sched.update_worker(report("w0", max_batch=4), now=0.0)
    x1 = call("x1", "x", 0.0, tenant="X", remaining_s=30.0)
    y1 = call("y1", "y", 0.0, tenant="Y", remaining_s=10.0)
    sched.submit(y1, now=0.0)
    sched.submit(x1, now=0.0)
    decisions = sched.dispatch(0.0)  # shares 0.75 / 0.25, nothing in use: X first
    assert [(d.request_id, d.base_priority) for d in decisions] == [("x1", 0.75), ("y1", 0.25)]
    x2 = call("x2", "x", 0.05, tenant="X", remaining_s=25.0)
    sched.submit(x2, now=0.05)
    assert afs.priority(x2, 0.05) == 0.75  # same epoch: unchanged though two seats are now used
    z1 = call("z1", "z", 0.05, tenant="Z", remaining_s=50.0)
    assert afs.priority(z1, 0.05) == 0.0  # a tenant first seen inside an epoch
    # Epoch 1: task x's latest call says 25 s, y's 10 s; each tenant uses 1 of 4 seats.
    assert afs.priority(x2, 0.1) == pytest.approx(25 / 35 - 0.25)
    assert afs.priority(y1, 0.1) == pytest.approx(10 / 35 - 0.25)
    assert afs.shares == {"X": pytest.approx(25 / 35), "Y": pytest.approx(10 / 35)}


def test_a_tenant_below_its_share_goes_first() -> None:
    sched = GlobalScheduler.from_preset("saga")
    sched.update_worker(report("w0", max_batch=4), now=0.0)
    for i in range(3):  # X holds 3 of 4 seats with 3 tasks of 10 s
        sched.submit(call(f"x{i}", f"x{i}", 0.0, tenant="X", remaining_s=10.0), now=0.0)
    assert len(sched.dispatch(0.0)) == 3
    sched.submit(call("x9", "x9", 0.1, tenant="X", remaining_s=10.0), now=0.1)
    sched.submit(call("y1", "y", 0.15, tenant="Y", remaining_s=10.0), now=0.15)
    # Epoch 2: X 40 s of 50 s -> 0.8 - 0.75 = 0.05; Y 0.2 - 0 = 0.2.  Y arrived later and goes first.
    decisions = sched.dispatch(0.2)
    assert [(d.request_id, d.base_priority) for d in decisions] == [("y1", pytest.approx(0.2))]
