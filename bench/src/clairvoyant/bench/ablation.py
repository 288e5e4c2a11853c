"""``ablation``: each mechanism's share of ``clairvoyant``'s gain over ``vllm-prodstack``, in the simulator.

Starting from the baseline as its paper runs it (``vllm-prodstack``: FCFS, session affinity, the
LMCache cache policy over an L2 host pool and a shared L3), the mechanisms are added one at a time,
each step keeping the ones before it, on the same instance and the same annotations:

=================  ============================  =========  ============  =========
step               preset                        placement  cache policy  scaling
=================  ============================  =========  ============  =========
baseline           vllm-prodstack                equal      lmcache       fixed
+ placement        vllm-prodstack                auto       lmcache       fixed
+ rank             clairvoyant-unbounded         auto       lmcache       fixed
+ admission        clairvoyant                   auto       lmcache       fixed
+ cache policy     clairvoyant                   auto       pythia        fixed
+ autoscaling      clairvoyant                   auto       pythia        pythia (Alg. 4)
=================  ============================  =========  ============  =========

"+ rank" swaps FCFS and session affinity for clairvoyant's priority and its memory-aware routing
(the two read the same predictions; the step measures both).  A step's *gain* is the avg JCT it
removes as a share of the baseline's (negative: the step costs JCT); its *share* is its part of
what the steps up to the best configuration on the ladder remove (a step after the best one gets
none).  Both depend on the order, which is the one above (cheapest to deploy first).  The autoscaler works within the same
GPU budget, moving replicas between models.

    python -m clairvoyant.bench ablation --workloads coding_assistant,deep_research
"""

from __future__ import annotations

import argparse
import dataclasses
from typing import Any, NamedTuple

from clairvoyant.bench.common import BENCHMARKS, BenchResult, progress
from clairvoyant.bench.experiment import ExperimentConfig, make_annotator, run_sim
from clairvoyant.bench.parallel import SimTask, default_jobs, run_tasks
from clairvoyant.workloads.registry import check_workload_name


class Step(NamedTuple):
    name: str
    preset: str
    changes: dict[str, Any]  # ExperimentConfig keys this step (and every later one) sets


STEPS = (
    Step("baseline", "vllm-prodstack", {}),
    Step("+ placement", "vllm-prodstack", {"placement": "auto"}),
    Step("+ rank", "clairvoyant-unbounded", {}),
    Step("+ admission", "clairvoyant", {}),
    Step("+ cache policy", "clairvoyant", {"cache_policy": "pythia"}),
    Step("+ autoscaling", "clairvoyant", {"scaling": "pythia"}),
)


def ladder(base: ExperimentConfig) -> list[tuple[Step, ExperimentConfig]]:
    """Each step with its config: the base, the baseline's cache policy, and every change so far."""
    config = dataclasses.replace(base, cache_policy="lmcache")
    steps = []
    for step in STEPS:
        config = dataclasses.replace(config, **step.changes)
        steps.append((step, config))
    return steps


MIN_GAIN = 0.001  # of the baseline's avg JCT: a smaller gain is noise to split, and gets no shares


def gains(jcts: list[float]) -> list[float | None]:
    """Each step's avg JCT removed, as a share of the baseline's (negative: the step costs JCT);
    they add up to 1 − the last step's ratio.  None for the baseline."""
    return [None, *((before - after) / jcts[0] for before, after in zip(jcts, jcts[1:], strict=False))]


def shares(jcts: list[float]) -> list[float | None]:
    """Each step's share of the gain of the best configuration on the ladder (the step with the
    lowest avg JCT): the avg JCT it removes over what the steps up to the best one remove.  None
    for the baseline, for the steps after the best one, and for every step when the best one removes
    less than ``MIN_GAIN`` of the baseline's."""
    best = min(range(len(jcts)), key=lambda i: (jcts[i], i))
    total = jcts[0] - jcts[best]
    if total < MIN_GAIN * jcts[0]:
        return [None] * len(jcts)
    return [None if i == 0 or i > best else (jcts[i - 1] - jcts[i]) / total for i in range(len(jcts))]


@BENCHMARKS.register("ablation")
class AblationBench:
    help = "each mechanism's share of clairvoyant's avg-JCT gain over vllm-prodstack, added one at a time"

    def add_arguments(self, parser: argparse.ArgumentParser) -> None:
        parser.add_argument("--workloads", default="coding_assistant,deep_research",
                            help="comma-separated workload names")  # fmt: skip
        parser.add_argument("--gpus", type=int, default=8)
        parser.add_argument("--gpu", default="H100-80G")
        parser.add_argument("--workflows", type=int, default=256)
        parser.add_argument("--arrivals", default="cron:period_s=100000,batch=256",
                            help="the arrival process (default: one burst of 256 workflows)")  # fmt: skip
        parser.add_argument("--annotations", default="profiler", help="none | profiler | profiler-path | oracle")
        parser.add_argument("--warmup-workflows", type=int, default=192,
                            help="the profiler's warm-up instance (a burst needs about 192 to converge)")  # fmt: skip
        parser.add_argument("--seed", type=int, default=0)
        parser.add_argument("--jobs", type=int, default=None, help="simulations at once (default: one per CPU)")

    def run(self, args: argparse.Namespace) -> BenchResult:
        workloads = [w for w in args.workloads.split(",") if w]
        for workload in workloads:
            try:
                check_workload_name(workload)
            except ValueError as exc:
                raise SystemExit(f"error: --workloads: {exc}") from None
        tasks: list[SimTask] = []
        labels: list[tuple[str, Step]] = []
        for workload in workloads:
            base = ExperimentConfig(
                workload=workload, gpus=args.gpus, gpu=args.gpu, workflows=args.workflows, arrivals=args.arrivals,
                annotations=args.annotations, warmup_workflows=args.warmup_workflows, seed=args.seed,
                block_size=64, host_cache="auto", l3="memory",
            )  # fmt: skip
            progress(f"{workload}: preparing the {args.annotations} annotator")
            annotator = make_annotator(base)
            for step, config in ladder(base):
                tasks.append(SimTask(config, step.preset, annotator, run_sim))
                labels.append((workload, step))
        jobs = args.jobs or default_jobs(len(tasks))
        progress(f"{len(tasks)} simulations, {jobs} at a time")
        results = run_tasks(tasks, jobs=jobs)
        rows: list[list[Any]] = []
        for workload in workloads:
            mine = [(step, r) for (w, step), r in zip(labels, results, strict=True) if w == workload]
            base_result = mine[0][1]
            jcts = [r["avg_jct_s"] for _, r in mine]
            for (step, result), gain, share in zip(mine, gains(jcts), shares(jcts), strict=True):
                rows.append([
                    workload, step.name, step.preset,
                    round(result["avg_jct_s"], 1), round(result["avg_jct_s"] / base_result["avg_jct_s"], 3),
                    "-" if gain is None else round(gain, 3), "-" if share is None else round(share, 2),
                    round(result["p95_jct_s"], 1), round(result["p95_jct_s"] / base_result["p95_jct_s"], 3),
                    round(result["throughput_tok_s"]),
                    round(result["throughput_tok_s"] / base_result["throughput_tok_s"], 3),
                    round(result.get("avg_jct_over_limit", float("nan")), 2),
                ])  # fmt: skip
        return BenchResult(
            name="ablation",
            columns=["workload", "step", "preset", "avg_jct_s", "jct_ratio", "gain", "share_of_gain", "p95_jct_s",
                     "p95_ratio", "throughput_tok_s", "throughput_ratio", "over_limit"],  # fmt: skip
            rows=rows,
            notes=["cumulative: each step keeps the ones above it; ratios against the baseline step on the "
                   "same instance; gain: the avg JCT the step removes over the baseline's; share: its part of "
                   "what the steps up to the best configuration remove"],  # fmt: skip
            params={k: v for k, v in vars(args).items() if k in
                    ("workloads", "gpus", "gpu", "workflows", "arrivals", "annotations", "warmup_workflows", "seed")},  # fmt: skip
        )
