"""The ablation ladder: each step adds one mechanism to the steps before it, and the shares add up."""

from __future__ import annotations

import dataclasses

import pytest

from clairvoyant.bench.__main__ import main
from clairvoyant.bench.ablation import STEPS, gains, ladder, shares
from clairvoyant.bench.experiment import ExperimentConfig

pytestmark = [pytest.mark.unit, pytest.mark.timeout(300)]


def test_each_step_keeps_every_earlier_change() -> None:
    base = ExperimentConfig(workload="coding_assistant", host_cache="auto", l3="memory")
    steps = ladder(base)
    assert [s.name for s, _ in steps] == [s.name for s in STEPS]
    configs = [c for _, c in steps]
    assert configs[0] == dataclasses.replace(base, cache_policy="lmcache")
    assert [c.placement for c in configs] == ["equal", "auto", "auto", "auto", "auto", "auto"]
    assert [c.cache_policy for c in configs] == ["lmcache"] * 4 + ["pythia"] * 2
    assert [c.scaling for c in configs] == [None] * 5 + ["pythia"]
    presets = [s.preset for s, _ in steps]
    assert presets == ["vllm-prodstack", "vllm-prodstack", "clairvoyant-unbounded", "clairvoyant", "clairvoyant",
                       "clairvoyant"]  # fmt: skip


def test_gains_add_up_and_shares_split_the_best_configurations_gain() -> None:
    jcts = [100.0, 90.0, 95.0, 80.0, 120.0]  # the best is the fourth; the last step costs 40 s
    assert gains(jcts)[0] is None
    assert gains(jcts)[1:] == pytest.approx([0.1, -0.05, 0.15, -0.4])
    assert sum(g for g in gains(jcts) if g is not None) == pytest.approx(1 - 120.0 / 100.0)
    got = shares(jcts)
    assert got[0] is None and got[4] is None  # after the best step: a gain, no share
    assert got[1:4] == pytest.approx([0.5, -0.25, 0.75])
    assert sum(s for s in got if s is not None) == pytest.approx(1.0)
    assert shares([100.0, 100.05, 110.0]) == [None, None, None]  # the best removes nothing: no shares
    assert shares([100.0, 100.00001, 99.99999]) == [None, None, None]  # rounding noise is not split


def test_a_small_ladder_runs_and_reports_every_step(tmp_path) -> None:  # type: ignore[no-untyped-def]
    code = main(["--out-dir", str(tmp_path), "ablation", "--workloads", "react_bfcl", "--gpus", "2",
                 "--workflows", "12", "--arrivals", "cron:period_s=100000,batch=12", "--annotations", "oracle",
                 "--jobs", "1"])  # fmt: skip
    assert code == 0
    import json

    result = json.loads((tmp_path / "ablation.json").read_text())
    rows = result["rows"]
    assert [r[1] for r in rows] == [s.name for s in STEPS]
    assert rows[0][4] == 1.0 and rows[0][5] == "-" and rows[0][6] == "-"
    assert sum(r[5] for r in rows[1:]) == pytest.approx(1 - rows[-1][4], abs=0.01)  # gains add up
    numeric = [r[6] for r in rows[1:] if r[6] != "-"]
    if numeric:  # the best configuration gained: the shares add up to its gain
        assert sum(numeric) == pytest.approx(1.0, abs=0.03)


def test_an_unknown_workload_is_refused() -> None:
    with pytest.raises(SystemExit, match="no_such_workload"):
        main(["ablation", "--workloads", "no_such_workload"])
