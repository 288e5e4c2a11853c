"""``--mode live``: one experiment against a running stack, with the metrics of ``--mode sim``.

The instance is ``experiment.instance`` (same seed: same programs, same arrival times, same
closed-loop backlog); the lower bound is the simulator's roofline service time of ``--gpu`` (each
model at the tensor-parallel degree ``experiment.build_cluster`` gives it).  The policy is the one
the scheduler runs: a live run checks it against the one named (``cluster.check_policies``).
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import openai
from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

from clairvoyant.bench.common import percentile, progress
from clairvoyant.bench.experiment import (
    QUEUE_SERIES_POINTS,
    ExperimentConfig,
    build_cluster,
    compare_result,
    instance,
)
from clairvoyant.bench.live.cluster import (
    LiveCluster,
    LiveModeError,
    LiveWorker,
    check_models,
    check_policies,
    preemptions_total,
    probe,
)
from clairvoyant.bench.live.driver import LiveDriver, cap_output, scale_tools
from clairvoyant.bench.metrics import jct_list, queue_depth_series, summarize
from clairvoyant.bench.records import WorkflowRecord
from clairvoyant.bench.sim.simulator import ReplicaSpec
from clairvoyant.bench.workloads import get_workload

DEFAULT_BASE_URL = "http://127.0.0.1:8000/v1"
DEFAULT_SCHEDULER = "127.0.0.1:50051"


@dataclass(frozen=True)
class LiveOptions:
    base_url: str = DEFAULT_BASE_URL
    api_key: str = "none"  # the gateway takes any key until an operator creates one
    time_scale: float = 1.0  # tool latencies are waited out x this
    scheduler: str | None = DEFAULT_SCHEDULER  # where to read the running preset; None: trust the name given
    request_timeout_s: float = 900.0
    show_progress: bool = True
    prompt_seed: int | None = None  # seeds the prompt text; None: the run's seed (same instance, other text)
    max_output_tokens: int | None = None  # caps every call's output; None: the workload's lengths
    session_header: str | None = None  # a header carrying the workflow id (a session-affinity key)
    served_model: str | None = None  # the model every call names; None: each call's own


def cluster_warnings(config: ExperimentConfig, replicas: Sequence[ReplicaSpec], cluster: LiveCluster) -> list[str]:
    """Where the live stack differs from the cluster ``--mode sim`` would simulate for ``config``."""
    warnings: list[str] = []
    if not cluster.workers:
        return warnings
    for model in sorted({spec.runner.info.name for spec in replicas}):
        sim = [spec for spec in replicas if spec.runner.info.name == model]
        live = [w for w in cluster.workers if w.model == model]
        if len(live) != len(sim):
            warnings.append(
                f"{model}: the stack runs {len(live)} workers; --mode sim with --gpus {config.gpus} "
                f"simulates {len(sim)} replicas (match them to compare the two)"
            )
        if {w.max_batch for w in live} - {sim[0].config.max_num_seqs}:
            warnings.append(
                f"{model}: workers batch up to {sorted({w.max_batch for w in live})} sequences, the "
                f"simulated replicas {sim[0].config.max_num_seqs} (CV_MAX_NUM_SEQS)"
            )
        if {w.kv_blocks_total for w in live} - {sim[0].config.num_blocks}:
            warnings.append(
                f"{model}: workers hold {sorted({w.kv_blocks_total for w in live})} KV blocks, an emulated "
                f"{model} on {config.gpu} {sim[0].config.num_blocks}; the lower bound assumes {config.gpu} (--gpu)"
            )
    return warnings


def compare_live(config: ExperimentConfig, policies: Sequence[str], options: LiveOptions) -> dict[str, Any]:
    """``experiment.compare``'s result for the running stack, whose scheduler runs exactly one
    policy.  Raises LiveModeError."""
    started = time.perf_counter()
    results = run_live(config, policies, options)
    return compare_result(config, "live", results, time.perf_counter() - started)


def run_live(config: ExperimentConfig, policies: Sequence[str], options: LiveOptions) -> dict[str, dict[str, Any]]:
    """{policy: metrics} for the one policy the stack runs.  Raises LiveModeError."""
    if options.time_scale < 0:
        raise LiveModeError(f"--time-scale must be >= 0, got {options.time_scale}")
    return asyncio.run(_run_live(config, policies, options))


async def _run_live(config: ExperimentConfig, policies: Sequence[str], options: LiveOptions) -> dict[str, dict[str, Any]]:
    workload = get_workload(config.workload)
    client = openai.AsyncOpenAI(
        base_url=options.base_url, api_key=options.api_key, max_retries=0, timeout=options.request_timeout_s
    )
    async with client:
        cluster = await probe(client, options.scheduler)
        policy = check_policies(policies, cluster.policy)
        check_models(workload.served_models(), cluster.models)
        replicas, _ = build_cluster(workload, config)
        warnings = cluster_warnings(config, replicas, cluster)
        for warning in warnings:
            progress(f"warning: {warning}")
        result = await drive(config, client, options, label=policy, workers=cluster.workers)
    result["live"]["policy_source"] = "scheduler" if cluster.policy is not None else "command line (not checked)"
    result["live"]["warnings"] = warnings
    return {policy: result}


async def drive(
    config: ExperimentConfig,
    client: openai.AsyncOpenAI,
    options: LiveOptions,
    *,
    label: str,
    workers: Sequence[LiveWorker] = (),
    model_clients: Mapping[str, openai.AsyncOpenAI] | None = None,
) -> dict[str, Any]:
    """``config``'s instance sent through ``client`` (or, per model, ``model_clients``): the metrics
    of ``--mode sim`` plus TTFT percentiles and a ``live`` block.  ``workers``: whose preemption
    counters to read before and after (none: not read).  Raises LiveModeError."""
    workload = get_workload(config.workload)
    _, service = build_cluster(workload, config)
    arrivals, backlog = instance(workload, config)
    arrivals = [(t, cap_output(scale_tools(p, options.time_scale), options.max_output_tokens)) for t, p in arrivals]
    backlog = [cap_output(scale_tools(p, options.time_scale), options.max_output_tokens) for p in backlog]
    run_tag = f"{int(time.time() * 1000):x}"
    preempted_before = await preemptions_total(workers)
    columns = (TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn())
    with Progress(*columns, console=Console(stderr=True), disable=not options.show_progress) as bar:
        task = bar.add_task(f"live {config.workload} ({label})", total=config.workflows)

        def done(_: WorkflowRecord) -> None:
            bar.advance(task)

        prompt_seed = config.seed if options.prompt_seed is None else options.prompt_seed
        driver = LiveDriver(
            client, service, seed=prompt_seed, run_tag=run_tag, on_workflow_done=done, model_clients=model_clients,
            session_header=options.session_header, served_model=options.served_model,
        )  # fmt: skip
        started = time.perf_counter()
        records = await driver.run(arrivals, backlog)
        wall = time.perf_counter() - started
    preempted_after = await preemptions_total(workers)
    if preempted_before is not None and preempted_after is not None:
        records.preemptions = preempted_after - preempted_before
    result = summarize(records)
    result["wall_seconds"] = wall
    result["replicas"] = {w.worker_id: w.model for w in workers}
    result["jct_s"] = jct_list(records)
    result["queue_depth_series"] = queue_depth_series(records, points=QUEUE_SERIES_POINTS)
    finished = [c for c in records.calls if c.end_time is not None]
    ttft = [c.first_token_time - c.ready_time for c in finished if c.first_token_time is not None]
    result["ttft_p50_s"] = percentile(ttft, 50)
    result["ttft_p99_s"] = percentile(ttft, 99)
    result["live"] = {
        "base_url": str(client.base_url),
        "time_scale": options.time_scale,
        "prompt_seed": prompt_seed,
        "run_tag": run_tag,
        "preemptions_read": preempted_before is not None and preempted_after is not None,
        # Calls whose prompt the worker counted otherwise than the workload asked (0 with an emulated
        # worker's byte tokenizer; a real tokenizer makes it most of them).
        "prompt_length_mismatches": driver.prompt_length_mismatches,
        # Calls whose server sent no usage (the driver then counts text chunks as tokens).
        "calls_without_usage": driver.calls_without_usage,
        "generated_tokens": sum(c.generated_tokens for c in finished),
        "prompt_tokens": sum(c.prompt_tokens for c in finished),
        "lower_bound_s": [w.lower_bound_s for w in records.workflows if w.end_time is not None],  # as jct_s
    }
    return result
