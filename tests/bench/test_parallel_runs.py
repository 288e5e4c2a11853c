"""Simulated runs in parallel processes give the results they give one after another, and report
their progress as they go."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from clairvoyant.bench.__main__ import main
from clairvoyant.bench.common import RunBars
from clairvoyant.bench.experiment import (
    ExperimentConfig,
    build_cluster,
    compare,
    instance,
    make_annotator,
    run_sim,
)
from clairvoyant.bench.parallel import SimTask, default_jobs, run_tasks
from clairvoyant.bench.sim.simulator import PROGRESS_EVERY_S, SimProgress, Simulator
from clairvoyant.bench.sweep import sweep
from clairvoyant.bench.workloads import get_workload

pytestmark = [pytest.mark.unit, pytest.mark.timeout(300)]

# The profiler's trained state travels to each process: the presets below differ only through it.
PROFILED = ExperimentConfig(workload="react_bfcl", gpus=2, workflows=16, concurrency=8, seed=7, block_size=64,
                            annotations="profiler", warmup_workflows=8)  # fmt: skip
PRESETS = ["fcfs-rr", "pythia", "kairos"]


def _without_wall(value: object) -> object:
    if isinstance(value, dict):
        return {k: _without_wall(v) for k, v in value.items() if k != "wall_seconds"}
    if isinstance(value, list):
        return [_without_wall(v) for v in value]
    return value


def _canonical(result: dict) -> str:
    return json.dumps(_without_wall(json.loads(json.dumps(result, default=str))), sort_keys=True)


def test_compare_in_parallel_equals_compare_in_turn() -> None:
    seen: list[tuple[int, SimProgress]] = []
    in_turn = compare(PROFILED, PRESETS, jobs=1)
    parallel = compare(PROFILED, PRESETS, jobs=2, on_progress=lambda i, where: seen.append((i, where)))
    assert _canonical(parallel) == _canonical(in_turn)
    assert list(parallel["policies"]) == PRESETS  # in the order asked, whichever finished first
    # Not vacuous: the presets' results differ, so a mix-up between runs would show.
    assert parallel["policies"]["pythia"]["avg_jct_s"] != parallel["policies"]["fcfs-rr"]["avg_jct_s"]
    # Every run reported, and each ended with all its workflows done.
    last = {index: where for index, where in seen}
    assert sorted(last) == [0, 1, 2]
    assert all(w.workflows_done == w.workflows_total == PROFILED.workflows for w in last.values())


def test_sweep_in_parallel_equals_sweep_in_turn() -> None:
    config = ExperimentConfig(workload="react_bfcl", gpus=2, seed=3)
    points: list[float] = []

    def run(jobs: int) -> dict:
        return sweep(config, ["fcfs-rr", "least-loaded"], "rate", [0.5, 2.0], workflows=[6, 10], jobs=jobs,
                     on_point=lambda load, _: points.append(load))  # fmt: skip

    in_turn, parallel = run(1), run(2)
    assert _canonical(parallel) == _canonical(in_turn)
    assert sorted(points) == [0.5, 0.5, 2.0, 2.0]  # each level once per sweep, once all its runs ended
    assert [p["policies"]["fcfs-rr"]["workflows"] for p in parallel["points"]] == [6, 10]
    assert parallel["points"][0]["wall_seconds"] == pytest.approx(
        sum(m["wall_seconds"] for m in parallel["points"][0]["policies"].values())
    )


def test_progress_slices_change_no_record() -> None:
    """A run reporting progress every PROGRESS_EVERY_S virtual seconds processes the same events in
    the same order as one without."""
    config = ExperimentConfig(workload="coding_assistant", gpus=2, workflows=10, concurrency=5, seed=2)
    workload = get_workload(config.workload)
    seen: list[SimProgress] = []

    def records(with_progress: bool) -> str:
        replicas, service = build_cluster(workload, config)
        arrivals, backlog = instance(workload, config)
        run = Simulator(replicas, "least-loaded", service_times=service).run(
            arrivals, backlog=backlog, progress=seen.append if with_progress else None
        )
        return json.dumps({"calls": [vars(c) for c in run.calls], "workflows": [vars(w) for w in run.workflows],
                           "depth": run.queue_depth, "duration": run.duration_s}, sort_keys=True)  # fmt: skip

    assert records(True) == records(False)
    assert len(seen) > 10 and seen[-1].virtual_s > 10 * PROGRESS_EVERY_S  # hundreds of virtual seconds
    assert all(b.virtual_s >= a.virtual_s and b.workflows_done >= a.workflows_done for a, b in zip(seen, seen[1:], strict=False))
    assert seen[-1].workflows_done == seen[-1].workflows_total == 10
    assert seen[0].workflows_done < 10


def test_a_failing_run_raises_in_the_caller() -> None:
    tasks = [SimTask(PROFILED, "fcfs-rr", None, run_sim), SimTask(PROFILED, "no-such-preset", None, run_sim)]
    with pytest.raises(ValueError, match="no-such-preset"):
        run_tasks(tasks, jobs=2)
    with pytest.raises(ValueError, match="jobs must be at least 1"):
        run_tasks(tasks, jobs=0)


def test_prepared_annotator_crosses_to_the_processes_intact() -> None:
    prepared = make_annotator(PROFILED)
    tasks = [SimTask(PROFILED, "pythia", prepared, run_sim)] * 2
    first, second = run_tasks(tasks, jobs=2)
    assert _canonical(first) == _canonical(second)
    assert _canonical(first) == _canonical(run_tasks(tasks[:1], jobs=1)[0])


def test_default_jobs_is_one_per_cpu_and_no_more_than_the_runs() -> None:
    assert default_jobs(1) == 1
    assert 1 <= default_jobs(64) <= 64
    assert default_jobs(0) == 1


def test_cli_rejects_bad_jobs(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    base = ["compare", "--workload", "react_bfcl", "--policies", "fcfs-rr", "--gpus", "2", "--workflows", "2",
            "--out", str(tmp_path / "out.json")]  # fmt: skip
    with pytest.raises(SystemExit, match="--jobs must be at least 1, got 0"):
        main([*base, "--jobs", "0"])
    with pytest.raises(SystemExit, match="--jobs applies to --mode sim"):
        main([*base, "--mode", "live", "--jobs", "2"])
    with pytest.raises(SystemExit, match="--jobs must be at least 1, got -1"):
        main(["sweep", "--workload", "react_bfcl", "--policies", "fcfs-rr", "--rates", "1", "--jobs", "-1",
              "--out", str(tmp_path / "s.json")])  # fmt: skip
    assert not (tmp_path / "out.json").exists() and not (tmp_path / "s.json").exists()


def test_progress_goes_to_plain_lines_where_stderr_is_not_a_terminal(capsys: pytest.CaptureFixture[str]) -> None:
    """A log file gets a line per run at its first report, every LINE_EVERY_S seconds, and once at its end."""
    with RunBars(["swe fcfs-rr", "swe pythia"]) as bars:
        bars.update(0, SimProgress(10.0, 0, 8))
        bars.update(0, SimProgress(20.0, 1, 8))  # within LINE_EVERY_S of the last line: quiet
        bars.update(1, SimProgress(10.0, 0, 8))
        bars.update(0, SimProgress(900.0, 8, 8))
        bars.update(0, SimProgress(900.0, 8, 8))  # the run's final call repeats its end: quiet
        bars.print("level 1 done")
    lines = [line.split("] ", 1)[1] for line in capsys.readouterr().err.splitlines()]
    assert lines == [
        "swe fcfs-rr: 0/8 workflows, 10 s virtual",
        "swe pythia: 0/8 workflows, 10 s virtual",
        "swe fcfs-rr: 8/8 workflows, 900 s virtual",
        "level 1 done",
    ]
