"""Simulator runs on built-in workloads: determinism, the lower bound, Little's law, the CLI."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import numpy as np
import pytest

from clairvoyant.bench import experiment
from clairvoyant.bench.__main__ import main
from clairvoyant.bench.arrivals import Bursty
from clairvoyant.bench.experiment import ExperimentConfig, build_cluster, compare, instance
from clairvoyant.bench.sim.annotations import ProfilerAnnotator
from clairvoyant.bench.sim.simulator import Simulator
from clairvoyant.bench.sweep import sweep
from clairvoyant.bench.workloads import get_workload

pytestmark = [pytest.mark.unit, pytest.mark.timeout(300)]
SMALL = ExperimentConfig(workload="react_bfcl", gpus=2, workflows=24, rate=0.5, seed=7)


def _without_wall(result: dict) -> dict:
    result = json.loads(json.dumps(result, default=str))
    result.pop("wall_seconds")
    for metrics in result["policies"].values():
        metrics.pop("wall_seconds")
    return result


def test_same_seed_gives_byte_identical_results() -> None:
    first = json.dumps(_without_wall(compare(SMALL, ["fcfs-rr", "least-loaded"])), sort_keys=True)
    second = json.dumps(_without_wall(compare(SMALL, ["fcfs-rr", "least-loaded"])), sort_keys=True)
    assert first == second
    other_seed = ExperimentConfig(**{**vars(SMALL), "seed": 8})
    assert json.dumps(_without_wall(compare(other_seed, ["fcfs-rr"])), sort_keys=True) != first


def test_lower_bound_never_exceeds_a_measured_jct() -> None:
    config = ExperimentConfig(workload="coding_assistant", gpus=4, workflows=8, concurrency=8, seed=3)
    workload = get_workload(config.workload)
    replicas, service = build_cluster(workload, config)
    arrivals, backlog = instance(workload, config)
    records = Simulator(replicas, "fcfs-rr", service_times=service).run(arrivals, backlog=backlog)
    assert len(records.workflows) == 8
    for workflow in records.workflows:
        assert 0 < workflow.lower_bound_s <= workflow.jct_s + 1e-9
    # Closed loop at concurrency 8 with 8 workflows: all start together at t=0.
    assert {w.arrival_time for w in records.workflows} == {0.0}


def test_littles_law_on_a_steady_run() -> None:
    """Time-average workflows in the system = arrival rate x average JCT (within sampling noise)."""
    rate = 1.0
    config = ExperimentConfig(workload="react_bfcl", gpus=2, workflows=300, rate=rate, seed=11)
    workload = get_workload(config.workload)
    replicas, service = build_cluster(workload, config)
    arrivals, _ = instance(workload, config)
    records = Simulator(replicas, "fcfs-rr", service_times=service).run(arrivals)
    spans = np.array([(w.arrival_time, w.end_time) for w in records.workflows])
    horizon = spans[:, 0].max()  # measure while arrivals still come in (steady state)
    samples = np.linspace(horizon * 0.1, horizon, 2000)
    in_system = [(np.sum((spans[:, 0] <= t) & (spans[:, 1] > t))) for t in samples]
    average_jct = float(np.mean(spans[:, 1] - spans[:, 0]))
    assert np.mean(in_system) == pytest.approx(rate * average_jct, rel=0.15)


def test_cli_compare_writes_the_documented_keys(tmp_path: Path) -> None:
    out = tmp_path / "compare.json"
    code = main(["compare", "--workload", "react_bfcl", "--policies", "fcfs-rr,least-loaded", "--gpus", "2",
                 "--workflows", "6", "--rate", "1", "--out", str(out)])
    assert code == 0
    result = json.loads(out.read_text())
    assert {"workload", "mode", "seed", "wall_seconds", "policies"} <= set(result)
    for metrics in result["policies"].values():
        assert {"avg_jct_s", "p95_jct_s", "p99_jct_s", "throughput_tok_s", "workflows_per_min", "avg_queue_s",
                "cache_hit_ratio", "preemptions", "lower_bound_avg_jct_s", "distance_from_limit",
                "virtual_seconds"} <= set(metrics)
        assert metrics["workflows"] == 6 and metrics["distance_from_limit"] >= 1.0
        assert metrics["cache_hit_ratio_by_tier"] == {"gpu": metrics["cache_hit_ratio"]}
        assert 0.0 < metrics["cache_hit_ratio"] < 1.0 and metrics["rejected_calls"] == 0


@pytest.mark.parametrize(
    ("workload_name", "concurrency", "policy"),
    [("coding_assistant", 6, "fcfs-rr"), ("swe_agent", 4, "least-loaded"), ("react_bfcl", 12, "fcfs-rr")],
)
def test_fast_forwarded_decode_runs_change_no_record(workload_name: str, concurrency: int, policy: str) -> None:
    """Decode runs taken in one event (cut whenever a call is dispatched to the replica) leave every
    call's and workflow's times, cache hits and the preemption count exactly as step-by-step."""
    config = ExperimentConfig(workload=workload_name, gpus=2, workflows=concurrency + 4, concurrency=concurrency, seed=5)
    workload = get_workload(config.workload)

    def records(fast_forward: bool) -> str:
        replicas, service = build_cluster(workload, config)
        arrivals, backlog = instance(workload, config)
        simulator = Simulator(replicas, policy, service_times=service, fast_forward=fast_forward)
        run = simulator.run(arrivals, backlog=backlog)
        assert run.workflows and all(w.end_time is not None for w in run.workflows)
        return json.dumps(
            {"calls": [vars(c) for c in run.calls], "workflows": [vars(w) for w in run.workflows],
             "preemptions": run.preemptions, "depth": run.queue_depth},
            sort_keys=True,
        )  # fmt: skip

    assert records(fast_forward=True) == records(fast_forward=False)


PROFILED = ExperimentConfig(workload="react_bfcl", gpus=2, workflows=16, concurrency=8, seed=7, block_size=64,
                            annotations="profiler", warmup_workflows=8)  # fmt: skip


def _metrics(result: dict) -> dict:
    return {p: {k: v for k, v in m.items() if k != "wall_seconds"} for p, m in result.items()}


def test_compare_warms_the_profiler_up_once_and_gives_each_preset_the_same_trained_state(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Each preset's numbers equal a run of that preset alone with its own warm-up, and do not
    depend on which presets share the compare or in what order."""
    warm_ups: list[int] = []
    real_warm_up = experiment.warm_up

    def counted(*args: object, **kwargs: object) -> object:
        warm_ups.append(1)
        return real_warm_up(*args, **kwargs)  # type: ignore[arg-type]

    monkeypatch.setattr(experiment, "warm_up", counted)
    together = _metrics(compare(PROFILED, ["pythia", "kairos", "fcfs-rr"])["policies"])
    assert len(warm_ups) == 1
    alone = {p: _metrics({p: experiment.run_sim(PROFILED, p)})[p] for p in ("pythia", "kairos", "fcfs-rr")}
    assert len(warm_ups) == 4  # run_sim without a prepared annotator warms up itself
    assert together == alone
    reordered = _metrics(compare(PROFILED, ["fcfs-rr", "pythia"])["policies"])
    assert reordered == {p: together[p] for p in ("fcfs-rr", "pythia")}
    # The annotations matter here (else the check above would be vacuous): pythia differs from FCFS.
    assert together["pythia"]["avg_jct_s"] != together["fcfs-rr"]["avg_jct_s"]


def test_run_sim_leaves_the_prepared_annotator_untouched() -> None:
    prepared = experiment.make_annotator(PROFILED)
    assert isinstance(prepared, ProfilerAnnotator)
    profile = prepared.store.profiles[("default", "react_bfcl")]
    learnt, offset = profile.instances, prepared.time_offset
    assert learnt == PROFILED.warmup_workflows
    experiment.run_sim(PROFILED, "pythia", prepared)
    assert (profile.instances, prepared.time_offset) == (learnt, offset)
    assert experiment.make_annotator(dataclasses.replace(PROFILED, annotations="none")) is None
    with pytest.raises(ValueError, match="unknown annotations 'psychic'"):
        experiment.make_annotator(dataclasses.replace(PROFILED, annotations="psychic"))


def test_compare_says_when_the_warm_up_left_the_profile_unconverged(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """8 warm-up workflows leave react_bfcl in SHADOW, 64 reach LOW: the file records the tiers
    either way, and the CLI warns (before the runs) only for the first."""
    short = compare(dataclasses.replace(PROFILED, workflows=4), ["fcfs-rr"])
    assert short["warmup"] == {"workflows": 8, "tiers": {"react_bfcl": "shadow"}, "unserved": ["react_bfcl"]}
    long = compare(dataclasses.replace(PROFILED, workflows=4, warmup_workflows=64), ["fcfs-rr"])
    assert long["warmup"] == {"workflows": 64, "tiers": {"react_bfcl": "low"}, "unserved": []}
    assert "warmup" not in compare(dataclasses.replace(PROFILED, workflows=4, annotations="oracle"), ["fcfs-rr"])
    assert experiment.warmup_warning(long["warmup"]) is None
    assert experiment.warmup_warning({"workflows": 0, "tiers": {}, "unserved": []}) is None

    out = tmp_path / "short.json"
    assert main(["compare", "--workload", "react_bfcl", "--policies", "fcfs-rr", "--gpus", "2", "--workflows", "4",
                 "--concurrency", "4", "--block-size", "64", "--annotations", "profiler", "--warmup-workflows", "8",
                 "--seed", "7", "--out", str(out)]) == 0  # fmt: skip
    errors = capsys.readouterr().err
    assert "warm-up of 8 workflows the profile of react_bfcl (shadow) has not converged" in errors
    assert "--warmup-workflows" in errors
    assert json.loads(out.read_text())["warmup"]["unserved"] == ["react_bfcl"]
    # A sweep warms up once per level, and each point says what its warm-up left.
    swept = sweep(dataclasses.replace(PROFILED, workflows=4), ["fcfs-rr"], "concurrency", [2, 4])
    assert [point["warmup"]["tiers"] for point in swept["points"]] == [{"react_bfcl": "shadow"}] * 2


def test_an_arrival_process_given_as_text_drives_the_instance(tmp_path: Path) -> None:
    """``--arrivals``: the workflows start at the process's times (drawn from the instance's
    arrival stream), the same for every preset; bad text is refused before anything runs."""
    config = ExperimentConfig(workload="react_bfcl", gpus=2, workflows=20, seed=4, arrivals="bursty:rate=0.5,cv=3")
    arrivals, backlog = instance(get_workload(config.workload), config)
    expected = Bursty(0.5, 3.0).times(np.random.default_rng([4, 1]), count=20)
    assert [t for t, _ in arrivals] == expected.tolist() and backlog == []
    out = tmp_path / "bursty.json"
    assert main(["compare", "--workload", "react_bfcl", "--policies", "fcfs-rr,least-loaded", "--gpus", "2",
                 "--workflows", "20", "--seed", "4", "--arrivals", "bursty:rate=0.5,cv=3", "--jobs", "1",
                 "--out", str(out)]) == 0  # fmt: skip
    result = json.loads(out.read_text())
    assert result["config"]["arrivals"] == "bursty:rate=0.5,cv=3"
    assert all(m["workflows"] == 20 for m in result["policies"].values())
    assert result["policies"]["fcfs-rr"]["virtual_seconds"] >= expected[-1] - expected[0]

    with pytest.raises(ValueError, match="at most one of rate, concurrency and arrivals, got rate and arrivals"):
        instance(get_workload("react_bfcl"), dataclasses.replace(config, rate=1.0))
    bad = tmp_path / "bad.json"
    with pytest.raises(SystemExit, match="--arrivals: bursty: missing cv; it takes rate, cv"):
        main(["run", "--workload", "react_bfcl", "--policy", "fcfs-rr", "--arrivals", "bursty:rate=1",
              "--out", str(bad)])  # fmt: skip
    assert not bad.exists()


def test_merge_reads_files_written_before_a_config_key_existed(tmp_path: Path) -> None:
    """A results file from before ``arrivals`` existed merges with one written now."""
    def compare_file(policy: str, drop_arrivals: bool) -> Path:
        out = tmp_path / f"{policy}.json"
        assert main(["compare", "--workload", "react_bfcl", "--policies", policy, "--gpus", "2", "--workflows", "4",
                     "--rate", "1", "--jobs", "1", "--out", str(out)]) == 0  # fmt: skip
        if drop_arrivals:
            result = json.loads(out.read_text())
            del result["config"]["arrivals"]
            out.write_text(json.dumps(result))
        return out

    old, new = compare_file("fcfs-rr", drop_arrivals=True), compare_file("least-loaded", drop_arrivals=False)
    merged = tmp_path / "merged.json"
    assert main(["merge", str(old), str(new), "--out", str(merged)]) == 0
    assert set(json.loads(merged.read_text())["policies"]) == {"fcfs-rr", "least-loaded"}


def test_run_compare_sweep_and_evaluate_take_a_spec_file(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """``--workload path/to/spec.yaml`` (docs/workloads.md): validated first, then run like a name."""
    import yaml

    from clairvoyant.profiler.evaluation.data import DataError, source
    from tests.bench.test_workloads_spec import tiny_spec

    spec = tmp_path / "mine.yaml"
    spec.write_text(yaml.safe_dump(tiny_spec()))
    out = tmp_path / "run.json"
    assert main(["run", "--workload", str(spec), "--policy", "fcfs-rr", "--gpus", "2", "--workflows", "3",
                 "--rate", "1", "--out", str(out)]) == 0  # fmt: skip
    result = json.loads(out.read_text())
    assert result["workload"] == str(spec) and result["policies"]["fcfs-rr"]["workflows"] == 3
    assert len(source(f"workload:{spec}")(1, 2, None)) == 2  # profiler evaluate --data workload:<spec>

    broken = tiny_spec()
    broken["agents"]["planner"]["output"]["cv"] = -1
    bad = tmp_path / "bad.yaml"
    bad.write_text(yaml.safe_dump(broken))
    for argv in (["compare", "--workload", str(bad), "--policies", "fcfs-rr"],
                 ["sweep", "--workload", str(tmp_path / "missing.yaml"), "--policies", "fcfs-rr"]):  # fmt: skip
        with pytest.raises(SystemExit) as exited:
            main(argv)
        assert exited.value.code == 2
    errors = capsys.readouterr().err
    assert "agents.planner.output.cv" in errors and "no workload spec file at" in errors
    with pytest.raises(DataError, match="agents.planner.output.cv"):
        source(f"workload:{bad}")
