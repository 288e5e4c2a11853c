"""The trace readers on bad input: every error names the file, the line, the run and the cell;
every fallback is logged with the file and how many rows fell back."""

from __future__ import annotations

import logging
from pathlib import Path

import pytest

from clairvoyant.workloads.errors import TraceFormatError
from clairvoyant.workloads.traces import chatdev, claude_code, load_chatdev_runs, load_claude_code_runs

pytestmark = pytest.mark.unit

WEKA_HEADER = (
    "trace_id,agent_id,agent_type,depth,seq,t_abs_s,in_tokens,out_tokens,n_blocks,think_time_s,"
    "api_time_s,stop,model,input_types,lcp_prev_blocks,inf_hit_blocks"
)
WEKA_ROWS = (
    "trace_0007,main,main,0,0,0.000,900,20,14,0.0,1.0,tool_use,claude-opus-4-5,text,0,0",
    "trace_0007,main,main,0,1,5.000,990,30,15,2.0,1.5,end_turn,claude-opus-4-5,tool_result,14,14",
)
SUMMARY = "trace_id,tool_tokens,system_tokens\ntrace_0007,7000,1000\n"
CHATDEV_HEADER = (
    "session,call_idx,recv_ts,send_ts,t_rel_s,latency_s,prompt_tokens,completion_tokens,phase_name,"
    "composed_phase,cycle,assistant_role,user_role,speaker,model_type"
)
CHATDEV_ROWS = (
    "run_a,0,,,0.0,7.0,172,198,,,,Prompt Engineer,User,Prompt Engineer,",
    "run_a,1,,,9.0,1.0,618,4,DemandAnalysis,,,CPO,CEO,Chief Product Officer,None",
)


def weka(
    tmp_path: Path, rows: tuple[str, ...] = WEKA_ROWS, header: str = WEKA_HEADER, summary: str = SUMMARY
) -> tuple[str, str]:
    folder = tmp_path / "weka_cc_traces"
    folder.mkdir(parents=True)
    (folder / "requests_all.csv").write_text("\n".join((header, *rows)) + "\n")
    (folder / "traces_summary.csv").write_text(summary)
    return str(folder / "requests_all.csv"), str(folder / "traces_summary.csv")


def chat(tmp_path: Path, rows: tuple[str, ...] = CHATDEV_ROWS, header: str = CHATDEV_HEADER) -> str:
    folder = tmp_path / "chatdev_warehouse"
    folder.mkdir(parents=True)
    (folder / "calls.csv").write_text("\n".join((header, *rows)) + "\n")
    return str(folder / "calls.csv")


def replace_cell(row: str, header: str, column: str, value: str) -> str:
    cells = row.split(",")
    cells[header.split(",").index(column)] = value
    return ",".join(cells)


def test_good_fixtures_load(tmp_path: Path) -> None:
    runs = load_claude_code_runs(*weka(tmp_path / "w"))
    assert [(r.run_id, len(r.calls)) for r in runs] == [("trace_0007", 2)]
    assert [(r.run_id, len(r.calls)) for r in load_chatdev_runs(chat(tmp_path / "c"))] == [("run_a", 2)]


@pytest.mark.parametrize(
    ("column", "value", "message"),
    [
        ("in_tokens", "", "in_tokens is '', expected an integer"),
        ("out_tokens", "abc", "out_tokens is 'abc', expected an integer"),
        ("seq", "", "seq is '', expected an integer"),
        ("t_abs_s", "", "t_abs_s is blank, expected a number"),
        ("think_time_s", "x", "think_time_s is 'x', expected a number"),
        ("api_time_s", "nan", "api_time_s is 'nan', expected a number"),
    ],
)
def test_a_bad_claude_code_cell_names_file_line_trace_and_cell(
    tmp_path: Path, column: str, value: str, message: str
) -> None:
    calls, summary = weka(tmp_path, (WEKA_ROWS[0], replace_cell(WEKA_ROWS[1], WEKA_HEADER, column, value)))
    with pytest.raises(TraceFormatError) as caught:
        load_claude_code_runs(calls, summary)
    assert str(caught.value) == f"{calls} line 3, trace_id 'trace_0007': {message}"


@pytest.mark.parametrize(
    ("column", "value", "message"),
    [
        ("prompt_tokens", "", "prompt_tokens is '', expected an integer"),
        ("completion_tokens", "abc", "completion_tokens is 'abc', expected an integer"),
        ("call_idx", "", "call_idx is '', expected an integer"),
        ("t_rel_s", "x", "t_rel_s is 'x', expected a number"),
        ("latency_s", "inf", "latency_s is 'inf', expected a number"),
    ],
)
def test_a_bad_chatdev_cell_names_file_line_session_and_cell(
    tmp_path: Path, column: str, value: str, message: str
) -> None:
    path = chat(tmp_path, (CHATDEV_ROWS[0], replace_cell(CHATDEV_ROWS[1], CHATDEV_HEADER, column, value)))
    with pytest.raises(TraceFormatError) as caught:
        load_chatdev_runs(path)
    assert str(caught.value) == f"{path} line 3, session 'run_a': {message}"


def test_a_missing_column_or_blank_run_id_is_named(tmp_path: Path) -> None:
    header = CHATDEV_HEADER.replace(",speaker", "")
    rows = tuple(",".join(r.split(",")[:13] + r.split(",")[14:]) for r in CHATDEV_ROWS)
    path = chat(tmp_path / "a", rows, header)
    with pytest.raises(TraceFormatError, match=f"^{path} line 1: the header lacks speaker$"):
        load_chatdev_runs(path)
    calls, summary = weka(tmp_path / "b", header=WEKA_HEADER.replace("agent_id,", "agent,"))
    with pytest.raises(TraceFormatError, match=f"^{calls} line 1: the header lacks agent_id$"):
        load_claude_code_runs(calls, summary)
    path = chat(
        tmp_path / "c", (CHATDEV_ROWS[0], replace_cell(CHATDEV_ROWS[1], CHATDEV_HEADER, "session", ""))
    )
    with pytest.raises(TraceFormatError, match=f"^{path} line 3, session '': session is blank$"):
        load_chatdev_runs(path)
    calls, summary = weka(tmp_path / "d", summary="")
    with pytest.raises(TraceFormatError, match=f"^{summary} is empty"):
        load_claude_code_runs(calls, summary)


def test_a_header_only_file_names_the_file(tmp_path: Path) -> None:
    weka(tmp_path / "w", rows=())
    with pytest.raises(TraceFormatError) as caught:
        claude_code(tmp_path / "w")
    assert str(caught.value).endswith(
        f"{tmp_path / 'w' / 'weka_cc_traces' / 'requests_all.csv'} holds no calls (a header only?)"
    )
    chat(tmp_path / "c", rows=())
    with pytest.raises(TraceFormatError, match="calls.csv holds no calls"):
        chatdev(tmp_path / "c")


def test_fallbacks_are_logged_with_the_file_and_the_count(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.WARNING, logger="clairvoyant.workloads.traces")
    rows = (WEKA_ROWS[0], replace_cell(WEKA_ROWS[1], WEKA_HEADER, "think_time_s", ""))
    calls, summary = weka(
        tmp_path / "w", rows, summary="trace_id,tool_tokens,system_tokens\ntrace_0001,1,2\n"
    )
    runs = load_claude_code_runs(calls, summary)
    assert runs[0].calls[0].tool_latency_s == 0.0  # the blank think time
    assert f"1 of 1 sessions have no row in {summary}" in caplog.text
    assert f"claude_code: 1 of 2 rows of {calls} have a blank think_time_s; taken as 0 s" in caplog.text
    caplog.clear()
    calls, summary = weka(tmp_path / "s", summary="trace_id,tool_tokens,system_tokens\ntrace_0007,,1000\n")
    load_claude_code_runs(calls, summary)
    assert f"claude_code: 1 of 1 rows of {summary} have a blank tool_tokens; taken as 0" in caplog.text
    caplog.clear()
    path = chat(
        tmp_path / "c", (CHATDEV_ROWS[0], replace_cell(CHATDEV_ROWS[1], CHATDEV_HEADER, "latency_s", ""))
    )
    load_chatdev_runs(path)
    assert f"chatdev: 1 of 2 rows of {path} have a blank latency_s; taken as unknown (no gap)" in caplog.text
