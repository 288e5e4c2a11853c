"""Named scenarios: each resolves to valid runs, flags given win over its values, and a scaled-down
point and sweep run in the simulator and name the scenario in their results."""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import pytest

from clairvoyant.bench import cli_experiment, scenarios, sweep
from clairvoyant.bench.__main__ import main
from clairvoyant.bench.arrivals import Replay, azure_replay, parse_arrivals
from clairvoyant.bench.experiment import ExperimentConfig
from clairvoyant.bench.scenarios import SCENARIOS, LoadPoint, Scenario, get_scenario
from clairvoyant.bench.workloads import WorkloadDataError, check_workload_name
from clairvoyant.policy import PRESETS

pytestmark = [pytest.mark.unit, pytest.mark.timeout(120)]

PAPER_SCENARIOS = [
    "autellix-rate",
    "kairos-rate",
    "pythia-fig11",
    "pythia-fig7",
    "pythia-fig9",
    "saga-sessions",
]


def parse(argv: list[str]) -> argparse.Namespace:
    """The CLI's parsers for compare and sweep, as ``python -m clairvoyant.bench`` builds them."""
    parser = argparse.ArgumentParser()
    commands = parser.add_subparsers(dest="command", required=True)
    cli_experiment.add_parsers(commands)
    sweep.add_parsers(commands)
    return parser.parse_args(argv)


def compare_args(*flags: str) -> tuple[argparse.Namespace, dict[str, object] | None]:
    args = parse(["compare", *flags, "--out", "x.json"])
    return args, scenarios.resolve_compare(args)


def check_or_skip(scenario: Scenario) -> None:
    try:
        scenario.check()
    except WorkloadDataError as exc:  # a trace the machine lacks (kairos-rate's Azure arrivals)
        pytest.skip(str(exc))


def test_the_papers_operating_points_are_registered() -> None:
    assert SCENARIOS.names() == PAPER_SCENARIOS


@pytest.mark.parametrize("name", PAPER_SCENARIOS)
def test_every_scenario_resolves_to_valid_runs_at_every_point(name: str) -> None:
    scenario = get_scenario(name)
    check_or_skip(scenario)
    assert scenario.presets and all(preset in PRESETS for preset in scenario.presets)
    for workload, points in scenario.points.items():
        assert check_workload_name(workload) == workload
        loads = [point.load for point in points]
        assert loads == sorted(loads) and len(set(loads)) == len(loads), loads  # an x axis, in order
        for index, point in enumerate(points):
            args, record = compare_args("--scenario", name, "--workload", workload, "--point", str(index))
            assert record == {"name": name, "figure": scenario.figure, "point": index, "load": point.load,
                              "axis": scenario.axis}  # fmt: skip
            assert (args.workload, args.gpus, args.workflows) == (workload, scenario.gpus, point.workflows)
            assert args.policies.split(",") == list(scenario.presets)
            load = {"rate": args.rate, "concurrency": args.concurrency, "arrivals": args.arrivals}
            assert [key for key, value in load.items() if value is not None] == [scenario.load_kind]
            if args.arrivals is not None:
                parse_arrivals(args.arrivals)
            else:
                assert load[scenario.load_kind] == point.load
            ExperimentConfig(workload=args.workload, gpus=args.gpus, workflows=args.workflows, rate=args.rate,
                             concurrency=args.concurrency, arrivals=args.arrivals)  # fmt: skip


def test_compare_takes_the_scenarios_default_point_and_settings() -> None:
    args, record = compare_args("--scenario", "pythia-fig11")
    assert record is not None and record["point"] == 3 and record["load"] == 4
    assert args.arrivals == "bursty:rate=0.3,cv=4" and args.rate is None and args.concurrency is None
    assert (args.workload, args.gpus, args.workflows) == ("coding_assistant", 4, 256)
    assert (args.block_size, args.annotations, args.warmup_workflows) == (64, "profiler", 32)
    assert args.policies == "vllm-prodstack,sglang-gw,continuum,autellix,thunderagent,pythia"


def test_flags_given_override_the_scenario_even_at_their_usual_default() -> None:
    args, record = compare_args("--scenario", "pythia-fig7", "--gpus", "8", "--workflows", "5", "--block-size", "16",
                                "--annotations", "none", "--policies", "fcfs-rr,pythia", "--rate", "0.5")  # fmt: skip
    assert (args.gpus, args.workflows, args.block_size, args.annotations) == (8, 5, 16, "none")
    assert args.policies == "fcfs-rr,pythia"
    assert (args.rate, args.concurrency, args.arrivals) == (0.5, None, None)
    assert (
        record is not None and record["point"] is None and record["load"] is None
    )  # not the scenario's load
    args, _ = compare_args("--scenario", "autellix-rate", "--workload", "mcts_lats", "--point", "0")
    assert (args.rate, args.workflows, args.gpus) == (
        0.2,
        60,
        1,
    )  # the workload's own points: 0.2/s for 300 s


def test_a_live_compare_takes_the_load_but_not_the_simulator_settings() -> None:
    args, record = compare_args("--scenario", "pythia-fig7", "--mode", "live", "--point", "0")
    assert record is not None and (args.concurrency, args.workflows, args.gpus) == (32, 48, 4)
    assert (args.block_size, args.annotations, args.warmup_workflows) == (16, "none", 64)


def test_a_workload_the_figure_did_not_use_runs_at_the_default_workloads_points() -> None:
    args, _ = compare_args("--scenario", "pythia-fig7", "--workload", "swe_agent", "--point", "1")
    assert (args.workload, args.concurrency, args.workflows) == ("swe_agent", 64, 96)


def test_without_a_scenario_compare_keeps_its_usual_defaults() -> None:
    args, record = compare_args("--workload", "react_bfcl", "--policies", "fcfs-rr")
    assert record is None
    assert (args.gpus, args.workflows, args.block_size, args.annotations, args.warmup_workflows) == (
        8,
        64,
        16,
        "none",
        64,
    )
    run = parse(["run", "--workload", "react_bfcl", "--policy", "fcfs-rr", "--out", "x.json"])
    assert scenarios.resolve_compare(run) is None and run.gpus == 8


@pytest.mark.parametrize(
    ("flags", "message"),
    [
        (
            ["--scenario", "pythia-fig99"],
            "unknown scenario 'pythia-fig99'; choose one of: " + ", ".join(PAPER_SCENARIOS),
        ),
        (
            ["--scenario", "pythia-fig9", "--point", "3"],
            "--point 3: pythia-fig9 has points 0-2 for coding_assistant",
        ),
        (["--scenario", "pythia-fig9", "--point", "-1"], "--point -1: pythia-fig9 has points 0-2"),
        (["--workload", "react_bfcl", "--point", "1"], "--point needs --scenario"),
        (["--policies", "fcfs-rr"], "compare needs --workload (or --scenario NAME"),
    ],
)
def test_bad_scenario_options_are_refused_by_name(flags: list[str], message: str) -> None:
    with pytest.raises(SystemExit) as raised:
        compare_args(*flags)
    assert message in str(raised.value)


def test_scenario_list_and_the_scenarios_command_print_every_scenario(
    capsys: pytest.CaptureFixture[str],
) -> None:
    with pytest.raises(SystemExit) as raised:
        parse(["sweep", "--scenario", "list"])  # before the required --out is missed
    assert raised.value.code == 0
    listed = capsys.readouterr().out
    assert main(["scenarios"]) == 0
    assert capsys.readouterr().out == listed
    for name in PAPER_SCENARIOS:
        assert f"{name} " in listed and get_scenario(name).figure in listed
    assert "Pythia §7.3, Fig. 11" in listed and "CV of the arrival intervals 0, 1, 2, 4 (default 4)" in listed


def test_check_names_the_bad_value() -> None:
    good = get_scenario("autellix-rate")

    def one_point(point: LoadPoint, workload: str = "chatbot", **changes: object) -> Scenario:
        return Scenario(**{**vars(good), "points": {workload: (point,)}, "default_point": 0, **changes})  # type: ignore[arg-type]

    bad = [
        (Scenario(**{**vars(good), "presets": ("fcfs-rr", "vllm")}), "unknown presets ['vllm']"),
        (
            one_point(LoadPoint(2.5, 8), load_kind="concurrency"),
            "load 2.5: a concurrency must be a whole number",
        ),
        (one_point(LoadPoint(1, 8, "poisson:rate=1")), "an arrival process goes with load kind 'arrivals'"),
        (
            one_point(LoadPoint(1, 8), load_kind="arrivals"),
            "an arrival process goes with load kind 'arrivals'",
        ),
        (one_point(LoadPoint(0, 8)), "load 0: a rate must be > 0"),
        (one_point(LoadPoint(1, 0)), "workflows must be >= 1, got 0"),
        (one_point(LoadPoint(1, 8, "bursty:rate=1"), load_kind="arrivals"), "bursty: missing cv"),
        (one_point(LoadPoint(1, 8), workload="no_such_workload"), "no_such_workload"),
        (
            Scenario(**{**vars(good), "default_point": 6}),
            "default point 6 out of range for chatbot's 6 points",
        ),
        (Scenario(**{**vars(good), "load_kind": "bursts"}), "load kind must be one of"),
    ]
    for scenario, message in bad:
        with pytest.raises(ValueError) as raised:
            scenario.check()
        assert message in str(raised.value)


def test_sweep_resolves_every_point_and_its_flags_override() -> None:
    args = parse(["sweep", "--scenario", "autellix-rate", "--workload", "react_bfcl", "--out", "x.json"])
    plan = scenarios.resolve_sweep(args, loads_given=False)
    assert (plan.load_kind, plan.loads, plan.arrivals) == ("rate", [4, 8, 12, 16, 20, 24], None)
    assert plan.workflows == [480, 960, 1440, 1920, 2400, 2880]  # 120 s of arrivals at each rate
    assert (args.policies, args.gpus, args.annotations) == ("fcfs-rr,mlfq,autellix", 1, "none")
    args = parse(["sweep", "--scenario", "pythia-fig9", "--workflows", "4", "--out", "x.json"])
    plan = scenarios.resolve_sweep(args, loads_given=False)
    assert plan.workflows == [] and args.workflows == "4"
    assert plan.arrivals == [f"cron:period_s=300,batch={b}" for b in (32, 64, 96)]
    args = parse(["sweep", "--scenario", "pythia-fig9", "--concurrencies", "2,4", "--out", "x.json"])
    plan = scenarios.resolve_sweep(args, loads_given=True)
    assert (plan.loads, plan.workflows, plan.record["axis"]) == ([], [], None) and args.workflows == "64"


def test_a_scaled_down_point_runs_and_its_results_name_the_scenario_and_point(tmp_path: Path) -> None:
    out = tmp_path / "point.json"
    flags = ["--scenario", "autellix-rate", "--workload", "react_bfcl", "--point", "1", "--workflows", "6"]
    assert main(["compare", *flags, "--policies", "fcfs-rr,autellix", "--jobs", "1", "--out", str(out)]) == 0
    data = json.loads(out.read_text())
    assert data["scenario"] == {"name": "autellix-rate", "figure": "Autellix §6.3, Fig. 12 (tails: Fig. 13)",
                                "point": 1, "load": 8.0, "axis": "programs/s"}  # fmt: skip
    assert data["workload"] == "react_bfcl"
    assert (data["config"]["rate"], data["config"]["gpus"], data["config"]["block_size"]) == (8.0, 1, 64)
    for metrics in data["policies"].values():
        assert metrics["workflows"] == 6 and metrics["avg_jct_s"] > 0


def test_a_scaled_down_sweep_runs_every_point_of_an_arrivals_scenario(tmp_path: Path) -> None:
    out = tmp_path / "sweep.json"
    flags = ["--scenario", "pythia-fig11", "--workflows", "3", "--gpus", "2", "--annotations", "none"]
    assert main(["sweep", *flags, "--policies", "fcfs-rr", "--jobs", "1", "--out", str(out)]) == 0
    data = json.loads(out.read_text())
    assert data["scenario"] == {"name": "pythia-fig11", "figure": "Pythia §7.3, Fig. 11",
                                "axis": "CV of the arrival intervals"}  # fmt: skip
    assert (data["load_kind"], data["loads"]) == ("arrivals", [0, 1, 2, 4])
    assert [p["config"]["arrivals"] for p in data["points"]] == [
        f"bursty:rate=0.3,cv={cv}" for cv in (0, 1, 2, 4)
    ]
    assert [p["policies"]["fcfs-rr"]["workflows"] for p in data["points"]] == [3, 3, 3, 3]


def test_sweep_refuses_arrivals_that_do_not_match_the_levels() -> None:
    config = ExperimentConfig(workload="react_bfcl", gpus=1, workflows=2)
    with pytest.raises(ValueError, match="one arrival process per load level"):
        sweep.sweep(config, ["fcfs-rr"], "arrivals", [1.0, 2.0], arrivals=["poisson:rate=1"])
    with pytest.raises(ValueError, match="one arrival process per load level"):
        sweep.sweep(config, ["fcfs-rr"], "rate", [1.0], arrivals=["poisson:rate=1"])


def test_azure_replay_takes_a_mean_rate_instead_of_a_scale() -> None:
    try:
        replay, unscaled = azure_replay("conv", rate=4.0), azure_replay("conv")
    except WorkloadDataError as exc:
        pytest.skip(str(exc))
    assert isinstance(replay, Replay) and isinstance(unscaled, Replay)
    assert replay.mean_rate == pytest.approx(4.0)
    assert replay.scale == pytest.approx(4.0 / unscaled.mean_rate)
    with pytest.raises(ValueError, match="give scale or a positive rate, not both"):
        azure_replay("conv", scale=2.0, rate=4.0)
