"""``python -m clairvoyant.profiler show`` and ``evaluate``."""

from __future__ import annotations

import sys
import types
from pathlib import Path

import pytest
from matplotlib.image import imread
from typer.testing import CliRunner

from clairvoyant.profiler.cli import app
from clairvoyant.profiler.core import WorkflowProfile
from clairvoyant.profiler.core.automaton import END, START
from clairvoyant.profiler.persistence import ProfileRepository, ProfileSnapshot
from clairvoyant.profiler.show import layout
from tests.profiler.generators import EXPECTED, listing1
from tests.profiler.test_service_records import completion_records, reference_store, small_config

pytestmark = pytest.mark.integration


@pytest.fixture(scope="module")
def trained() -> WorkflowProfile:
    return reference_store(completion_records("acme", "coding", 60, seed=21), small_config()).profile(
        "acme", "coding"
    )


@pytest.fixture
def database_url(tmp_path: Path, trained: WorkflowProfile) -> str:
    url = f"sqlite:///{tmp_path / 'profiler.db'}"
    repository = ProfileRepository(url)
    repository.save([ProfileSnapshot.of(trained)])
    repository.close()
    return url


def test_show_prints_the_profile_and_draws_the_automaton(
    database_url: str, tmp_path: Path, trained: WorkflowProfile
) -> None:
    png = tmp_path / "out" / "coding.png"
    result = CliRunner().invoke(
        app, ["show", "coding", "--tenant", "acme", "--database-url", database_url, "--png", str(png)],
        env={"COLUMNS": "200"},
    )
    assert result.exit_code == 0, result.output
    lines = result.output.splitlines()
    assert f"path expression: {EXPECTED[listing1]}" in lines
    assert f"tier: {trained.confidence.tier.value} ({trained.confidence.reason})" in lines
    assert "instances: 60" in lines
    # The agent table, in Kairos rank order: the verifier (least remaining latency) first.
    rows = [line.split("│")[1].strip() for line in lines if line.count("│") >= 8]
    assert rows == ["verifier", "reviewer", "engineer", "explorer", "planner"]
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    height, width, _ = imread(png).shape
    assert width > height > 100


def test_show_of_an_unknown_profile_lists_the_known_ones(database_url: str) -> None:
    result = CliRunner().invoke(app, ["show", "nothing", "--tenant", "acme", "--database-url", database_url])
    assert result.exit_code == 1
    assert "known: ['coding']" in result.output
    other = CliRunner().invoke(app, ["show", "coding", "--tenant", "globex", "--database-url", database_url])
    assert other.exit_code == 1 and "known: none" in other.output


def test_layout_puts_states_in_columns_by_distance_from_the_start(trained: WorkflowProfile) -> None:
    drawn = layout(trained.automaton.pruned(0.05))
    column = {state: x for state, (x, _) in drawn.positions.items()}
    assert [column[s] for s in (START, "planner", "<explorer>", "engineer", "reviewer", "verifier", END)] == [
        0, 1, 2, 3, 4, 5, 6
    ]
    probabilities = {(u, v): p for u, v, p in drawn.edges}
    assert probabilities[(START, "planner")] == 1.0
    assert probabilities[("reviewer", "verifier")] + probabilities[("reviewer", "engineer")] == pytest.approx(1.0)
    assert probabilities[("engineer", "engineer")] > probabilities[("engineer", "reviewer")]


def test_evaluate_forwards_its_arguments(monkeypatch: pytest.MonkeyPatch) -> None:
    seen: list[list[str]] = []

    def main(argv: list[str]) -> int:
        seen.append(argv)
        return 3

    package = types.ModuleType("clairvoyant.profiler.evaluation")
    module = types.ModuleType("clairvoyant.profiler.evaluation.cli")
    module.main = main  # type: ignore[attr-defined]
    monkeypatch.setitem(sys.modules, "clairvoyant.profiler.evaluation", package)
    monkeypatch.setitem(sys.modules, "clairvoyant.profiler.evaluation.cli", module)
    args = ["--data", "traces.jsonl", "--holdout", "0.2", "--seed", "7", "--out", "report.json", "--help"]
    result = CliRunner().invoke(app, ["evaluate", *args])
    assert (result.exit_code, seen) == (3, [["evaluate", *args]])
