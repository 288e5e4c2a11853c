"""Starvation properties: every preset finishes every call; beta is what saves a demoted call."""

from __future__ import annotations

import math

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from clairvoyant.bench.sim.simulator import ReplicaSpec, Simulator
from clairvoyant.bench.sim.unit_time import UnitTimeRunner
from clairvoyant.scheduler.core import PRESETS, KQueueConfig, KQueueRule
from clairvoyant.worker.core.engine import EngineConfig, EngineRequest, LLMEngine
from clairvoyant.worker.core.sampling import SamplingParams
from clairvoyant.workloads.program import Call, NewSegment, WorkflowProgram

pytestmark = pytest.mark.unit


def program(name: str, widths: list[int], steps: list[int]) -> WorkflowProgram:
    """Stages of ``widths[i]`` parallel calls; each stage waits for the whole previous one."""
    calls: list[Call] = []
    previous: tuple[str, ...] = ()
    for stage, width in enumerate(widths):
        ids = tuple(f"{name}/{stage}.{k}" for k in range(width))
        for k, call_id in enumerate(ids):
            decode = steps[(stage + k) % len(steps)]
            calls.append(
                Call(call_id, len(calls), "agent", "unit", (NewSegment("new", 4),), 4, decode, previous)
            )
        previous = ids
    return WorkflowProgram("prop", name, tuple(calls))


workloads = st.lists(
    st.tuples(
        st.floats(0.0, 6.0).map(lambda t: float(round(t))),
        st.lists(st.integers(1, 3), min_size=1, max_size=3),
        st.lists(st.integers(1, 6), min_size=1, max_size=4),
    ),
    min_size=1,
    max_size=6,
)


@pytest.mark.parametrize("preset", PRESETS.names())
@settings(max_examples=12, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(workload=workloads)
def test_every_preset_finishes_every_call(
    preset: str, workload: list[tuple[float, list[int], list[int]]]
) -> None:
    config = EngineConfig(block_size=4, num_blocks=256, max_num_seqs=2, enable_prefix_cache=False)
    replicas = [ReplicaSpec(f"w{i}", UnitTimeRunner(), config) for i in range(2)]
    sim = Simulator(replicas, preset)
    arrivals = [(t, program(f"p{i}", widths, steps)) for i, (t, widths, steps) in enumerate(workload)]
    records = sim.run(arrivals)  # raises if a workflow never finishes
    assert len(records.calls) == sum(len(p.calls) for _, p in arrivals)
    assert all(c.end_time is not None and c.generated_tokens == c.output_tokens for c in records.calls)
    sim.scheduler.check_integrity()
    assert len(sim.scheduler.programs) == 0  # every workflow ended: the process table is empty


def _starved_steps(beta: float) -> int | None:
    """One seat; a call that starts in the last queue, and a new Q1 call every step, forever.
    The step at which the old call gets its first token, or None within 50 steps."""
    clock = [0.0]
    engine = LLMEngine(
        UnitTimeRunner(), EngineConfig(block_size=4, num_blocks=512, max_num_seqs=1), clock=lambda: clock[0]
    )
    engine.scheduler.rule = KQueueRule(KQueueConfig(boundaries=(2.0, 3.0), beta=beta))
    params = SamplingParams(max_tokens=1, temperature=0.0, ignore_eos=True)
    engine.add_request(EngineRequest("old", [1, 2, 3], params, priority=-2.0, detokenize=False))
    for step in range(50):
        engine.add_request(EngineRequest(f"new{step}", [1, 2, 3], params, priority=0.0, detokenize=False))
        if any(out.request_id == "old" for out in engine.step()):
            return step
        clock[0] += 1.0
    return None


def test_beta_bounds_the_wait_of_a_call_a_stream_of_new_calls_would_starve() -> None:
    assert _starved_steps(math.inf) is None  # MLFQ without anti-starvation: never runs
    # Alone (no process table) and never served, the call is promoted after its first unit of
    # waiting, then waits behind the Q1 calls ahead of it (FCFS by arrival: it is the oldest).
    assert _starved_steps(2.0) == 1
