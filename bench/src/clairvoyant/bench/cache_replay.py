"""``cache-replay``: every cache policy's misses against Belady's optimum, replayed offline.

One deterministic simulated run per workload (plain LRU engines; the profiler's annotations,
trained on a warm-up instance as in ``cache-policies``, or the oracle's) gives the access trace: its completed calls, each reading its prompt's block chain
at its start and writing its response's at its end (access_trace.py).  The trace is replayed at
each capacity, per worker or with the cluster as one cache, under Belady's optimum and under each
registered cache policy's eviction order and drops (replay_cache.py has the rules).  Reported per
policy and capacity: block reads, misses, Belady's misses, and the competitive ratio

    misses / Belady misses        (SAGA §7, Eq. 15: tokens prefilled, online over offline optimal)

Capacities are blocks per cache, or fractions (below 1) of the trace's working set (the most
distinct blocks one cache sees).

    python -m clairvoyant.bench cache-replay --workload deep_research --workload swe_agent \\
        --capacities 0.03,0.1 --workflows 32 --scope worker
"""

from __future__ import annotations

import argparse
import sys
import time
from typing import Any

from clairvoyant.bench.access_trace import SCOPES, AccessTrace
from clairvoyant.bench.common import BENCHMARKS, RESULTS_DIR, BenchResult, progress, run_standalone
from clairvoyant.bench.experiment import ExperimentConfig, build_cluster, instance, make_annotator
from clairvoyant.bench.replay_cache import belady, competitive_ratio, replay
from clairvoyant.bench.sim.simulator import Simulator
from clairvoyant.bench.workloads import get_workload
from clairvoyant.policy import CACHE_POLICIES, PRESETS
from clairvoyant.policy.cache import CompletedCall

DEFAULT_WORKLOADS = ("deep_research", "coding_assistant", "swe_agent")
DEFAULT_CAPACITIES = "0.03,0.1"  # of the working set: tight, and where Belady nears its first reads
COLUMNS = ["workload", "scope", "capacity", "of working set", "policy", "reads", "first reads", "misses", "Belady misses",
           "hit ratio", "Belady hit ratio", "dropped", "competitive ratio"]  # fmt: skip


def parse_capacities(text: str, working_set: int) -> list[int]:
    """Blocks per cache: an integer >= 1 is blocks, a number in (0, 1) a fraction of ``working_set``
    (at least one block).  Raises ValueError for anything else."""
    out: list[int] = []
    for item in (part.strip() for part in text.split(",")):
        if not item:
            continue
        value = float(item)
        if 0 < value < 1:
            out.append(max(1, round(value * working_set)))
        elif value >= 1 and value == int(value):
            out.append(int(value))
        else:
            raise ValueError(f"a capacity is a whole number of blocks or a fraction in (0, 1), got {item!r}")
    if not out:
        raise ValueError("no capacity given")
    return out


def simulate(workload: str, args: argparse.Namespace) -> list[CompletedCall]:
    """The served calls of one deterministic run of ``workload`` (the options' instance), plain
    LRU engines with no cache manager."""
    config = ExperimentConfig(
        workload=workload, gpus=args.gpus, workflows=args.workflows, concurrency=args.concurrency,
        seed=args.seed, annotations=args.annotations, warmup_workflows=args.warmup_workflows,
    )  # fmt: skip
    spec = get_workload(workload)
    replicas, service = build_cluster(spec, config)
    arrivals, backlog = instance(spec, config)
    simulator = Simulator(replicas, args.preset, seed=config.seed, service_times=service,
                          annotator=make_annotator(config), record_completions=True)  # fmt: skip
    simulator.run(arrivals, backlog=backlog)
    return [call for call in simulator.completions if call.ok]  # a refused call never ran


def replay_rows(workload: str, trace: AccessTrace, capacities: list[int], policies: list[str],
                tick_s: float) -> list[dict[str, Any]]:  # fmt: skip
    """One result per (capacity, policy): Belady's and the policy's misses on ``trace``."""
    working_set = trace.working_set()
    first_reads = belady(trace, working_set).misses  # unbounded: only a block's first read misses
    out: list[dict[str, Any]] = []
    for capacity in capacities:
        started = time.perf_counter()
        optimum = belady(trace, capacity)
        progress(f"{workload} @{capacity} blocks: Belady {optimum.misses:,} misses "
                 f"({time.perf_counter() - started:.1f} s)")  # fmt: skip
        for name in policies:
            started = time.perf_counter()
            result = replay(trace, capacity, CACHE_POLICIES.create(name), tick_s=tick_s)
            progress(f"{workload} @{capacity} blocks: {name} {result.misses:,} misses "
                     f"({time.perf_counter() - started:.1f} s)")  # fmt: skip
            out.append({
                "workload": workload, "scope": trace.scope, "capacity": capacity,
                "fraction": capacity / working_set if working_set else float("nan"), "policy": name,
                "reads": result.reads, "first_reads": first_reads, "misses": result.misses, "belady_misses": optimum.misses,
                "evictions": result.evictions, "belady_evictions": optimum.evictions, "dropped": result.dropped,
                "directives": result.directives,
                "competitive_ratio": competitive_ratio(result.misses, optimum.misses),
            })  # fmt: skip
    return out


def _row(result: dict[str, Any]) -> list[Any]:
    reads = result["reads"]
    hit = (reads - result["misses"]) / reads if reads else float("nan")
    optimal_hit = (reads - result["belady_misses"]) / reads if reads else float("nan")
    return [result["workload"], result["scope"], result["capacity"], result["fraction"], result["policy"], reads,
            result["first_reads"], result["misses"], result["belady_misses"], hit, optimal_hit, result["dropped"],
            result["competitive_ratio"]]  # fmt: skip


@BENCHMARKS.register("cache-replay")
class CacheReplay:
    help = "offline replay: every cache policy's misses over Belady's optimum (competitive ratio)"

    def add_arguments(self, parser: argparse.ArgumentParser) -> None:
        parser.add_argument("--workload", action="append", default=None,
                            help=f"repeat for several (default: {', '.join(DEFAULT_WORKLOADS)})")  # fmt: skip
        parser.add_argument("--capacities", default=DEFAULT_CAPACITIES,
                            help="blocks per cache, or fractions (< 1) of the working set, comma-separated")  # fmt: skip
        parser.add_argument(
            "--scope", choices=SCOPES, default="worker", help="a cache per worker, or one for all"
        )
        parser.add_argument(
            "--policies", default=None, help="comma-separated (default: every registered one)"
        )
        parser.add_argument("--workflows", type=int, default=32)
        parser.add_argument("--concurrency", type=int, default=16, help="closed loop: workflows in flight")
        parser.add_argument("--gpus", type=int, default=2)
        parser.add_argument("--seed", type=int, default=0)
        parser.add_argument(
            "--preset", choices=PRESETS.names(), default="fcfs-rr", help="the scheduling preset"
        )
        parser.add_argument("--annotations", choices=("profiler", "oracle"), default="profiler",
                            help="what the policies read of each call (the profiler's is trained on a warm-up)")  # fmt: skip
        parser.add_argument(
            "--warmup-workflows", type=int, default=64, help="the profiler's warm-up instance (0: learn online only)"
        )
        parser.add_argument(
            "--tick-s", type=float, default=1.0, help="trace seconds between the policies' ticks"
        )

    def run(self, args: argparse.Namespace) -> BenchResult:
        workloads = args.workload or list(DEFAULT_WORKLOADS)
        policies = args.policies.split(",") if args.policies else CACHE_POLICIES.names()
        unknown = [name for name in policies if name not in CACHE_POLICIES.names()]
        if unknown:
            raise SystemExit(f"unknown cache policies {unknown}; choose from {CACHE_POLICIES.names()}")
        results: list[dict[str, Any]] = []
        traces: dict[str, dict[str, int]] = {}
        for workload in workloads:
            started = time.perf_counter()
            progress(f"{workload}: simulating {args.workflows} workflows")
            trace = AccessTrace.of(simulate(workload, args), args.scope)
            capacities = parse_capacities(args.capacities, trace.working_set())
            traces[workload] = {"calls": len(trace.calls), "caches": len(trace.caches()), "reads": trace.reads(),
                                "working_set": trace.working_set()}  # fmt: skip
            progress(f"{workload}: {len(trace.calls)} calls, {trace.reads():,} block reads, working set "
                     f"{trace.working_set():,} blocks ({time.perf_counter() - started:.0f} s); capacities {capacities}")  # fmt: skip
            results += replay_rows(workload, trace, capacities, policies, args.tick_s)
        summary = {f"{r['workload']} {r['policy']} @{r['capacity']}: competitive ratio": r["competitive_ratio"]
                   for r in results}  # fmt: skip
        params = {k: v for k, v in vars(args).items() if k not in ("command", "out_dir")}
        params.update(workload=workloads, policies=policies, traces=traces, replays=results)
        notes = [
            "competitive ratio = misses / Belady's misses on the same trace and capacity (SAGA Eq. 15, whose "
            "cost is tokens prefilled: whole blocks, so misses x block size); first reads count as misses for both",
            "first reads: the misses at unbounded capacity, a floor for every policy and Belady alike",
            "a call reads its prompt's chain at its start and writes its response's at its end; the current "
            "access's blocks cannot be evicted, and an offered block that ranks lowest bypasses the cache",
            "a policy orders evictions by eviction_rank and acts through drop directives only: retain, "
            "write_back, promote and pre_prefill are ignored in the replay (one tier, no speculation)",
            f"scope {args.scope}: " + ("one cache per worker, each of the capacity" if args.scope == "worker"
                                       else "the whole cluster as one cache of the capacity"),
            "the trace comes from one simulated run with plain LRU engines; the replay changes no placement",
            f"annotations: {args.annotations}" + (f" (trained on a warm-up of {args.warmup_workflows} workflows, "
                                                  "then online)" if args.annotations == "profiler" else ""),
        ]  # fmt: skip
        return BenchResult("cache-replay", COLUMNS, [_row(r) for r in results], summary=summary, notes=notes,
                           params=params)  # fmt: skip


def main(argv: list[str] | None = None) -> int:
    return run_standalone(CacheReplay(), argv, prog="python -m clairvoyant.bench.cache_replay", description=__doc__,
                          out_dir=RESULTS_DIR / "cache-replay")  # fmt: skip


if __name__ == "__main__":
    sys.exit(main())
