"""``cache-tiers``: the prompt cache hit by KV tier in the simulator, L1 alone against L1+L2 and L1+L2+L3.

Each workload runs three times on the same instance (same seed: the same programs and arrivals)
under one scheduling preset, with the engines' plain LRU eviction and no cache directives:

    l1          the device pool alone (the simulator's default)
    l1+l2       plus a host pool per replica (``--host-cache``, default auto: half the GPU's DRAM share)
    l1+l2+l3    plus one shared in-memory L3 for all replicas (``--l3-capacity-gb``)

Reported per run: the hit ratio by tier (prompt tokens served from L1, L2, L3 over the prompt
tokens the engines took), the prefill tokens saved, avg and P95 JCT, and each as a ratio against
L1 alone in the same run.  This is the baseline a cache manager has to beat.

    python -m clairvoyant.bench.cache_tiers --workloads deep_research,coding_assistant \\
        --gpus 2 --concurrency 96 --workflows 128
"""

from __future__ import annotations

import argparse
import dataclasses
import sys
from typing import Any

from clairvoyant.bench.common import (
    BENCHMARKS,
    RESULTS_DIR,
    BenchResult,
    progress,
    run_standalone,
)
from clairvoyant.bench.experiment import ExperimentConfig, check_tiers, run_sim
from clairvoyant.bench.parallel import SimTask, default_jobs, run_tasks
from clairvoyant.policy import PRESETS
from clairvoyant.worker.core.tiers import WRITE_POLICIES

SETUPS: dict[str, dict[str, Any]] = {  # name -> the ExperimentConfig tier keys (host cache filled in)
    "l1": {},
    "l1+l2": {"l3": "none"},
    "l1+l2+l3": {"l3": "memory"},
}
COLUMNS = ["workload", "tiers", "hit L1", "hit L2", "hit L3", "hit total", "prefill tokens saved",
           "avg JCT s", "P95 JCT s", "preemptions", "hit / L1", "saved / L1", "avg JCT / L1", "P95 / L1"]  # fmt: skip


def configs(args: argparse.Namespace, workload: str) -> dict[str, ExperimentConfig]:
    base = ExperimentConfig(
        workload=workload, gpus=args.gpus, workflows=args.workflows, concurrency=args.concurrency,
        seed=args.seed, block_size=args.block_size,
    )  # fmt: skip
    out = {}
    for name, tiers in SETUPS.items():
        if tiers:
            tiers = {**tiers, "host_cache": args.host_cache, "l3_capacity_gb": args.l3_capacity_gb,
                     "l3_write_policy": args.l3_write_policy}  # fmt: skip
        out[name] = dataclasses.replace(base, **tiers)
        check_tiers(out[name])
    return out


def rows_of(workload: str, runs: dict[str, dict[str, Any]]) -> list[list[Any]]:
    base = runs["l1"]
    base_tiers = base["kv_tiers"]
    base_hit = sum(base_tiers["hit_ratio"].values())
    rows = []
    for name, metrics in runs.items():
        tiers = metrics["kv_tiers"]
        hit = tiers["hit_ratio"]
        total = sum(hit.values())
        rows.append([
            workload, name, hit["l1"], hit["l2"], hit["l3"], total, tiers["prefill_tokens_saved"],
            metrics["avg_jct_s"], metrics["p95_jct_s"], metrics["preemptions"],
            total / base_hit if base_hit else float("nan"),
            tiers["prefill_tokens_saved"] / base_tiers["prefill_tokens_saved"] if base_tiers["prefill_tokens_saved"] else float("nan"),
            metrics["avg_jct_s"] / base["avg_jct_s"], metrics["p95_jct_s"] / base["p95_jct_s"],
        ])  # fmt: skip
    return rows


@BENCHMARKS.register("cache-tiers")
class CacheTiers:
    help = "simulator: prompt cache hit by KV tier, L1 alone vs L1+L2 vs L1+L2+L3 (same instance)"

    def add_arguments(self, parser: argparse.ArgumentParser) -> None:
        parser.add_argument("--workloads", default="deep_research,coding_assistant", help="comma-separated")
        parser.add_argument("--policy", choices=PRESETS.names(), default="fcfs-rr", help="the scheduling preset")
        parser.add_argument("--gpus", type=int, default=2, help="H100s (one replica per model at 2)")
        parser.add_argument("--gpu", default="H100-80G")
        parser.add_argument("--concurrency", type=int, default=96, help="closed loop: workflows in flight")
        parser.add_argument("--workflows", type=int, default=128)
        parser.add_argument("--seed", type=int, default=0)
        parser.add_argument("--block-size", type=int, default=16)
        parser.add_argument("--host-cache", default="auto", metavar="GB|auto", help="the L2 of the tiered runs")
        parser.add_argument("--l3-capacity-gb", type=float, default=1000.0)
        parser.add_argument("--l3-write-policy", choices=WRITE_POLICIES, default="write_through")
        parser.add_argument("--jobs", type=int, default=None, help="runs at once, one process each (default: per CPU)")

    def run(self, args: argparse.Namespace) -> BenchResult:
        workloads = [w for w in args.workloads.split(",") if w]
        plans = {w: configs(args, w) for w in workloads}
        tasks = [SimTask(dataclasses.replace(config, gpu=args.gpu), args.policy, None, run_sim)
                 for per_workload in plans.values() for config in per_workload.values()]  # fmt: skip
        labels = [f"{w} {name}" for w, per_workload in plans.items() for name in per_workload]
        jobs = args.jobs or default_jobs(len(tasks))
        progress(f"cache-tiers: {len(tasks)} runs, {jobs} at a time")

        def done(index: int, result: dict[str, Any]) -> None:
            progress(f"{labels[index]}: {result['wall_seconds']:.0f} s wall, {result['virtual_seconds']:.0f} s virtual")

        results = iter(run_tasks(tasks, jobs, on_result=done))
        rows: list[list[Any]] = []
        summary: dict[str, Any] = {}
        runs_by_workload: dict[str, dict[str, Any]] = {}
        for workload, per_workload in plans.items():
            runs = {name: next(results) for name in per_workload}
            runs_by_workload[workload] = {name: _kept(m) for name, m in runs.items()}
            rows += rows_of(workload, runs)
            for row in rows[-len(runs):]:
                summary[f"{workload} {row[1]}: hit / L1"] = row[10]
                summary[f"{workload} {row[1]}: avg JCT / L1"] = row[12]
        params = {k: v for k, v in vars(args).items() if k not in ("command", "out_dir")}
        params["runs"] = runs_by_workload
        notes = [
            "hit ratios are prompt tokens served from each tier over the prompt tokens the engines took "
            "(summed over replicas; each call once, at its first admission)",
            "prefill tokens saved: prompt tokens served from any tier instead of being recomputed",
            "every ratio is against L1 alone on the same instance (same seed), measured in this run",
            "plain LRU in every tier and no cache directives: the baseline a cache manager must beat",
        ]
        return BenchResult("cache-tiers", COLUMNS, rows, summary=summary, notes=notes, params=params)


def _kept(metrics: dict[str, Any]) -> dict[str, Any]:
    """A run's metrics without its long series (the JCT CDF and queue depth)."""
    return {k: v for k, v in metrics.items() if k not in ("jct_s", "queue_depth_series")}


def main(argv: list[str] | None = None) -> int:
    return run_standalone(CacheTiers(), argv, prog="python -m clairvoyant.bench.cache_tiers", description=__doc__,
                          out_dir=RESULTS_DIR / "cache-tiers")  # fmt: skip

if __name__ == "__main__":
    sys.exit(main())
