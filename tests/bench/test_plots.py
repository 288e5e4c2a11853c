"""Plots and the series behind them: JCT lists, queue depth over time, sweeps, the PNG files."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from clairvoyant.bench.__main__ import main
from clairvoyant.bench.experiment import ExperimentConfig, build_cluster, instance
from clairvoyant.bench.metrics import queue_depth_series
from clairvoyant.bench.sim.simulator import Simulator
from clairvoyant.bench.workloads import get_workload

pytestmark = [pytest.mark.unit, pytest.mark.timeout(120)]

PNG_MAGIC = b"\x89PNG\r\n\x1a\n"
TINY = ["--workload", "react_bfcl", "--policies", "fcfs-rr,least-loaded", "--gpus", "2", "--workflows", "8"]


def _assert_png(path: Path) -> None:
    data = path.read_bytes()
    assert data[:8] == PNG_MAGIC, path
    assert len(data) > 5_000, (path, len(data))  # axes, lines and labels, not an empty canvas


def test_compare_results_carry_the_series_and_plot(tmp_path: Path) -> None:
    results = tmp_path / "tiny.json"
    assert main(["compare", *TINY, "--rate", "2", "--out", str(results)]) == 0
    data = json.loads(results.read_text())
    for metrics in data["policies"].values():
        assert len(metrics["jct_s"]) == metrics["workflows"] == 8
        assert sum(metrics["jct_s"]) / 8 == pytest.approx(metrics["avg_jct_s"])
        series = metrics["queue_depth_series"]
        assert set(series) == {"llama-3.1-8b"}
        points = series["llama-3.1-8b"]
        assert 0 < len(points) <= 500
        times = [t for t, _ in points]
        assert times == sorted(times) and times[0] >= 0.0
        assert all(depth >= 0 for _, depth in points) and points[-1][1] == 0  # everything started
    assert main(["plot", str(results), "--out-dir", str(tmp_path / "img")]) == 0
    for name in ("tiny-jct-cdf.png", "tiny-queue-depth.png"):
        _assert_png(tmp_path / "img" / name)


def test_queue_depth_series_is_exact_then_keeps_peaks_when_downsampled() -> None:
    """Exact: the area under depth(t) is the total time calls spent queued (sum of queue_s)."""
    config = ExperimentConfig(workload="react_bfcl", gpus=1, workflows=30, rate=4.0, seed=5)
    workload = get_workload(config.workload)
    replicas, service = build_cluster(workload, config)
    arrivals, _ = instance(workload, config)
    records = Simulator(replicas, "fcfs-rr", service_times=service).run(arrivals)
    exact = queue_depth_series(records, points=10_000)["llama-3.1-8b"]
    area = sum(d * (t1 - t0) for (t0, d), (t1, _) in zip(exact, exact[1:], strict=False))
    assert area == pytest.approx(sum(c.queue_s for c in records.calls), rel=1e-9)
    peak = max(d for _, d in exact)
    assert peak >= 2  # a loaded single replica: calls do wait
    coarse = queue_depth_series(records, points=20)["llama-3.1-8b"]
    assert len(coarse) == 20 and max(d for _, d in coarse) == peak
    assert coarse[0][0] == exact[0][0]


def test_sweep_stores_each_load_level_and_plots_latency_against_throughput(tmp_path: Path) -> None:
    out = tmp_path / "sweep.json"
    assert main(["sweep", *TINY, "--rates", "0.5,4", "--out", str(out)]) == 0
    data = json.loads(out.read_text())
    assert data["kind"] == "sweep" and data["load_kind"] == "rate" and data["loads"] == [0.5, 4.0]
    assert [p["config"]["rate"] for p in data["points"]] == [0.5, 4.0]
    for point in data["points"]:
        assert set(point["policies"]) == {"fcfs-rr", "least-loaded"}
        assert all(len(m["jct_s"]) == 8 for m in point["policies"].values())
    # The same programs arrive 8x faster: throughput rises (the run is shorter).
    slow, fast = (p["policies"]["fcfs-rr"] for p in data["points"])
    assert fast["throughput_tok_s"] > slow["throughput_tok_s"]
    assert main(["plot", str(out), "--out-dir", str(tmp_path), "--load", "4"]) == 0
    for name in ("sweep-latency-throughput.png", "sweep-4-jct-cdf.png", "sweep-4-queue-depth.png"):
        _assert_png(tmp_path / name)


def test_closed_loop_sweep_runs_its_own_workflow_count_at_each_level(tmp_path: Path) -> None:
    out = tmp_path / "loop.json"
    args = ["--workload", "react_bfcl", "--policies", "fcfs-rr", "--gpus", "1"]
    assert main(["sweep", *args, "--concurrencies", "1,3", "--workflows", "2,6", "--out", str(out)]) == 0
    points = json.loads(out.read_text())["points"]
    assert [(p["config"]["concurrency"], p["config"]["workflows"]) for p in points] == [(1, 2), (3, 6)]
    assert [len(p["policies"]["fcfs-rr"]["jct_s"]) for p in points] == [2, 6]


def test_presets_run_apart_merge_into_the_compare_of_all_and_the_matrix_report_plots(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """merge: two compares of one config equal one compare of both presets (but for wall time);
    configs that differ, or a preset in two parts, are refused.  matrix-report: ratio tables and
    one avg-JCT-ratio plot per workload over its loads."""
    def compare(policies: str, concurrency: int, name: str) -> Path:
        out = tmp_path / f"{name}.json"
        args = ["compare", "--workload", "react_bfcl", "--gpus", "2", "--workflows", str(concurrency),
                "--concurrency", str(concurrency), "--policies", policies, "--out", str(out)]  # fmt: skip
        assert main(args) == 0
        return out

    def without_wall(path: Path) -> dict:
        data = json.loads(path.read_text())
        data.pop("wall_seconds")
        for metrics in data["policies"].values():
            metrics.pop("wall_seconds")
        return data

    both = compare("fcfs-rr,mlfq", 6, "both")
    merged = tmp_path / "merged.json"
    assert main(["merge", str(compare("fcfs-rr", 6, "a")), str(compare("mlfq", 6, "b")), "--out", str(merged)]) == 0
    assert without_wall(merged) == without_wall(both)
    with pytest.raises(SystemExit, match="config differs"):
        main(["merge", str(both), str(compare("mlfq", 12, "other")), "--out", str(tmp_path / "x.json")])
    with pytest.raises(SystemExit, match=r"\['mlfq'\] in two parts"):
        main(["merge", str(both), str(tmp_path / "b.json"), "--out", str(tmp_path / "x.json")])

    heavier = compare("fcfs-rr,mlfq", 12, "heavier")
    capsys.readouterr()
    assert main(["matrix-report", str(both), str(heavier), "--baseline", "fcfs-rr", "--plots", str(tmp_path)]) == 0
    printed = capsys.readouterr().out
    data = json.loads(both.read_text())["policies"]
    ratio = data["mlfq"]["avg_jct_s"] / data["fcfs-rr"]["avg_jct_s"]
    assert "react_bfcl, 2 GPUs (H100-80G), concurrency 6, 6 workflows, annotations none" in printed
    assert f"| mlfq | {data['mlfq']['avg_jct_s']:.1f} |" in printed and f"| {ratio:.3f} |" in printed
    assert printed.count("| fcfs-rr |") == 2 and "| 1.000 | 1.000 | 1.000 |" in printed
    _assert_png(tmp_path / "matrix-react_bfcl-none.png")
    with pytest.raises(SystemExit, match="no 'vllm-prodstack'"):
        main(["matrix-report", str(both)])


def test_headline_cells_report_stacks_and_the_limit_and_plot_bars_per_load(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Cells run with --own-stacks under a closed loop and under bursts: the table names each
    preset's cache and scaling policies and its distance from the capacity-aware limit, and the
    plot has one bar group per cell (the loads are not all closed loops)."""
    base = ["compare", "--workload", "react_bfcl", "--gpus", "2", "--own-stacks", "--host-cache", "auto",
            "--policies", "vllm-prodstack,pythia"]  # fmt: skip
    light = tmp_path / "headline-react_bfcl-light.json"
    bursts = tmp_path / "headline-react_bfcl-bursts.json"
    assert main([*base, "--concurrency", "4", "--workflows", "6", "--out", str(light)]) == 0
    assert main([*base, "--arrivals", "cron:period_s=30,batch=6", "--workflows", "12", "--out", str(bursts)]) == 0
    capsys.readouterr()
    assert main(["matrix-report", str(light), str(bursts), "--plots", str(tmp_path)]) == 0
    printed = capsys.readouterr().out
    assert "arrivals cron:period_s=30,batch=6, 12 workflows" in printed
    assert "| preset | cache, scaling | avg JCT s |" in printed and "| over limit | limit s |" in printed
    data = json.loads(bursts.read_text())["policies"]["pythia"]
    assert data["stack"] == {"cache": "pythia", "scaling": "pythia"}
    assert f"| pythia | pythia, pythia | {data['avg_jct_s']:.1f} |" in printed
    base = json.loads(bursts.read_text())["policies"]["vllm-prodstack"]
    held = data["autoscaling"]["gpu_seconds"] / (2 * base["virtual_seconds"])  # the baseline holds 2 GPUs throughout
    assert f"| {data['avg_jct_over_limit']:.2f} | {data['limit_avg_jct_s']:.1f} | {held:.3f} |" in printed
    assert data["avg_jct_over_limit"] >= 1.0
    _assert_png(tmp_path / "headline-react_bfcl-none.png")

    # --summary: one row per cell, the focus preset against the baseline and the best rival
    capsys.readouterr()
    assert main(["matrix-report", str(light), str(bursts), "--summary", "--focus", "pythia",
                 "--rivals", "vllm-prodstack"]) == 0  # fmt: skip
    rows = [line for line in capsys.readouterr().out.splitlines() if line.startswith("| react_bfcl |")]
    assert len(rows) == 2 and rows[0].startswith("| react_bfcl | light | concurrency 4 |")
    cells = [c.strip() for c in rows[1].split("|")[1:-1]]
    assert cells[:3] == ["react_bfcl", "bursts", "arrivals cron:period_s=30,batch=6"]
    assert float(cells[4]) == pytest.approx(data["avg_jct_s"] / base["avg_jct_s"], abs=1e-3)
    assert cells[7] == "vllm-prodstack" and float(cells[8]) == pytest.approx(float(cells[4]), abs=2e-3)
    assert cells[11] == min(("vllm-prodstack", "pythia"), key=lambda p: json.loads(bursts.read_text())["policies"][p]["avg_jct_s"])
    with pytest.raises(SystemExit, match="no 'clairvoyant'"):
        main(["matrix-report", str(light), "--summary"])
