"""PNG figures from a ``compare`` or ``sweep`` results file (matplotlib, Agg backend: no display).

    python -m clairvoyant.bench plot compare.json --out-dir docs/img
    python -m clairvoyant.bench plot sweep.json --out-dir docs/img

A compare file gives ``<stem>-jct-cdf.png`` (the CDF of workflow JCT, one line per policy) and
``<stem>-queue-depth.png`` (calls waiting per model over time, one panel per model, one line per
policy, as Pythia's Fig. 9); with autoscaling, also ``<stem>-replicas.png`` (each model's ready
replicas over time, solid, and all it holds, starting and draining too, dashed).  A sweep file gives ``<stem>-latency-throughput.png``: average and P95
JCT against output-token throughput, one point per load level, one line per policy.  Figures are
small (100 dpi) so they can be committed.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import matplotlib

matplotlib.use("Agg")

import matplotlib.pyplot as plt  # noqa: E402  (after choosing the backend)
from matplotlib.figure import Figure  # noqa: E402

DPI = 100


def plot_file(results_path: Path, out_dir: Path | None = None, *, load: float | None = None) -> list[Path]:
    """Draw every figure the file supports into ``out_dir`` (default: next to the file).

    For a sweep file, ``load`` also draws that level's compare figures (``<stem>-<load>-...``).
    """
    results = json.loads(results_path.read_text())
    out_dir = out_dir or results_path.parent
    out_dir.mkdir(parents=True, exist_ok=True)
    stem = results_path.stem
    if results.get("kind") != "sweep":
        return _compare_figures(results, out_dir, stem)
    paths = [plot_latency_throughput(results, out_dir / f"{stem}-latency-throughput.png")]
    if load is not None:
        points = [p for p in results["points"] if p["load"] == load]
        if not points:
            raise ValueError(f"no load {load:g} in {results_path}; it has {results['loads']}")
        paths += _compare_figures(points[0], out_dir, f"{stem}-{load:g}")
    return paths


def _compare_figures(results: dict[str, Any], out_dir: Path, stem: str) -> list[Path]:
    paths = [
        plot_jct_cdf(results, out_dir / f"{stem}-jct-cdf.png"),
        plot_queue_depth(results, out_dir / f"{stem}-queue-depth.png"),
    ]
    if any("autoscaling" in metrics for metrics in results["policies"].values()):
        paths.append(plot_replicas(results, out_dir / f"{stem}-replicas.png"))
    return paths


def _title(results: dict[str, Any]) -> str:
    config = results.get("config", {})
    if config.get("concurrency"):
        load = f"concurrency {config['concurrency']}"
    elif config.get("rate"):
        load = f"{config['rate']:g} workflows/s"
    else:
        load = "all at t=0"
    if config.get("arrivals"):
        load = config["arrivals"]
    gpus = f"{config.get('gpus', '?')} GPUs"
    if "scaling" in config:  # an autoscaled run: the budget is what bounds it
        gpus = f"budget {config.get('gpu_budget') or config.get('gpus')} GPUs, preset {results.get('preset', '?')}"
    return f"{results['workload']}: {config.get('workflows', '?')} workflows, {load}, {gpus}"


def _save(fig: Figure, path: Path) -> Path:
    fig.tight_layout()
    fig.savefig(path, dpi=DPI)
    plt.close(fig)
    return path


def _require(metrics: dict[str, Any], key: str, policy: str) -> Any:
    if key not in metrics:
        raise ValueError(f"policy {policy!r} has no {key!r}: re-run compare with this version to plot it")
    return metrics[key]


def plot_jct_cdf(results: dict[str, Any], path: Path) -> Path:
    fig, ax = plt.subplots(figsize=(6, 4))
    for policy, metrics in results["policies"].items():
        jcts = sorted(_require(metrics, "jct_s", policy))
        if not jcts:
            continue
        fractions = [(i + 1) / len(jcts) for i in range(len(jcts))]
        ax.step(jcts, fractions, where="post", label=f"{policy} (avg {metrics['avg_jct_s']:.3g} s)")
    ax.set_xlabel("workflow JCT (s)")
    ax.set_ylabel("fraction of workflows")
    ax.set_ylim(0, 1.02)
    ax.grid(alpha=0.3)
    ax.legend(loc="lower right", fontsize=8)
    ax.set_title(_title(results), fontsize=9)
    return _save(fig, path)


def plot_queue_depth(results: dict[str, Any], path: Path) -> Path:
    policies = results["policies"]
    models = sorted(
        {m for p, metrics in policies.items() for m in _require(metrics, "queue_depth_series", p)}
    )
    fig, axes = plt.subplots(
        len(models) or 1, 1, figsize=(7, 2.4 * max(1, len(models))), sharex=True, squeeze=False
    )
    for ax, model in zip(axes[:, 0], models, strict=False):
        for policy, metrics in policies.items():
            series = metrics["queue_depth_series"].get(model, [])
            if series:
                ax.step(
                    [t for t, _ in series], [d for _, d in series], where="post", label=policy, linewidth=1
                )
        ax.set_ylabel("calls waiting")
        ax.set_title(model, fontsize=9)
        ax.grid(alpha=0.3)
        ax.legend(loc="upper right", fontsize=8)
    axes[-1, 0].set_xlabel("time since the first arrival (s)")
    fig.suptitle(_title(results), fontsize=9)
    return _save(fig, path)


def plot_replicas(results: dict[str, Any], path: Path) -> Path:
    """Replicas per model over time, one panel per model, one colour per entry (a scaling
    policy, or a preset under one): ready (solid) and held in all (dashed)."""
    entries = {name: m["autoscaling"] for name, m in results["policies"].items() if "autoscaling" in m}
    models = sorted({model for scaled in entries.values() for model in scaled["replica_series"]})
    fig, axes = plt.subplots(
        len(models) or 1, 1, figsize=(7, 2.4 * max(1, len(models))), sharex=True, squeeze=False
    )
    for ax, model in zip(axes[:, 0], models, strict=False):
        for name, scaled in entries.items():
            series = scaled["replica_series"].get(model, [])
            if not series:
                continue
            end = results["policies"][name].get("virtual_seconds", series[-1][0])
            times = [t for t, _, _ in series] + [max(end, series[-1][0])]
            (line,) = ax.step(times, [r for _, r, _ in series] + [series[-1][1]], where="post",
                              linewidth=1, label=f"{name} ({scaled['gpu_seconds']:,.0f} GPU-s)")  # fmt: skip
            ax.step(times, [n for _, _, n in series] + [series[-1][2]], where="post", linewidth=0.8,
                    linestyle="--", color=line.get_color())  # fmt: skip
        ax.set_ylabel("replicas")
        ax.set_title(f"{model}: ready (solid), held (dashed)", fontsize=9)
        ax.grid(alpha=0.3)
        ax.legend(loc="upper right", fontsize=7)
    axes[-1, 0].set_xlabel("virtual time (s)")
    fig.suptitle(_title(results), fontsize=9)
    return _save(fig, path)


def plot_latency_throughput(sweep: dict[str, Any], path: Path) -> Path:
    """Average (solid) and P95 (dashed) JCT against throughput, points in load order."""
    fig, ax = plt.subplots(figsize=(6, 4))
    for policy in sweep["policies"]:
        points = [(p["policies"][policy], p["load"]) for p in sweep["points"] if policy in p["policies"]]
        throughput = [m["throughput_tok_s"] for m, _ in points]
        (line,) = ax.plot(throughput, [m["avg_jct_s"] for m, _ in points], marker="o", label=f"{policy} avg")
        ax.plot(throughput, [m["p95_jct_s"] for m, _ in points], marker="x", linestyle="--",
                color=line.get_color(), label=f"{policy} p95")  # fmt: skip
        for (m, load), x in zip(points, throughput, strict=True):
            ax.annotate(
                f"{load:g}", (x, m["avg_jct_s"]), textcoords="offset points", xytext=(3, 3), fontsize=7
            )
    ax.set_xlabel("throughput (output tokens/s)")
    ax.set_ylabel("workflow JCT (s)")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    unit = (sweep.get("scenario") or {}).get("axis") or (
        "workflows/s" if sweep["load_kind"] == "rate" else "concurrent workflows"
    )
    ax.set_title(f"{sweep['workload']}: latency vs throughput (labels: {unit})", fontsize=9)
    return _save(fig, path)


def plot_cells(results: list[dict[str, Any]], labels: list[str], path: Path, baseline: str) -> Path:
    """Avg JCT as a ratio to ``baseline``, one group of bars per results file (``labels``, in the
    order given: light, mid, peak, bursts) and one bar per preset."""
    presets = list(dict.fromkeys(p for r in results for p in r["policies"]))
    fig, ax = plt.subplots(figsize=(max(6.0, 1.6 * len(results)), 4))
    width = 0.8 / max(1, len(presets))
    for i, preset in enumerate(presets):
        xs, ys = [], []
        for x, result in enumerate(results):
            if preset in result["policies"] and baseline in result["policies"]:
                xs.append(x - 0.4 + (i + 0.5) * width)
                ys.append(result["policies"][preset]["avg_jct_s"] / result["policies"][baseline]["avg_jct_s"])
        ax.bar(xs, ys, width, label=preset, color="black" if preset == baseline else None)
    ax.axhline(1.0, color="black", linewidth=0.8, linestyle="--")
    ax.set_xticks(range(len(results)), labels)
    ax.set_ylabel(f"avg JCT / {baseline}")
    ax.grid(alpha=0.3, axis="y")
    ax.legend(fontsize=7, ncol=3)
    config = results[0]["config"]
    ax.set_title(f"{results[0]['workload']}: {config['gpus']} x {config.get('gpu', 'H100-80G')}, "
                 f"annotations {config['annotations']}", fontsize=9)  # fmt: skip
    return _save(fig, path)


def plot_matrix(results: list[dict[str, Any]], path: Path, baseline: str) -> Path:
    """Avg JCT as a ratio to ``baseline`` against the load, one line per preset: one workload's
    compare files at several closed-loop concurrencies (same annotations)."""
    cells = sorted(results, key=lambda r: r["config"]["concurrency"])
    presets = list(dict.fromkeys(p for r in cells for p in r["policies"]))
    fig, ax = plt.subplots(figsize=(6, 4))
    for preset in presets:
        points = [
            (r["config"]["concurrency"], r["policies"][preset]["avg_jct_s"] / r["policies"][baseline]["avg_jct_s"])
            for r in cells
            if preset in r["policies"] and baseline in r["policies"]
        ]
        baseline_style = preset == baseline
        ax.plot([x for x, _ in points], [y for _, y in points], marker="o", label=preset,
                linestyle="--" if baseline_style else "-", color="black" if baseline_style else None)  # fmt: skip
    ax.set_xscale("log", base=2)
    ax.set_xticks([r["config"]["concurrency"] for r in cells], [str(r["config"]["concurrency"]) for r in cells])
    ax.set_xlabel("closed-loop concurrency (workflows in flight)")
    ax.set_ylabel(f"avg JCT / {baseline}")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    config = cells[0]["config"]
    ax.set_title(f"{cells[0]['workload']}: {config['gpus']} GPUs, annotations {config['annotations']}", fontsize=9)
    return _save(fig, path)
