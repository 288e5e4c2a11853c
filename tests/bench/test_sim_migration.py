"""SAGA's work stealing in the simulator moves the stolen session's KV, in the cost model's time."""

from __future__ import annotations

import dataclasses

import pytest

from clairvoyant.bench.records import RunRecords
from clairvoyant.bench.sim.simulator import Migration, ReplicaSpec, Simulator
from clairvoyant.policy.saga import SagaAffinityRouting, Steal
from clairvoyant.worker.core.engine import EngineConfig
from clairvoyant.worker.costmodel.gpus import H100_80G, GpuSpec
from clairvoyant.worker.runners.emulated import EmulatedRunner
from clairvoyant.workloads.program import Call, CallSegment, NewSegment, WorkflowProgram

pytestmark = pytest.mark.unit
MODEL = "llama-3.1-8b"
KV_BYTES_PER_TOKEN = 32 * 2 * 8 * 128 * 2  # layers x (K, V) x KV heads x head_dim x bf16 bytes


def fan_out(session: str) -> WorkflowProgram:
    """A 1,000-token call, a 0.5 s tool, then three calls that each repeat its prompt and reply."""
    root = Call(f"{session}/0", 0, "a", MODEL, (NewSegment("new", 1000),), 1000, 8, (), "tool", 0.5)
    reuse = (
        CallSegment("call", root.call_id, "prompt", 1000),
        CallSegment("call", root.call_id, "response", 8),
        NewSegment("new", 50),
    )
    calls = [Call(f"{session}/{i}", i, "a", MODEL, reuse, 1058, 400, (root.call_id,)) for i in (1, 2, 3)]
    return WorkflowProgram("fan", session, (root, *calls))


def short(session: str) -> WorkflowProgram:
    return WorkflowProgram(
        "short", session, (Call(f"{session}/0", 0, "e", MODEL, (NewSegment("new", 100),), 100, 150, ()),)
    )


def simulate(
    gpu: GpuSpec = H100_80G, *, migrate_kv: bool = True, fast_forward: bool = True
) -> tuple[Simulator, RunRecords]:
    """w0 (1 seat) runs E; w1 (3 seats) runs A, B and C.  Their nine follow-up calls are ready at
    0.648 s: w1 takes three (A's), six wait for it, and w0, its queue empty since t=0, steals B,
    the oldest waiting session (ties: the key), once w1's load is (3 + 4) / 3 > 2 x w0's 1.0."""

    def replica(worker_id: str, seats: int) -> ReplicaSpec:
        runner = EmulatedRunner(MODEL, gpu, sleep=lambda _: None, distinct_tokens=True)
        return ReplicaSpec(
            worker_id, runner, EngineConfig(block_size=16, num_blocks=4096, max_num_seqs=seats)
        )

    sim = Simulator(
        [replica("w0", 1), replica("w1", 3)], "saga", migrate_kv=migrate_kv, fast_forward=fast_forward
    )
    records = sim.run([(0.0, short("E")), *((0.0, fan_out(s)) for s in "ABC")])
    return sim, records


def calls(records: RunRecords) -> dict[str, dict[str, object]]:
    return {c.call_id: dataclasses.asdict(c) for c in records.calls}


def test_the_stolen_sessions_call_waits_for_its_kv_exactly_as_long_as_the_cost_model_says() -> None:
    sim, records = simulate()
    routing = sim.scheduler.routing_policy
    assert isinstance(routing, SagaAffinityRouting)
    assert routing.steals[0] == Steal("w0", "w1", ("default", "B"))
    by_id = {c.call_id: c for c in records.calls}
    e, b1 = by_id["E/0"], by_id["B/1"]
    move = sim.migrations[0]
    # B/0's 1,000 prompt tokens and 7 computed reply tokens fill 62 whole blocks of 16 on w1.
    assert move[:5] == ("B/1", "w1", "w0", 992, 992)
    assert move.start == b1.dispatch_time == e.end_time  # E leaves w0's seat: B/1 is placed there
    seconds = 50e-6 + 992 * KV_BYTES_PER_TOKEN / (50e9 * 0.8)  # set-up + bytes / (NIC x efficiency)
    runner = sim.replicas["w0"].runner
    assert isinstance(runner, EmulatedRunner) and runner.kv_transfer_seconds(992) == pytest.approx(
        seconds, rel=1e-12
    )
    assert move.end == move.start + runner.kv_transfer_seconds(992)
    assert b1.start_time == move.end  # w0 is idle: the call starts the moment its KV is there
    assert b1.cached_tokens == 992  # and hits it

    _, recomputed = simulate(migrate_kv=False)
    b1_again = next(c for c in recomputed.calls if c.call_id == "B/1")
    assert (b1_again.dispatch_time, b1_again.start_time, b1_again.cached_tokens) == (
        e.end_time,
        e.end_time,
        0,
    )
    assert b1.end_time < b1_again.end_time  # 3.3 ms of transfer beat a 992-token prefill
    assert calls(recomputed)["A/1"] == calls(records)["A/1"]  # calls before the steal are untouched


def test_a_transfer_slower_than_the_recompute_is_not_made() -> None:
    slow_link = dataclasses.replace(H100_80G, name="H100-slow-link", network_bandwidth=1e8)  # 100 MB/s
    sim, records = simulate(slow_link)
    runner = sim.replicas["w0"].runner
    assert isinstance(runner, EmulatedRunner)
    assert runner.kv_transfer_seconds(992) > runner.recompute_seconds(992)
    assert sim.migrations == []
    _, recomputed = simulate(slow_link, migrate_kv=False)
    assert calls(records) == calls(recomputed)


def test_runs_with_migrations_are_reproducible_and_fast_forward_changes_nothing() -> None:
    sim, records = simulate()
    again, records_again = simulate()
    stepped, records_stepped = simulate(fast_forward=False)
    assert len(sim.migrations) >= 1 and all(isinstance(m, Migration) for m in sim.migrations)
    assert sim.migrations == again.migrations == stepped.migrations
    assert calls(records) == calls(records_again) == calls(records_stepped)
    assert records.workflows == records_stepped.workflows
