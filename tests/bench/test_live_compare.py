"""``live-compare``: the fleet's workers mirror the simulated cluster, the table's ratios are against
fcfs-rr of the same run, and (e2e) the three arms run one instance on one fleet."""

from __future__ import annotations

import argparse
import json
import math
from pathlib import Path
from typing import Any

import pytest

from clairvoyant.bench.__main__ import main
from clairvoyant.bench.experiment import ExperimentConfig, build_cluster, instance
from clairvoyant.bench.live.compare import BASELINE, ROUTER, comparison, worker_specs
from clairvoyant.bench.workloads import get_workload


@pytest.mark.unit
def test_the_fleet_is_the_simulated_cluster_with_subject_safe_ids() -> None:
    config = ExperimentConfig(workload="coding_assistant", gpus=8, gpu="H100-80G")
    replicas, _ = build_cluster(get_workload(config.workload), config)
    specs = worker_specs(replicas, config.gpu)
    assert [s.model for s in specs] == ["qwen2.5-14b"] * 4 + ["qwen2.5-7b"] * 4
    assert all("." not in s.worker_id for s in specs) and len({s.worker_id for s in specs}) == 8
    for spec, replica in zip(specs, replicas, strict=True):
        assert spec.env["CV_RUNNER"] == "emulated" and spec.env["CV_GPU"] == "H100-80G"
        assert int(spec.env["CV_NUM_BLOCKS"]) == replica.config.num_blocks
        assert int(spec.env["CV_MAX_NUM_SEQS"]) == replica.config.max_num_seqs
        assert int(spec.env["CV_MAX_NUM_BATCHED_TOKENS"]) == replica.config.max_num_batched_tokens


def _metrics(jct: float, tok_s: float, ttft: float) -> dict[str, Any]:
    return {
        "avg_jct_s": jct, "p50_jct_s": jct, "p95_jct_s": 2 * jct, "throughput_tok_s": tok_s,
        "workflows_per_min": 1.0, "ttft_p50_s": ttft, "ttft_p99_s": 3 * ttft, "preemptions": 0,
        "replicas": {"w1": "m", "w2": "m"}, "live": {"warnings": []},
    }  # fmt: skip


@pytest.mark.unit
def test_ratios_are_against_fcfs_rr_of_the_same_run() -> None:
    args = argparse.Namespace(preset="pythia", time_scale=0.5, router_policy="cache_aware")
    config = ExperimentConfig(workload="react_bfcl", gpus=2, workflows=4, concurrency=2)
    results = {BASELINE: _metrics(10.0, 100.0, 0.2), ROUTER: _metrics(8.0, 125.0, 0.1), "pythia": _metrics(12.5, 80.0, 0.4)}
    result = comparison(config, args, results)
    assert [row[0] for row in result.rows] == [BASELINE, ROUTER, "pythia"]
    ratios = {row[0]: row[-5:] for row in result.rows}
    assert ratios[BASELINE] == [1.0] * 5
    assert ratios[ROUTER] == pytest.approx([0.8, 0.8, 1.25, 0.5, 0.5])
    assert ratios["pythia"] == pytest.approx([1.25, 1.25, 0.8, 2.0, 2.0])
    assert result.summary["pythia_avg_jct_s_vs_fcfs-rr"] == pytest.approx(1.25)
    assert result.name == "live-compare-react_bfcl-c2"
    without_baseline = comparison(config, args, {ROUTER: results[ROUTER]})
    assert all(math.isnan(v) for v in without_baseline.rows[0][-5:])


@pytest.mark.e2e
@pytest.mark.slow
@pytest.mark.timeout(400)
def test_three_arms_run_one_instance_on_one_fleet(tmp_path: Path) -> None:
    pytest.importorskip("sglang_router")
    args = ["--out-dir", str(tmp_path), "live-compare", "--workload", "react_bfcl", "--gpus", "2",
            "--workflows", "3", "--concurrency", "2", "--seed", "3", "--time-scale", "0.2", "--preset", "pythia"]  # fmt: skip
    assert main(args) == 0
    saved = json.loads((tmp_path / "live-compare-react_bfcl-c2.json").read_text())
    per_arm = saved["params"]["per_arm"]
    assert list(per_arm) == [BASELINE, ROUTER, "pythia"]
    config = ExperimentConfig(workload="react_bfcl", gpus=2, workflows=3, concurrency=2, seed=3)
    arrivals, backlog = instance(get_workload("react_bfcl"), config)
    programs = [p for _, p in arrivals] + list(backlog)
    calls = sum(len(p.calls) for p in programs)
    output_tokens = sum(c.output_tokens for p in programs for c in p.calls)
    for arm, result in per_arm.items():
        assert (result["workflows"], result["calls"]) == (3, calls), arm
        assert result["live"]["generated_tokens"] == output_tokens, arm  # ignore_eos: exact lengths
        assert len(result["replicas"]) == 2
    assert per_arm[ROUTER]["live"]["calls_without_usage"] == calls  # the workers' HTTP sends no usage
    assert per_arm[BASELINE]["live"]["calls_without_usage"] == per_arm["pythia"]["live"]["calls_without_usage"] == 0
    prompt_seeds = {result["live"]["prompt_seed"] for result in per_arm.values()}
    assert len(prompt_seeds) == 3  # one instance, other text per arm: no arm reuses another's cache
    baseline_row = next(row for row in saved["rows"] if row[0] == BASELINE)
    assert baseline_row[-5:] == [1.0] * 5
