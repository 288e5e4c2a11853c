"""``evaluate`` on bad trace data: a one-line error naming the file, line, run and cell, exit code 1,
never a traceback, even with --quiet; missing data names the directory looked at and its flag."""

from __future__ import annotations

from pathlib import Path

import pytest

from clairvoyant.profiler.evaluation.cli import main

pytestmark = pytest.mark.unit

HEADER = (
    "session,call_idx,recv_ts,send_ts,t_rel_s,latency_s,prompt_tokens,completion_tokens,phase_name,"
    "composed_phase,cycle,assistant_role,user_role,speaker,model_type\n"
)
ROW = "{session},{idx},,,{t},1.0,{prompt},20,Coding,,,Programmer,CTO,Programmer,\n"


def chatdev_dir(tmp_path: Path, rows: str) -> Path:
    folder = tmp_path / "chatdev_warehouse"
    folder.mkdir(parents=True)
    (folder / "calls.csv").write_text(HEADER + rows)
    return tmp_path


def evaluate(data_dir: Path, out: Path, *extra: str) -> int:
    return main(["evaluate", "--data", "chatdev", "--data-dir", str(data_dir), "--out", str(out), *extra])


def one_line(err: str) -> str:
    lines = [line for line in err.splitlines() if line.strip()]
    assert len(lines) == 1 and lines[0].startswith("error: ") and "Traceback" not in err, err
    return lines[0]


@pytest.mark.parametrize("quiet", [(), ("--quiet",)])
def test_a_garbage_cell_is_one_line_and_exit_1(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], quiet: tuple[str, ...]
) -> None:
    rows = ROW.format(session="s1", idx=0, t=0.0, prompt=100) + ROW.format(
        session="s1", idx=1, t=3.0, prompt="12x"
    )
    data = chatdev_dir(tmp_path, rows)
    assert evaluate(data, tmp_path / "x.json", *quiet) == 1
    line = one_line(capsys.readouterr().err)
    calls = data / "chatdev_warehouse" / "calls.csv"
    assert line == f"error: {calls} line 3, session 's1': prompt_tokens is '12x', expected an integer"
    assert not (tmp_path / "x.json").exists()


def test_a_header_only_file_and_a_single_workflow_exit_1(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    data = chatdev_dir(tmp_path / "empty", "")
    assert evaluate(data, tmp_path / "x.json", "--quiet") == 1
    assert one_line(capsys.readouterr().err).endswith(
        f"{data / 'chatdev_warehouse' / 'calls.csv'} holds no calls (a header only?)"
    )
    data = chatdev_dir(tmp_path / "one", ROW.format(session="s1", idx=0, t=0.0, prompt=100))
    assert evaluate(data, tmp_path / "x.json", "--quiet") == 1
    assert (
        one_line(capsys.readouterr().err) == "error: --data chatdev holds 1 workflows; at least 2 are needed"
    )


def test_missing_data_names_the_directory_and_the_flag_even_when_quiet(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("CV_DATA_DIR", str(tmp_path / "elsewhere"))
    assert evaluate(tmp_path, tmp_path / "x.json", "--quiet") == 1
    line = one_line(capsys.readouterr().err)
    assert str(tmp_path / "chatdev_warehouse" / "calls.csv") in line and "--data-dir" in line
    assert "CV_DATA_DIR" not in line and "elsewhere" not in line
    # Without --data-dir: the directory from the variable, and the variable.
    assert main(["evaluate", "--data", "chatdev", "--out", str(tmp_path / "x.json"), "--quiet"]) == 1
    line = one_line(capsys.readouterr().err)
    assert str(tmp_path / "elsewhere" / "chatdev_warehouse" / "calls.csv") in line and "CV_DATA_DIR" in line
