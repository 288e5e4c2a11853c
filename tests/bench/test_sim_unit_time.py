"""Hand-checkable schedules in unit time, through the real engine core and scheduler presets."""

from __future__ import annotations

import pytest

from clairvoyant.bench.sim.lower_bound import UnitServiceTime
from clairvoyant.bench.sim.simulator import ReplicaSpec, Simulator
from clairvoyant.bench.sim.unit_time import UnitTimeRunner
from clairvoyant.bench.workloads.program import Call, NewSegment, WorkflowProgram
from clairvoyant.worker.core.engine import EngineConfig

pytestmark = pytest.mark.unit


def chain(name: str, decode_steps: list[int]) -> WorkflowProgram:
    """A single-threaded program: each call starts when the previous one ends (no tools)."""
    calls = []
    for i, steps in enumerate(decode_steps):
        call_id = f"{name}/{i}"
        deps = (f"{name}/{i - 1}",) if i else ()
        calls.append(Call(call_id, i, "agent", "unit", (NewSegment("new", 4),), 4, steps, deps))
    return WorkflowProgram("fig2", name, tuple(calls))


def run_fig2(preset: str, batch: int = 2) -> tuple[float, dict[str, float]]:
    runner = UnitTimeRunner()
    config = EngineConfig(block_size=4, num_blocks=256, max_num_seqs=batch, enable_prefix_cache=False)
    sim = Simulator([ReplicaSpec("w0", runner, config)], preset, service_times={"unit": UnitServiceTime()})
    programs = [chain("A", [4, 3, 1, 1]), chain("B", [3, 3, 4]), chain("C", [1, 2]), chain("D", [4])]
    records = sim.run([(0.0, p) for p in programs])
    waiting = sum(c.queue_s for c in records.calls)
    jct = {w.workflow_id: w.jct_s for w in records.workflows}
    # The critical path (no queueing) is each program's total decode steps, and never above its JCT.
    assert {w.workflow_id: w.lower_bound_s for w in records.workflows} == {"A": 9, "B": 10, "C": 3, "D": 4}
    assert all(w.lower_bound_s <= w.jct_s for w in records.workflows)
    return waiting, jct


def test_autellix_fig2_fcfs_total_waiting_is_18() -> None:
    """Autellix §3 Fig. 2: A {4,3,1,1}, B {3,3,4}, C {1,2}, D {4} at t=0, batch 2, FCFS -> 18."""
    waiting, jct = run_fig2("fcfs-rr")
    assert waiting == 18
    # Worked by hand: B1 0-3, C1 3-4, B2 4-7, D1 4-8, A2 7-10, C2 8-10, B3 10-14, A3 10-11, A4 11-12.
    assert jct == {"A": 12, "B": 14, "C": 10, "D": 8}


def test_unit_time_run_is_deterministic() -> None:
    assert run_fig2("fcfs-rr") == run_fig2("fcfs-rr")
    assert run_fig2("least-loaded") == run_fig2("fcfs-rr")  # one replica: routing cannot matter
