"""``evaluate``: learn a profile from part of a data set and score its predictions on the rest.

    python -m clairvoyant.profiler.evaluation.cli evaluate --data chatdev --out bench/results/profiler-chatdev.json

Exit codes: 0 done, 1 the data is missing, 2 a bad command line (argparse's own code), including an
unknown ``--data``.  See ``replay.py`` for what each metric means and ``data.py`` for the sources.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
from rich.table import Table

from clairvoyant.profiler.core.confidence import ConfidenceConfig
from clairvoyant.profiler.core.profile import ProfileConfig
from clairvoyant.profiler.evaluation.data import DataError, load_workflows, source
from clairvoyant.profiler.evaluation.replay import replay


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="clairvoyant.profiler", description=__doc__.splitlines()[0])
    commands = parser.add_subparsers(dest="command", required=True)
    evaluate = commands.add_parser("evaluate", help="offline evaluation on held-out workflows")
    evaluate.add_argument("--data", required=True, help="chatdev, claude_code or workload:<name>")
    evaluate.add_argument("--holdout", type=float, default=0.3, help="share of workflows held out (last)")
    evaluate.add_argument("--seed", type=int, default=0)
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
    return parser


def main(argv: list[str]) -> int:
    parser = _parser()
    args = parser.parse_args(argv)
    console = Console(stderr=True, quiet=args.quiet)
    if not 0.0 < args.holdout < 1.0:
        parser.error(f"--holdout must be in (0, 1), got {args.holdout}")
    try:
        source(args.data)
    except DataError as exc:
        parser.error(str(exc))
    try:
        with console.status(f"loading {args.data}"):
            workflows = load_workflows(
                args.data,
                seed=args.seed,
                limit=args.limit,
                data_dir=args.data_dir,
                concurrency=args.concurrency,
                hash_tokens=args.hash_tokens,
            )
    except DataError as exc:  # said even with --quiet: the run did not happen
        Console(stderr=True).print(f"[red]error:[/red] {exc}", highlight=False, soft_wrap=True)
        return 1
    if len(workflows) < 2:
        parser.error(f"--data {args.data} gave {len(workflows)} workflows; at least 2 are needed")
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
