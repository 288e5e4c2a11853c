"""``bench constrained`` in a tiny configuration: its result's fields, equal token counts on both
sides, and constrained outputs that parse."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from clairvoyant.bench.__main__ import main

pytestmark = [pytest.mark.integration, pytest.mark.timeout(240)]


def test_the_constrained_benchmark_reports_both_sides_and_valid_json(tmp_path: Path) -> None:
    argv = [
        "--out-dir", str(tmp_path), "constrained", "--model", "tiny-random", "--batches", "2,3",
        "--repeats", "1", "--max-tokens", "600", "--threads", "1",
    ]  # fmt: skip
    assert main(argv) == 0
    result = json.loads((tmp_path / "constrained-tiny-random.json").read_text())
    assert result["benchmark"] == "constrained-tiny-random"
    assert result["columns"][:5] == ["decoding", "batch", "out tokens", "seconds", "tok/s"]
    rows = {(row[0], row[1]): row for row in result["rows"]}
    assert set(rows) == {("constrained", 2), ("free", 2), ("constrained", 3), ("free", 3)}
    summary = result["summary"]
    assert summary["model"] == "tiny-random"
    for batch in (2, 3):
        constrained, free = rows[("constrained", batch)], rows[("free", batch)]
        assert constrained[2] == free[2] > 0  # the same output tokens on both sides
        assert summary[f"parsed_fraction_at_batch_{batch}"] == 1.0
        assert summary[f"stopped_fraction_at_batch_{batch}"] == 1.0
        ratio = summary[f"ratio_at_batch_{batch}"]
        assert ratio == pytest.approx(constrained[4] / free[4], rel=1e-2)
        assert summary[f"slowdown_at_batch_{batch}"] == pytest.approx(1 - ratio, abs=1e-2)
        assert summary[f"goal_met_at_batch_{batch}"] == (summary[f"slowdown_at_batch_{batch}"] <= 0.10)
        # mask time is spent on the constrained side only
        assert constrained[7] > 0 and free[7] == 0 and free[8] == 0
        assert summary[f"mask_ms_per_step_at_batch_{batch}"] == pytest.approx(
            constrained[7] + constrained[8], abs=0.01
        )
        # the constraint's cost per step: time outside the forward, constrained minus free
        overhead = (constrained[5] - constrained[6]) - (free[5] - free[6])
        assert summary[f"overhead_ms_per_step_at_batch_{batch}"] == pytest.approx(overhead, abs=0.05)
    assert summary["compile_ms"] > 0
