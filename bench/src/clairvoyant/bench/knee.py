"""``knee``: the trade-off between throughput and JCT that admission at the knee makes, in the simulator.

For each workload and each knee fraction φ (policy/admission.py: each engine admits calls until its
batch reaches φ of its decode-throughput ceiling; 1 turns the limit off), the presets that admit at
the knee run on the same instance as ``vllm-prodstack``, the baseline measured in the same run, and
as the same presets without the knee (``--references``).  A
row gives avg JCT, P95 and throughput, each as a ratio to the baseline, so the table shows where the
knee setting sits: how much throughput each step of φ gives up and what it buys in JCT.

    python -m clairvoyant.bench knee --workloads coding_assistant,deep_research \\
        --fractions 0.4,0.5,0.6,0.7,1.0 --workflows 256 --arrivals cron:period_s=100000,batch=256
"""

from __future__ import annotations

import argparse
import dataclasses
from typing import Any

from clairvoyant.bench.common import BENCHMARKS, BenchResult, progress
from clairvoyant.bench.experiment import ExperimentConfig, make_annotator, run_sim
from clairvoyant.bench.parallel import SimTask, default_jobs, run_tasks

BASELINE = "vllm-prodstack"
KNEE_PRESETS = ("clairvoyant", "pythia-knee")
REFERENCES = ("clairvoyant-unbounded", "pythia")  # the same presets without the knee (and, for pythia, the throttle)


def _fractions(text: str) -> list[float]:
    try:
        values = [float(part) for part in text.split(",") if part]
    except ValueError:
        raise argparse.ArgumentTypeError(f"fractions must be numbers, got {text!r}") from None
    bad = [v for v in values if not 0.0 < v <= 1.0]
    if not values or bad:
        raise argparse.ArgumentTypeError(f"each fraction must be in (0, 1], got {text!r}")
    return values


@BENCHMARKS.register("knee")
class KneeBench:
    help = "admission at the knee: avg JCT, P95 and throughput against the knee fraction, vs vllm-prodstack"

    def add_arguments(self, parser: argparse.ArgumentParser) -> None:
        parser.add_argument("--workloads", default="coding_assistant", help="comma-separated workload names")
        parser.add_argument("--fractions", type=_fractions, default=_fractions("0.4,0.5,0.6,0.7,1.0"),
                            help="knee fractions φ to run, comma-separated, each in (0, 1]")  # fmt: skip
        parser.add_argument("--presets", default=",".join(KNEE_PRESETS), help="presets that admit at the knee")
        parser.add_argument("--references", default=",".join(REFERENCES),
                            help="presets run once each, without a knee, for reference")  # fmt: skip
        parser.add_argument("--displace", default="off", choices=["off", "on", "both"],
                            help="whether an urgent call may displace a less urgent one beyond the knee "
                                 "(the engine then preempts for it); both: run each setting")  # fmt: skip
        parser.add_argument("--workflows", type=int, default=256)
        parser.add_argument("--arrivals", default="cron:period_s=100000,batch=256",
                            help="the arrival process (default: one burst of 256 workflows)")  # fmt: skip
        parser.add_argument("--annotations", default="oracle", help="none | profiler | profiler-path | oracle")
        parser.add_argument("--seed", type=int, default=0)
        parser.add_argument("--jobs", type=int, default=None, help="simulations at once (default: one per CPU)")

    def run(self, args: argparse.Namespace) -> BenchResult:
        tasks: list[SimTask] = []
        labels: list[tuple[str, str, float | None]] = []
        for workload in [w for w in args.workloads.split(",") if w]:
            config = ExperimentConfig(
                workload=workload, workflows=args.workflows, arrivals=args.arrivals,
                annotations=args.annotations, seed=args.seed,
            )  # fmt: skip
            progress(f"{workload}: preparing the {args.annotations} annotator")
            annotator = make_annotator(config)
            for reference in [BASELINE, *(p for p in args.references.split(",") if p)]:
                tasks.append(SimTask(config, reference, annotator, run_sim))
                labels.append((workload, reference, None))
            settings = {"off": [False], "on": [True], "both": [False, True]}[args.displace]
            for preset in [p for p in args.presets.split(",") if p]:
                for displace in settings:
                    for fraction in args.fractions:
                        knee = dataclasses.replace(config, knee_fraction=fraction, knee_displace=displace)
                        tasks.append(SimTask(knee, preset, annotator, run_sim))
                        labels.append((workload, preset + (" +displace" if displace else ""), fraction))
        jobs = args.jobs or default_jobs(len(tasks))
        progress(f"{len(tasks)} simulations, {jobs} at a time")
        results = run_tasks(tasks, jobs=jobs)
        rows: list[list[Any]] = []
        baselines = {w: r for (w, p, _), r in zip(labels, results, strict=True) if p == BASELINE}
        for (workload, preset, fraction), result in zip(labels, results, strict=True):
            base = baselines[workload]
            rows.append([
                workload, preset, "-" if fraction is None else fraction,
                round(result["avg_jct_s"], 1), round(result["avg_jct_s"] / base["avg_jct_s"], 3),
                round(result["p95_jct_s"], 1), round(result["p95_jct_s"] / base["p95_jct_s"], 3),
                round(result["throughput_tok_s"]), round(result["throughput_tok_s"] / base["throughput_tok_s"], 3),
                round(result["avg_queue_s"], 1),
            ])  # fmt: skip
        return BenchResult(
            name="knee",
            columns=["workload", "preset", "phi", "avg_jct_s", "jct_ratio", "p95_jct_s", "p95_ratio",
                     "throughput_tok_s", "throughput_ratio", "avg_queue_s"],  # fmt: skip
            rows=rows,
            notes=[f"ratios against {BASELINE} on the same instance; phi 1.0 = no admission limit"],
            params={k: v for k, v in vars(args).items() if k in
                    ("workloads", "fractions", "presets", "references", "displace", "workflows", "arrivals", "annotations", "seed")},  # fmt: skip
        )
