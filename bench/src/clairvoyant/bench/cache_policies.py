"""``cache-policies``: the cache manager's policies in the simulator, the scheduler held fixed.

Every run has the same cluster with KV tiers (each replica's device pool cut to ``--l1-fraction``
so that a small run's contexts contend for it, an L2 host pool per replica and one shared L3), the
same scheduling preset (``--preset``) and profiler annotations (trained once per workload on a
warm-up instance at the highest load; every run gets its own copy), so the cache policy alone
explains a difference.  For each workload and each of two loads (closed-loop concurrency), every
policy runs on the same instance (same seed):

    lru  lmcache  hicache  continuum  saga  kvflow  pythia

Reported per run: avg and P95 JCT (and against ``lru`` on the same instance), the prompt cache hit
ratio by tier (prompt tokens served from L1, L2, L3 over the prompt tokens the engines took), the
prefill tokens saved, the speculative tokens the cache manager placed and those wasted (never
served to a call), and the directives applied.  The Pythia Fig. 8 view (``fig8`` in the JSON and the
markdown): on ``deep_research``, the decomposer's mean TTFT under ``pythia`` against ``lru`` and
``lmcache``, with the input hit ratio by tier.

    python -m clairvoyant.bench cache-policies --workloads deep_research --loads 8,24 --workflows 32
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
    format_table,
    progress,
    run_standalone,
    table_and_notes,
)
from clairvoyant.bench.experiment import ExperimentConfig, check_tiers, make_annotator, run_sim
from clairvoyant.bench.parallel import SimTask, default_jobs, run_tasks
from clairvoyant.bench.sim.simulator import Annotator
from clairvoyant.policy import PRESETS
from clairvoyant.policy.cache import CACHE_POLICIES

POLICIES = ("lru", "lmcache", "hicache", "continuum", "saga", "kvflow", "pythia")
FIG8_POLICIES = ("pythia", "lru", "lmcache")
FIG8_WORKLOAD, FIG8_AGENT = "deep_research", "decomposer"
BASELINE = "lru"
COLUMNS = ["workload", "load", "cache policy", "avg JCT s", "P95 JCT s", "avg JCT / lru", "hit L1", "hit L2",
           "hit L3", "hit total", "prefill tokens saved", "speculative tokens", "wasted", "directives"]  # fmt: skip
FIG8_COLUMNS = [
    "load",
    "cache policy",
    f"{FIG8_AGENT} TTFT s",
    "TTFT / lru",
    "hit L1",
    "hit L2",
    "hit L3",
    "hit total",
]


def run_or_failure(
    config: ExperimentConfig, policy: str, annotator: Annotator | None = None, progress: Any = None
) -> dict[str, Any]:
    """``run_sim``, or ``{"failed": why}`` when the run stops on an engine assertion or error (the
    table shows the failure; the other runs go on)."""
    try:
        return run_sim(config, policy, annotator, progress)
    except (AssertionError, RecursionError, ValueError) as exc:
        return {"failed": f"{type(exc).__name__}: {exc}"}


def configs(args: argparse.Namespace, workload: str, load: int) -> dict[str, ExperimentConfig]:
    """Each policy's config for one workload at one load: identical but for the cache policy."""
    base = ExperimentConfig(
        workload=workload, gpus=args.gpus, gpu=args.gpu, workflows=args.workflows, concurrency=load,
        seed=args.seed, annotations="profiler", warmup_workflows=args.warmup_workflows,
        host_cache=args.host_cache, l3="memory", l3_capacity_gb=args.l3_capacity_gb, l1_fraction=args.l1_fraction,
    )  # fmt: skip
    out = {
        policy: dataclasses.replace(base, cache_policy=policy)
        for policy in args.policies.split(",")
        if policy
    }
    for config in out.values():
        check_tiers(config)
    return out


def row_of(
    workload: str, load: int, policy: str, metrics: dict[str, Any], baseline: dict[str, Any] | None
) -> list[Any]:
    if "failed" in metrics:
        return [workload, load, policy, "failed", *([None] * (len(COLUMNS) - 4))]
    cache = metrics["cache_manager"]
    hit = cache["hit_ratio"]
    base_jct = baseline.get("avg_jct_s", float("nan")) if baseline is not None else float("nan")
    return [
        workload, load, policy, metrics["avg_jct_s"], metrics["p95_jct_s"],
        metrics["avg_jct_s"] / base_jct if base_jct else float("nan"), hit["l1"], hit["l2"], hit["l3"],
        cache["hit_ratio_total"], cache["prefill_tokens_saved"], cache["speculative_tokens"],
        cache["wasted_speculative_tokens"], sum(cache["directives_applied"].values()),
    ]  # fmt: skip


def fig8_rows(runs: dict[int, dict[str, dict[str, Any]]]) -> list[list[Any]]:
    """Pythia Fig. 8: per load, the decomposer's mean TTFT and the hit ratio by tier."""
    rows = []
    for load, per_policy in runs.items():
        base = per_policy.get(BASELINE, {}).get("cache_manager")
        base_ttft = base["ttft_s_by_agent"].get(FIG8_AGENT, float("nan")) if base else float("nan")
        for policy in FIG8_POLICIES:
            if "cache_manager" not in per_policy.get(policy, {}):
                continue  # not run, or failed
            cache = per_policy[policy]["cache_manager"]
            ttft = cache["ttft_s_by_agent"].get(FIG8_AGENT, float("nan"))
            hit = cache["hit_ratio"]
            rows.append([load, policy, ttft, ttft / base_ttft if base_ttft else float("nan"), hit["l1"], hit["l2"],
                         hit["l3"], cache["hit_ratio_total"]])  # fmt: skip
    return rows


def markdown(result: BenchResult) -> str:
    """The policies' table, then the Fig. 8 table (when deep_research ran), then the notes."""
    text = table_and_notes(result)
    fig8 = result.params.get("fig8")
    if fig8:
        text += f"\n{FIG8_WORKLOAD}: the {FIG8_AGENT}'s TTFT (Pythia Fig. 8)\n\n{format_table(FIG8_COLUMNS, fig8)}\n"
    return text


@BENCHMARKS.register("cache-policies")
class CachePolicies:
    help = "simulator: the cache policies at two loads, scheduler fixed; Pythia Fig. 8 (decomposer TTFT)"

    def add_arguments(self, parser: argparse.ArgumentParser) -> None:
        parser.add_argument(
            "--workloads", default="coding_assistant,deep_research,swe_agent", help="comma-separated"
        )
        parser.add_argument("--policies", default=",".join(POLICIES), help="cache policies, comma-separated: "
                            + ",".join(CACHE_POLICIES.names()))  # fmt: skip
        parser.add_argument(
            "--preset", choices=PRESETS.names(), default="clairvoyant", help="the scheduling preset"
        )
        parser.add_argument("--loads", default="4,8", help="closed-loop concurrencies, comma-separated")
        parser.add_argument("--workflows", type=int, default=8)
        parser.add_argument(
            "--warmup-workflows", type=int, default=64, help="the profiler's warm-up instance"
        )
        parser.add_argument("--gpus", type=int, default=2)
        parser.add_argument("--gpu", default="H100-80G")
        parser.add_argument("--seed", type=int, default=0)
        parser.add_argument(
            "--l1-fraction", type=float, default=0.25, help="of each replica's device KV pool"
        )
        parser.add_argument(
            "--host-cache", default="4", metavar="GB|auto", help="the L2 per replica (GB per GPU)"
        )
        parser.add_argument("--l3-capacity-gb", type=float, default=1000.0)
        parser.add_argument(
            "--jobs", type=int, default=None, help="runs at once, one process each (default: per CPU)"
        )

    def run(self, args: argparse.Namespace) -> BenchResult:
        unknown = [p for p in args.policies.split(",") if p and p not in CACHE_POLICIES.names()]
        if unknown:
            raise SystemExit(f"error: unknown cache policies {unknown}; choose from {CACHE_POLICIES.names()}")
        workloads = [w for w in args.workloads.split(",") if w]
        loads = [int(text) for text in args.loads.split(",") if text]
        plans = {(w, load): configs(args, w, load) for w in workloads for load in loads}
        tasks: list[SimTask] = []
        labels: list[str] = []
        annotators = {}
        for (workload, load), per_policy in plans.items():
            if workload not in annotators:  # the same for every policy and load: trained at the highest
                progress(f"cache-policies: training the profiler on a {workload} warm-up (load {max(loads)})")
                annotators[workload] = make_annotator(next(iter(plans[workload, max(loads)].values())))
            annotator = annotators[workload]
            for policy, config in per_policy.items():
                tasks.append(SimTask(config, args.preset, annotator, run_or_failure))
                labels.append(f"{workload} load {load} {policy}")
        jobs = args.jobs or default_jobs(len(tasks))
        progress(f"cache-policies: {len(tasks)} runs, {jobs} at a time")

        def done(index: int, result: dict[str, Any]) -> None:
            if "failed" in result:
                progress(f"{labels[index]}: failed ({result['failed']})")
                return
            progress(
                f"{labels[index]}: {result['wall_seconds']:.0f} s wall, {result['virtual_seconds']:.0f} s virtual"
            )

        results = iter(run_tasks(tasks, jobs, on_result=done))
        rows: list[list[Any]] = []
        summary: dict[str, Any] = {}
        kept: dict[str, dict[str, dict[str, Any]]] = {}
        fig8_runs: dict[int, dict[str, dict[str, Any]]] = {}
        failures: list[str] = []
        for (workload, load), per_policy in plans.items():
            runs = {policy: next(results) for policy in per_policy}
            baseline = runs.get(BASELINE)
            for policy, metrics in runs.items():
                rows.append(row_of(workload, load, policy, metrics, baseline))
                if "failed" in metrics:
                    failures.append(f"{workload} load {load} {policy}: {metrics['failed']}")
                elif policy != BASELINE and baseline is not None:
                    summary[f"{workload} load {load} {policy}: avg JCT / lru"] = rows[-1][5]
            kept[f"{workload} load {load}"] = {policy: _kept(metrics) for policy, metrics in runs.items()}
            if workload == FIG8_WORKLOAD:
                fig8_runs[load] = runs
        fig8 = fig8_rows(fig8_runs)
        for row in fig8:
            if row[1] != BASELINE:
                summary[f"{FIG8_WORKLOAD} load {row[0]} {row[1]}: {FIG8_AGENT} TTFT / lru"] = row[3]
        params = {k: v for k, v in vars(args).items() if k not in ("command", "out_dir")}
        params["fig8"] = fig8
        params["runs"] = kept
        notes = [
            f"scheduler fixed ({args.preset}), profiler annotations, L1 cut to {args.l1_fraction:g} of each pool, "
            f"L2 host cache ({args.host_cache}) and a shared L3 in every run; per workload and load every policy "
            "runs the same instance (same seed)",
            "hit ratios are prompt tokens served from each tier over the prompt tokens the engines took",
            "speculative tokens: named by applied promote / pre-prefill directives on a prediction, once per block "
            "and worker; wasted: never served to a call from that worker's cache",
            "directives: applied on the replicas (a refused one is counted in the JSON, not here)",
            "cache manager messages are delayed as in CacheManagerDelays: KV events 5 ms, completion records "
            "10 ms, directives 5 ms; the core ticks every virtual second",
        ]
        notes += [f"failed: {failure}" for failure in failures]
        return BenchResult("cache-policies", COLUMNS, rows, summary=summary, notes=notes, params=params)


def _kept(metrics: dict[str, Any]) -> dict[str, Any]:
    """A run's metrics without its long series (the JCT CDF and queue depth)."""
    return {k: v for k, v in metrics.items() if k not in ("jct_s", "queue_depth_series")}


def main(argv: list[str] | None = None) -> int:
    return run_standalone(CachePolicies(), argv, prog="python -m clairvoyant.bench.cache_policies",
                          description=__doc__, out_dir=RESULTS_DIR / "cache-policies", markdown=markdown)  # fmt: skip


if __name__ == "__main__":
    sys.exit(main())
