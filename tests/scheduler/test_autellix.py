"""Autellix (seeds/001 §4): process table, PLAS, ATLAS, K queues with beta, load balancer (Alg. 2)."""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass

import pytest

from clairvoyant.core.app_metadata import AppMetadata
from clairvoyant.policy.autellix import AtlasPriority, LocalityLoadBalancer, PlasPriority
from clairvoyant.scheduler.core import (
    PRESETS,
    GlobalScheduler,
    KQueueConfig,
    KQueueRule,
    ProcessTable,
    QueuedRequest,
    WorkerReport,
)

pytestmark = pytest.mark.unit


def call(
    rid: str,
    workflow: str = "w1",
    *,
    parents: tuple[str, ...] = (),
    prompt_tokens: int = 100,
    end: bool | None = None,
    arrival: float = 0.0,
) -> QueuedRequest:
    meta = AppMetadata("type", workflow, "agent", parent_request_ids=parents, workflow_end=end)
    return QueuedRequest(rid, "t", "m", arrival, prompt_tokens=prompt_tokens, app_metadata=meta)


def scheduler(preset: str, *workers: tuple[str, int], ttl: float = 600.0) -> GlobalScheduler:
    sched = GlobalScheduler.from_preset(preset, max_queue_per_model=1000, program_idle_ttl_s=ttl)
    for worker_id, max_batch in workers:
        sched.update_worker(WorkerReport(worker_id, "m", f"{worker_id}:1", max_batch=max_batch), now=0.0)
    return sched


def serve(sched: GlobalScheduler, request: QueuedRequest, start: float, service: float) -> str:
    """Submit at ``start``, place at once, complete after ``service``; the worker it ran on."""
    request = dataclasses.replace(request, arrival_time=start)
    sched.submit(request, start)
    decisions = sched.dispatch(start)
    assert [d.request_id for d in decisions] == [request.request_id]
    assert sched.complete(request.request_id, now=start + service, service_s=service)
    sched.check_integrity()
    return decisions[0].worker_id


# ---- process table, PLAS, ATLAS ------------------------------------------------------------------


def test_plas_priority_is_minus_the_programs_total_completed_service() -> None:
    sched = scheduler("plas", ("w0", 4))
    plas = sched.priority_policy
    assert isinstance(plas, PlasPriority)
    assert plas.priority(call("a0"), 0.0) == 0.0  # a new program has attained nothing
    serve(sched, call("a0"), 0.0, 3.0)
    serve(sched, call("a1"), 5.0, 2.0)
    assert plas.priority(call("a2"), 9.0) == -5.0
    assert plas.priority(call("b0", "w2"), 9.0) == 0.0  # another program: its own entry
    no_program = QueuedRequest("x", "t", "m", 0.0)
    assert plas.priority(no_program, 9.0) == 0.0
    program = sched.programs.get(("t", "w1"))
    assert program is not None and program.service_s == 5.0
    assert program.waiting_s == 0.0  # placed on arrival, served for its whole residence


def test_service_defaults_to_dispatch_to_completion_and_waiting_accumulates() -> None:
    sched = scheduler("plas", ("w0", 1))
    sched.submit(call("a0"), 0.0)
    sched.submit(call("a1", arrival=1.0), 1.0)  # a parallel thread
    assert [d.request_id for d in sched.dispatch(1.0)] == ["a0", "a1"]  # both queue at the engine
    assert sched.complete("a0", now=4.0)  # no service_s: 4 - 1 (placed at 1) = 3
    assert sched.complete("a1", now=6.0, service_s=1.5)
    assert not sched.complete("a1", now=7.0, service_s=9.0)  # idempotent: counted once
    program = sched.programs.get(("t", "w1"))
    assert program is not None
    assert program.service_s == 4.5
    assert program.waiting_s == (4.0 - 0.0 - 3.0) + (6.0 - 1.0 - 1.5)  # residence minus service


def test_atlas_follows_parents_along_the_critical_path() -> None:
    #        r (2)
    #       /     \
    #   a (5)     b (1)          j: max(2 + 5, 2 + 1) = 7 (Eq. 2)
    #       \     /              x (no parent ids): the program's longest path so far, 7
    #         j
    sched = scheduler("atlas", ("w0", 4))
    atlas = sched.priority_policy
    assert isinstance(atlas, AtlasPriority)
    serve(sched, call("r"), 0.0, 2.0)
    sched.submit(call("a", parents=("r",)), 2.0)
    sched.submit(call("b", parents=("r",)), 2.0)
    assert {d.request_id: d.base_priority for d in sched.dispatch(2.0)} == {"a": -2.0, "b": -2.0}
    assert sched.complete("b", now=3.0, service_s=1.0)
    assert sched.complete("a", now=7.0, service_s=5.0)
    sched.submit(call("j", parents=("a", "b")), 7.0)
    sched.submit(call("b2", parents=("b",)), 7.0)  # the short branch continues: 2 + 1 = 3
    sched.submit(call("x"), 7.0)
    assert {d.request_id: d.base_priority for d in sched.dispatch(7.0)} == {"b2": -3.0, "j": -7.0, "x": -7.0}
    program = sched.programs.get(("t", "w1"))
    assert program is not None and program.critical_path_s == 7.0 and program.service_s == 8.0
    sched.check_integrity()


def test_a_program_leaves_the_table_at_workflow_end_or_when_idle() -> None:
    sched = scheduler("plas", ("w0", 4), ttl=10.0)
    serve(sched, call("a0"), 0.0, 1.0)
    serve(sched, call("b0", "w2"), 0.0, 1.0)
    serve(sched, call("c0", "w3"), 0.0, 1.0)
    sched.submit(call("c1", "w3", arrival=5.0), 5.0)  # w3 stays active
    assert [d.request_id for d in sched.dispatch(5.0)] == ["c1"]
    assert len(sched.programs) == 3
    serve(sched, call("a1", end=True), 2.0, 1.0)  # workflow_end on its last call
    assert sched.programs.get(("t", "w1")) is None
    assert sched.end_workflow("t", "w2") and not sched.end_workflow("t", "w2")
    sched.submit(call("d0", "w4", arrival=20.0), 20.0)
    sched.dispatch(20.0)
    assert sched.complete("d0", now=21.0)
    assert sched.expire_programs(25.0) == []  # w3 has an active call; w4 was active at 21
    assert sched.expire_programs(31.5) == [("t", "w4")]
    assert sched.complete("c1")  # abandoned (no time given): leaves w3 without counting
    assert sched.expire_programs(31.5) == [("t", "w3")]
    assert len(sched.programs) == 0


# ---- K queues: demotion, promotion, beta --------------------------------------------------------


@dataclass(frozen=True)
class _Lineage:
    tenant: str
    workflow_id: str | None


class _Seq:
    """The fields of an engine Sequence the rule reads."""

    def __init__(
        self, priority: float, workflow: str | None = None, wait_s: float = 0.0, service_s: float = 0.0
    ) -> None:
        self.priority = priority
        self.num_output_tokens = 0
        self.lineage = None if workflow is None else _Lineage("t", workflow)
        self.program_wait_s = wait_s  # the placement's, as the worker gets them
        self.program_service_s = service_s


def test_queue_boundaries_and_quanta_default_to_the_queue_widths() -> None:
    config = KQueueConfig(boundaries=(2.0, 3.0, 7.0))
    assert config.num_queues == 4
    assert [config.queue_of(v) for v in (0.0, 1.9, 2.0, 3.0, 6.9, 7.0, 1e9)] == [0, 0, 1, 2, 2, 3, 3]
    assert [config.quantum(q) for q in range(4)] == [2.0, 1.0, 4.0, math.inf]
    explicit = KQueueConfig(boundaries=(2.0, 3.0), quanta=(0.5, 0.25))
    assert [explicit.quantum(q) for q in range(3)] == [0.5, 0.25, math.inf]
    with pytest.raises(ValueError):
        KQueueConfig(boundaries=(3.0, 2.0))


def test_a_call_starts_in_its_programs_queue_and_demotes_after_each_quantum() -> None:
    rule = KQueueRule(KQueueConfig(boundaries=(2.0, 3.0), beta=math.inf))
    seq, fresh, late = _Seq(0.0), _Seq(-1.0), _Seq(-5.0)  # base priority = -(initial queue)
    trace = []
    for now in range(6):
        trace.append([rule.effective_priority(s, float(now)) for s in (seq, fresh, late)])
        seq.num_output_tokens += 1  # seq runs every step; the others wait
    assert trace == [
        [0.0, -1.0, -2.0],  # queues clamp to the last one
        [0.0, -1.0, -2.0],
        [-1.0, -1.0, -2.0],  # 2 units served: Q1's quantum (2) spent
        [-2.0, -1.0, -2.0],  # Q2's quantum (1) spent
        [-2.0, -1.0, -2.0],  # Q3 has no quantum
        [-2.0, -1.0, -2.0],
    ]
    assert rule.queue_of(seq) == 2 and rule.queue_of(_Seq(0.0)) is None


def test_beta_promotes_a_starving_call_to_q1_and_resets_only_the_calls_own_times() -> None:
    # beta = 2: promote once (W_p + W_c) / (T_p + T_c) >= 2.
    rule = KQueueRule(KQueueConfig(boundaries=(2.0, 3.0), beta=2.0))
    seq = _Seq(-2.0)  # starts in Q3
    assert rule.effective_priority(seq, 0.0) == -2.0
    seq.num_output_tokens = 1
    assert rule.effective_priority(seq, 1.0) == -2.0  # ran 1: W 0 / T 1
    assert rule.effective_priority(seq, 2.0) == -2.0  # waited 1: 1 / 1
    assert rule.effective_priority(seq, 3.0) == 0.0  # waited 2: 2 / 1 >= 2 -> Q1
    seq.num_output_tokens = 3
    assert rule.effective_priority(seq, 5.0) == -1.0  # ran 2 since: Q1's quantum spent, demoted


def test_beta_counts_the_programs_waiting_and_service_that_the_placement_carries() -> None:
    sched = scheduler("autellix", ("w0", 4))
    serve(sched, call("a0"), 0.0, 4.0)
    serve(sched, call("a1"), 10.0, 2.0)
    sched.submit(call("a2", arrival=10.0), 10.0)
    sched.dispatch(10.0)
    assert sched.complete("a2", now=29.0, service_s=0.0)  # waited 19 for nothing
    program = sched.programs.get(("t", "w1"))
    assert program is not None and (program.waiting_s, program.service_s) == (19.0, 6.0)
    sched.submit(call("a3", arrival=29.0), 29.0)
    (decision,) = sched.dispatch(29.0)
    assert (decision.program_wait_s, decision.program_service_s) == (19.0, 6.0)  # what the worker gets
    config = KQueueConfig(boundaries=(2.0, 3.0), beta=2.0)
    promoted_at = {}
    for name, attained in (("placed", decision), ("alone", None)):
        rule = KQueueRule(config)
        wait, service = (attained.program_wait_s, attained.program_service_s) if attained else (0.0, 0.0)
        seq = _Seq(-2.0, "w1", wait, service)  # Q3; runs for 1 unit, then waits
        rule.effective_priority(seq, 0.0)
        seq.num_output_tokens = 1
        for now in range(1, 8):
            if rule.effective_priority(seq, float(now)) == 0.0:
                promoted_at[name] = now
                break
    # alone: W_c / T_c = 2 / 1 at t=3.  placed: the program's debt, (19 + 0) / (6 + 1) >= 2, at t=1.
    assert promoted_at == {"alone": 3, "placed": 1}
    rule = KQueueRule(config)
    seq = _Seq(-2.0, "w1", wait_s=0.0, service_s=6.0)  # never waited: (0 + W_c) / 7 >= 2 needs W_c = 14
    rule.effective_priority(seq, 0.0)
    seq.num_output_tokens = 1
    assert [rule.effective_priority(seq, float(now)) for now in (1, 3, 14, 15)] == [-2.0, -2.0, -2.0, 0.0]


# ---- the load balancer (Alg. 2) -----------------------------------------------------------------


def test_short_calls_go_to_the_least_used_engine_and_long_calls_stay_with_their_program() -> None:
    sched = scheduler("autellix", ("w0", 2), ("w1", 2))
    lb = sched.routing_policy
    assert isinstance(lb, LocalityLoadBalancer)
    sched.submit(call("long0", prompt_tokens=4000), 0.0)
    assert [d.worker_id for d in sched.dispatch(0.0)] == ["w0"]  # least used (tie: id), pinned
    program = sched.programs.get(("t", "w1"))
    assert program is not None and program.engine_id == "w0"
    for i, tokens in enumerate((2048, 2048, 4000, 2049)):
        sched.submit(call(f"c{i}", prompt_tokens=tokens), 0.0)
    placed = {d.request_id: d.worker_id for d in sched.dispatch(0.0)}
    # 2,048 tokens is still short: least used (w1, then a tie -> w0); longer ones follow the pin
    # even to the busier engine.
    assert placed == {"c0": "w1", "c1": "w0", "c2": "w0", "c3": "w0"}
    sched.check_integrity()


def test_calls_queue_at_the_engine_up_to_the_factor_then_the_pin_waits() -> None:
    sched = scheduler("autellix", ("w0", 1), ("w1", 1))
    assert [w.admission_limit for w in sched.workers()] == [8, 8]  # 8 x max_batch
    sched.submit(call("p0", prompt_tokens=4000), 0.0)
    sched.dispatch(0.0)
    for i in range(8):
        sched.submit(call(f"p{i + 1}", prompt_tokens=4000, arrival=float(i)), float(i))
    placed = [d.worker_id for d in sched.dispatch(8.0)]
    assert placed == ["w0"] * 7  # pinned to a full engine: the 8th long call waits, w1 idle
    assert sched.is_queued("p8")
    sched.submit(call("short", prompt_tokens=10), 8.0)
    assert [(d.request_id, d.worker_id) for d in sched.dispatch(8.0)] == [("short", "w1")]
    assert sched.complete("p0", now=9.0)
    assert [d.request_id for d in sched.dispatch(9.0)] == ["p8"]


def test_a_pin_to_a_draining_engine_moves_to_the_least_used() -> None:
    sched = scheduler("autellix", ("w0", 2), ("w1", 2))
    assert serve(sched, call("a0", prompt_tokens=5000), 0.0, 1.0) == "w0"
    sched.drain("w0")
    assert serve(sched, call("a1", prompt_tokens=5000), 1.0, 1.0) == "w1"
    program = sched.programs.get(("t", "w1"))
    assert program is not None and program.engine_id == "w1"


def test_autellix_presets_are_registered() -> None:
    assert {"plas", "atlas", "mlfq", "autellix"} <= set(PRESETS.names())
    assert PRESETS.create("autellix")[:2] == ("autellix-kq", "autellix-lb")
    assert GlobalScheduler.from_preset("fcfs-rr").engine_rule() is None
    assert isinstance(GlobalScheduler.from_preset("autellix").engine_rule(), KQueueRule)
    assert isinstance(ProcessTable(), ProcessTable)
