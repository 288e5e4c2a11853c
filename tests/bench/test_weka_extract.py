"""weka_extract: raw Claude Code traces -> requests_all.csv + traces_summary.csv."""

from __future__ import annotations

import csv
import json
import shutil
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from clairvoyant.bench.weka_extract import (
    CALL_COLUMNS,
    CALLS_FILE,
    SUMMARY_COLUMNS,
    SUMMARY_FILE,
    extract_dir,
    extract_trace,
    main,
)
from clairvoyant.workloads.data import data_dir
from clairvoyant.workloads.errors import TraceFormatError

pytestmark = pytest.mark.unit

FIXTURES = Path(__file__).parent / "fixtures" / "weka"

# Derived by hand from fixtures/weka/*.json.  trace_a: the sub-agent entry (t=2.25) sits between the
# main agent's two calls, so its calls come there, offset by 2.25 s, at depth 1 with their own seq.
# lcp_prev_blocks compares with the same agent's previous call; inf_hit_blocks counts the leading
# blocks any earlier call of the trace sent: the sub-agent's [1, 9] after main's [1, 2] hits 1; main's
# second call [1, 2, 3, 10] hits 2 (block 10 was sent, but after the miss on 3, so not a prefix hit).
# trace_b: a new trace forgets trace_a's blocks; missing think/api times are empty cells; the input
# types are sorted and joined by "|"; 12.3456 s prints as 12.346.
EXPECTED_CALLS = [
    ["trace_a", "main", "main", "0", "0", "0.000", "130", "10", "2", "0.0", "1.5", "tool_use", "claude-opus-x", "text", "0", "0"],
    ["trace_a", "agent_001", "Explore", "1", "0", "2.250", "70", "5", "2", "0.0", "0.5", "tool_use", "claude-haiku-x", "text", "0", "1"],
    ["trace_a", "agent_001", "Explore", "1", "1", "3.750", "200", "7", "3", "1.0", "0.75", "end_turn", "claude-haiku-x", "tool_result", "2", "2"],
    ["trace_a", "main", "main", "0", "1", "5.000", "250", "12", "4", "1.5", "2.0", "end_turn", "claude-opus-x", "tool_result", "2", "2"],
    ["trace_b", "main", "main", "0", "0", "0.000", "64", "3", "2", "0.0", "", "", "claude-sonnet-x", "text|tool_result", "0", "0"],
    ["trace_b", "main", "main", "0", "1", "12.346", "128", "4", "3", "9.0", "3.0", "end_turn", "claude-opus-x", "text", "2", "2"],
    ["trace_b", "main", "main", "0", "2", "20.040", "64", "1", "1", "", "", "", "claude-sonnet-x", "text", "0", "0"],
]  # fmt: skip
# duration_s is the latest call start; models are the main agent's only (not the sub-agent's haiku).
EXPECTED_SUMMARY = [
    ["trace_a", "traces/trace_a.json", "<bytes>", "4", "2", "1", "2", "5.0", "100", "20", "claude-opus-x"],
    ["trace_b", "traces/trace_b.json", "<bytes>", "3", "3", "0", "0", "20.0", "300", "40", "claude-opus-x|claude-sonnet-x"],
]  # fmt: skip


def read_csv(path: Path) -> list[list[str]]:
    with open(path, newline="") as f:
        return list(csv.reader(f))


def with_sizes(rows: list[list[str]]) -> list[list[str]]:
    return [[str((FIXTURES / f"{row[0]}.json").stat().st_size) if c == "<bytes>" else c for c in row] for row in rows]


def test_fixture_rows_match_hand_derived_rows(tmp_path: Path) -> None:
    assert extract_dir(FIXTURES, tmp_path) == 2
    assert read_csv(tmp_path / CALLS_FILE) == [list(CALL_COLUMNS), *EXPECTED_CALLS]
    assert read_csv(tmp_path / SUMMARY_FILE) == [list(SUMMARY_COLUMNS), *with_sizes(EXPECTED_SUMMARY)]
    assert (tmp_path / CALLS_FILE).read_bytes().count(b"\r\n") == 1 + len(EXPECTED_CALLS)  # csv's CRLF
    assert sorted(p.name for p in tmp_path.iterdir()) == [CALLS_FILE, SUMMARY_FILE]  # no partial files left


def test_extract_trace_keeps_missing_times_as_none() -> None:
    calls, summary = extract_trace(FIXTURES / "trace_b.json")
    assert [(c.think_time_s, c.api_time_s) for c in calls] == [(0.0, None), (9.0, 3.0), (None, None)]
    assert summary.models == ("claude-opus-x", "claude-sonnet-x")


def copy_fixtures(tmp_path: Path) -> Path:
    raw = tmp_path / "raw"
    shutil.copytree(FIXTURES, raw)
    return raw


def test_bad_json_names_the_file_and_writes_nothing(tmp_path: Path) -> None:
    raw = copy_fixtures(tmp_path)
    (raw / "trace_c.json").write_text('{"id": "trace_c", "requests": [')
    out = tmp_path / "out"
    with pytest.raises(TraceFormatError, match=r"trace_c\.json: not valid JSON"):
        extract_dir(raw, out)
    assert list(out.iterdir()) == []


@pytest.mark.parametrize(
    ("edit", "message"),
    [
        (lambda t: t["requests"][1]["requests"][0].pop("hash_ids"), r"requests\[1\]\.requests\[0\] lacks the field 'hash_ids'"),
        (lambda t: t["requests"][2].update({"in": "250"}), r"requests\[2\]\.in is '250', expected int"),
        (lambda t: t["requests"][1].pop("agent_id"), r"requests\[1\] lacks the field 'agent_id'"),
        (lambda t: t.pop("tool_tokens"), r"the trace lacks the field 'tool_tokens'"),
    ],
)  # fmt: skip
def test_a_missing_or_mistyped_field_names_file_and_request(
    tmp_path: Path, edit: Callable[[dict[str, Any]], object], message: str
) -> None:
    raw = copy_fixtures(tmp_path)
    trace = json.loads((raw / "trace_a.json").read_text())
    edit(trace)
    (raw / "trace_a.json").write_text(json.dumps(trace))
    with pytest.raises(TraceFormatError, match=str(raw / "trace_a.json").replace(".", r"\.") + ": " + message):
        extract_dir(raw, tmp_path / "out")


def test_cli_writes_csvs_with_progress_lines(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main([str(FIXTURES), str(tmp_path), "--progress-every", "1"]) == 0
    err = capsys.readouterr().err
    assert "weka_extract: 1/2 traces" in err and "weka_extract: 2/2 traces" in err
    assert len(read_csv(tmp_path / CALLS_FILE)) == 1 + len(EXPECTED_CALLS)


def test_cli_reports_a_bad_file_and_fails(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    raw = tmp_path / "raw"
    raw.mkdir()
    (raw / "broken.json").write_text("not json")
    assert main([str(raw), str(tmp_path / "out")]) == 1
    assert f"weka_extract: error: {raw / 'broken.json'}: not valid JSON" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        main([str(tmp_path / "absent"), str(tmp_path / "out")])


def test_shipped_raw_traces_reproduce_the_shipped_rows_byte_for_byte(tmp_path: Path) -> None:
    shipped = data_dir() / "weka_cc_traces"
    raw = shipped / "raw"
    if not raw.is_dir() or not (shipped / CALLS_FILE).is_file():
        pytest.skip(f"no raw Claude Code traces under {shipped} (set CV_DATA_DIR to the shared data directory)")
    n = extract_dir(raw, tmp_path)
    for name in (CALLS_FILE, SUMMARY_FILE):
        produced = (tmp_path / name).read_bytes().split(b"\r\n")
        traces = {line.split(b",", 1)[0] for line in produced[1:] if line}
        expected = [line for line in (shipped / name).read_bytes().split(b"\r\n") if line.split(b",", 1)[0] in traces]
        assert len(traces) == n and produced[-1] == b""
        assert produced[0] == (shipped / name).read_bytes().split(b"\r\n", 1)[0]
        assert produced[1:-1] == expected, name
