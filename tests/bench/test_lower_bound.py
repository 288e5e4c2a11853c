"""The capacity bound: SRPT by hand, the per-call peak work against the cost model, the bound
below every simulated mean JCT, and above the critical-path bound under a burst."""

from __future__ import annotations

from typing import cast

import numpy as np
import pytest

from clairvoyant.bench.experiment import ExperimentConfig, _runner, build_cluster, instance, run_sim
from clairvoyant.bench.sim.lower_bound import PeakWork, capacity_bound, lower_bound, srpt_mean_response
from clairvoyant.bench.workloads import get_workload
from clairvoyant.worker.costmodel.roofline import BatchItem, CostModel
from clairvoyant.worker.runners.emulated import EmulatedRunner
from clairvoyant.workloads.program import Call, NewSegment, WorkflowProgram

pytestmark = [pytest.mark.unit, pytest.mark.timeout(300)]


def test_srpt_matches_the_hand_computed_schedule() -> None:
    # A(0, 3) runs 0-1; B(1, 1) is shorter than A's 2 left: 1-2; A 2-4; C(2, 4) 4-8.
    # Responses 4, 1, 6: mean 11/3.  At speed 2 every size halves: A and B tie at 0.5 left at t=1,
    # either order gives 1.5 + 0.5 + 0.5 ... responses (1.5, 1, 2) or (2, 0.5, 2): mean 1.5.
    jobs = [(0.0, 3.0), (1.0, 1.0), (2.0, 4.0)]
    assert srpt_mean_response(jobs) == pytest.approx(11 / 3)
    assert srpt_mean_response(jobs, speed=2.0) == pytest.approx(1.5)
    # An idle gap, and a job that arrives to an empty server.
    assert srpt_mean_response([(0.0, 1.0), (5.0, 2.0)]) == pytest.approx(1.5)
    assert srpt_mean_response([]) == 0.0
    with pytest.raises(ValueError, match="speed must be > 0, got 0"):
        srpt_mean_response(jobs, speed=0.0)
    with pytest.raises(ValueError, match="job sizes must be >= 0, got -1"):
        srpt_mean_response([(0.0, -1.0)])


def _single(workflow_id: str, model: str, output_tokens: int, fresh: int = 100) -> WorkflowProgram:
    call = Call(f"{workflow_id}/0", 0, "agent", model, (NewSegment("new", fresh),), fresh, output_tokens, ())
    return WorkflowProgram("hand", workflow_id, (call,))


def test_capacity_bound_is_srpt_on_the_peak_work_per_model_and_in_all() -> None:
    big, small = _runner("qwen2.5-14b", "H100-80G")[0], _runner("qwen2.5-7b", "H100-80G")[0]
    work = {"qwen2.5-14b": PeakWork.per_seat(big.cost, 256), "qwen2.5-7b": PeakWork.per_seat(small.cost, 256)}
    workflows = [(0.0, _single("a", "qwen2.5-14b", 4000)), (0.0, _single("b", "qwen2.5-14b", 2000)),
                 (0.0, _single("c", "qwen2.5-7b", 1000))]  # fmt: skip
    size = {w.workflow_id: work[w.calls[0].model].call_gpu_seconds(100, 0, w.calls[0].output_tokens)
            for _, w in workflows}  # fmt: skip
    # Two GPUs in all: b, c, a in SRPT order on a server of speed 2 (c is the smallest).
    order = sorted(size.values())
    aggregate = (order[0] + (order[0] + order[1]) + sum(order)) / 2 / 3
    assert capacity_bound(workflows, work, total_gpus=2) == pytest.approx((aggregate, aggregate))
    # One GPU each: the 14B's two jobs alone on one GPU (c counts 0) outweigh the aggregate.
    per_model = (size["b"] + (size["b"] + size["a"])) / 3
    placed = capacity_bound(workflows, work, total_gpus=2, gpus_by_model={"qwen2.5-14b": 1, "qwen2.5-7b": 1})
    assert placed.capacity_s == pytest.approx(max(per_model, aggregate)) and per_model > aggregate
    # With critical paths: the workflow finishing k-th ends no earlier than the k-th SRPT
    # completion nor its own path.  On the 14B's server b, a end at s1 < s2; paths 1e3 (a), 0 (b),
    # 5 (c): sorted pairing (0 with s1, 1e3 with s2) and c alone at 5.
    s1, s2 = size["b"], size["b"] + size["a"]
    paths = [1e3, 0.0, 5.0]
    with_paths = capacity_bound(
        workflows, work, total_gpus=2, gpus_by_model={"qwen2.5-14b": 1, "qwen2.5-7b": 1}, critical_paths=paths
    )
    assert with_paths.capacity_s == placed.capacity_s
    assert with_paths.limit_s == pytest.approx((max(0.0, s1) + max(1e3, s2) + 5.0) / 3)
    assert with_paths.limit_s >= max(with_paths.capacity_s, sum(paths) / 3)
    with pytest.raises(ValueError, match=r"no peak work for models \['llama-3.1-8b'\]"):
        capacity_bound([(0.0, _single("d", "llama-3.1-8b", 10))], work, total_gpus=1)
    with pytest.raises(ValueError, match="total_gpus must be >= 1, got 0"):
        capacity_bound(workflows, work, total_gpus=0)


def _share_of_full_batches(cost: CostModel, batch: int, fresh: int, reused: int, output: int) -> float:
    """Seconds of the call's share of steps of ``batch`` calls like it, in step with it."""
    prefill = cost.step_cost([BatchItem(fresh, reused)] * batch).seconds / batch
    return prefill + sum(
        cost.step_cost([BatchItem(1, fresh + reused + j)] * batch).seconds / batch for j in range(output - 1)
    )


@pytest.mark.parametrize("model", ["qwen2.5-7b", "qwen2.5-14b", "llama-3.1-70b"])
def test_peak_work_is_below_any_batching_of_the_call(model: str) -> None:
    """Below the call at batch 1, and below its share of the fullest batches of calls like it:
    ``max_num_seqs`` of them (per seat), or as many as the KV pool holds (per KV token)."""
    runner = _runner(model, "H100-80G")[0]
    cost, seats, pool = runner.cost, 256, (runner.default_num_blocks(16) or 1024) * 16
    per_seat, per_kv = PeakWork.per_seat(cost, seats), PeakWork.per_kv_token(cost, pool)
    for fresh, reused, output in [(1, 0, 1), (500, 3000, 200), (8000, 0, 1500), (40, 12000, 4000)]:
        alone = _share_of_full_batches(cost, 1, fresh, reused, output)
        by_seats = _share_of_full_batches(cost, seats, fresh, reused, output)
        fits = max(1, min(seats, pool // (fresh + output)))  # each holds its own tokens in the pool
        by_pool = _share_of_full_batches(cost, fits, fresh, reused, output)
        assert 0 < per_seat.call_gpu_seconds(fresh, reused, output) <= by_seats * cost.tp * (1 + 1e-9)
        assert 0 < per_kv.call_gpu_seconds(fresh, reused, output) <= by_pool * cost.tp * (1 + 1e-9)
        assert by_seats <= by_pool <= alone
        # Tight for long decodes: within a factor of two of the fullest batching.
        if output >= 1000:
            assert per_seat.call_gpu_seconds(fresh, reused, output) >= 0.5 * by_seats * cost.tp
    with pytest.raises(ValueError, match="max_num_seqs must be >= 1, got 0"):
        PeakWork.per_seat(cost, 0)
    with pytest.raises(ValueError, match="kv_pool_tokens must be >= 1, got 0"):
        PeakWork.per_kv_token(cost, 0)


RUNS = [
    ExperimentConfig(workload="react_bfcl", gpus=1, workflows=40, seed=1),  # a burst at t=0
    ExperimentConfig(workload="coding_assistant", gpus=2, workflows=12, concurrency=6, seed=2),
    ExperimentConfig(workload="deep_research", gpus=2, workflows=10, rate=0.2, seed=3, placement="auto"),
    ExperimentConfig(workload="react_bfcl", gpus=2, workflows=30, rate=2.0, seed=4, scaling="reactive"),
]


@pytest.mark.parametrize("config", RUNS, ids=lambda config: f"{config.workload}-{config.gpus}")
@pytest.mark.parametrize("preset", ["fcfs-rr", "clairvoyant"])
def test_both_bounds_and_the_limit_stay_below_the_simulated_mean(
    config: ExperimentConfig, preset: str
) -> None:
    metrics = run_sim(config, preset)
    assert metrics["workflows"] == config.workflows
    capacity, critical = metrics["capacity_bound_avg_jct_s"], metrics["lower_bound_avg_jct_s"]
    assert 0 < capacity <= metrics["avg_jct_s"]
    assert max(capacity, critical) <= metrics["limit_avg_jct_s"] <= metrics["avg_jct_s"]
    assert metrics["avg_jct_over_limit"] == pytest.approx(metrics["avg_jct_s"] / metrics["limit_avg_jct_s"])


def test_under_a_big_burst_capacity_binds_harder_than_the_critical_path() -> None:
    """A burst of 512 coding workflows on 2 GPUs: the capacity bound is far above the critical
    path (and, checked in a run, below the simulated mean); a burst of 8 is bound by the path."""
    config = ExperimentConfig(workload="coding_assistant", gpus=2, workflows=512, seed=5)  # all at t=0
    workload = get_workload(config.workload)
    replicas, service = build_cluster(workload, config)
    arrivals, _ = instance(workload, config)
    gpus_by_model: dict[str, int] = {}
    work = {}
    for spec in replicas:
        runner = cast(EmulatedRunner, spec.runner)
        gpus_by_model[runner.info.name] = gpus_by_model.get(runner.info.name, 0) + runner.cost.tp
        work[runner.info.name] = PeakWork.per_kv_token(
            runner.cost, spec.config.num_blocks * spec.config.block_size
        )
    critical = float(np.mean([lower_bound(program, service) for _, program in arrivals]))
    capacity = capacity_bound(arrivals, work, total_gpus=2, gpus_by_model=gpus_by_model).capacity_s
    assert capacity > 1.5 * critical
    few = arrivals[:8]
    assert capacity_bound(few, work, total_gpus=2, gpus_by_model=gpus_by_model).capacity_s < float(
        np.mean([lower_bound(program, service) for _, program in few])
    )
