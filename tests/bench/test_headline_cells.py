"""bench/headline.sh: every cell is a compare the command line accepts, on a known workload, GPU and
arrival process, so the script does not fail an hour into its run."""

from __future__ import annotations

import argparse
import re
import shlex
from pathlib import Path

import pytest

from clairvoyant.bench import cli_experiment
from clairvoyant.bench.arrivals import parse_arrivals
from clairvoyant.worker.costmodel.gpus import GPUS
from clairvoyant.workloads.registry import check_workload_name

pytestmark = pytest.mark.unit

SCRIPT = Path(__file__).resolve().parents[2] / "bench" / "headline.sh"


def _cells() -> list[list[str]]:
    text = SCRIPT.read_text()
    block = re.search(r'CELLS="\n(.*?)\n"', text, re.S)
    assert block is not None
    return [line.split() for line in block.group(1).splitlines() if line.strip() and not line.startswith("#")]


def _stack() -> list[str]:
    found = re.search(r'^STACK="(.*)"$', SCRIPT.read_text(), re.M)
    assert found is not None
    return shlex.split(found.group(1))


def test_every_cell_parses_as_a_compare_of_known_things() -> None:
    parser = argparse.ArgumentParser()
    cli_experiment.add_parsers(parser.add_subparsers(dest="command"))
    cells = _cells()
    assert len(cells) >= 20 and len({c[0] for c in cells}) == len(cells)  # names are unique: one file each
    for name, workload, gpu, warmup, *load in cells:
        argv = ["compare", "--workload", workload, "--gpus", "8", "--gpu", gpu, *_stack(),
                "--warmup-workflows", warmup, *load, "--policies", "vllm-prodstack", "--out", "x.json"]  # fmt: skip
        args = parser.parse_args(argv)
        assert check_workload_name(args.workload) == workload, name
        assert gpu.lower() in GPUS, name
        assert args.own_stacks and args.annotations == "profiler" and args.block_size == 64
        assert (args.concurrency is None) != (args.arrivals is None), name  # one load each
        if args.arrivals is not None:
            parse_arrivals(args.arrivals)
