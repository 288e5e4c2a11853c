"""Kairos and topo-depth in the simulator's unit-time mode (seeds/004 Fig. 7 and Fig. 9, constructed)."""

from __future__ import annotations

import pytest

from clairvoyant.bench.sim.simulator import ReplicaSpec, Simulator
from clairvoyant.bench.sim.unit_time import UnitTimeRunner
from clairvoyant.policy.kairos import KairosPriority, KairosTimeSlotRouting, TimeSlotConfig
from clairvoyant.scheduler.core import GlobalScheduler
from clairvoyant.worker.core.engine import EngineConfig
from clairvoyant.workloads.program import Call, NewSegment, WorkflowProgram

pytestmark = pytest.mark.unit


def chain(name: str, stages: list[tuple[str, int]]) -> WorkflowProgram:
    calls = []
    for i, (agent, steps) in enumerate(stages):
        deps = (f"{name}/{i - 1}",) if i else ()
        calls.append(Call(f"{name}/{i}", i, agent, "unit", (NewSegment("new", 4),), 4, steps, deps))
    return WorkflowProgram("app", name, tuple(calls))


@pytest.mark.parametrize(
    ("preset", "total_wait", "completions"),
    [
        ("fcfs-rr", 12.0, {"code": 6.0, "hist": 8.0, "math": 9.0}),
        ("topo-depth", 10.0, {"code": 5.0, "hist": 7.0, "math": 9.0}),
        ("kairos", 12.0, {"code": 6.0, "hist": 8.0, "math": 9.0}),  # no ranks in the simulator: FCFS
    ],
)
def test_fig7_like_example_in_unit_time(
    preset: str, total_wait: float, completions: dict[str, float]
) -> None:
    """tests/scheduler/test_kairos.py's example through the real engine, one seat.  FCFS matches
    the exact-time run (12).  Topology depth gives 10, not 9: the tester becomes ready at t=3 only
    after the dispatch at t=3 has placed the hist router (a successor's READY event follows its
    parent's STEP_DONE), so the tester waits 1 and the history call 1.  The simulator's calls carry
    no annotations, so ``kairos`` falls back to FCFS."""
    config = EngineConfig(block_size=4, num_blocks=256, max_num_seqs=1, enable_prefix_cache=False)
    sim = Simulator([ReplicaSpec("w0", UnitTimeRunner(), config)], preset)
    records = sim.run(
        [
            (0.0, chain("code", [("coder", 3), ("tester", 1)])),
            (2.0, chain("hist", [("router", 1), ("history", 4)])),
            (2.0, chain("math", [("router", 1), ("math", 1)])),
        ]
    )
    assert records.preemptions == 0
    assert sum(c.queue_s for c in records.calls) == total_wait
    assert {w.workflow_id: w.jct_s for w in records.workflows} == completions


def test_time_slot_packing_avoids_the_preemption_round_robin_causes() -> None:
    """Fig. 9-like: two replicas of 48 KV tokens, eight single calls at t=0 (4 prompt tokens; 20 or
    4 output tokens).  Round robin puts three long calls on w0 (3 x 24 > 48): one is preempted and
    ends at 27.  The time-slot dispatcher (decode rate 1 token per unit) books two long calls per
    replica and the short ones where their slots fit: no preemption."""
    config = EngineConfig(block_size=4, num_blocks=12, max_num_seqs=4, enable_prefix_cache=False)
    outputs = [20, 20, 4, 4, 20, 4, 20, 4]
    programs = [
        (
            0.0,
            WorkflowProgram(
                "app", f"p{i}", (Call(f"p{i}/0", 0, "a", "unit", (NewSegment("new", 4),), 4, n, ()),)
            ),
        )
        for i, n in enumerate(outputs)
    ]
    results = {}
    for preset in ("fcfs-rr", "kairos"):
        scheduler = None
        if preset == "kairos":
            routing = KairosTimeSlotRouting(TimeSlotConfig(decode_tokens_per_s=1.0, block_size=4))
            scheduler = GlobalScheduler(KairosPriority(), routing, max_queue_per_model=1000)
        replicas = [ReplicaSpec(f"w{i}", UnitTimeRunner(), config) for i in range(2)]
        records = Simulator(replicas, preset, scheduler=scheduler).run(programs)
        long_calls = {c.worker_id: 0 for c in records.calls}
        for c in records.calls:
            long_calls[c.worker_id] += c.output_tokens == 20
        results[preset] = (records.preemptions, sum(w.jct_s for w in records.workflows), long_calls)
    assert results["fcfs-rr"] == (1, 103.0, {"w0": 3, "w1": 1})
    assert results["kairos"] == (0, 96.0, {"w0": 2, "w1": 2})
