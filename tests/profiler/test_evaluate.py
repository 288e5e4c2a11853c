"""The offline evaluation: exact metrics on a workload of known structure, the report on real data,
and clear errors."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from clairvoyant.profiler.core.confidence import ConfidenceConfig
from clairvoyant.profiler.core.profile_types import ProfileConfig
from clairvoyant.profiler.evaluation.cli import main
from clairvoyant.profiler.evaluation.data import DataError, load_workflows, source
from clairvoyant.profiler.evaluation.replay import replay

pytestmark = pytest.mark.unit

FRACTIONS = (
    "length_interval_coverage",
    "path_acceptance",
    "next_agent_top1",
    "remaining_steps_predicted",
    "priority_ordering_accuracy",
    "priority_ordering_accuracy_kairos_rank",
)
KEYS = (
    *FRACTIONS,
    "workflows_train",
    "workflows_test",
    "length_interval_width_ratio",
    "remaining_steps_mae",
    "workflows_to_converge",
    "annotate_p50_ms",
    "annotate_p99_ms",
    "ingest_records_per_s",
)


def test_a_linear_workload_is_predicted_exactly() -> None:
    """report_generate is researcher -> writer: the structure is certain, so every structural
    metric is exact once the profile leaves shadow (it is ungated here: 30 instances suffice)."""
    workflows = load_workflows("workload:report_generate", seed=1, limit=60, hash_tokens=256)
    config = ProfileConfig(confidence=ConfidenceConfig(require_convergence=False))
    report = replay(workflows, 0.3, config)
    assert (report["workflows_train"], report["workflows_test"]) == (42, 18)
    assert report["calls_test"] == 36
    assert report["expression"] == "researcher -> writer -> $"
    assert report["path_acceptance"] == 1.0
    assert report["next_agent_top1"] == 1.0
    assert report["remaining_steps_mae"] == 0.0 and report["remaining_steps_predicted"] == 1.0
    assert report["workflows_to_active"] == 30
    assert 0.9 <= report["length_interval_coverage"] <= 1.0
    assert report["length_interval_width_ratio"] > 1.0
    # Two workflows in flight: the one that started earlier ends earlier almost always, and the
    # writer (last step) has less left than a researcher.
    assert report["priority_ordering_accuracy"] >= 0.8
    assert report["priority_requests"] > 0
    # Each prompt starts with its agent's system prompt; the writer's continues nothing hashed.
    assert report["templates"]["researcher"] == "${static:[0,$]}${new}"


def test_the_generated_workload_is_reproducible() -> None:
    first = load_workflows("workload:qa_router", seed=3, limit=10, hash_tokens=64)
    again = load_workflows("workload:qa_router", seed=3, limit=10, hash_tokens=64)
    assert first == again
    assert all(w.records[-1].workflow_end for w in first)
    assert sum(r.workflow_end for w in first for r in w.records) == 10
    # Calls of a workflow respect their dependencies in time.
    for w in first:
        by_id = {r.request_id: r for r in w.records}
        for r in w.records:
            assert all(by_id[p].end <= r.start for p in r.parent_request_ids)


def test_the_report_on_a_slice_of_chatdev(tmp_path: Path) -> None:
    try:
        source("chatdev")(0, 1, None)
    except DataError:
        pytest.skip("chatdev data not present")
    out = tmp_path / "chatdev.json"
    assert main(["evaluate", "--data", "chatdev", "--limit", "12", "--out", str(out), "--quiet"]) == 0
    report = json.loads(out.read_text())
    assert set(KEYS) <= set(report)
    assert (report["workflows_train"], report["workflows_test"]) == (8, 4)
    for key in FRACTIONS:
        assert 0.0 <= report[key] <= 1.0, key
    assert report["agents"] >= 4 and report["calls_test"] > 0


def test_a_bad_data_value_is_a_usage_error(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as bad:
        main(["evaluate", "--data", "chatdevv", "--out", str(tmp_path / "x.json")])
    assert bad.value.code == 2
    assert "unknown --data 'chatdevv'" in capsys.readouterr().err
    with pytest.raises(SystemExit) as unknown_workload:
        main(["evaluate", "--data", "workload:nope", "--out", str(tmp_path / "x.json")])
    assert unknown_workload.value.code == 2
    assert "coding_assistant" in capsys.readouterr().err  # the choices are listed
    with pytest.raises(SystemExit) as bad_holdout:
        main(["evaluate", "--data", "chatdev", "--holdout", "1.5", "--out", str(tmp_path / "x.json")])
    assert bad_holdout.value.code == 2


def test_missing_data_is_reported(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    code = main(
        ["evaluate", "--data", "chatdev", "--data-dir", str(tmp_path), "--out", str(tmp_path / "x.json")]
    )
    assert code == 1
    err = capsys.readouterr().err
    assert str(tmp_path) in err and "does not exist" in err
    assert not (tmp_path / "x.json").exists()


HEADER = (
    "trace_id,agent_id,agent_type,depth,seq,t_abs_s,in_tokens,out_tokens,n_blocks,think_time_s,"
    "api_time_s,stop,model,input_types,lcp_prev_blocks,inf_hit_blocks\n"
)
SUMMARY = "trace_id,path,bytes,n_calls,n_main_calls,n_subagents,n_sub_calls,duration_s,tool_tokens,system_tokens,models\n"


def claude_code_dir(tmp_path: Path, calls: str, summary: str = SUMMARY) -> Path:
    traces = tmp_path / "data" / "weka_cc_traces"
    traces.mkdir(parents=True)
    (traces / "requests_all.csv").write_text(HEADER + calls)
    (traces / "traces_summary.csv").write_text(summary)
    return tmp_path / "data"


def evaluate(data_dir: Path, out: Path, *extra: str) -> int:
    return main(["evaluate", "--data", "claude_code", "--data-dir", str(data_dir), "--out", str(out), *extra])


def test_trace_errors_name_the_file_the_line_and_the_trace(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    # A header only: which file holds no calls, said even with --quiet.
    data = claude_code_dir(tmp_path / "empty", "")
    assert evaluate(data, tmp_path / "x.json", "--quiet") == 1
    err = " ".join(capsys.readouterr().err.split())
    assert f"{data / 'weka_cc_traces' / 'requests_all.csv'} holds no calls" in err
    # A blank in_tokens cell: the file, its line and the trace id.
    row = "trace_0007,main,main,0,0,0.000,,169,1112,0.0,7.34,tool_use,claude-opus-4-5,text,0,0\n"
    data = claude_code_dir(tmp_path / "blank", row)
    calls_file = data / "weka_cc_traces" / "requests_all.csv"
    assert evaluate(data, tmp_path / "x.json") == 1
    err = capsys.readouterr().err
    assert f"{calls_file} line 2, trace_id 'trace_0007': in_tokens is '', expected an integer" in " ".join(err.split())
    assert not (tmp_path / "x.json").exists()


def test_sessions_without_a_summary_row_are_warned_about(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    from clairvoyant.workloads.traces import WEKA_SUBAGENT_SYSTEM_TOKENS, load_claude_code_runs

    row = "trace_0009,main,main,0,0,0.000,900,20,56,0.0,1.0,end_turn,claude-opus-4-5,text,0,0\n"
    data = claude_code_dir(tmp_path, row, SUMMARY + "trace_0001,x,1,1,1,0,0,1.0,10,20,m\n")
    traces = data / "weka_cc_traces"
    runs = load_claude_code_runs(str(traces / "requests_all.csv"), str(traces / "traces_summary.csv"))
    assert [run.run_id for run in runs] == ["trace_0009"]
    assert f"1 of 1 sessions have no row in {traces / 'traces_summary.csv'}" in caplog.text
    assert f"gets {WEKA_SUBAGENT_SYSTEM_TOKENS} system tokens" in caplog.text


def test_missing_data_under_a_given_directory_names_it_not_the_variable(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert evaluate(tmp_path, tmp_path / "x.json", "--quiet") == 1
    err = " ".join(capsys.readouterr().err.split())
    assert f"the data directory given ({tmp_path}) does not hold it" in err and "CV_DATA_DIR" not in err


def test_seeds_give_each_report_and_their_spread(tmp_path: Path) -> None:
    out = tmp_path / "seeds.json"
    argv = ["evaluate", "--data", "workload:coding_assistant", "--limit", "24", "--seeds", "0-1,3", "--out", str(out)]
    assert main([*argv, "--jobs", "2", "--quiet"]) == 0
    report = json.loads(out.read_text())
    assert report["seeds"] == [0, 1, 3] and [r["seed"] for r in report["runs"]] == [0, 1, 3]
    coverage = [r["length_interval_coverage"] for r in report["runs"]]
    spread = report["summary"]["length_interval_coverage"]
    assert spread["mean"] == pytest.approx(sum(coverage) / 3)
    assert (spread["min"], spread["max"]) == (min(coverage), max(coverage))
    oracle = report["summary"]["priority_predictors"]["oracle_path"]
    assert 0.5 <= oracle["min"] <= oracle["max"] <= 1.0
    # each seed's replay is the single-seed command's
    single = tmp_path / "one.json"
    argv = ["evaluate", "--data", "workload:coding_assistant", "--limit", "24", "--seed", "3"]
    assert main([*argv, "--out", str(single), "--quiet"]) == 0
    one = json.loads(single.read_text())
    assert one["length_interval_coverage"] == report["runs"][2]["length_interval_coverage"]
    assert one["priority_predictors"] == report["runs"][2]["priority_predictors"]
