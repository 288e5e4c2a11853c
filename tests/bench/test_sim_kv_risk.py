"""KV is never oversubscribed beyond what a preset says it risks, in the simulator.

Of the registered presets only ``pythia`` states a memory risk: a node takes a call only while
the reserved bounds (prompt + p99 output) fit its KV and the union bound on overflow stays at most
ε (Alg. 2).  With exact bounds (the oracle's p99 is the true length) nothing can overflow, so
the engines must never preempt.  The other presets state none: the engine preempts when memory
runs out (the control below shows that this traffic makes FCFS do so).
"""

from __future__ import annotations

from typing import cast

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from clairvoyant.bench.sim.annotations import OracleAnnotator
from clairvoyant.bench.sim.simulator import ReplicaSpec, Simulator, SteppedRunner
from clairvoyant.bench.sim.unit_time import UnitTimeRunner
from clairvoyant.worker.core.engine import EngineConfig
from clairvoyant.workloads.program import Call, NewSegment, WorkflowProgram

pytestmark = pytest.mark.unit

BLOCK = 4
BLOCKS = 24  # 96 tokens per replica: a few calls fill it


def program(name: str, sizes: list[tuple[int, int]]) -> WorkflowProgram:
    """A chain of calls of (prompt tokens, output tokens), each after the previous."""
    calls = tuple(
        Call(f"{name}/{i}", i, f"agent{i % 2}", "unit", (NewSegment("new", prompt),), prompt, output,
             (f"{name}/{i - 1}",) if i else ())
        for i, (prompt, output) in enumerate(sizes)
    )  # fmt: skip
    return WorkflowProgram("risk", name, calls)


def run(preset: str, arrivals: list[tuple[float, WorkflowProgram]]) -> int:
    config = EngineConfig(block_size=BLOCK, num_blocks=BLOCKS, max_num_seqs=8, enable_prefix_cache=False)
    replicas = [ReplicaSpec(f"w{i}", cast(SteppedRunner, UnitTimeRunner()), config) for i in range(2)]
    sim = Simulator(replicas, preset, annotator=OracleAnnotator())
    records = sim.run(arrivals)
    assert all(c.end_time is not None for c in records.calls)
    return records.preemptions


sizes = st.tuples(st.integers(4, 40), st.integers(1, 40))  # at most 80 tokens: each fits alone
traffic = st.lists(
    st.tuples(st.integers(0, 5).map(float), st.lists(sizes, min_size=1, max_size=3)), min_size=1, max_size=8
)


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(workload=traffic)
def test_pythia_with_exact_bounds_never_oversubscribes(workload: list[tuple[float, list[tuple[int, int]]]]) -> None:
    arrivals = [(t, program(f"p{i}", calls)) for i, (t, calls) in enumerate(workload)]
    assert run("pythia", arrivals) == 0


def test_the_same_traffic_makes_fcfs_preempt() -> None:
    """The control: eight programs of two long calls at once overflow FCFS's engines."""
    arrivals = [(0.0, program(f"p{i}", [(30, 40), (30, 40)])) for i in range(8)]
    assert run("fcfs-rr", arrivals) > 0
    assert run("pythia", arrivals) == 0
