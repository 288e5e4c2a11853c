"""A call a replica refuses (here: longer than the context window) is recorded, not fatal."""

from __future__ import annotations

import pytest

from clairvoyant.bench.metrics import summarize
from clairvoyant.bench.sim.simulator import ReplicaSpec, Simulator
from clairvoyant.worker.core.engine import EngineConfig
from clairvoyant.worker.runners.emulated import EmulatedRunner
from clairvoyant.workloads.program import Call, NewSegment, WorkflowProgram

pytestmark = pytest.mark.unit
MODEL = "llama-3.1-8b"


def _call(index: int, prompt_tokens: int, dependencies: tuple[str, ...]) -> Call:
    return Call(
        call_id=f"wf/{index}", index=index, agent_id=f"a{index}", model=MODEL,
        prompt=(NewSegment("new", prompt_tokens),), prompt_tokens=prompt_tokens, output_tokens=8,
        dependencies=dependencies, tool="search", tool_latency_s=0.5,
    )  # fmt: skip


def test_an_over_long_call_is_rejected_and_its_workflow_goes_on() -> None:
    # a0 -> a1 (3,000 prompt tokens > the 2,048-token window) -> a2
    program = WorkflowProgram(
        "chain", "wf", (_call(0, 100, ()), _call(1, 3000, ("wf/0",)), _call(2, 100, ("wf/1",)))
    )
    runner = EmulatedRunner(MODEL, "H100-80G", sleep=lambda _: None, max_model_len=2048)
    config = EngineConfig(block_size=16, num_blocks=1024, max_num_seqs=8, max_num_batched_tokens=4096)
    records = Simulator([ReplicaSpec("w0", runner, config)], "fcfs-rr").run([(0.0, program)])

    first, rejected, last = records.calls
    assert "2048" in rejected.rejected and not first.rejected and not last.rejected
    assert rejected.end_time == rejected.dispatch_time == first.end_time + 0.5  # refused on arrival
    assert rejected.start_time is None and rejected.generated_tokens == 0
    assert last.ready_time == rejected.end_time and last.generated_tokens == 8  # no reply, so no tool call
    (workflow,) = records.workflows
    assert workflow.end_time == last.end_time + 0.5
    summary = summarize(records)
    assert (summary["calls"], summary["rejected_calls"], summary["workflows"]) == (2, 1, 1)
