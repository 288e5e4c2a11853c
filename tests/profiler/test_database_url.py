"""A profile database that cannot be used is one paragraph naming CV_DATABASE_URL, password masked."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
from typer.testing import CliRunner

from clairvoyant.profiler.cli import app
from clairvoyant.profiler.persistence import DatabaseUnavailable, ProfileRepository
from clairvoyant.stack.natsserver import free_port


@pytest.mark.integration
@pytest.mark.parametrize(
    ("url", "shown", "cause"),
    [
        (
            "postgresql://cv:hunter22@127.0.0.1:{port}/cv",
            "postgresql://cv:***@127.0.0.1:{port}/cv",
            "Connection refused",
        ),
        ("garbage", "garbage", "Could not parse SQLAlchemy URL from given URL string"),
        ("mysql://cv:hunter22@127.0.0.1/cv", "mysql://cv:***@127.0.0.1/cv", "No module named"),
    ],
)
def test_an_unusable_database_url_is_named_and_masked(url: str, shown: str, cause: str) -> None:
    port = free_port()
    with pytest.raises(DatabaseUnavailable) as failed:
        ProfileRepository(url.format(port=port))
    message = str(failed.value)
    assert message.startswith(f"cannot use the profile database CV_DATABASE_URL={shown.format(port=port)}: ")
    assert cause in message and "hunter22" not in message and "\n" not in message


@pytest.mark.integration
@pytest.mark.parametrize(
    ("url", "shown", "cause"),
    [
        (
            "postgresql+psycopg://cv:hunter22@127.0.0.1:{port}/cv",
            "postgresql+psycopg://cv:***@127.0.0.1:{port}/cv",
            "Connection refused",
        ),
        ("garbage", "garbage", "Could not parse SQLAlchemy URL from given URL string"),
        ("mysql://cv:hunter22@127.0.0.1/cv", "mysql://cv:***@127.0.0.1/cv", "No module named"),
        ("postgresql://cv:hunter22@127.0.0.1:notaport/cv", "postgresql://cv:***@127.0.0.1:notaport/cv", "int()"),
    ],
)
def test_serve_with_an_unusable_database_url_exits_with_one_line(
    url: str, shown: str, cause: str, tmp_path: Path
) -> None:
    port = free_port()
    run = subprocess.run(
        [sys.executable, "-m", "clairvoyant.profiler", "serve"],
        env={**os.environ, "CV_DATABASE_URL": url.format(port=port), "CV_NATS_URL": "nats://127.0.0.1:1",
             "CV_PROFILER_PORT": "0", "CV_METRICS_PORT": "0"},
        cwd=tmp_path, capture_output=True, text=True, timeout=120,
    )
    assert run.returncode == 1, run.stderr[-2000:]
    lines = run.stderr.strip().splitlines()
    assert len(lines) == 1, run.stderr  # one paragraph, no traceback
    expected = f"error: cannot use the profile database CV_DATABASE_URL={shown.format(port=port)}: "
    assert lines[0].startswith(expected), lines[0]
    assert cause in lines[0]
    assert "Traceback" not in run.stderr and "hunter22" not in run.stderr + run.stdout


@pytest.mark.integration
def test_show_names_the_option_the_url_came_from(tmp_path: Path) -> None:
    port = free_port()
    result = CliRunner().invoke(
        app, ["show", "coding", "--database-url", f"postgresql://cv:hunter22@127.0.0.1:{port}/cv"]
    )
    assert result.exit_code == 1
    assert result.output.startswith(
        f"error: cannot use the profile database --database-url=postgresql://cv:***@127.0.0.1:{port}/cv: "
    )
    assert "hunter22" not in result.output
