"""``sim-speed``: how much faster than real time the simulator runs (virtual seconds per wall second).

    python -m clairvoyant.bench sim-speed                        # 8 GPUs, 256 coding_assistant workflows
    python -m clairvoyant.bench sim-speed --concurrency 64,256 --horizon 30 --profile
    python -m clairvoyant.bench sim-speed --warmup 300 --horizon 30   # once the KV pools are full

A closed loop keeps ``concurrency`` workflows in flight from t=0; after ``--warmup`` virtual seconds
(not timed) the simulator runs ``--horizon`` more, and the wall time of that stretch is the
denominator (the loop stays full: twice the concurrency in programs, and coding_assistant workflows
take minutes).  The timed stretch is the event loop (``Simulator.advance``); assembling the
records afterwards is a pass over every call since t=0 (warm-up included), done once per run, and
is reported apart ("records s").  Per generated token and per engine step costs say whether the
time goes into per-row or per-step work.  ``--profile`` runs the largest concurrency again under
cProfile and breaks its time down by part (engine steps, decode runs, the radix cache, the global
scheduler, the simulator).
"""

from __future__ import annotations

import argparse
import cProfile
import io
import pstats
import time
from typing import Any

from clairvoyant.bench.common import BENCHMARKS, BenchResult, progress
from clairvoyant.bench.experiment import ExperimentConfig, build_cluster, instance
from clairvoyant.bench.sim.simulator import Simulator
from clairvoyant.bench.workloads import get_workload, list_workloads

# (part, file suffix, function): cumulative times of these, from the profile.  Nested parts
# are shown indented and are included in their parent; the RadixCache parts sum every caller.
PROFILE_PARTS: tuple[tuple[str, str, str], ...] = (
    ("simulator event loop (everything)", "bench/sim/events.py", "run"),
    ("  LLMEngine.step (admissions, prefill chunks, decode rows)", "worker/core/engine.py", "step"),
    ("    Scheduler.schedule (batch formation, KV blocks)", "worker/core/scheduler.py", "schedule"),
    ("      BlockManager.allocate (prompt blocks)", "worker/core/block_manager.py", "allocate"),
    ("    EmulatedRunner.forward_tokens (cost model, tokens)", "worker/runners/emulated.py", "forward_tokens"),
    ("    BlockManager.cache_computed_blocks (prefill blocks)", "worker/core/block_manager.py", "cache_computed_blocks"),
    ("  LLMEngine.plan_decode_run", "worker/core/engine.py", "plan_decode_run"),
    ("  LLMEngine.advance_decode (decode runs)", "worker/core/engine.py", "advance_decode"),
    ("    replay_block_events (a run's KV blocks)", "worker/core/decode_run.py", "replay_block_events"),
    ("  RadixCache.evict (every caller)", "worker/core/radix_cache.py", "evict"),
    ("  RadixCache.insert (prefill blocks, every caller)", "worker/core/radix_cache.py", "insert"),
    ("  RadixCache.insert_held (decode-run blocks)", "worker/core/radix_cache.py", "insert_held"),
    ("  RadixCache.release (finished sequences)", "worker/core/radix_cache.py", "release"),
    ("  Simulator._step_done (outputs, heartbeat, dispatch)", "bench/sim/simulator.py", "_step_done"),
    ("    GlobalScheduler.update_worker", "scheduler/core/global_queue.py", "update_worker"),
    ("    GlobalScheduler.dispatch", "scheduler/core/global_queue.py", "dispatch"),
    ("  Simulator._add_request (prompt assembly, admission checks)", "bench/sim/simulator.py", "_add_request"),
)


@BENCHMARKS.register("sim-speed")
class SimSpeed:
    help = "simulator speed: virtual seconds per wall second (goal >= 100x real time)"

    def add_arguments(self, parser: argparse.ArgumentParser) -> None:
        parser.add_argument("--workload", default="coding_assistant", choices=list_workloads())
        parser.add_argument("--policy", default="fcfs-rr")
        parser.add_argument("--gpus", type=int, default=8)
        parser.add_argument("--concurrency", default="256", help="comma-separated closed-loop concurrencies")
        parser.add_argument("--horizon", type=float, default=30.0, help="virtual seconds timed per run")
        parser.add_argument("--warmup", type=float, default=0.0, help="virtual seconds run, untimed, first")
        parser.add_argument("--seed", type=int, default=0)
        parser.add_argument("--block-size", type=int, default=16, help="simulated KV block size (tokens)")
        parser.add_argument(
            "--profile", action="store_true", help="cProfile one more run at the largest concurrency"
        )
        parser.add_argument("--quick", action="store_true", help="concurrency 16, 5 virtual seconds")

    def run(self, args: argparse.Namespace) -> BenchResult:
        levels = [16] if args.quick else [int(c) for c in args.concurrency.split(",") if c]
        horizon = 5.0 if args.quick else args.horizon
        rows: list[list[Any]] = []
        for concurrency in levels:
            figures = self._timed(args, concurrency, horizon)
            progress(f"concurrency {concurrency}: {figures['speed']:.1f}x real time")
            rows.append([concurrency, figures["virtual_s"], figures["wall_s"], figures["speed"], figures["steps"],
                         figures["tokens"], figures["rows_per_step"], figures["us_per_token"],
                         figures["us_per_step"], figures["records_s"]])  # fmt: skip
        notes: list[str] = []
        summary: dict[str, Any] = {f"speed at concurrency {r[0]} (x real time)": r[3] for r in rows}
        summary["goal"] = ">= 100x real time at 256 concurrent workflows on 8 GPUs"
        if args.profile:
            parts, top = self._profiled(args, max(levels), horizon)
            total = parts[PROFILE_PARTS[0][0]] or 1e-9
            lines = [
                f"{label:<64} {seconds:8.2f} s {seconds / total:6.1%}" for label, seconds in parts.items()
            ]
            notes.append(
                f"cProfile at concurrency {max(levels)}, cumulative time by part:\n" + "\n".join(lines)
            )
            notes.append("cProfile, top 25 by own time:\n" + top)
        return BenchResult(
            name="sim-speed",
            columns=[
                "concurrency",
                "virtual s",
                "wall s",
                "x real time",
                "engine steps",
                "tokens out",
                "rows/step",
                "µs/token",
                "µs/step",
                "records s",
            ],  # fmt: skip
            rows=rows,
            summary=summary,
            notes=notes,
            params={k: v for k, v in vars(args).items() if k not in ("func", "out_dir")},
        )

    @staticmethod
    def _simulator(args: argparse.Namespace, concurrency: int) -> tuple[Simulator, Any, Any]:
        # Twice the concurrency in programs: the loop stays full past any horizon a run uses.
        config = ExperimentConfig(workload=args.workload, gpus=args.gpus, workflows=2 * concurrency,
                                  concurrency=concurrency, seed=args.seed, block_size=args.block_size)  # fmt: skip
        workload = get_workload(config.workload)
        replicas, service = build_cluster(workload, config)
        arrivals, backlog = instance(workload, config)
        return Simulator(replicas, args.policy, seed=args.seed, service_times=service), arrivals, backlog

    def _timed(self, args: argparse.Namespace, concurrency: int, horizon: float) -> dict[str, float]:
        sim, arrivals, backlog = self._simulator(args, concurrency)
        sim.run(arrivals, backlog=backlog, until=args.warmup)
        virtual0, steps0, tokens0 = sim.events.now, _steps(sim), _tokens(sim)
        started = time.perf_counter()
        sim.advance(until=args.warmup + horizon)
        wall = time.perf_counter() - started
        virtual, steps, tokens = sim.events.now - virtual0, _steps(sim) - steps0, _tokens(sim) - tokens0
        started = time.perf_counter()
        sim.resume(until=args.warmup + horizon)  # nothing left to simulate: assembles the records
        records_wall = time.perf_counter() - started
        return {
            "records_s": records_wall,
            "virtual_s": virtual,
            "wall_s": wall,
            "speed": virtual / wall,
            "steps": steps,
            "tokens": tokens,
            "rows_per_step": tokens / max(1, steps),
            "us_per_token": wall / max(1, tokens) * 1e6,
            "us_per_step": wall / max(1, steps) * 1e6,
        }

    def _profiled(
        self, args: argparse.Namespace, concurrency: int, horizon: float
    ) -> tuple[dict[str, float], str]:
        sim, arrivals, backlog = self._simulator(args, concurrency)
        sim.run(arrivals, backlog=backlog, until=args.warmup)
        profiler = cProfile.Profile()
        profiler.enable()
        sim.advance(until=args.warmup + horizon)
        profiler.disable()
        stats = pstats.Stats(profiler)
        parts: dict[str, float] = {}
        for label, suffix, function in PROFILE_PARTS:
            parts[label] = sum(
                row[3]
                for (path, _, name), row in stats.stats.items()  # type: ignore[attr-defined]
                if name == function and path.replace("\\", "/").endswith(suffix)
            )
        text = io.StringIO()
        pstats.Stats(profiler, stream=text).sort_stats("tottime").print_stats(25)
        return parts, text.getvalue()


def _steps(sim: Simulator) -> int:
    return sum(r.runner.steps for r in sim.replicas.values())  # type: ignore[attr-defined]


def _tokens(sim: Simulator) -> int:
    return sum(r.engine.stats().generated_tokens_total for r in sim.replicas.values())
