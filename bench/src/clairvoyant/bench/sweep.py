"""``sweep``: ``compare`` at several load levels, for a latency-throughput curve; and ``plot``.

    python -m clairvoyant.bench sweep --workload react_bfcl --policies fcfs-rr,least-loaded \\
        --rates 0.5,1,2 --workflows 64 --out sweep.json
    python -m clairvoyant.bench sweep --workload swe_agent --policies fcfs-rr,least-loaded \\
        --concurrencies 4,16,48 --workflows 8,32,48 --out sweep.json
    python -m clairvoyant.bench sweep --scenario pythia-fig11 --out fig11.json  # a paper's figure (scenarios.py)
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

from clairvoyant.bench import scenarios
from clairvoyant.bench.arrivals import parse_arrivals
from clairvoyant.bench.common import RunBars, progress, rounded
from clairvoyant.bench.experiment import (
    ANNOTATORS,
    ExperimentConfig,
    compare_result,
    make_annotator,
    run_sim,
    warmup_summary,
    warmup_warning,
)
from clairvoyant.bench.parallel import ProgressCallback, SimTask, default_jobs, run_tasks
from clairvoyant.bench.workloads import WorkloadDataError, check_workload_name
from clairvoyant.policy import PRESETS

LOAD_KINDS = ("rate", "concurrency", "arrivals")


def workload_arg(name: str) -> str:
    """``--workload``: a registered workload or a spec file, validated before the sweep starts."""
    try:
        return check_workload_name(name)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def sweep(
    config: ExperimentConfig,
    policies: list[str],
    load_kind: str,
    loads: Sequence[float],
    *,
    workflows: Sequence[int] | None = None,
    arrivals: Sequence[str] | None = None,
    jobs: int = 1,
    on_progress: ProgressCallback | None = None,
    on_point: Callable[[float, dict[str, Any]], None] | None = None,
) -> dict[str, Any]:
    """``compare`` at each load (``load_kind`` "rate": workflows/s; "concurrency": closed loop;
    "arrivals": ``arrivals[i]``, an arrival process, at level i, the load being its axis value).

    ``workflows``: how many workflows each level runs (default: ``config.workflows`` at every one).
    The runs (every policy at every level) go ``jobs`` at a time; ``on_progress`` gets (run index,
    where it stands), runs numbered level by level, policy by policy; ``on_point`` gets each level
    once all its runs are done.  A level's ``wall_seconds`` is the sum of its runs'.
    """
    counts = [config.workflows] * len(loads) if workflows is None else list(workflows)
    if len(counts) != len(loads):
        raise ValueError(f"{len(counts)} workflow counts for {len(loads)} load levels")
    if load_kind not in LOAD_KINDS:
        raise ValueError(f"load_kind must be one of {LOAD_KINDS}, got {load_kind!r}")
    if (load_kind == "arrivals") != (arrivals is not None) or len(arrivals or loads) != len(loads):
        raise ValueError("load_kind 'arrivals' needs one arrival process per load level, and only it takes them")
    started = time.perf_counter()
    specs: Sequence[str | None] = arrivals if arrivals is not None else [None] * len(loads)
    configs = [
        _level(config, load_kind, load, spec, count) for load, spec, count in zip(loads, specs, counts, strict=True)
    ]
    prepared = [make_annotator(c) for c in configs]  # once per level, as ``compare`` does
    warmups = [warmup_summary(a, c) for c, a in zip(configs, prepared, strict=True)]
    tasks = [SimTask(c, policy, a, run_sim) for c, a in zip(configs, prepared, strict=True) for policy in policies]
    points: list[dict[str, Any] | None] = [None] * len(loads)
    runs: dict[int, dict[str, Any]] = {}

    def finished(index: int, result: dict[str, Any]) -> None:
        runs[index] = result
        level = index // len(policies)
        first = level * len(policies)
        if all(i in runs for i in range(first, first + len(policies))):
            results = {policy: runs[first + i] for i, policy in enumerate(policies)}
            wall = sum(r["wall_seconds"] for r in results.values())
            point = points[level] = {"load": loads[level], **compare_result(configs[level], "sim", results, wall, warmups[level])}
            if on_point is not None:
                on_point(loads[level], point)

    run_tasks(tasks, jobs, on_progress, finished)
    return {
        "kind": "sweep",
        "workload": config.workload,
        "mode": "sim",
        "seed": config.seed,
        "policies": policies,
        "load_kind": load_kind,
        "loads": list(loads),
        **({"arrivals": list(arrivals)} if arrivals is not None else {}),
        "wall_seconds": time.perf_counter() - started,
        "points": points,
    }


def _level(config: ExperimentConfig, load_kind: str, load: float, arrivals: str | None, workflows: int) -> ExperimentConfig:
    """``config`` at one load level: the level's load alone, and its workflow count."""
    level = dataclasses.replace(config, rate=None, concurrency=None, arrivals=None, workflows=workflows)
    if load_kind == "rate":
        return dataclasses.replace(level, rate=float(load))
    if load_kind == "concurrency":
        return dataclasses.replace(level, concurrency=int(load))
    return dataclasses.replace(level, arrivals=arrivals)


# ---- command line --------------------------------------------------------------------------------


def add_parsers(commands: Any) -> None:
    sub = commands.add_parser("sweep", help="compare at several load levels (latency vs throughput)",
                              description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)  # fmt: skip
    sub.add_argument("--workload", type=workload_arg,
                     help="a workload name or a spec file (required unless --scenario)")  # fmt: skip
    sub.add_argument("--policies", help="comma-separated: " + ",".join(PRESETS.names()) + " (required unless --scenario)")
    loads = sub.add_mutually_exclusive_group()
    loads.add_argument("--rates", help="comma-separated Poisson workflow arrival rates (per second)")
    loads.add_argument("--concurrencies", help="comma-separated closed-loop concurrencies")
    sub.add_argument("--gpus", type=int, default=8)
    sub.add_argument("--gpu", default="H100-80G")
    sub.add_argument("--workflows", default="64", help="per load level: one number, or one per level")
    sub.add_argument("--seed", type=int, default=0)
    sub.add_argument("--block-size", type=int, default=16, help="KV block size in tokens (64 runs ~2.5x faster)")
    sub.add_argument("--annotations", choices=list(ANNOTATORS), default="none",
                     help="what annotates each call (as compare's --annotations)")  # fmt: skip
    sub.add_argument("--warmup-workflows", type=int, default=64, help="--annotations profiler: the warm-up's workflows")
    sub.add_argument("--jobs", type=int, default=None,
                     help="runs simulated at once, one process each (default: one per CPU); results do not depend on it")
    sub.add_argument("--out", type=Path, required=True, help="results JSON")
    scenarios.add_arguments(sub, one_point=False)

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
    loads_given = args.rates is not None or args.concurrencies is not None
    if args.scenario is not None:
        plan = scenarios.resolve_sweep(args, loads_given)
    else:
        scenarios.fill_defaults(args)
        if args.workload is None or args.policies is None or not loads_given:
            raise SystemExit("error: sweep needs --workload, --policies and --rates or --concurrencies "
                             "(or --scenario NAME; --scenario list names them)")  # fmt: skip
        plan = scenarios.SweepPlan("", [], [], None, {})
    policies = [p for p in args.policies.split(",") if p]
    unknown = [p for p in policies if p not in PRESETS]
    if unknown:
        raise SystemExit(f"unknown policies {unknown}; choose from {PRESETS.names()}")
    if args.rates:
        load_kind, loads = "rate", _floats(args.rates)
    elif args.concurrencies:
        load_kind, loads = "concurrency", [float(int(c)) for c in _floats(args.concurrencies)]
    else:
        load_kind, loads = plan.load_kind, plan.loads
    counts = plan.workflows or [int(n) for n in _floats(args.workflows)]
    if len(counts) == 1:
        counts *= len(loads)
    if len(counts) != len(loads):
        raise SystemExit(f"--workflows: give one count or one per level ({len(loads)}), got {len(counts)}")
    for spec in plan.arrivals or []:
        try:
            parse_arrivals(spec)
        except (ValueError, WorkloadDataError) as exc:
            raise SystemExit(f"error: {plan.record['name']}: {exc}") from None
    config = ExperimentConfig(workload=args.workload, gpus=args.gpus, gpu=args.gpu, seed=args.seed,
                              block_size=args.block_size, annotations=args.annotations,
                              warmup_workflows=args.warmup_workflows)  # fmt: skip
    label = plan.record.get("axis") or load_kind
    scenario = f" ({plan.record['name']})" if plan.record else ""
    progress(
        f"sweep{scenario}: {args.workload}, {len(policies)} policies x {len(loads)} {label} levels "
        f"({', '.join(f'{load:g}' for load in loads)}; workflows {', '.join(map(str, counts))}), {args.gpus} GPUs"
    )
    if args.jobs is not None and args.jobs < 1:
        raise SystemExit(f"error: --jobs must be at least 1, got {args.jobs}")
    if args.block_size <= 0 or args.warmup_workflows < 0:
        raise SystemExit(f"error: need --block-size > 0 and --warmup-workflows >= 0, got {args.block_size}, "
                         f"{args.warmup_workflows}")  # fmt: skip
    labels = [f"{load_kind} {load:g} {policy}" for load in loads for policy in policies]
    with RunBars(labels) as bars:

        def done(load: float, point: dict[str, Any]) -> None:
            summary = ", ".join(f"{p} avg JCT {m['avg_jct_s']:.1f} s" for p, m in point["policies"].items())
            bars.print(f"{load_kind} {load:g}: {summary} ({point['wall_seconds']:.0f} s of runs)")
            warning = warmup_warning(point.get("warmup"))
            if warning is not None:
                bars.print(f"{load_kind} {load:g}: {warning}")

        jobs = args.jobs or default_jobs(len(labels))
        result = sweep(config, policies, load_kind, loads, workflows=counts, arrivals=plan.arrivals, jobs=jobs,
                       on_progress=bars.update, on_point=done)  # fmt: skip
    if plan.record:
        result["scenario"] = plan.record
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(rounded(result), indent=1, sort_keys=True, default=str) + "\n")
    print(table(result))
    progress(f"saved {args.out}")
    return 0


def table(result: dict[str, Any]) -> str:
    """Markdown: one row per (load, policy); avg JCT also as a ratio to the first policy's."""
    baseline = result["policies"][0]
    axis = (result.get("scenario") or {}).get("axis") or result["load_kind"]
    lines = [
        f"| {axis} | workflows | policy | avg JCT s | vs {baseline} | p95 JCT s | tokens/s "
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
