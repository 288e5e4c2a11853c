"""Summarise `compare --scalings` results files as the markdown table docs/benchmarks.md shows.

    python bench/autoscale_table.py bench/results/autoscale-b3-*-oracle.json
    python bench/autoscale_table.py --sweep bench/results/autoscale-sweep.png bench/results/autoscale-b3-*-c*-oracle.json

Per file and scaling policy: the global queue wait over every call (mean, calls-weighted across
models) and per model, avg and P95 JCT, GPU-seconds, and pythia's ratios against static in the
same file (queueing: static / pythia, higher is better; GPU-seconds: pythia / static).
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

ORDER = ("pythia", "static", "reactive", "predictive")


def overall_queue_s(run: dict[str, Any]) -> float:
    by_model = run.get("global_queue_s_by_model", {})
    calls = sum(m["calls"] for m in by_model.values())
    return sum(m["calls"] * m["mean_s"] for m in by_model.values()) / calls if calls else 0.0


def rows(path: Path) -> list[str]:
    data = json.loads(path.read_text())
    runs: dict[str, Any] = data["policies"]
    models = sorted({m for run in runs.values() for m in run.get("global_queue_s_by_model", {})})
    name = path.stem.removeprefix("autoscale-")
    out = []
    for policy in [p for p in ORDER if p in runs]:
        run = runs[policy]
        per_model = " / ".join(f"{run['global_queue_s_by_model'][m]['mean_s']:.1f}" for m in models)
        out.append(
            f"| {name} | {policy} | {overall_queue_s(run):.1f} | {per_model} | {run['avg_jct_s']:.0f} | "
            f"{run['p95_jct_s']:.0f} | {run['autoscaling']['gpu_seconds']:,.0f} |"
        )
    if "pythia" in runs and "static" in runs:
        pythia, static = runs["pythia"], runs["static"]
        queue = overall_queue_s(static) / max(overall_queue_s(pythia), 1e-9)
        gpu = pythia["autoscaling"]["gpu_seconds"] / static["autoscaling"]["gpu_seconds"]
        jct = static["avg_jct_s"] / pythia["avg_jct_s"]
        out.append(f"| {name} | *pythia vs static* | **{queue:.2f}x** lower | | {jct:.2f}x | | {gpu:.2f}x |")
    return out


def sweep_plot(out: Path, paths: list[str]) -> None:
    """Queueing (all calls) against concurrency, per workload and scaling policy (Pythia Fig. 10)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    points: dict[str, dict[str, list[tuple[int, float]]]] = {}
    for path in paths:
        data = json.loads(Path(path).read_text())
        concurrency = data["config"].get("concurrency")
        if not concurrency:
            continue
        for policy, run in data["policies"].items():
            points.setdefault(data["workload"], {}).setdefault(policy, []).append((concurrency, overall_queue_s(run)))
    fig, axes = plt.subplots(1, len(points), figsize=(5 * len(points), 3.6), squeeze=False)
    for ax, (workload, policies) in zip(axes[0], sorted(points.items()), strict=True):
        for policy in [p for p in ORDER if p in policies]:
            xs, ys = zip(*sorted(policies[policy]), strict=True)
            ax.plot(xs, ys, marker="o", label=policy)
        ax.set_title(workload)
        ax.set_xlabel("concurrent workflows")
        ax.set_ylabel("mean queueing delay, all calls (s)")
        ax.grid(alpha=0.3)
        ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(out, dpi=100)
    print(f"saved {out}")


def main(paths: list[str]) -> None:
    if paths and paths[0] == "--sweep":
        sweep_plot(Path(paths[1]), paths[2:])
        return
    print("| run | policy | queue mean s (all calls) | queue mean s per model | avg JCT s | P95 JCT s | GPU-s |")
    print("|---|---|---:|---|---:|---:|---:|")
    for path in paths:
        for row in rows(Path(path)):
            print(row)


if __name__ == "__main__":
    main(sys.argv[1:])
