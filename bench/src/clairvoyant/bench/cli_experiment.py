"""``run`` and ``compare``: policies on a workload, in the simulator (``--mode sim``) or against a
running stack through its gateway (``--mode live``, the policy the stack's scheduler runs).

    python -m clairvoyant.bench run --workload coding_assistant --policy fcfs-rr --gpus 8 \\
        --workflows 64 --concurrency 32 --seed 0 --out run.json
    python -m clairvoyant.bench compare --workload swe_agent --policies fcfs-rr,least-loaded \\
        --rate 0.5 --out compare.json
    python -m clairvoyant.bench run --mode live --workload react_bfcl --policy fcfs-rr --gpus 2 \\
        --workflows 16 --concurrency 8 --base-url http://127.0.0.1:8000/v1 --out live.json
    python -m clairvoyant.bench compare --workload qa_router+report_generate+code_generate ...  # served together
    python -m clairvoyant.bench --list
"""

from __future__ import annotations

import argparse
import json
import os
from pathlib import Path
from typing import Any

from clairvoyant.bench.common import progress
from clairvoyant.bench.experiment import ANNOTATORS, ExperimentConfig, compare
from clairvoyant.bench.live import validate  # noqa: F401  (registers the sim-vs-live benchmark)
from clairvoyant.bench.live.cluster import LiveModeError
from clairvoyant.bench.live.run import DEFAULT_BASE_URL, DEFAULT_SCHEDULER, LiveOptions
from clairvoyant.bench.workloads import list_workloads
from clairvoyant.scheduler.core import PRESETS

SHOWN = ("avg_jct_s", "p95_jct_s", "throughput_tok_s", "avg_queue_s", "cache_hit_ratio", "preemptions",
         "distance_from_limit", "virtual_seconds", "wall_seconds")


def listing() -> str:
    return "workloads: " + ", ".join(list_workloads()) + "\npolicies:  " + ", ".join(PRESETS.names())


def workload_name(name: str) -> str:
    """A registered workload, or registered ones joined by ``+`` (served together on one cluster)."""
    known = set(list_workloads())
    unknown = [part for part in name.split("+") if part not in known]
    if unknown:
        raise argparse.ArgumentTypeError(f"unknown workload {unknown[0]!r}; choose from {sorted(known)} or join them with +")
    return name


def add_parsers(commands: Any) -> None:
    for name, help_text in (("run", "one policy on a workload"), ("compare", "several policies, same instance")):
        sub = commands.add_parser(name, help=help_text, description=help_text)
        sub.add_argument("--workload", required=True, type=workload_name,
                         help="a workload name, or names joined by + to serve them together")
        if name == "run":
            sub.add_argument("--policy", required=True, choices=PRESETS.names())
        else:
            sub.add_argument("--policies", required=True, help="comma-separated: " + ",".join(PRESETS.names()))
        sub.add_argument("--mode", choices=["sim", "live"], default="sim",
                         help="sim: the simulator; live: the stack behind --base-url (one policy: the one it runs)")
        sub.add_argument("--gpus", type=int, default=8)
        sub.add_argument("--gpu", default="H100-80G")
        sub.add_argument("--workflows", type=int, default=64)
        load = sub.add_mutually_exclusive_group()
        load.add_argument("--rate", type=float, help="Poisson workflow arrivals per second")
        load.add_argument("--concurrency", type=int, help="closed loop: workflows in flight")
        sub.add_argument("--seed", type=int, default=0)
        sub.add_argument("--block-size", type=int, default=16,
                         help="sim: KV block size in tokens (16 as live workers; 64 runs ~2.5x faster, "
                              "prefix hits rounded to 64 tokens)")  # fmt: skip
        sub.add_argument("--annotations", choices=list(ANNOTATORS), default="none",
                         help="sim: what annotates each call: nothing, the profiler core (trained on a warm-up "
                              "instance, then online) or the generator's ground truth")  # fmt: skip
        sub.add_argument("--warmup-workflows", type=int, default=64,
                         help="sim, --annotations profiler: workflows in the warm-up instance (0: none)")
        sub.add_argument("--out", type=Path, required=True, help="results JSON")
        live = sub.add_argument_group("live mode")
        live.add_argument("--base-url", default=DEFAULT_BASE_URL, help="the gateway's OpenAI API")
        live.add_argument("--api-key", default=os.environ.get("OPENAI_API_KEY", "none"),
                          help="the gateway key (default: $OPENAI_API_KEY)")
        live.add_argument("--time-scale", type=float, default=1.0, help="tool latencies are waited out x this")
        live.add_argument("--scheduler", default=DEFAULT_SCHEDULER,
                          help="the scheduler's gRPC address, to read the policy it runs; 'none' takes --policy on trust")


def run_command(args: argparse.Namespace) -> int:
    policies = [args.policy] if args.command == "run" else [p for p in args.policies.split(",") if p]
    unknown = [p for p in policies if p not in PRESETS]
    if unknown:
        raise SystemExit(f"unknown policies {unknown}; choose from {PRESETS.names()}")
    config = ExperimentConfig(
        workload=args.workload, gpus=args.gpus, gpu=args.gpu, workflows=args.workflows,
        rate=args.rate, concurrency=args.concurrency, seed=args.seed, block_size=args.block_size,
        annotations=args.annotations, warmup_workflows=args.warmup_workflows,
    )  # fmt: skip
    if args.block_size <= 0:
        raise SystemExit(f"error: --block-size must be positive, got {args.block_size}")
    if args.warmup_workflows < 0:
        raise SystemExit(f"error: --warmup-workflows must be >= 0, got {args.warmup_workflows}")
    if args.mode == "live" and args.annotations != "none":
        raise SystemExit("error: --annotations applies to --mode sim; a live stack has its own profiler")
    if args.mode == "live" and args.block_size != 16:
        raise SystemExit("error: --block-size applies to --mode sim; live workers use their own setting")
    progress(f"{args.command}: {args.workload}, {len(policies)} policies, {args.workflows} workflows, {args.gpus} GPUs")
    live = LiveOptions(
        base_url=args.base_url, api_key=args.api_key, time_scale=args.time_scale,
        scheduler=None if args.scheduler.lower() == "none" else args.scheduler,
    )  # fmt: skip
    try:
        result = compare(config, policies, args.mode, live)
    except LiveModeError as exc:
        raise SystemExit(f"error: {exc}") from None
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=2, sort_keys=True, default=str) + "\n")
    print("| policy | " + " | ".join(SHOWN) + " |")
    print("|---" * (len(SHOWN) + 1) + "|")
    for policy, metrics in result["policies"].items():
        print(f"| {policy} | " + " | ".join(f"{metrics[k]:.3g}" if k in metrics else "-" for k in SHOWN) + " |")
    progress(f"saved {args.out}")
    return 0
