"""``python -m clairvoyant.bench <name> [options]``: run one benchmark, print its table, save its JSON.

Benchmarks are not tests: they report figures and ratios against a baseline measured in the same
run, and never fail on a threshold.  Results go to ``bench/results/<name>.json``.
"""

from __future__ import annotations

import argparse
import logging
import sys
from pathlib import Path

# Imported for their registrations in BENCHMARKS.
from clairvoyant.bench import (  # noqa: F401
    ablation,
    aragog,
    cache_replay,
    cache_tiers,
    cachemgr_memory,
    cli_experiment,
    constrained,
    decision_cost,
    engine_throughput,
    gateway_breakdown,
    gateway_overhead,
    knee,
    kv_swap,
    prefix_ttft,
    profiler_ingest,
    reinvoked_agent,
    sim_speed,
    soak,
    sweep,
)
from clairvoyant.bench.common import BENCHMARKS, RESULTS_DIR, load_average, progress, report
from clairvoyant.bench.live import compare as live_compare  # noqa: F401  (registers live-compare)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m clairvoyant.bench", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out-dir", type=Path, default=RESULTS_DIR, help="where <name>.json is written")
    parser.add_argument("--list", action="store_true", help="list workloads and policies")
    if argv is None:
        argv = sys.argv[1:]
    if "--list" in argv:
        print(cli_experiment.listing())
        return 0
    commands = parser.add_subparsers(dest="command", required=True, metavar="command")
    cli_experiment.add_parsers(commands)
    sweep.add_parsers(commands)
    for name in BENCHMARKS.names():
        bench = BENCHMARKS.create(name)
        sub = commands.add_parser(name, help=bench.help, description=bench.help)
        bench.add_arguments(sub)
    args = parser.parse_args(argv)
    if args.command in cli_experiment.COMMANDS:
        return cli_experiment.run_command(args)
    if args.command in ("sweep", "plot"):
        return sweep.run_command(args)
    logging.basicConfig(level=logging.WARNING, format="%(levelname)s %(name)s: %(message)s")
    started = load_average()
    progress(f"{args.command}: load average {started[0]:.2f} {started[1]:.2f} {started[2]:.2f}")
    result = BENCHMARKS.create(args.command).run(args)
    report(result, args.out_dir, started)
    return 0


if __name__ == "__main__":
    sys.exit(main())
