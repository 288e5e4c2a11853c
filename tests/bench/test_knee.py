"""Admission at the knee in the simulator: the knee fraction reaches the preset's routing, holds calls
in the global queue, and is refused where it means nothing."""

from __future__ import annotations

import argparse
import dataclasses
from pathlib import Path

import pytest

from clairvoyant.bench.__main__ import main
from clairvoyant.bench.experiment import ExperimentConfig, run_sim, sim_scheduler
from clairvoyant.bench.knee import _fractions
from clairvoyant.policy.admission import KneeAdmission

pytestmark = [pytest.mark.unit, pytest.mark.timeout(300)]
# A burst on two GPUs: more calls at once than a knee of φ = 0.05 admits (a few per replica).
BURST = ExperimentConfig(workload="react_bfcl", gpus=2, workflows=48, arrivals="cron:period_s=100000,batch=48")


def test_the_fraction_reaches_the_routing_policy() -> None:
    sched = sim_scheduler("clairvoyant", dataclasses.replace(BURST, knee_fraction=0.3))
    assert sched is not None
    assert isinstance(sched.routing_policy, KneeAdmission)
    assert sched.routing_policy.knee.throughput_fraction == 0.3
    assert sim_scheduler("clairvoyant", BURST) is None  # the preset's own
    displacing = sim_scheduler("pythia-knee", dataclasses.replace(BURST, knee_displace=True))
    assert displacing is not None and isinstance(displacing.routing_policy, KneeAdmission)
    assert displacing.routing_policy.knee.displace and displacing.routing_policy.knee.throughput_fraction == 0.7


def test_a_fraction_for_a_preset_without_a_knee_is_refused() -> None:
    with pytest.raises(ValueError, match="admits at the knee"):
        sim_scheduler("fcfs-rr", dataclasses.replace(BURST, knee_fraction=0.5))


def test_a_lower_knee_holds_more_calls_in_the_global_queue() -> None:
    tight = run_sim(dataclasses.replace(BURST, knee_fraction=0.05), "clairvoyant")
    open_ = run_sim(dataclasses.replace(BURST, knee_fraction=1.0), "clairvoyant")
    assert tight["workflows"] == open_["workflows"] == 48
    assert tight["avg_queue_s"] > open_["avg_queue_s"]


def test_cli_refuses_a_knee_fraction_out_of_range_or_for_the_wrong_preset(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    base = ["compare", "--workload", "react_bfcl", "--workflows", "4", "--out", str(tmp_path / "o.json")]
    with pytest.raises(SystemExit, match="must be in"):
        main([*base, "--policies", "clairvoyant", "--knee-fraction", "1.5"])
    with pytest.raises(SystemExit, match="fcfs-rr does not"):
        main([*base, "--policies", "fcfs-rr", "--knee-fraction", "0.5"])


def test_bench_fractions_are_parsed_and_checked() -> None:
    assert _fractions("0.5,0.7,1") == [0.5, 0.7, 1.0]
    for bad in ("", "0", "0.5,x", "1.2"):
        with pytest.raises(argparse.ArgumentTypeError):
            _fractions(bad)
