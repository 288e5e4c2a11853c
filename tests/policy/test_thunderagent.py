"""The ``thunderagent`` preset through the real scheduler core: admission of new programs, the
per-model paused queues, the 0.5 s check (resume by best fit decreasing, pause at tool
boundaries), the forced resume, and exact placements in virtual time."""

from __future__ import annotations

from typing import cast

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from clairvoyant.core.app_metadata import AppMetadata
from clairvoyant.policy.presets import PRESETS, Preset
from clairvoyant.policy.thunderagent import (
    ProgramGate,
    ThunderAgentConfig,
    ThunderAgentPriority,
    ThunderAgentRouting,
)
from clairvoyant.scheduler.core import GlobalScheduler, QueuedRequest, WorkerReport

pytestmark = pytest.mark.unit

BLOCKS = 100  # x 16 tokens: 1,600 KV tokens per worker; each registered program also costs 100


def make(
    workers: tuple[tuple[str, str], ...] = (("w1", "m"),), config: ThunderAgentConfig | None = None
) -> GlobalScheduler:
    if config is None:
        sched = GlobalScheduler.from_preset("thunderagent")
    else:
        sched = GlobalScheduler(
            ThunderAgentPriority(), ThunderAgentRouting(config), policy_name="thunderagent"
        )
    for worker_id, model in workers:
        report = WorkerReport(worker_id, model, "", max_batch=4, kv_blocks_total=BLOCKS, block_size=16)
        sched.update_worker(report, 0.0)
    return sched


def call(
    rid: str, workflow: str, prompt: int, now: float, model: str = "m", end: bool = False
) -> QueuedRequest:
    meta = AppMetadata("app", workflow, "agent", workflow_end=end)
    return QueuedRequest(rid, "t", model, now, prompt_tokens=prompt, app_metadata=meta)


def submit(sched: GlobalScheduler, now: float, *calls: QueuedRequest) -> None:
    for request in calls:
        sched.submit(request, now)


def step(sched: GlobalScheduler, now: float) -> list[tuple[str, str]]:
    """One dispatch: (request id, worker id) in placement order; the invariants hold after it."""
    placed = [(d.request_id, d.worker_id) for d in sched.dispatch(now)]
    sched.check_integrity()
    gate(sched).check_integrity()
    return placed


def gate(sched: GlobalScheduler) -> ProgramGate:
    return cast(ThunderAgentRouting, sched.routing_policy).gate


def paused(sched: GlobalScheduler, model: str = "m") -> list[str]:
    return [workflow for _, workflow in gate(sched).paused_queue(model)]


def test_the_preset_runs_on_hicache_with_a_static_fleet_and_a_half_second_check() -> None:
    assert PRESETS.create("thunderagent") == Preset("thunderagent", "thunderagent", "hicache", "static")
    config = ThunderAgentRouting().config
    assert (config.interval_s, config.buffer_per_program, config.wait_timeout_s) == (0.5, 100, 1800.0)
    assert not config.count_marked_as_released  # the released code's loop


@pytest.mark.parametrize(
    ("field", "value"),
    [("interval_s", 0.0), ("acting_token_weight", -1.0), ("buffer_per_program", -1), ("wait_timeout_s", 0.0)],
)
def test_bad_settings_are_rejected_by_name(field: str, value: float) -> None:
    with pytest.raises(ValueError, match=f"{field} must be .*got {value}"):
        ThunderAgentConfig(**{field: value})  # type: ignore[arg-type]


def test_new_programs_go_to_the_worker_with_fewest_program_tokens_and_stay_there() -> None:
    sched = make((("w1", "m"), ("w2", "m")))
    submit(sched, 0.0, call("a1", "A", 500, 0.0))
    assert step(sched, 0.0) == [("a1", "w1")]  # a tie: the first worker
    submit(sched, 0.0, call("b1", "B", 300, 0.0))
    assert step(sched, 0.0) == [("b1", "w2")]
    submit(sched, 0.0, call("c1", "C", 200, 0.0))
    assert step(sched, 0.0) == [("c1", "w2")]  # 300 < 500 program tokens
    assert sched.complete("a1", now=0.1)
    submit(sched, 0.1, call("a2", "A", 700, 0.1))
    assert step(sched, 0.1) == [("a2", "w1")]  # its program's worker, though w2 holds fewer tokens


def test_a_program_that_does_not_fit_waits_and_so_does_every_later_new_program_of_its_model() -> None:
    sched = make((("w1", "m"), ("w9", "n")))
    submit(sched, 0.0, call("a1", "A", 1000, 0.0, end=True))
    assert step(sched, 0.0) == [("a1", "w1")]  # 1,600 - 1,100: 500 left
    submit(
        sched, 0.0, call("b1", "B", 600, 0.0), call("c1", "C", 100, 0.0), call("d1", "D", 900, 0.0, model="n")
    )
    assert step(sched, 0.0) == [("d1", "w9")]  # B needs 700; C would fit, but B is ahead of it
    assert paused(sched) == ["B", "C"] and paused(sched, "n") == []
    assert sched.workers()[0].placed == 1 < 4  # seats were free: memory held them back
    assert sched.wake_at(0.0) == 0.5
    assert sched.complete("a1", now=0.2)  # workflow_end: A is released
    assert step(sched, 0.2) == []  # no check before 0.5
    assert step(sched, 0.5) == [("b1", "w1"), ("c1", "w1")]
    assert paused(sched) == [] and sched.wake_at(0.5) is None  # nothing left for the check to do


def test_an_acting_program_keeps_its_memory_and_is_paused_first_when_memory_runs_short() -> None:
    sched = make()
    submit(sched, 0.0, call("a1", "A", 400, 0.0), call("b1", "B", 400, 0.0))
    assert step(sched, 0.0) == [("a1", "w1"), ("b1", "w1")]
    assert sched.complete("a1", now=0.1) and sched.complete("b1", now=0.1)  # both run tools now
    submit(sched, 0.1, call("c1", "C", 600, 0.1))
    assert step(sched, 0.1) == []  # 1,600 - 2 x 500 reserved: C's 700 does not fit
    assert sched.workers()[0].placed == 0  # an idle engine, by design
    submit(sched, 0.2, call("a2", "A", 1100, 0.2))  # A's context grew
    assert step(sched, 0.2) == [("a2", "w1")]  # admitted: it goes at once, over capacity
    assert step(sched, 0.5) == []  # the check pauses B (ACTING), not A (REASONING)
    assert paused(sched) == ["C", "B"]
    submit(sched, 0.6, call("b2", "B", 300, 0.6))
    assert step(sched, 0.6) == []  # B is paused: its next call waits for a resume
    # At 1.0: 400 free.  B has a call waiting and is past its first step: it goes before C (new).
    assert step(sched, 1.0) == [("b2", "w1")]
    assert paused(sched) == ["C"]


@pytest.mark.parametrize(("count_marks", "paused_after"), [(False, ["B", "A"]), (True, ["B"])])
def test_reasoning_programs_are_marked_and_paused_at_their_tool_boundary(
    count_marks: bool, paused_after: list[str]
) -> None:
    sched = make(config=ThunderAgentConfig(count_marked_as_released=count_marks))
    submit(sched, 0.0, call("a1", "A", 500, 0.0), call("b1", "B", 500, 0.0))
    assert step(sched, 0.0) == [("a1", "w1"), ("b1", "w1")]
    submit(sched, 0.1, call("a1b", "A", 1000, 0.1))  # a parallel call: A now counts 1,000 tokens
    assert step(sched, 0.1) == [("a1b", "w1")]  # 1,500 + 200 > 1,600
    assert step(sched, 0.5) == [] and paused(sched) == []  # marked, still running
    assert sched.complete("b1", now=0.6) and sched.complete("a1", now=0.6)
    step(sched, 0.6)
    assert paused(sched) == ["B"]  # B's call ended: paused; A still has a1b running
    assert sched.complete("a1b", now=0.7)
    step(sched, 0.7)
    # The released loop marks every REASONING program, since a mark does not lower the overflow.
    assert paused(sched) == paused_after
    submit(sched, 0.8, call("a2", "A", 1000, 0.8))
    assert step(sched, 0.8) == ([] if "A" in paused_after else [("a2", "w1")])


@pytest.mark.parametrize(("decay", "resumed"), [(False, []), (True, [("b1", "w1")])])
def test_with_decay_an_idle_acting_programs_reservation_fades_for_the_resume_pass(
    decay: bool, resumed: list[tuple[str, str]]
) -> None:
    sched = make(config=ThunderAgentConfig(acting_token_decay=decay))
    submit(sched, 0.0, call("a1", "A", 1000, 0.0))
    assert step(sched, 0.0) == [("a1", "w1")]
    assert sched.complete("a1", now=0.1)  # A runs a tool from 0.1
    submit(sched, 0.1, call("b1", "B", 600, 0.1))
    assert step(sched, 0.1) == []  # 1,600 - 1,100 < 700
    # At 0.5 A counts 1,000 x 2^-0.4 = 757 tokens: 743 free >= 700, so B is resumed; the pause
    # pass, which counts A in full, is then over capacity and pauses A (ACTING).
    assert step(sched, 0.5) == resumed
    assert paused(sched) == (["A"] if decay else ["B"])


def test_paused_programs_resume_largest_first_on_the_worker_with_most_free_tokens() -> None:
    sched = make((("w1", "m"), ("w2", "m")))
    submit(sched, 0.0, call("x1", "X", 1400, 0.0, end=True), call("y1", "Y", 1400, 0.0, end=True))
    assert step(sched, 0.0) == [("x1", "w1"), ("y1", "w2")]
    submit(sched, 0.1, call("p1", "P", 300, 0.1), call("q1", "Q", 500, 0.1), call("r1", "R", 200, 0.1))
    assert step(sched, 0.1) == []
    assert sched.complete("x1", now=0.2) and sched.complete("y1", now=0.2)
    # Q (600 with its buffer) -> w1 (1,600 free, first on a tie); P -> w2 (1,600 > 1,000); R -> w2 (1,200 > 1,000)
    assert step(sched, 0.5) == [("p1", "w2"), ("q1", "w1"), ("r1", "w2")]


def test_the_check_runs_on_a_half_second_grid_and_only_while_it_has_work() -> None:
    sched = make()
    submit(sched, 0.0, call("a1", "A", 1000, 0.0))
    step(sched, 0.0)
    assert sched.wake_at(0.0) is None  # nothing paused, nothing over capacity
    submit(sched, 0.3, call("b1", "B", 1000, 0.3))
    assert step(sched, 0.3) == []
    assert sched.wake_at(0.3) == 0.5
    assert step(sched, 0.5) == [] and sched.wake_at(0.5) == 1.0


def test_a_call_that_can_never_fit_is_forced_in_after_the_wait_timeout() -> None:
    sched = make((("w1", "m"), ("w2", "m")))
    submit(sched, 0.0, call("a1", "A", 1000, 0.0))
    submit(sched, 10.0, call("big1", "Big", 2000, 10.0))  # more than a worker's whole pool
    assert step(sched, 10.0) == [("a1", "w1")]
    assert step(sched, 1809.5) == []
    assert sched.wake_at(1809.6) == 1810.0
    assert step(sched, 1810.0) == [("big1", "w2")]  # the healthy worker with the fewest programs


def test_a_program_whose_worker_drains_moves_to_the_eligible_worker_with_fewest_tokens() -> None:
    sched = make((("w1", "m"), ("w2", "m"), ("w3", "m")))
    submit(sched, 0.0, call("a1", "A", 100, 0.0), call("b1", "B", 900, 0.0), call("c1", "C", 200, 0.0))
    assert step(sched, 0.0) == [("a1", "w1"), ("b1", "w2"), ("c1", "w3")]
    assert sched.complete("a1", now=1.0)
    assert sched.drain("w1")
    submit(sched, 1.0, call("a2", "A", 150, 1.0))
    assert step(sched, 1.0) == [("a2", "w3")]  # 200 tokens on w3 < 900 on w2
    moved = gate(sched).program("m", ("t", "A"))
    assert moved is not None and moved.worker_id == "w3"


def test_calls_without_a_program_are_never_held_back() -> None:
    sched = make()
    submit(sched, 0.0, call("a1", "A", 1400, 0.0), call("b1", "B", 500, 0.0))
    sched.submit(QueuedRequest("loose", "t", "m", 0.0, prompt_tokens=900), 0.0)
    assert step(sched, 0.0) == [("a1", "w1"), ("loose", "w1")]  # B is paused; the loose call passes it
    assert paused(sched) == ["B"]


OPS = st.lists(
    st.tuples(
        st.sampled_from(["submit", "submit", "complete", "end", "beat", "tick"]),
        st.integers(0, 4),  # the workflow
        st.sampled_from(["m", "n"]),
        st.sampled_from([100, 400, 900, 1500, 1800]),  # prompt tokens: 1,800 never fits a worker
        st.sampled_from([0.0, 0.2, 0.5, 3.0]),  # time until the op
        st.integers(0, 40),  # which placed call completes
    ),
    min_size=1,
    max_size=40,
)


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(ops=OPS)
def test_only_paused_programs_calls_wait_while_their_workers_have_seats(
    ops: list[tuple[str, int, str, int, float, int]],
) -> None:
    """Random submits (growing contexts), completions, workflow ends, heartbeats and checks on two
    workers of ``m`` and one of ``n``: the gate's invariants hold, and after every dispatch a call
    of an admitted program (or of none) waits only while some worker of its model is at its
    admission limit (the head of the queue waits for it)."""
    sched = make((("w1", "m"), ("w2", "m"), ("w3", "n")))
    now, count = 0.0, 0
    placed: list[str] = []
    for op, workflow, model, prompt, dt, pick in ops:
        now += dt
        if op == "submit":
            count += 1
            sched.submit(call(f"r{count}", f"wf{workflow}", prompt, now, model=model), now)
        elif op in ("complete", "end") and placed:
            assert sched.complete(placed.pop(pick % len(placed)), now=now)
            if op == "end":
                sched.end_workflow("t", f"wf{workflow}")
        elif op == "beat":
            report = WorkerReport("w2", "m", "", max_batch=4, kv_blocks_total=BLOCKS, block_size=16)
            sched.update_worker(report, now)
        placed += [request_id for request_id, _ in step(sched, now)]
        for request in sched.queued_requests():
            if not gate(sched).is_paused(request):
                full = [w for w in sched.workers() if w.model == request.model and not w.has_room]
                assert full, f"{request.request_id} waits, admitted, with seats free on {request.model}"
