"""``sweep``: ``compare`` at several load levels, for a latency-throughput curve; and ``plot``.

    python -m clairvoyant.bench sweep --workload react_bfcl --policies fcfs-rr,least-loaded \\
        --rates 0.5,1,2 --workflows 64 --out sweep.json
    python -m clairvoyant.bench sweep --workload swe_agent --policies fcfs-rr,least-loaded \\
        --concurrencies 4,16,48 --workflows 8,32,48 --out sweep.json
    python -m clairvoyant.bench plot sweep.json --out-dir docs/img [--load 48]

Every load level is a full ``compare`` (all policies on the same instance: same seed, same
programs, arrivals scaled to the rate) and is stored whole under ``points``, so a sweep file can be
re-plotted or read like the compare files it holds.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

from clairvoyant.bench.common import progress, rounded
from clairvoyant.bench.experiment import ExperimentConfig, compare
from clairvoyant.bench.workloads import list_workloads
from clairvoyant.scheduler.core import PRESETS

LOAD_KINDS = ("rate", "concurrency")


def sweep(
    config: ExperimentConfig,
    policies: list[str],
    load_kind: str,
    loads: Sequence[float],
    *,
    workflows: Sequence[int] | None = None,
    on_point: Callable[[float, dict[str, Any]], None] | None = None,
) -> dict[str, Any]:
    """``compare`` at each load (``load_kind`` "rate": workflows/s; "concurrency": closed loop).

    ``workflows``: how many workflows each level runs (default: ``config.workflows`` at every one).
    """
    counts = [config.workflows] * len(loads) if workflows is None else list(workflows)
    if len(counts) != len(loads):
        raise ValueError(f"{len(counts)} workflow counts for {len(loads)} load levels")
    if load_kind not in LOAD_KINDS:
        raise ValueError(f"load_kind must be one of {LOAD_KINDS}, got {load_kind!r}")
    started = time.perf_counter()
    points: list[dict[str, Any]] = []
    for load, count in zip(loads, counts, strict=True):
        if load_kind == "rate":
            point_config = dataclasses.replace(config, rate=float(load), concurrency=None, workflows=count)
        else:
            point_config = dataclasses.replace(config, rate=None, concurrency=int(load), workflows=count)
        point = {"load": load, **compare(point_config, policies)}
        points.append(point)
        if on_point is not None:
            on_point(load, point)
    return {
        "kind": "sweep",
        "workload": config.workload,
        "mode": "sim",
        "seed": config.seed,
        "policies": policies,
        "load_kind": load_kind,
        "loads": list(loads),
        "wall_seconds": time.perf_counter() - started,
        "points": points,
    }


# ---- command line --------------------------------------------------------------------------------


def add_parsers(commands: Any) -> None:
    sub = commands.add_parser("sweep", help="compare at several load levels (latency vs throughput)",
                              description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)  # fmt: skip
    sub.add_argument("--workload", required=True, choices=list_workloads())
    sub.add_argument("--policies", required=True, help="comma-separated: " + ",".join(PRESETS.names()))
    loads = sub.add_mutually_exclusive_group(required=True)
    loads.add_argument("--rates", help="comma-separated Poisson workflow arrival rates (per second)")
    loads.add_argument("--concurrencies", help="comma-separated closed-loop concurrencies")
    sub.add_argument("--gpus", type=int, default=8)
    sub.add_argument("--gpu", default="H100-80G")
    sub.add_argument("--workflows", default="64", help="per load level: one number, or one per level")
    sub.add_argument("--seed", type=int, default=0)
    sub.add_argument("--out", type=Path, required=True, help="results JSON")

    sub = commands.add_parser("plot", help="PNG figures from a compare or sweep results file")
    sub.add_argument("results", type=Path, help="a compare or sweep results JSON")
    sub.add_argument(
        "--out-dir", type=Path, default=None, help="where the PNGs go (default: next to the file)"
    )
    sub.add_argument("--load", type=float, help="sweep file: also the JCT CDF and queue depth at this load")


def _floats(text: str) -> list[float]:
    try:
        return [float(x) for x in text.split(",") if x.strip()]
    except ValueError:
        raise SystemExit(f"expected comma-separated numbers, got {text!r}") from None


def run_command(args: argparse.Namespace) -> int:
    if args.command == "plot":
        from clairvoyant.bench.plots import plot_file  # matplotlib only when plotting

        for path in plot_file(args.results, args.out_dir, load=args.load):
            progress(f"saved {path} ({path.stat().st_size // 1024} KiB)")
        return 0
    policies = [p for p in args.policies.split(",") if p]
    unknown = [p for p in policies if p not in PRESETS]
    if unknown:
        raise SystemExit(f"unknown policies {unknown}; choose from {PRESETS.names()}")
    if args.rates:
        load_kind, loads = "rate", _floats(args.rates)
    else:
        load_kind, loads = "concurrency", [float(int(c)) for c in _floats(args.concurrencies)]
    counts = [int(n) for n in _floats(args.workflows)]
    if len(counts) == 1:
        counts *= len(loads)
    if len(counts) != len(loads):
        raise SystemExit(f"--workflows: give one count or one per level ({len(loads)}), got {len(counts)}")
    config = ExperimentConfig(workload=args.workload, gpus=args.gpus, gpu=args.gpu, seed=args.seed)
    progress(
        f"sweep: {args.workload}, {len(policies)} policies x {len(loads)} {load_kind} levels "
        f"({', '.join(f'{load:g}' for load in loads)}; workflows {', '.join(map(str, counts))}), {args.gpus} GPUs"
    )
    columns = (TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn())
    with Progress(*columns, console=Console(stderr=True)) as bar:
        task = bar.add_task(f"sweep {args.workload}", total=len(loads))

        def done(load: float, point: dict[str, Any]) -> None:
            summary = ", ".join(f"{p} avg JCT {m['avg_jct_s']:.1f} s" for p, m in point["policies"].items())
            bar.console.print(
                f"{load_kind} {load:g}: {summary} ({point['wall_seconds']:.0f} s wall)", soft_wrap=True
            )
            bar.advance(task)

        result = sweep(config, policies, load_kind, loads, workflows=counts, on_point=done)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(rounded(result), indent=1, sort_keys=True, default=str) + "\n")
    print(table(result))
    progress(f"saved {args.out}")
    return 0


def table(result: dict[str, Any]) -> str:
    """Markdown: one row per (load, policy); avg JCT also as a ratio to the first policy's."""
    baseline = result["policies"][0]
    lines = [
        f"| {result['load_kind']} | workflows | policy | avg JCT s | vs {baseline} | p95 JCT s | tokens/s "
        "| workflows/min | avg queue s | distance from limit | wall s |",
        "|---:|---:|---|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for point in result["points"]:
        base = point["policies"][baseline]["avg_jct_s"]
        for policy, m in point["policies"].items():
            lines.append(
                f"| {point['load']:g} | {m['workflows']} | {policy} | {m['avg_jct_s']:.1f} "
                f"| {m['avg_jct_s'] / base:.3f} | {m['p95_jct_s']:.1f} | {m['throughput_tok_s']:,.0f} "
                f"| {m['workflows_per_min']:.2f} | {m['avg_queue_s']:.2f} | {m['distance_from_limit']:.2f} "
                f"| {m['wall_seconds']:.0f} |"
            )
    return "\n".join(lines)
