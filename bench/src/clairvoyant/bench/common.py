"""What every benchmark shares: the registry, progress lines, tables, percentiles and the JSON results.

A benchmark prints and saves figures; it never asserts on a wall-clock threshold (STYLE.md, rule 9).
Goals are reported as a ratio against a baseline measured in the same run, next to the goal itself.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

from clairvoyant.core.registry import Registry

# bench/src/clairvoyant/bench/common.py -> bench/results
RESULTS_DIR = Path(__file__).resolve().parents[3] / "results"


@dataclass
class BenchResult:
    """One run's figures: ``rows`` render as the table and ``summary`` holds the ratios vs the goals."""

    name: str
    columns: list[str]
    rows: list[list[Any]]
    summary: dict[str, Any] = field(default_factory=dict)
    notes: list[str] = field(default_factory=list)
    params: dict[str, Any] = field(default_factory=dict)


class Benchmark(Protocol):
    """A named benchmark: declares its options, then runs and returns its figures (no asserts)."""

    help: str

    def add_arguments(self, parser: argparse.ArgumentParser) -> None: ...

    def run(self, args: argparse.Namespace) -> BenchResult: ...


BENCHMARKS: Registry[Benchmark] = Registry("benchmark")

_START = time.monotonic()


def progress(message: str) -> None:
    """A progress line on stderr, stamped with seconds since start, so stdout stays the table."""
    print(f"[{time.monotonic() - _START:7.1f}s] {message}", file=sys.stderr, flush=True)


class RunBars:
    """Rich progress bars on stderr, one per simulated run: workflows ended of the run's total,
    and its virtual clock.  Use as a context manager; ``update`` is a ``parallel.ProgressCallback``.
    Where stderr is not a terminal (a log file), bars cannot redraw: each run prints a progress line
    every ``LINE_EVERY_S`` seconds and when it ends instead."""

    LINE_EVERY_S = 30.0

    def __init__(self, labels: Sequence[str]) -> None:
        from rich.console import Console
        from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

        console = Console(stderr=True)
        self._lines = not console.is_terminal
        self._labels = list(labels)
        self._last_line = [float("-inf")] * len(labels)
        self._bars = Progress(
            TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), TextColumn("workflows"),
            TextColumn("{task.fields[virtual]:>9} virtual"), TimeElapsedColumn(), console=console,
            disable=self._lines,
        )  # fmt: skip
        self._tasks = [self._bars.add_task(label, total=None, virtual="0 s", start=False) for label in labels]

    def __enter__(self) -> RunBars:
        self._bars.__enter__()
        return self

    def __exit__(self, *exc: object) -> None:
        self._bars.__exit__(*exc)  # type: ignore[arg-type]

    def update(self, index: int, where: Any) -> None:
        """``where``: a ``SimProgress`` of run ``index``."""
        if self._lines:
            now, ended = time.monotonic(), where.workflows_done == where.workflows_total
            last = self._last_line[index]
            if last != float("inf") and (ended or now - last >= self.LINE_EVERY_S):
                self._last_line[index] = float("inf") if ended else now  # inf: its last line is out
                progress(f"{self._labels[index]}: {where.workflows_done}/{where.workflows_total} workflows, "
                         f"{where.virtual_s:,.0f} s virtual")  # fmt: skip
            return
        task = self._tasks[index]
        self._bars.start_task(task)
        self._bars.update(
            task, completed=where.workflows_done, total=where.workflows_total, virtual=f"{where.virtual_s:,.0f} s"
        )

    def print(self, message: str) -> None:
        if self._lines:
            progress(message)
        else:
            self._bars.console.print(message, soft_wrap=True)


def percentile(values: Sequence[float], q: float) -> float:
    """The ``q``-th percentile (0-100) with linear interpolation, as numpy's default."""
    if not values:
        return float("nan")
    ordered = sorted(values)
    rank = (len(ordered) - 1) * q / 100.0
    low = int(rank)
    high = min(low + 1, len(ordered) - 1)
    return ordered[low] + (ordered[high] - ordered[low]) * (rank - low)


def median(values: Sequence[float]) -> float:
    return statistics.median(values) if values else float("nan")


def load_average() -> tuple[float, float, float]:
    return os.getloadavg()


def machine() -> dict[str, Any]:
    """What the numbers were measured on; the load average tells readers how noisy the box was."""
    model = platform.processor()
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                model = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    info: dict[str, Any] = {"cpu": model, "cpus": os.cpu_count(), "python": platform.python_version()}
    try:
        import torch

        info["torch"] = torch.__version__
        info["cuda"] = torch.cuda.is_available()
    except ImportError:
        pass
    return info


def _cell(value: Any) -> str:
    if isinstance(value, float):
        if value != value:  # NaN
            return "-"
        return f"{value:,.2f}" if abs(value) < 1000 else f"{value:,.0f}"
    return "-" if value is None else str(value)


def format_table(columns: Sequence[str], rows: Sequence[Sequence[Any]]) -> str:
    """A Markdown table (readable in a terminal, pasteable into docs/benchmarks.md)."""
    cells = [[_cell(v) for v in row] for row in rows]
    widths = [max(len(c), *(len(r[i]) for r in cells)) for i, c in enumerate(columns)]
    # Text columns read best left-aligned, numbers right-aligned (Markdown's "---:").
    numeric = [all(isinstance(row[i], int | float) for row in rows) for i in range(len(columns))]
    line = "| " + " | ".join(c.ljust(w) for c, w in zip(columns, widths, strict=True)) + " |"
    rule = "| " + " | ".join("-" * (w - 1) + (":" if n else "-") for w, n in zip(widths, numeric, strict=True)) + " |"
    body = [
        "| " + " | ".join(v.rjust(w) if n else v.ljust(w) for v, w, n in zip(r, widths, numeric, strict=True)) + " |"
        for r in cells
    ]
    return "\n".join([line, rule, *body])


def rounded(value: Any) -> Any:
    """Floats to 3 decimals, recursively: the saved JSON stays small and its diffs readable."""
    if isinstance(value, float):
        return round(value, 3)
    if isinstance(value, dict):
        return {k: rounded(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [rounded(v) for v in value]
    return value


def table_and_notes(result: BenchResult) -> str:
    """The Markdown a standalone benchmark saves beside its JSON: its table, then its notes."""
    notes = "".join(f"- {note}\n" for note in result.notes)
    return f"{format_table(result.columns, result.rows)}\n\n{notes}"


def run_standalone(
    bench: Benchmark,
    argv: list[str] | None,
    *,
    prog: str,
    description: str | None,
    out_dir: Path,
    markdown: Callable[[BenchResult], str] = table_and_notes,
) -> int:
    """``python -m clairvoyant.bench.<module>``: parse ``bench``'s options (and ``--out-dir``), run it,
    save ``<out_dir>/<name>.json`` (``report``) and the ``markdown`` of its result beside it."""
    parser = argparse.ArgumentParser(prog=prog, description=description,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)  # fmt: skip
    parser.add_argument("--out-dir", type=Path, default=out_dir, help="where the JSON and markdown go")
    bench.add_arguments(parser)
    args = parser.parse_args(argv)
    started = load_average()
    result = bench.run(args)
    path = report(result, args.out_dir, started).with_suffix(".md")
    path.write_text(markdown(result))
    progress(f"saved {path}")
    return 0


def report(result: BenchResult, out_dir: Path = RESULTS_DIR, started_load: tuple[float, ...] = ()) -> Path:
    """Print the table, summary and notes; save everything as ``<out_dir>/<name>.json``."""
    print()
    print(format_table(result.columns, result.rows))
    print()
    for key, value in result.summary.items():
        print(f"{key}: {_cell(value)}")
    for note in result.notes:
        print(f"note: {note}")
    payload = {
        "benchmark": result.name,
        "date": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
        "machine": machine(),
        "load_average": {"start": list(started_load), "end": list(load_average())},
        "params": result.params,
        "columns": result.columns,
        "rows": result.rows,
        "summary": result.summary,
        "notes": result.notes,
    }
    out_dir.mkdir(parents=True, exist_ok=True)
    path = out_dir / f"{result.name}.json"
    path.write_text(json.dumps(rounded(payload), indent=2, default=str) + "\n")
    print(f"saved {path}")
    return path
