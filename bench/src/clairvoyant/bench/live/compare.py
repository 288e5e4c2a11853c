"""``python -m clairvoyant.bench live-compare``: our gateway under two presets against sglang-router,
live, on one fleet of emulated workers; with ``--engine vllm``, against vllm-router on one fleet of
workers fronting real vLLM servers (``vllm_fleet``).

    one fleet: NATS + one emulated worker per replica ``build_cluster`` gives --gpus (coding_assistant
               on 8 x H100-80G: 4 x qwen2.5-14b, 4 x qwen2.5-7b) + our scheduler and gateway
    arm fcfs-rr        driver ─> gateway ─> scheduler(fcfs-rr) ─> workers
    arm sglang-router  driver ─> one sglang-router per model (cache_aware) ─> that model's workers' HTTP
    arm <preset>       driver ─> gateway ─> scheduler(<preset>, restarted) ─> workers

Every arm runs the same instance (``experiment.instance``: same seed, programs, arrival times and
closed-loop backlog) with the ``--mode live`` driver.  Only the prompt *text* differs between arms
(``LiveOptions.prompt_seed``; same lengths and the same sharing structure), so that no arm finds an
earlier arm's prompts in the workers' prefix caches.  Between gateway arms only the scheduler is
restarted, as an operator switches presets; the workers learn the new preset from the requests.

Arms run in the order fcfs-rr, sglang-router, <preset>: sglang-router's requests name no preset,
so the workers keep fcfs-rr's ranking (none) for it rather than an engine rule of ``<preset>``.
With ``--engine vllm`` they run vllm-router-rr, vllm-router-session, fcfs-rr, <preset>, and the
ratios are against vllm-router-rr.  A flag rather than a benchmark of its own: the instance, the
driver, the fleet's life cycle and the table are the same; only the workers and the routers differ.
"""

from __future__ import annotations

import argparse
import asyncio
import tempfile
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any, NamedTuple

import openai

from clairvoyant.bench.common import BENCHMARKS, BenchResult, progress
from clairvoyant.bench.experiment import ExperimentConfig, build_cluster
from clairvoyant.bench.live.cluster import LiveModeError, LiveWorker, scheduler_state
from clairvoyant.bench.live.fleet import Fleet, WorkerSpec
from clairvoyant.bench.live.prompts import ALPHABET
from clairvoyant.bench.live.routers import RouterProcess, sglang_router, vllm_router
from clairvoyant.bench.live.run import LiveOptions, drive
from clairvoyant.bench.live.vllm_fleet import (
    CHECKPOINT,
    ROUTER_POLICIES,
    SERVED_MODEL,
    SESSION_HEADER,
    VLLM_PYTHON,
    engine_counters,
    vllm_installed,
    vllm_worker_specs,
)
from clairvoyant.bench.sim.simulator import ReplicaSpec
from clairvoyant.bench.workloads import get_workload, list_workloads
from clairvoyant.policy import PRESETS

BASELINE = "fcfs-rr"
ROUTER = "sglang-router"
VLLM_BASELINE = "vllm-router-rr"
METRICS = (
    ("avg_jct_s", "avg JCT s"), ("p50_jct_s", "p50 JCT s"), ("p95_jct_s", "p95 JCT s"),
    ("throughput_tok_s", "out tok/s"), ("workflows_per_min", "wf/min"), ("ttft_p50_s", "TTFT p50 s"),
    ("ttft_p99_s", "TTFT p99 s"), ("preemptions", "preemptions"),
)  # fmt: skip
RATIOS = ("avg_jct_s", "p95_jct_s", "throughput_tok_s", "ttft_p50_s", "ttft_p99_s")


def worker_specs(replicas: Sequence[ReplicaSpec], gpu: str) -> list[WorkerSpec]:
    """The simulated replicas as live emulated workers: same model, GPU, TP degree, KV pool, batch
    limit and token budget (as ``sim-vs-live``), one torch thread each."""
    specs = []
    for spec in replicas:
        engine = spec.config
        env = {
            "CV_RUNNER": "emulated", "CV_GPU": gpu,
            "CV_TENSOR_PARALLEL": spec.runner.info.extra.get("tensor_parallel", "1"),
            "CV_BLOCK_SIZE": str(engine.block_size), "CV_NUM_BLOCKS": str(engine.num_blocks),
            "CV_MAX_NUM_SEQS": str(engine.max_num_seqs),
            "CV_MAX_NUM_BATCHED_TOKENS": str(engine.max_num_batched_tokens), "CV_TORCH_THREADS": "1",
        }  # fmt: skip
        # A worker id is a token of its NATS subject (cv.workers.<id>.stats): no dots.
        specs.append(WorkerSpec(spec.worker_id.replace(".", "_"), spec.runner.info.name, env))
    return specs


class Routers:
    """One sglang-router process per model, each fronting that model's workers' HTTP endpoints."""

    def __init__(self, fleet: Fleet, policy: str, var_dir: Path) -> None:
        self._routers: dict[str, RouterProcess] = {}
        try:
            for model in fleet.models:
                self._routers[model] = sglang_router(fleet.http_urls(model), policy, var_dir / f"router-{model}.log")
            for model, router in self._routers.items():
                router.wait_serving(model)
        except BaseException:
            self.stop()
            raise

    @property
    def urls(self) -> dict[str, str]:
        return {model: router.url for model, router in self._routers.items()}

    def stop(self) -> None:
        for router in self._routers.values():
            router.stop()
        self._routers.clear()


async def _run_arm(
    config: ExperimentConfig, options: LiveOptions, label: str, base_url: str, workers: Sequence[LiveWorker],
    model_urls: Mapping[str, str] | None = None, engine_urls: Sequence[str] = (),
) -> dict[str, Any]:  # fmt: skip
    """One arm's metrics; with ``engine_urls`` (vLLM servers), also what vLLM counted over the arm:
    its prefix-cache hits and queries (tokens) and its preemptions."""

    def client(url: str) -> openai.AsyncOpenAI:
        return openai.AsyncOpenAI(base_url=url, api_key=options.api_key, max_retries=0, timeout=options.request_timeout_s)

    main = client(base_url)
    per_model = {model: client(f"{url}/v1") for model, url in (model_urls or {}).items()}
    try:
        await _warm_up(main, per_model, workers)
        before = await asyncio.to_thread(engine_counters, engine_urls) if engine_urls else None
        result = await drive(config, main, options, label=label, workers=workers, model_clients=per_model)
    finally:
        for c in (main, *per_model.values()):
            await c.close()
    if before is not None:
        counted = (await asyncio.to_thread(engine_counters, engine_urls)).since(before)
        result["preemptions"] = int(counted.preemptions)
        result["prefix_cache_hit_rate"] = counted.hit_rate
        result["vllm_prefix_cache"] = {"hits": counted.prefix_cache_hits, "queries": counted.prefix_cache_queries}
    return result


async def _warm_up(main: openai.AsyncOpenAI, per_model: Mapping[str, openai.AsyncOpenAI], workers: Sequence[LiveWorker]) -> None:
    """One 1-token call per worker through the arm's path, so that no arm pays for opening the
    connections in its measured calls (the prompts share nothing with the workload's)."""
    for index, worker in enumerate(workers):
        prompt = ALPHABET[index % len(ALPHABET):] + ALPHABET[: index % len(ALPHABET)]
        await per_model.get(worker.model, main).completions.create(
            model=worker.model, prompt=prompt, max_tokens=1, temperature=0.0
        )


class EngineDefaults(NamedTuple):
    workload: str
    workflows: int
    concurrency: int
    time_scale: float


DEFAULTS = {
    "emulated": EngineDefaults("coding_assistant", workflows=12, concurrency=6, time_scale=0.1),
    # Two vLLM servers on two cores, 32 in flight: the knee of the sweep (docs/benchmarks.md); 3-4 min an arm.
    "vllm": EngineDefaults("react_bfcl", workflows=48, concurrency=32, time_scale=1.0),
}


@BENCHMARKS.register("live-compare")
class LiveCompare:
    help = (
        "live: our gateway (a preset, fcfs-rr) against sglang-router on emulated workers, or (--engine "
        "vllm) against vllm-router on real vLLM servers"
    )

    def add_arguments(self, parser: argparse.ArgumentParser) -> None:
        parser.add_argument("--engine", default="emulated", choices=list(DEFAULTS),
                            help="emulated workers, or workers fronting vLLM servers of SmolLM2 (make install-vllm)")  # fmt: skip
        parser.add_argument("--workload", choices=list_workloads(), help="default: coding_assistant; vllm: react_bfcl")
        parser.add_argument("--preset", default="clairvoyant", choices=PRESETS.names(), help="compared with fcfs-rr")
        parser.add_argument("--gpus", type=int, default=8, help="emulated: the simulated cluster's GPUs")
        parser.add_argument("--gpu", default="H100-80G")
        parser.add_argument("--workers", type=int, default=2, help="vllm: vLLM workers (one core each)")
        parser.add_argument("--max-num-seqs", type=int, default=8, help="vllm: each server's batch limit")
        parser.add_argument("--max-tokens", type=int, help="caps every call's output tokens (default: the workload's)")
        parser.add_argument("--workflows", type=int, help="default: 12; vllm: 48")
        parser.add_argument("--concurrency", type=int, help="closed loop: workflows in flight (default: 6; vllm: 32)")
        parser.add_argument("--seed", type=int, default=0)
        parser.add_argument("--time-scale", type=float, help="tool latencies are waited out x this (default: 0.1; vllm: 1)")
        parser.add_argument("--router-policy", default="cache_aware", help="sglang-router's --policy (its default)")
        parser.add_argument("--arms", nargs="+", help="a subset, in this order (default: "
                            f"{BASELINE} {ROUTER} <preset>; vllm: {' '.join(ROUTER_POLICIES)} {BASELINE} <preset>)")  # fmt: skip
        parser.add_argument("--quick", action="store_true", help="react_bfcl on 2 GPUs, 3 workflows, 2 in flight")

    def run(self, args: argparse.Namespace) -> BenchResult:
        vllm = args.engine == "vllm"
        defaults = DEFAULTS[args.engine]
        for name in ("workload", "workflows", "concurrency", "time_scale"):
            if getattr(args, name) is None:
                setattr(args, name, getattr(defaults, name))
        if args.quick:
            args.workload, args.gpus, args.workflows, args.concurrency, args.time_scale = "react_bfcl", 2, 3, 2, 0.2
        config = ExperimentConfig(
            workload=args.workload, gpus=args.gpus, gpu=args.gpu, workflows=args.workflows,
            concurrency=args.concurrency, seed=args.seed,
        )  # fmt: skip
        routers = list(ROUTER_POLICIES) if vllm else [ROUTER]
        default_arms = [*routers, BASELINE, args.preset] if vllm else [BASELINE, ROUTER, args.preset]
        arms: list[str] = args.arms or default_arms
        unknown = [a for a in arms if a not in routers and a not in PRESETS]
        if unknown:
            raise SystemExit(f"error: unknown arm(s) {unknown}: presets or {' '.join(routers)}")
        if vllm and not vllm_installed():
            raise SystemExit(f"error: vLLM is not installed ({VLLM_PYTHON}, {CHECKPOINT}): run make install-vllm")
        results: dict[str, dict[str, Any]] = {}
        with tempfile.TemporaryDirectory(prefix="live-compare-") as tmp:
            var = Path(tmp)
            if vllm:
                specs = vllm_worker_specs(args.workers, args.max_num_seqs, var)
                timeout_s, what = 600.0, f"{len(specs)} vLLM workers ({SERVED_MODEL}, max_num_seqs {args.max_num_seqs})"
            else:
                replicas, _ = build_cluster(get_workload(config.workload), config)
                specs = worker_specs(replicas, config.gpu)
                timeout_s = 300.0
                what = f"{len(specs)} emulated workers on {config.gpu} ({', '.join(sorted({s.model for s in specs}))})"
            first = next((a for a in arms if a not in routers), BASELINE)
            progress(f"starting {what}, scheduler {first}")
            try:
                fleet = Fleet(var, specs).start(first, timeout_s=timeout_s)
            except (RuntimeError, TimeoutError) as exc:
                raise SystemExit(f"error: {exc}") from None
            try:
                for index, arm in enumerate(arms):
                    options = LiveOptions(
                        time_scale=args.time_scale, prompt_seed=1000 * (index + 1) + config.seed,
                        max_output_tokens=args.max_tokens, session_header=SESSION_HEADER if vllm else None,
                        served_model=SERVED_MODEL if vllm else None,
                    )  # fmt: skip
                    results[arm] = self._arm(config, options, fleet, arm, args, var)
                    progress(f"{arm}: avg JCT {results[arm]['avg_jct_s']:.1f} s, {results[arm]['throughput_tok_s']:.0f} tok/s")
            except (LiveModeError, RuntimeError, TimeoutError) as exc:
                raise SystemExit(f"error: {exc}") from None
            finally:
                fleet.stop()
        return comparison(config, args, results, engine=args.engine)

    @staticmethod
    def _arm(
        config: ExperimentConfig, options: LiveOptions, fleet: Fleet, arm: str, args: argparse.Namespace, var: Path
    ) -> dict[str, Any]:
        vllm = args.engine == "vllm"
        if arm == ROUTER:
            _, workers = asyncio.run(scheduler_state(fleet.scheduler_address))
            progress(f"{arm}: one router per model ({args.router_policy})")
            routers = Routers(fleet, args.router_policy, var)
            try:
                return asyncio.run(_run_arm(config, options, arm, fleet.gateway_url + "/v1", workers, routers.urls))
            finally:
                routers.stop()
        if arm in ROUTER_POLICIES:
            _, workers = asyncio.run(scheduler_state(fleet.scheduler_address))
            servers = [w.http_address for w in workers]
            progress(f"{arm}: vllm-router --policy {ROUTER_POLICIES[arm]} over {' '.join(servers)}")
            router = vllm_router(servers, ROUTER_POLICIES[arm], var / f"{arm}.log")
            try:
                router.wait_serving(SERVED_MODEL)
                return asyncio.run(_run_arm(config, options, arm, router.url + "/v1", workers, engine_urls=servers))
            finally:
                router.stop()
        if fleet.policy != arm:
            progress(f"{arm}: restarting the scheduler")
            fleet.restart_scheduler(arm)
        running, workers = asyncio.run(scheduler_state(fleet.scheduler_address))
        if running != arm:
            raise LiveModeError(f"the scheduler runs {running!r}, not {arm!r}")
        servers = [w.http_address for w in workers] if vllm else []
        return asyncio.run(_run_arm(config, options, arm, fleet.gateway_url + "/v1", workers, engine_urls=servers))


def comparison(
    config: ExperimentConfig, args: argparse.Namespace, results: Mapping[str, dict[str, Any]], engine: str = "emulated"
) -> BenchResult:
    """The table, with ratios against fcfs-rr (emulated) or vllm-router-rr (vllm) of the same run."""
    vllm = engine == "vllm"
    baseline_arm = VLLM_BASELINE if vllm else BASELINE
    baseline = results.get(baseline_arm)

    def ratio(arm: str, key: str) -> float:
        if baseline is None or not baseline[key]:
            return float("nan")
        return float(results[arm][key]) / float(baseline[key])

    metrics = [*METRICS, ("prefix_cache_hit_rate", "prefix hit")] if vllm else list(METRICS)
    rows = [
        [arm, *(results[arm][key] for key, _ in metrics), *(ratio(arm, key) for key in RATIOS)]
        for arm in results
    ]
    summary = {f"{arm}_{key}_vs_{baseline_arm}": ratio(arm, key) for arm in results if arm != baseline_arm for key in RATIOS}
    workers = len(next(iter(results.values()))["replicas"])
    loop = (
        f"closed loop, {config.concurrency} workflows in flight, {config.workflows} workflows, seed {config.seed}, "
        f"tool latencies x {args.time_scale}"
    )
    if vllm:
        notes = [
            f"{workers} workers fronting vLLM servers of {SERVED_MODEL} (CPU, one core each, max_num_seqs "
            f"{args.max_num_seqs}); every call names {SERVED_MODEL}; {loop}"
            + (f"; output capped at {args.max_tokens} tokens" if args.max_tokens else ""),
            "vllm-router reaches the vLLM servers directly; vllm-router-session is its consistent_hash policy "
            f"keyed on the workflow id ({SESSION_HEADER})",
            "prefix hit: vLLM's prefix_cache_hits / prefix_cache_queries (tokens) over the arm, all servers",
            "lower bounds and the queue estimate use the H100 roofline of the workload's model: not this machine",
        ]
    else:
        notes = [
            f"{workers} emulated workers on {config.gpu}; {loop}",
            "sglang-router reaches the workers' own HTTP endpoints, which report no usage: its arm counts one "
            "token per streamed text chunk and cannot report cached tokens",
        ]
    for arm, result in results.items():
        notes += [f"{arm}: {w}" for w in result["live"].get("warnings", [])]
    params: dict[str, Any] = {
        "config": vars(config),
        "engine": engine,
        "preset": args.preset,
        "time_scale": args.time_scale,
        "arms": list(results),
        "per_arm": {arm: {k: v for k, v in r.items() if k not in ("queue_depth_series",)} for arm, r in results.items()},
    }
    if vllm:
        params |= {"served_model": SERVED_MODEL, "max_num_seqs": args.max_num_seqs, "max_tokens": args.max_tokens}
    else:
        params["router_policy"] = args.router_policy
    return BenchResult(
        name=f"live-{'vllm' if vllm else 'compare'}-{config.workload}-c{config.concurrency}",
        columns=["arm", *(title for _, title in metrics), *(f"{key} / {baseline_arm}" for key in RATIOS)],
        rows=rows,
        summary=summary,
        notes=notes,
        params=params,
    )
