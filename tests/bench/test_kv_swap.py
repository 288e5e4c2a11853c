"""``kv-swap`` on a tiny cache: its rows, the bytes each call moves, and the ratios to the loop."""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import pytest

from clairvoyant.bench.kv_swap import COLUMNS, KvSwap, main

pytestmark = pytest.mark.unit

TINY = ["--pages", "1,3", "--methods", "torch,loop", "--layers", "2", "--kv-heads", "1", "--head-dim", "8",
        "--block-size", "4", "--repeats", "2", "--budget-s", "0.1"]  # fmt: skip
PAGE_BYTES = 2 * 2 * 4 * 1 * 8 * 4  # layers x (K, V) x block_size x kv_heads x head_dim x float32


def test_rows_report_bytes_moved_and_ratios_to_the_loop() -> None:
    bench = KvSwap()
    parser = argparse.ArgumentParser()
    bench.add_arguments(parser)
    result = bench.run(parser.parse_args(TINY))
    assert result.columns == COLUMNS
    rows = [dict(zip(COLUMNS, row, strict=True)) for row in result.rows]
    assert [(r["pages"], r["direction"], r["method"]) for r in rows] == [
        (pages, direction, method)
        for pages in (1, 3)
        for method in ("loop", "torch")  # the baseline first, whatever order was asked
        for direction in ("gather", "scatter")
    ]
    for row in rows:
        assert row["MB moved"] == pytest.approx(row["pages"] * PAGE_BYTES / 1e6)
        assert row["GB/s"] == pytest.approx(row["MB moved"] / row["ms per call"])  # MB/ms = GB/s
        loop = next(
            r
            for r in rows
            if (r["pages"], r["direction"], r["method"]) == (row["pages"], row["direction"], "loop")
        )
        assert row["x loop"] == pytest.approx(row["GB/s"] / loop["GB/s"])
    assert set(result.summary) == {"torch gather x loop at 3 pages", "torch scatter x loop at 3 pages"}
    assert result.params["num_blocks"] == 6


def test_main_saves_json_and_markdown(tmp_path: Path) -> None:
    assert main([*TINY, "--out-dir", str(tmp_path)]) == 0
    saved = json.loads((tmp_path / "kv-swap.json").read_text())
    assert saved["columns"] == COLUMNS and len(saved["rows"]) == 8
    assert saved["rows"][2][3] == pytest.approx(PAGE_BYTES / 1e6, abs=1e-3)  # 1 page, torch gather
    table = (tmp_path / "kv-swap.md").read_text()
    assert "| pages | direction | method |" in table and table.count("| torch") == 4


def test_methods_must_include_the_baseline() -> None:
    bench = KvSwap()
    parser = argparse.ArgumentParser()
    bench.add_arguments(parser)
    with pytest.raises(SystemExit, match="must include loop"):
        bench.run(parser.parse_args(["--methods", "torch"]))
