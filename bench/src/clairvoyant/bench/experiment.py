"""One experiment = a workload instance, an arrival process and a cluster, run under one preset.

``compare`` runs every preset on the *same* instance: the same seed gives the same programs
(lengths, fan-outs, tool latencies) and the same arrival times, so differences are the policy's.

Cluster placement (a choice; the seeds each fix their own): the GPUs are shared equally among the
workload's served models; each replica of a model uses the smallest tensor-parallel degree in
(1, 2, 4, 8) whose KV pool holds at least one full-context request (``min(max_model_len, 32K)``
tokens), as a serving operator would size it.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np

from clairvoyant.bench.arrivals import ClosedLoop, Poisson
from clairvoyant.bench.metrics import jct_list, queue_depth_series, summarize
from clairvoyant.bench.sim.lower_bound import RooflineServiceTime, ServiceTime
from clairvoyant.bench.sim.simulator import ReplicaSpec, Simulator
from clairvoyant.bench.workloads import Workload, get_workload
from clairvoyant.bench.workloads.program import WorkflowProgram
from clairvoyant.worker.core.engine import EngineConfig
from clairvoyant.worker.runners.emulated import EmulatedRunner

if TYPE_CHECKING:
    from clairvoyant.bench.live.run import LiveOptions

TP_CHOICES = (1, 2, 4, 8)
QUEUE_SERIES_POINTS = 500  # per model, in the results file


@dataclass(frozen=True)
class ExperimentConfig:
    workload: str
    gpus: int = 8
    gpu: str = "H100-80G"
    workflows: int = 64
    rate: float | None = None  # workflows/s (Poisson); None with concurrency None: all at t=0
    concurrency: int | None = None  # closed loop
    seed: int = 0
    block_size: int = 16
    max_num_seqs: int = 256
    max_num_batched_tokens: int = 8192


def _no_sleep(seconds: float) -> None:
    del seconds  # virtual time: the simulator moves the clock


MIN_KV_TOKENS = 32_768


def _runner(model: str, gpu: str) -> tuple[EmulatedRunner, int]:
    for tp in TP_CHOICES:
        try:
            runner = EmulatedRunner(model, gpu, tp, sleep=_no_sleep, distinct_tokens=True)
        except ValueError:
            continue
        if runner.cost.kv_capacity_tokens(runner.gpu_mem_util) >= min(runner.info.max_model_len, MIN_KV_TOKENS):
            return runner, tp
    raise ValueError(f"{model} does not fit 8 x {gpu} with room for a full-context request")


def build_cluster(workload: Workload, config: ExperimentConfig) -> tuple[list[ReplicaSpec], dict[str, ServiceTime]]:
    models = workload.served_models()
    share = max(1, config.gpus // len(models))
    replicas: list[ReplicaSpec] = []
    service: dict[str, ServiceTime] = {}
    for model in models:
        probe, tp = _runner(model, config.gpu)
        service[model] = RooflineServiceTime(probe.cost)
        for i in range(max(1, share // tp)):
            runner = probe if i == 0 else _runner(model, config.gpu)[0]
            engine = EngineConfig(
                block_size=config.block_size,
                num_blocks=runner.default_num_blocks(config.block_size) or 1024,
                max_num_seqs=config.max_num_seqs,
                max_num_batched_tokens=config.max_num_batched_tokens,
            )
            replicas.append(ReplicaSpec(f"{model}-{i}", runner, engine))
    return replicas, service


def instance(workload: Workload, config: ExperimentConfig) -> tuple[list[tuple[float, WorkflowProgram]], list[WorkflowProgram]]:
    """(initial arrivals, closed-loop backlog): identical for every preset given the seed."""
    rng = np.random.default_rng(config.seed)
    programs = [workload.instantiate(rng, f"wf-{i:05d}") for i in range(config.workflows)]
    arrival_rng = np.random.default_rng([config.seed, 1])
    if config.concurrency:
        initial = len(ClosedLoop(config.concurrency).times(arrival_rng, count=len(programs)))
        return [(0.0, p) for p in programs[:initial]], programs[initial:]
    if config.rate:
        times = Poisson(config.rate).times(arrival_rng, count=len(programs))
        return [(float(t), p) for t, p in zip(times, programs, strict=True)], []
    return [(0.0, p) for p in programs], []


def run_sim(config: ExperimentConfig, policy: str) -> dict[str, Any]:
    workload = get_workload(config.workload)
    replicas, service = build_cluster(workload, config)
    arrivals, backlog = instance(workload, config)
    started = time.perf_counter()
    records = Simulator(replicas, policy, seed=config.seed, service_times=service).run(arrivals, backlog=backlog)
    result = summarize(records)
    result["virtual_seconds"] = records.duration_s
    result["wall_seconds"] = time.perf_counter() - started
    result["replicas"] = {spec.worker_id: spec.runner.info.extra.get("tensor_parallel", "1") for spec in replicas}
    # For the plots (``python -m clairvoyant.bench plot``): the JCT CDF and queue depth over time.
    result["jct_s"] = jct_list(records)
    result["queue_depth_series"] = queue_depth_series(records, points=QUEUE_SERIES_POINTS)
    return result


def compare(
    config: ExperimentConfig, policies: list[str], mode: str = "sim", live: LiveOptions | None = None
) -> dict[str, Any]:
    """``mode`` "sim": every policy in the simulator; "live": the running stack, whose scheduler
    runs exactly one policy (``live.run``; raises ``live.cluster.LiveModeError``)."""
    if mode not in ("sim", "live"):
        raise ValueError(f"unknown mode {mode!r}; choose sim or live")
    started = time.perf_counter()
    if mode == "live":
        from clairvoyant.bench.live.run import LiveOptions, run_live  # the live package imports this module

        results = run_live(config, policies, live or LiveOptions())
    else:
        results = {policy: run_sim(config, policy) for policy in policies}
    return {
        "workload": config.workload,
        "mode": mode,
        "seed": config.seed,
        "wall_seconds": time.perf_counter() - started,
        "config": {k: v for k, v in vars(config).items()},
        "policies": results,
    }
