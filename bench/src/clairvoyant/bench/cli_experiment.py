"""``run`` and ``compare``: policies on a workload, in the simulator (``--mode sim``).

    python -m clairvoyant.bench run --workload coding_assistant --policy fcfs-rr --gpus 8 \\
        --workflows 64 --concurrency 32 --seed 0 --out run.json
    python -m clairvoyant.bench compare --workload swe_agent --policies fcfs-rr,least-loaded \\
        --rate 0.5 --out compare.json
    python -m clairvoyant.bench --list
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

from clairvoyant.bench.common import progress
from clairvoyant.bench.experiment import ExperimentConfig, compare
from clairvoyant.bench.workloads import list_workloads
from clairvoyant.scheduler.core import PRESETS

SHOWN = ("avg_jct_s", "p95_jct_s", "throughput_tok_s", "avg_queue_s", "cache_hit_ratio", "preemptions",
         "distance_from_limit", "virtual_seconds", "wall_seconds")


def listing() -> str:
    return "workloads: " + ", ".join(list_workloads()) + "\npolicies:  " + ", ".join(PRESETS.names())


def add_parsers(commands: Any) -> None:
    for name, help_text in (("run", "one policy on a workload"), ("compare", "several policies, same instance")):
        sub = commands.add_parser(name, help=help_text, description=help_text)
        sub.add_argument("--workload", required=True, choices=list_workloads())
        if name == "run":
            sub.add_argument("--policy", required=True, choices=PRESETS.names())
        else:
            sub.add_argument("--policies", required=True, help="comma-separated: " + ",".join(PRESETS.names()))
        sub.add_argument("--mode", choices=["sim"], default="sim", help="sim (live lands next)")
        sub.add_argument("--gpus", type=int, default=8)
        sub.add_argument("--gpu", default="H100-80G")
        sub.add_argument("--workflows", type=int, default=64)
        load = sub.add_mutually_exclusive_group()
        load.add_argument("--rate", type=float, help="Poisson workflow arrivals per second")
        load.add_argument("--concurrency", type=int, help="closed loop: workflows in flight")
        sub.add_argument("--seed", type=int, default=0)
        sub.add_argument("--out", type=Path, required=True, help="results JSON")


def run_command(args: argparse.Namespace) -> int:
    policies = [args.policy] if args.command == "run" else [p for p in args.policies.split(",") if p]
    unknown = [p for p in policies if p not in PRESETS]
    if unknown:
        raise SystemExit(f"unknown policies {unknown}; choose from {PRESETS.names()}")
    config = ExperimentConfig(
        workload=args.workload, gpus=args.gpus, gpu=args.gpu, workflows=args.workflows,
        rate=args.rate, concurrency=args.concurrency, seed=args.seed,
    )  # fmt: skip
    progress(f"{args.command}: {args.workload}, {len(policies)} policies, {args.workflows} workflows, {args.gpus} GPUs")
    result = compare(config, policies, args.mode)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=2, sort_keys=True, default=str) + "\n")
    print("| policy | " + " | ".join(SHOWN) + " |")
    print("|---" * (len(SHOWN) + 1) + "|")
    for policy, metrics in result["policies"].items():
        print(f"| {policy} | " + " | ".join(f"{metrics[k]:.3g}" for k in SHOWN) + " |")
    progress(f"saved {args.out}")
    return 0
