"""``python -m clairvoyant.bench sim-vs-live``: the simulator against a live stack, same experiment.

Starts a stack (``clairvoyant.stack.Stack``: NATS, scheduler with ``--policy``, one emulated worker per
replica the simulator's ``build_cluster`` gives ``--gpus``, gateway) whose workers have the
simulated replicas' engine settings (GPU, model, tensor-parallel degree, KV pool, batch and token
budget); measures, on the idle stack, the two costs a live request pays that the simulator does
not model; runs the workload on it with ``--mode live``; runs the same instance in the simulator
as it is, and once more with the two measured costs added; prints the three side by side.

The two costs (``Overheads``), measured with single streamed requests before the run:

- ``hop_s``, per call: client -> gateway -> scheduler -> worker and the reply's way back, i.e. a
  1-token request's latency less the roofline's prefill time;
- ``step_s``, per engine step: the worker's own CPU time per step (scheduling, sampling, the
  asyncio and gRPC hand-off of each token), which an emulated worker spends *on top of* the
  roofline's step time although that time already counts ``GpuSpec.step_overhead`` for it.

"sim + overheads" adds ``step_s`` to ``step_overhead`` and folds ``hop_s`` into every call's tool
latency (each call on a path pays it once, so a workflow's critical path gains what it gains live).
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import tempfile
import time
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import numpy as np
import openai

from clairvoyant.bench.common import BENCHMARKS, BenchResult, progress
from clairvoyant.bench.experiment import ExperimentConfig, build_cluster, instance, run_sim
from clairvoyant.bench.live.cluster import LiveModeError
from clairvoyant.bench.live.prompts import ALPHABET
from clairvoyant.bench.live.run import LiveOptions, run_live
from clairvoyant.bench.metrics import summarize
from clairvoyant.bench.sim.simulator import ReplicaSpec, Simulator
from clairvoyant.bench.workloads import get_workload, list_workloads
from clairvoyant.policy import PRESETS
from clairvoyant.stack import Stack, StackConfig
from clairvoyant.worker.costmodel.roofline import BatchItem, CostModel
from clairvoyant.worker.runners.emulated import EmulatedRunner
from clairvoyant.workloads.program import WorkflowProgram

COMPARED = (
    "workflows", "calls", "avg_jct_s", "p50_jct_s", "p95_jct_s", "throughput_tok_s", "workflows_per_min",
    "avg_queue_s", "program_token_latency_s", "cache_hit_ratio", "preemptions", "lower_bound_avg_jct_s",
    "distance_from_limit", "duration_s",
)  # fmt: skip
TARGETS = {"avg_jct_s": 0.15, "throughput_tok_s": 0.10}  # |live / sim - 1| within these agrees
PROBE_REPEATS, PROBE_PROMPT_TOKENS, PROBE_DECODE_STEPS = 9, 256, 100


@dataclass(frozen=True)
class Overheads:
    hop_s: float  # per call, beyond the roofline's prefill of a 1-token request
    step_s: float  # per engine step, beyond the roofline's step time


async def measure_overheads(client: openai.AsyncOpenAI, model: str, cost: CostModel) -> Overheads:
    """Medians of sequential single requests on an idle stack (fresh prompts: no cache hits)."""
    rng = np.random.default_rng(0)

    async def latency(max_tokens: int) -> float:
        prompt = "".join(rng.choice(list(ALPHABET), size=PROBE_PROMPT_TOKENS))
        started = time.perf_counter()
        stream = await client.completions.create(
            model=model, prompt=prompt, max_tokens=max_tokens, temperature=0.0, stream=True,
            stream_options={"include_usage": True}, extra_body={"ignore_eos": True},
        )  # fmt: skip
        async for _ in stream:
            pass
        return time.perf_counter() - started

    await latency(1)  # connections and first-request work
    one = statistics.median([await latency(1) for _ in range(PROBE_REPEATS)])
    many = statistics.median([await latency(1 + PROBE_DECODE_STEPS) for _ in range(PROBE_REPEATS)])
    prefill = cost.step_cost([BatchItem(PROBE_PROMPT_TOKENS, 0)]).seconds
    decodes = sum(cost.step_cost([BatchItem(1, PROBE_PROMPT_TOKENS + s)]).seconds for s in range(PROBE_DECODE_STEPS))
    return Overheads(hop_s=one - prefill, step_s=(many - one - decodes) / PROBE_DECODE_STEPS)


def _no_sleep(seconds: float) -> None:
    del seconds


def _with_hop(program: WorkflowProgram, hop_s: float) -> WorkflowProgram:
    calls = tuple(replace(c, tool_latency_s=c.tool_latency_s + hop_s) for c in program.calls)
    return WorkflowProgram(program.workflow_type, program.workflow_id, calls)


def run_sim_with_overheads(config: ExperimentConfig, policy: str, overheads: Overheads) -> dict[str, Any]:
    """``run_sim``'s metrics with ``overheads`` modelled (see the module docstring)."""
    workload = get_workload(config.workload)
    replicas, service = build_cluster(workload, config)
    slower: list[ReplicaSpec] = []
    for spec in replicas:
        cost = _emulated(spec).cost
        gpu = replace(cost.gpu, step_overhead=cost.gpu.step_overhead + max(0.0, overheads.step_s))
        runner = EmulatedRunner(cost.model, gpu, cost.tp, sleep=_no_sleep, distinct_tokens=True)
        slower.append(ReplicaSpec(spec.worker_id, runner, spec.config))
    arrivals, backlog = instance(workload, config)
    hop = max(0.0, overheads.hop_s)
    records = Simulator(slower, policy, seed=config.seed, service_times=service).run(
        [(t, _with_hop(p, hop)) for t, p in arrivals], backlog=[_with_hop(p, hop) for p in backlog]
    )
    return summarize(records)


def emulated_stack_config(var_dir: Path, config: ExperimentConfig, policy: str, replicas: list[ReplicaSpec]) -> StackConfig:
    """A stack whose workers are the simulated replicas, emulated in real time, on free ports.

    No profiler: the simulator has none (the compared policies do not read annotations), and on a
    2-core machine its process and each call's Annotate round trip would be measured as the
    serving path's cost."""
    spec = replicas[0]
    engine = spec.config
    return StackConfig.on_free_ports(
        var_dir,
        model=spec.runner.info.name,
        workers=len(replicas),
        policy=policy,
        profiler=False,
        worker_env={
            "CV_RUNNER": "emulated",
            "CV_GPU": config.gpu,
            "CV_TENSOR_PARALLEL": spec.runner.info.extra.get("tensor_parallel", "1"),
            "CV_BLOCK_SIZE": str(engine.block_size),
            "CV_NUM_BLOCKS": str(engine.num_blocks),
            "CV_MAX_NUM_SEQS": str(engine.max_num_seqs),
            "CV_MAX_NUM_BATCHED_TOKENS": str(engine.max_num_batched_tokens),
            "CV_TORCH_THREADS": "1",
        },
    )


@BENCHMARKS.register("sim-vs-live")
class SimVsLive:
    help = "the simulator against a live stack of emulated workers: same workload, instance and cluster"

    def add_arguments(self, parser: argparse.ArgumentParser) -> None:
        parser.add_argument("--workload", default="react_bfcl", choices=list_workloads())
        parser.add_argument("--policy", default="fcfs-rr", choices=PRESETS.names())
        parser.add_argument("--gpus", type=int, default=2)
        parser.add_argument("--gpu", default="H100-80G")
        parser.add_argument("--workflows", type=int, default=16)
        load = parser.add_mutually_exclusive_group()
        load.add_argument("--rate", type=float, help="Poisson workflow arrivals per second")
        load.add_argument("--concurrency", type=int, default=8, help="closed loop: workflows in flight")
        parser.add_argument("--seed", type=int, default=0)

    def run(self, args: argparse.Namespace) -> BenchResult:
        config = ExperimentConfig(
            workload=args.workload, gpus=args.gpus, gpu=args.gpu, workflows=args.workflows,
            rate=args.rate, concurrency=None if args.rate else args.concurrency, seed=args.seed,
        )  # fmt: skip
        workload = get_workload(config.workload)
        if len(workload.served_models()) != 1:
            raise SystemExit(f"error: {config.workload} uses {len(workload.served_models())} models; the stack serves one")
        replicas, _ = build_cluster(workload, config)
        with tempfile.TemporaryDirectory(prefix="sim-vs-live-") as var:
            stack_config = emulated_stack_config(Path(var), config, args.policy, replicas)
            progress(f"starting a stack: {stack_config.workers} emulated {stack_config.model} on {config.gpu}, {args.policy}")
            stack = Stack(stack_config).start(ready_timeout=120)
            try:
                options = LiveOptions(base_url=f"{stack.gateway_url}/v1", scheduler=stack.scheduler_address)
                overheads = asyncio.run(_measure(options, replicas[0]))
                progress(f"measured per call {overheads.hop_s * 1e3:.1f} ms, per step {overheads.step_s * 1e3:.2f} ms")
                live = run_live(config, [args.policy], options)[args.policy]
            except LiveModeError as exc:
                raise SystemExit(f"error: {exc}") from None
            finally:
                stack.stop()
        progress("live run done; simulating the same instance")
        sim = run_sim(config, args.policy)
        calibrated = run_sim_with_overheads(config, args.policy, overheads)
        return comparison(config, args.policy, sim, calibrated, live, overheads)


async def _measure(options: LiveOptions, replica: ReplicaSpec) -> Overheads:
    async with openai.AsyncOpenAI(base_url=options.base_url, api_key=options.api_key, max_retries=0) as client:
        return await measure_overheads(client, replica.runner.info.name, _emulated(replica).cost)


def _emulated(spec: ReplicaSpec) -> EmulatedRunner:
    assert isinstance(spec.runner, EmulatedRunner), "build_cluster makes emulated replicas"
    return spec.runner


def comparison(
    config: ExperimentConfig,
    policy: str,
    sim: dict[str, Any],
    calibrated: dict[str, Any],
    live: dict[str, Any],
    overheads: Overheads,
) -> BenchResult:
    def ratio(a: float, b: float) -> float:
        return a / b if b else float("nan")

    rows: list[list[Any]] = []
    for key in COMPARED:
        values = (float(sim[key]), float(calibrated[key]), float(live[key]))
        rows.append([key, *values, ratio(values[2], values[0]), ratio(values[2], values[1])])
    summary: dict[str, Any] = {
        "hop_ms_per_call": overheads.hop_s * 1e3,
        "overhead_ms_per_step": overheads.step_s * 1e3,
    }
    for label, reference in (("sim", sim), ("sim_plus_overheads", calibrated)):
        jct = ratio(live["avg_jct_s"], reference["avg_jct_s"])
        throughput = ratio(live["throughput_tok_s"], reference["throughput_tok_s"])
        summary[f"avg_jct_live_over_{label}"] = jct
        summary[f"throughput_live_over_{label}"] = throughput
        summary[f"agrees_{label}"] = (
            abs(jct - 1) <= TARGETS["avg_jct_s"] and abs(throughput - 1) <= TARGETS["throughput_tok_s"]
        )
    load = f"r{config.rate:g}" if config.rate else f"c{config.concurrency}"
    return BenchResult(
        name=f"sim-vs-live-{config.workload}-{load}",
        columns=["metric", "sim", "sim + overheads", "live", "live / sim", "live / (sim + overheads)"],
        rows=rows,
        summary=summary,
        notes=[
            f"agreement targets: avg JCT within {TARGETS['avg_jct_s']:.0%}, throughput within {TARGETS['throughput_tok_s']:.0%}",
            *live["live"]["warnings"],
        ],
        params={
            "config": vars(config),
            "policy": policy,
            "overheads": vars(overheads),
            "replicas": sim["replicas"],
            "live_workers": live["replicas"],
            "sim_jct_s": sim["jct_s"],
            "live_jct_s": live["jct_s"],
            "live": live["live"],
        },
    )
