"""The ``thunderagent`` preset in the simulator's unit-time mode: programs keep their KV memory
through their tool calls, so a program that does not fit waits for one to end, and is let in at
the next 0.5 s check."""

from __future__ import annotations

import pytest

from clairvoyant.bench.sim.simulator import ReplicaSpec, Simulator
from clairvoyant.bench.sim.unit_time import UnitTimeRunner
from clairvoyant.worker.core.engine import EngineConfig
from clairvoyant.workloads.program import Call, NewSegment, WorkflowProgram

pytestmark = pytest.mark.unit


def agent_loop(name: str, tool_s: float) -> WorkflowProgram:
    """Two calls of 8 prompt tokens and 2 output tokens, a tool of ``tool_s`` between them."""
    first = Call(f"{name}/0", 0, "coder", "unit", (NewSegment("new", 8),), 8, 2, (), "bash", tool_s)
    second = Call(f"{name}/1", 1, "coder", "unit", (NewSegment("new", 8),), 8, 2, (f"{name}/0",))
    return WorkflowProgram("app", name, (first, second))


def run(preset: str) -> dict[str, tuple[float, float]]:
    """Workflow id -> (its first call's dispatch time, its end time)."""
    # 64 blocks x 4 tokens = 256 KV tokens: two programs of 8 tokens and 100 reserved each fit, not three.
    config = EngineConfig(block_size=4, num_blocks=64, max_num_seqs=4, enable_prefix_cache=False)
    sim = Simulator([ReplicaSpec("w0", UnitTimeRunner(), config)], preset)
    records = sim.run([(0.0, agent_loop(f"p{i}", tool_s=5.2)) for i in range(3)])
    sim.scheduler.check_integrity()
    assert len(sim.scheduler.programs) == 0  # every workflow ended
    first = {c.workflow_id: c.dispatch_time for c in records.calls if c.call_id.endswith("/0")}
    ends = {w.workflow_id: w.end_time for w in records.workflows}
    assert all(t is not None for t in [*first.values(), *ends.values()])
    return {w: (float(first[w] or 0.0), float(ends[w] or 0.0)) for w in sorted(ends)}


def test_a_third_program_waits_for_a_program_to_end_then_enters_on_the_half_second_grid() -> None:
    # p0 and p1 run calls of 3 unit steps around a 5.2 s tool each and end at 9.2.  p2 waits through
    # their tools (the engine has free seats: memory, not seats, holds it) and enters at the first
    # check after they are released, 9.5.
    assert run("thunderagent") == {"p0": (0.0, 9.2), "p1": (0.0, 9.2), "p2": (9.5, 18.7)}
    # Without the memory reservation all three start at once.
    assert run("vllm-prodstack") == {"p0": (0.0, 9.2), "p1": (0.0, 9.2), "p2": (0.0, 9.2)}
