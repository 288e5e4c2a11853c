"""``python -m clairvoyant.bench live-compare``: our gateway under two presets against sglang-router,
live, on one fleet of emulated workers.

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
"""

from __future__ import annotations

import argparse
import asyncio
import subprocess
import sys
import tempfile
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import IO, Any

import httpx
import openai

from clairvoyant.bench.common import BENCHMARKS, BenchResult, progress
from clairvoyant.bench.experiment import ExperimentConfig, build_cluster
from clairvoyant.bench.live.cluster import LiveModeError, LiveWorker, scheduler_state
from clairvoyant.bench.live.fleet import Fleet, WorkerSpec
from clairvoyant.bench.live.prompts import ALPHABET
from clairvoyant.bench.live.run import LiveOptions, drive
from clairvoyant.bench.sim.simulator import ReplicaSpec
from clairvoyant.bench.workloads import get_workload, list_workloads
from clairvoyant.policy import PRESETS
from clairvoyant.stack.natsserver import free_port

BASELINE = "fcfs-rr"
ROUTER = "sglang-router"
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
        self.urls: dict[str, str] = {}  # model -> router base URL
        self._processes: list[tuple[subprocess.Popen[bytes], IO[bytes]]] = []
        try:
            for model in fleet.models:
                port = free_port()
                log = (var_dir / f"router-{model}.log").open("ab")
                args = [sys.executable, "-m", "sglang_router.launch_router", "--worker-urls", *fleet.http_urls(model),
                        "--host", "127.0.0.1", "--port", str(port), "--policy", policy, "--log-level", "warn",
                        "--prometheus-host", "127.0.0.1", "--prometheus-port", str(free_port())]  # fmt: skip
                self._processes.append((subprocess.Popen(args, stdout=log, stderr=subprocess.STDOUT), log))
                self.urls[model] = f"http://127.0.0.1:{port}"
            for model, url in self.urls.items():
                self._wait_serving(model, url)
        except BaseException:
            self.stop()
            raise

    def _wait_serving(self, model: str, url: str, timeout_s: float = 60.0) -> None:
        """Until a 1-token completion goes through (the router adds workers in the background)."""
        deadline = time.monotonic() + timeout_s
        body = {"model": model, "prompt": ALPHABET[::-1], "max_tokens": 1, "temperature": 0.0}
        while True:
            try:
                if httpx.post(f"{url}/v1/completions", json=body, timeout=10.0).status_code == 200:
                    return
            except httpx.HTTPError:
                pass
            if any(p.poll() is not None for p, _ in self._processes):
                raise RuntimeError("sglang-router exited during start-up; see router-*.log")
            if time.monotonic() > deadline:
                raise TimeoutError(f"sglang-router for {model} not serving after {timeout_s:.0f} s")
            time.sleep(0.5)

    def stop(self) -> None:
        for process, log in self._processes:
            if process.poll() is None:
                process.terminate()
                try:
                    process.wait(10)
                except subprocess.TimeoutExpired:
                    process.kill()
                    process.wait()
            log.close()
        self._processes.clear()


async def _run_arm(
    config: ExperimentConfig, options: LiveOptions, label: str, base_url: str, workers: Sequence[LiveWorker],
    model_urls: Mapping[str, str] | None = None,
) -> dict[str, Any]:  # fmt: skip
    def client(url: str) -> openai.AsyncOpenAI:
        return openai.AsyncOpenAI(base_url=url, api_key=options.api_key, max_retries=0, timeout=options.request_timeout_s)

    main = client(base_url)
    per_model = {model: client(f"{url}/v1") for model, url in (model_urls or {}).items()}
    try:
        await _warm_up(main, per_model, workers)
        return await drive(config, main, options, label=label, workers=workers, model_clients=per_model)
    finally:
        for c in (main, *per_model.values()):
            await c.close()


async def _warm_up(main: openai.AsyncOpenAI, per_model: Mapping[str, openai.AsyncOpenAI], workers: Sequence[LiveWorker]) -> None:
    """One 1-token call per worker through the arm's path, so that no arm pays for opening the
    connections in its measured calls (the prompts share nothing with the workload's)."""
    for index, worker in enumerate(workers):
        prompt = ALPHABET[index % len(ALPHABET):] + ALPHABET[: index % len(ALPHABET)]
        await per_model.get(worker.model, main).completions.create(
            model=worker.model, prompt=prompt, max_tokens=1, temperature=0.0
        )


@BENCHMARKS.register("live-compare")
class LiveCompare:
    help = "live, one fleet of emulated workers: our gateway (a preset, fcfs-rr) against sglang-router"

    def add_arguments(self, parser: argparse.ArgumentParser) -> None:
        parser.add_argument("--workload", default="coding_assistant", choices=list_workloads())
        parser.add_argument("--preset", default="clairvoyant", choices=PRESETS.names(), help="compared with fcfs-rr")
        parser.add_argument("--gpus", type=int, default=8)
        parser.add_argument("--gpu", default="H100-80G")
        parser.add_argument("--workflows", type=int, default=12)
        parser.add_argument("--concurrency", type=int, default=6, help="closed loop: workflows in flight")
        parser.add_argument("--seed", type=int, default=0)
        parser.add_argument("--time-scale", type=float, default=0.1, help="tool latencies are waited out x this")
        parser.add_argument("--router-policy", default="cache_aware", help="sglang-router's --policy (its default)")
        parser.add_argument("--arms", nargs="+", help=f"a subset, in this order (default: {BASELINE} {ROUTER} <preset>)")
        parser.add_argument("--quick", action="store_true", help="react_bfcl on 2 GPUs, 3 workflows, 2 in flight")

    def run(self, args: argparse.Namespace) -> BenchResult:
        if args.quick:
            args.workload, args.gpus, args.workflows, args.concurrency, args.time_scale = "react_bfcl", 2, 3, 2, 0.2
        config = ExperimentConfig(
            workload=args.workload, gpus=args.gpus, gpu=args.gpu, workflows=args.workflows,
            concurrency=args.concurrency, seed=args.seed,
        )  # fmt: skip
        arms: list[str] = args.arms or [BASELINE, ROUTER, args.preset]
        unknown = [a for a in arms if a != ROUTER and a not in PRESETS]
        if unknown:
            raise SystemExit(f"error: unknown arm(s) {unknown}: presets or {ROUTER}")
        replicas, _ = build_cluster(get_workload(config.workload), config)
        specs = worker_specs(replicas, config.gpu)
        results: dict[str, dict[str, Any]] = {}
        with tempfile.TemporaryDirectory(prefix="live-compare-") as tmp:
            var = Path(tmp)
            first = next((a for a in arms if a != ROUTER), BASELINE)
            progress(f"starting {len(specs)} emulated workers on {config.gpu} ({', '.join(sorted({s.model for s in specs}))}), scheduler {first}")
            try:
                fleet = Fleet(var, specs).start(first)
            except (RuntimeError, TimeoutError) as exc:
                raise SystemExit(f"error: {exc}") from None
            try:
                for index, arm in enumerate(arms):
                    options = LiveOptions(time_scale=args.time_scale, prompt_seed=1000 * (index + 1) + config.seed)
                    results[arm] = self._arm(config, options, fleet, arm, args.router_policy, var)
                    progress(f"{arm}: avg JCT {results[arm]['avg_jct_s']:.1f} s, {results[arm]['throughput_tok_s']:.0f} tok/s")
            except (LiveModeError, RuntimeError, TimeoutError) as exc:
                raise SystemExit(f"error: {exc}") from None
            finally:
                fleet.stop()
        return comparison(config, args, results)

    @staticmethod
    def _arm(config: ExperimentConfig, options: LiveOptions, fleet: Fleet, arm: str, router_policy: str, var: Path) -> dict[str, Any]:
        if arm == ROUTER:
            _, workers = asyncio.run(scheduler_state(fleet.scheduler_address))
            progress(f"{arm}: one router per model ({router_policy})")
            routers = Routers(fleet, router_policy, var)
            try:
                return asyncio.run(_run_arm(config, options, arm, fleet.gateway_url + "/v1", workers, routers.urls))
            finally:
                routers.stop()
        if fleet.policy != arm:
            progress(f"{arm}: restarting the scheduler")
            fleet.restart_scheduler(arm)
        running, workers = asyncio.run(scheduler_state(fleet.scheduler_address))
        if running != arm:
            raise LiveModeError(f"the scheduler runs {running!r}, not {arm!r}")
        return asyncio.run(_run_arm(config, options, arm, fleet.gateway_url + "/v1", workers))


def comparison(config: ExperimentConfig, args: argparse.Namespace, results: Mapping[str, dict[str, Any]]) -> BenchResult:
    baseline = results.get(BASELINE)

    def ratio(arm: str, key: str) -> float:
        if baseline is None or not baseline[key]:
            return float("nan")
        return float(results[arm][key]) / float(baseline[key])

    rows = [
        [arm, *(results[arm][key] for key, _ in METRICS), *(ratio(arm, key) for key in RATIOS)]
        for arm in results
    ]
    summary = {f"{arm}_{key}_vs_{BASELINE}": ratio(arm, key) for arm in results if arm != BASELINE for key in RATIOS}
    notes = [
        f"{len(next(iter(results.values()))['replicas'])} emulated workers on {config.gpu}; closed loop, "
        f"{config.concurrency} workflows in flight, {config.workflows} workflows, seed {config.seed}, "
        f"tool latencies x {args.time_scale}",
        "sglang-router reaches the workers' own HTTP endpoints, which report no usage: its arm counts one "
        "token per streamed text chunk and cannot report cached tokens",
    ]
    for arm, result in results.items():
        notes += [f"{arm}: {w}" for w in result["live"].get("warnings", [])]
    return BenchResult(
        name=f"live-compare-{config.workload}-c{config.concurrency}",
        columns=["arm", *(title for _, title in METRICS), *(f"{key} / {BASELINE}" for key in RATIOS)],
        rows=rows,
        summary=summary,
        notes=notes,
        params={
            "config": vars(config),
            "preset": args.preset,
            "time_scale": args.time_scale,
            "router_policy": args.router_policy,
            "arms": list(results),
            "per_arm": {arm: {k: v for k, v in r.items() if k not in ("queue_depth_series",)} for arm, r in results.items()},
        },
    )
