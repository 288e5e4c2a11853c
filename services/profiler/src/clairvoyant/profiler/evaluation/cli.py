"""``evaluate``: learn a profile from part of a data set and score its predictions on the rest;
``convergence``: when a profile's distributions converge, seed by seed.

    python -m clairvoyant.profiler.evaluation.cli evaluate --data chatdev --out bench/results/profiler-chatdev.json
    python -m clairvoyant.profiler.evaluation.cli evaluate --data chatdev --seeds 0-12 --out bench/results/profiler-chatdev-seeds.json
    python -m clairvoyant.profiler.evaluation.cli convergence --data chatdev --seeds 0-12

``convergence`` folds the workflows into ``LearnedWorkloadStats`` in the order ``replay`` closes
them (by end time), so its ``workflows_to_converge`` is ``evaluate``'s, without the predictions.

Exit codes: 0 done, 1 the data is missing or malformed (one line naming the file, the line, the run
and the cell; said even with ``--quiet``), 2 a bad command line (argparse's own code), including an
unknown ``--data``.  See ``replay.py`` for what each metric means and ``data.py`` for the sources.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Sequence
from concurrent.futures import ProcessPoolExecutor, as_completed
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
from rich.table import Table

from clairvoyant.profiler.core.confidence import ConfidenceConfig
from clairvoyant.profiler.core.profile import ProfileConfig
from clairvoyant.profiler.core.trace import build_trace
from clairvoyant.profiler.core.workload_stats import LearnedWorkloadStats
from clairvoyant.profiler.evaluation.data import DataError, Workflow, load_workflows, source
from clairvoyant.profiler.evaluation.replay import replay


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="clairvoyant.profiler", description=__doc__.splitlines()[0])
    commands = parser.add_subparsers(dest="command", required=True)
    evaluate = commands.add_parser("evaluate", help="offline evaluation on held-out workflows")
    evaluate.add_argument("--data", required=True, help="chatdev, claude_code, synthetic:per_task_experts or workload:<name>")
    evaluate.add_argument("--holdout", type=float, default=0.3, help="share of workflows held out (last)")
    seeds = evaluate.add_mutually_exclusive_group()
    seeds.add_argument("--seed", type=int, default=0)
    seeds.add_argument(
        "--seeds",
        type=_seeds,
        default=None,
        help="e.g. 0-12: one replay per seed; --out gets every report and their mean, min and max",
    )
    evaluate.add_argument("--jobs", type=int, default=1, help="with --seeds: replays run at once")
    evaluate.add_argument("--out", type=Path, required=True, help="the JSON report")
    evaluate.add_argument("--limit", type=int, default=None, help="use the first N workflows only")
    evaluate.add_argument("--data-dir", type=Path, default=None, help="the shared data directory")
    evaluate.add_argument("--concurrency", type=float, default=8.0, help="workflows running at once")
    evaluate.add_argument(
        "--hash-tokens", type=int, default=4096, help="tokens of each sequence hashed into blocks (0: none)"
    )
    evaluate.add_argument(
        "--ungated",
        action="store_true",
        help="serve structure predictions after min_instances even before the distributions converge",
    )
    evaluate.add_argument("--quiet", action="store_true", help="no progress bar or table")
    convergence = commands.add_parser("convergence", help="workflows to converge for each seed")
    convergence.add_argument("--data", required=True, help="chatdev, claude_code, synthetic:per_task_experts or workload:<name>")
    convergence.add_argument("--seeds", type=_seeds, default=list(range(13)), help="e.g. 0-12 or 0,3,7")
    convergence.add_argument("--limit", type=int, default=None, help="use the first N workflows only")
    convergence.add_argument("--data-dir", type=Path, default=None, help="the shared data directory")
    convergence.add_argument("--concurrency", type=float, default=8.0, help="workflows running at once")
    convergence.add_argument("--out", type=Path, default=None, help="also write the table as JSON")
    return parser


def _seeds(text: str) -> list[int]:
    seeds: list[int] = []
    for part in text.split(","):
        first, _, last = part.partition("-")
        seeds += range(int(first), int(last or first) + 1)
    return seeds


def workflows_to_converge(workflows: Sequence[Workflow], max_traces: int) -> tuple[int | None, int]:
    """(closed workflows when ``LearnedWorkloadStats.converged()`` first held, None if never;
    the workflows closed) with the workflows closing in end order, as ``replay`` closes them."""
    stats = LearnedWorkloadStats(max_traces)
    order = sorted(range(len(workflows)), key=lambda w: (workflows[w].end, w))
    for closed, w in enumerate(order, 1):
        stats.observe(build_trace(workflows[w].workflow_id, (r.call() for r in workflows[w].records)), closed)
        if stats.converged():
            return closed, len(order)
    return None, len(order)


def _load(args: argparse.Namespace, seed: int, hash_tokens: int) -> list[Workflow]:
    """The workflows ``--data`` names for ``seed``, as the command line asks for them."""
    return load_workflows(
        args.data,
        seed=seed,
        limit=args.limit,
        data_dir=args.data_dir,
        concurrency=args.concurrency,
        hash_tokens=hash_tokens,
    )


def _convergence(args: argparse.Namespace, console: Console) -> int:
    table = Table(title=f"workflows to converge: {args.data}")
    for column in ("seed", "workflows", "workflows_to_converge"):
        table.add_column(column, justify="right")
    rows = []
    for seed in args.seeds:
        workflows = _load(args, seed, hash_tokens=0)
        converged_at, total = workflows_to_converge(workflows, ProfileConfig().max_traces)
        rows.append({"seed": seed, "workflows": total, "workflows_to_converge": converged_at})
        table.add_row(str(seed), str(total), str(converged_at))
    console.print(table)
    reached = [r["workflows_to_converge"] for r in rows if r["workflows_to_converge"] is not None]
    spread = max(reached) / min(reached) if reached else None
    console.print(f"converged on {len(reached)} of {len(rows)} seeds; max / min = {spread}")
    if args.out is not None:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(json.dumps({"data": args.data, "seeds": rows, "spread": spread}, indent=2) + "\n")
    return 0


SWEPT = (
    "priority_ordering_accuracy",
    "priority_ordering_vs_oracle",
    "length_interval_coverage",
    "path_acceptance",
    "next_agent_top1",
    "workflows_to_converge",
    "annotate_p99_ms",
    "ingest_records_per_s",
)


def _one_seed(args: argparse.Namespace, seed: int) -> dict[str, Any]:
    """``evaluate``'s report for one seed (no progress bar: seeds run in worker processes)."""
    workflows = _load(args, seed, args.hash_tokens)
    if len(workflows) < 2:
        raise DataError(f"--data {args.data} holds {len(workflows)} workflows; at least 2 are needed")
    config = ProfileConfig(confidence=ConfidenceConfig(require_convergence=not args.ungated))
    return {"seed": seed, **replay(workflows, args.holdout, config)}


def _spread(values: Sequence[float | None]) -> dict[str, float | int | None]:
    known = [float(v) for v in values if v is not None]
    return {
        "mean": sum(known) / len(known) if known else None,
        "min": min(known) if known else None,
        "max": max(known) if known else None,
        "missing": len(values) - len(known),
    }


def _sweep(args: argparse.Namespace, console: Console) -> int:
    """``evaluate --seeds``: one replay per seed (``--jobs`` at once), every report in ``--out`` with
    the mean, min and max of each headline metric and of each ordering predictor."""
    runs: dict[int, dict[str, Any]] = {}
    columns = (TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn())
    try:
        with Progress(*columns, console=console, transient=True) as progress:
            task = progress.add_task(f"{args.data}: {len(args.seeds)} seeds", total=len(args.seeds))
            with ProcessPoolExecutor(max_workers=min(args.jobs, len(args.seeds))) as pool:
                futures = {pool.submit(_one_seed, args, seed): seed for seed in args.seeds}
                for future in as_completed(futures):
                    runs[futures[future]] = future.result()
                    progress.advance(task)
    except DataError as exc:  # said even with --quiet: the run did not happen
        Console(stderr=True).print(f"[red]error:[/red] {exc}", highlight=False, soft_wrap=True)
        return 1
    ordered = [runs[seed] for seed in args.seeds]
    predictors = sorted({name for r in ordered for name in r["priority_predictors"]})
    summary: dict[str, Any] = {key: _spread([r[key] for r in ordered]) for key in SWEPT}
    summary["priority_predictors"] = {
        name: _spread([r["priority_predictors"].get(name) for r in ordered]) for name in predictors
    }
    report = {
        "data": args.data,
        "holdout": args.holdout,
        "seeds": args.seeds,
        "ungated": args.ungated,
        "summary": summary,
        "runs": ordered,
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(report, indent=2) + "\n")
    table = Table(title=f"profiler evaluation: {args.data}, seeds {args.seeds[0]}..{args.seeds[-1]}")
    for column in ("metric", "mean", "min", "max"):
        table.add_column(column, justify="right" if column != "metric" else "left")
    rows = [(key, summary[key]) for key in SWEPT] + [
        (f"ordering by {name}", summary["priority_predictors"][name])
        for name in predictors
        if not name.endswith("_cross_agent")
    ]
    for key, spread in rows:
        cells = [f"{spread[k]:.4g}" if spread[k] is not None else "-" for k in ("mean", "min", "max")]
        table.add_row(key, *cells)
    console.print(table)
    console.print(f"wrote {args.out}")
    return 0


def main(argv: list[str]) -> int:
    parser = _parser()
    args = parser.parse_args(argv)
    if args.command == "convergence":
        try:
            source(args.data)
        except DataError as exc:
            parser.error(str(exc))
        try:
            return _convergence(args, Console())
        except DataError as exc:
            Console(stderr=True).print(f"[red]error:[/red] {exc}", highlight=False, soft_wrap=True)
            return 1
    console = Console(stderr=True, quiet=args.quiet)
    if not 0.0 < args.holdout < 1.0:
        parser.error(f"--holdout must be in (0, 1), got {args.holdout}")
    if args.jobs < 1:
        parser.error(f"--jobs must be >= 1, got {args.jobs}")
    try:
        source(args.data)
    except DataError as exc:
        parser.error(str(exc))
    if args.seeds is not None:
        return _sweep(args, console)
    try:
        with console.status(f"loading {args.data}"):
            workflows = _load(args, args.seed, args.hash_tokens)
    except DataError as exc:  # said even with --quiet: the run did not happen
        Console(stderr=True).print(f"[red]error:[/red] {exc}", highlight=False, soft_wrap=True)
        return 1
    if len(workflows) < 2:
        if args.limit is not None and args.limit < 2:
            parser.error(f"--limit {args.limit} gives {len(workflows)} workflows; at least 2 are needed")
        message = f"--data {args.data} holds {len(workflows)} workflows; at least 2 are needed"
        Console(stderr=True).print(f"[red]error:[/red] {message}", highlight=False, soft_wrap=True)
        return 1
    events = sum(len(w.records) for w in workflows) * 2
    columns = (TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn())
    with Progress(*columns, console=console, transient=True) as progress:
        task = progress.add_task(f"replaying {len(workflows)} workflows", total=events)
        config = ProfileConfig(confidence=ConfidenceConfig(require_convergence=not args.ungated))
        report = replay(
            workflows, args.holdout, config, progress=lambda done: progress.update(task, completed=done)
        )
    report = {
        "data": args.data,
        "holdout": args.holdout,
        "seed": args.seed,
        "ungated": args.ungated,
        **report,
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(report, indent=2) + "\n")
    table = Table(title=f"profiler evaluation: {args.data}")
    table.add_column("metric")
    table.add_column("value", justify="right")
    for key, value in report.items():
        if isinstance(value, float):
            table.add_row(key, f"{value:.4g}")
        elif isinstance(value, int | str) and key not in ("expression",):
            table.add_row(key, str(value))
    console.print(table)
    console.print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
