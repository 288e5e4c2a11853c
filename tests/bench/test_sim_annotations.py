"""Annotations in the simulator: the oracle's exact values, the profiler annotator after a warm-up,
and records that do not change for policies that ignore annotations (or with no annotator)."""

from __future__ import annotations

import dataclasses
from typing import cast

import pytest

from clairvoyant.bench.records import CallResult
from clairvoyant.bench.sim.annotations import OracleAnnotator, ProfilerAnnotator, warm_up
from clairvoyant.bench.sim.lower_bound import UnitServiceTime
from clairvoyant.bench.sim.simulator import ReplicaSpec, Simulator, SteppedRunner
from clairvoyant.bench.sim.unit_time import UnitTimeRunner
from clairvoyant.contracts.v1 import common_pb2
from clairvoyant.core.annotations import SysAnnotations
from clairvoyant.policy.cache import CompletedCall
from clairvoyant.profiler.core import Tier
from clairvoyant.worker.core.engine import EngineConfig
from clairvoyant.workloads.program import Call, NewSegment, WorkflowProgram

pytestmark = pytest.mark.unit


def _call(wf: str, index: int, agent: str, out: int, deps: tuple[int, ...] = (), tool_s: float = 0.0) -> Call:
    tool = "tool" if tool_s else None
    return Call(f"{wf}/{index}", index, agent, "unit", (NewSegment("new", 4),), 4, out,
                tuple(f"{wf}/{d}" for d in deps), tool, tool_s)  # fmt: skip


def diamond(wf: str) -> WorkflowProgram:
    """plan (3 tokens, tool 2 s) -> search x2 (5 and 7 tokens) -> write (4 tokens, tool 1 s)."""
    calls = (
        _call(wf, 0, "plan", 3, tool_s=2.0),
        _call(wf, 1, "search", 5, (0,)),
        _call(wf, 2, "search", 7, (0,)),
        _call(wf, 3, "write", 4, (1, 2), tool_s=1.0),
    )
    return WorkflowProgram("diamond", wf, calls)


def chain(wf: str) -> WorkflowProgram:
    """plan (2) -> code (6, tool 1 s) -> review (3): always the same three agents."""
    calls = (
        _call(wf, 0, "plan", 2),
        _call(wf, 1, "code", 6, (0,), tool_s=1.0),
        _call(wf, 2, "review", 3, (1,)),
    )
    return WorkflowProgram("chain", wf, calls)


def replicas(count: int = 2, seats: int = 4) -> list[ReplicaSpec]:
    config = EngineConfig(block_size=4, num_blocks=256, max_num_seqs=seats, enable_prefix_cache=False)
    # cast: its ByteTokenizer is a Tokenizer structurally, but mypy sees the attribute as invariant.
    return [ReplicaSpec(f"w{i}", cast(SteppedRunner, UnitTimeRunner()), config) for i in range(count)]


def test_oracle_values_are_the_programs_ground_truth() -> None:
    program = diamond("d")
    oracle = OracleAnnotator({"unit": UnitServiceTime()})
    got = [oracle.annotate(program, call, 0.0) for call in program.calls]
    assert [a.confidence for a in got] == [common_pb2.CONFIDENCE_HIGH] * 4
    assert [(a.predicted_output_len.p50, a.predicted_output_len.p99) for a in got] == [
        (3, 3),
        (5, 5),
        (7, 7),
        (4, 4),
    ]
    assert [a.expected_remaining_steps for a in got] == [2, 1, 1, 0]
    assert [[(n.agent_id, n.probability) for n in a.next_agents] for a in got] == [
        [("search", 1.0)], [("write", 1.0)], [("write", 1.0)], []
    ]  # fmt: skip
    # Unit service = output tokens.  write: its tool, 1.  search: 0 + 4 + 1.  plan: 2 + 7 + 5.
    assert [a.expected_remaining_time_s for a in got] == [14.0, 5.0, 5.0, 1.0]
    # Without service times there is no remaining time.
    assert (
        OracleAnnotator().annotate(program, program.calls[0], 0.0).expected_remaining_time_s is None
    )


class Recording:
    """Wraps an annotator and records what the simulator asked and told it."""

    needs_completions = False

    def __init__(self, inner: OracleAnnotator) -> None:
        self.inner = inner
        self.annotated: list[tuple[str, float]] = []
        self.observed: list[tuple[str, bool]] = []

    def annotate(self, program: WorkflowProgram, call: Call, now: float) -> SysAnnotations | None:
        self.annotated.append((call.call_id, now))
        return self.inner.annotate(program, call, now)

    def observe(
        self, program: WorkflowProgram, record: CallResult, last: bool, completion: CompletedCall | None = None
    ) -> None:
        self.observed.append((record.call_id, last))
        self.inner.observe(program, record, last, completion)


def test_the_simulator_annotates_each_call_when_ready_and_reports_each_end_once() -> None:
    annotator = Recording(OracleAnnotator())
    sim = Simulator(replicas(), "fcfs-rr", annotator=annotator)
    records = sim.run([(0.0, diamond("a")), (1.0, diamond("b"))])
    ready = {c.call_id: c.ready_time for c in records.calls}
    assert sorted(annotator.annotated) == sorted(ready.items())
    assert sorted(cid for cid, _ in annotator.observed) == sorted(ready)
    last = [cid for cid, is_last in annotator.observed if is_last]
    assert sorted(last) == ["a/3", "b/3"]  # the joins end their workflows
    assert annotator.inner._truth == {}  # the oracle forgets finished workflows


def _records(preset: str, annotator: OracleAnnotator | None, seats: int = 4) -> list[dict[str, object]]:
    sim = Simulator(replicas(seats=seats), preset, annotator=annotator)
    records = sim.run([(float(i), diamond(f"p{i}")) for i in range(6)])
    return [dataclasses.asdict(c) for c in records.calls] + [dataclasses.asdict(w) for w in records.workflows]


@pytest.mark.parametrize("preset", ["fcfs-rr", "autellix"])
def test_annotations_change_nothing_for_policies_that_do_not_read_them(preset: str) -> None:
    assert _records(preset, None) == _records(preset, OracleAnnotator({"unit": UnitServiceTime()}))


def test_pythia_with_the_oracle_runs_calls_nearer_their_workflows_end_first() -> None:
    # One seat per replica: the global priority alone decides.  Unannotated, pythia is FCFS.
    assert _records("pythia", None, seats=1) == _records("fcfs-rr", None, seats=1)
    calls = {c["call_id"]: c for c in _records("pythia", OracleAnnotator(), seats=1) if "call_id" in c}
    fcfs = {c["call_id"]: c for c in _records("fcfs-rr", None, seats=1) if "call_id" in c}
    assert calls != fcfs
    # p0's join (1 / (0 + 1) = 1) starts before p5's plan (1/3), which arrived earlier than it.
    assert calls["p0/3"]["ready_time"] > calls["p5/0"]["ready_time"]  # type: ignore[operator]
    assert calls["p0/3"]["start_time"] < calls["p5/0"]["start_time"]  # type: ignore[operator]


def test_the_profiler_annotator_leaves_shadow_after_a_warm_up_and_predicts_the_next_agent() -> None:
    annotator = ProfilerAnnotator()
    assert annotator.tier("chain") is Tier.NONE
    warm = [(5.0 * i, chain(f"warm-{i}")) for i in range(40)]
    records = warm_up(annotator, replicas(), warm)
    assert annotator.tier("chain") in (Tier.LOW, Tier.HIGH)
    assert annotator.time_offset == max(c.end_time or 0.0 for c in records.calls)
    program = chain("new")
    plan = annotator.annotate(program, program.calls[0], 0.0)
    assert plan.confidence in (common_pb2.CONFIDENCE_LOW, common_pb2.CONFIDENCE_HIGH)
    assert [(n.agent_id, n.probability) for n in plan.next_agents] == [("code", 1.0)]
    assert plan.expected_remaining_steps == 2.0
    assert (plan.predicted_output_len.p50, plan.predicted_output_len.p99) == (2.0, 2.0)
    # Online: once the plan call of "new" finished, its code call is one step from the end.
    sim = Simulator(replicas(), "fcfs-rr", annotator=annotator)
    sim.run([(0.0, program)])
    profile = annotator.store.profiles[("default", "chain")]
    assert profile.instances == 41  # the measured workflow was learnt too
    review = annotator.annotate(chain("other"), chain("other").calls[2], 0.0)
    assert [(n.agent_id, n.probability) for n in review.next_agents] == []
    assert review.expected_remaining_steps == 0.0


def test_the_profiler_annotator_is_unannotated_for_an_unknown_workflow() -> None:
    program = chain("x")
    got = ProfilerAnnotator().annotate(program, program.calls[0], 0.0)
    assert got.confidence == common_pb2.CONFIDENCE_NONE
    assert got.predicted_output_len is None and not got.next_agents
