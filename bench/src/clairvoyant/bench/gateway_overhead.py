"""``gateway-overhead``: latency the gateway (and scheduler) add over calling a worker directly.

Starts the whole local stack (NATS, scheduler, 2 tiny-random workers, gateway) on free ports, then
sends identical tiny requests (max_tokens=1, ignore_eos) open-loop at a steady rate.  Paths are
interleaved request by request, so drift (other processes, thermal, caches) hits them all alike::

    t:     0    1/R   2/R   3/R   4/R   ...       (R = --rate x number of paths)
    path:  gw-http  w-http  gw-grpc  w-grpc  gw-http ...

The same protocol is compared with the same protocol: gateway HTTP /v1/chat/completions vs the
worker's own HTTP /v1/chat/completions, and gateway gRPC ChatCompletion vs worker gRPC Generate.
Direct calls take the workers in turn, as the gateway's placements spread over them, so at a high
rate each worker carries the same share of direct and gateway traffic.
"""

from __future__ import annotations

import argparse
import asyncio
import itertools
import tempfile
import time
import uuid
from collections.abc import Awaitable, Callable
from pathlib import Path

import grpc
import httpx

from clairvoyant.bench.common import BENCHMARKS, BenchResult, percentile, progress
from clairvoyant.contracts.v1 import (
    common_pb2,
    gateway_pb2,
    gateway_pb2_grpc,
    scheduler_pb2,
    scheduler_pb2_grpc,
    worker_pb2,
    worker_pb2_grpc,
)
from clairvoyant.stack import Stack, StackConfig

MODEL = "tiny-random"
GOAL_ADDED_P50_MS = 2.0
MESSAGES = [{"role": "user", "content": "Reply with one word."}]

Send = Callable[[], Awaitable[None]]


def start_stack(var_dir: Path, workers: int, worker_threads: int, env: dict[str, str] | None = None) -> Stack:
    """The whole stack on free ports, state under ``var_dir``; ``env`` goes to every service."""
    config = StackConfig.on_free_ports(
        var_dir,
        model=MODEL,
        workers=workers,
        env=env,
        worker_env={"CV_TORCH_THREADS": str(worker_threads)},
    )
    return Stack(config).start(ready_timeout=180)


def worker_grpc_addresses(stack: Stack) -> list[str]:
    """Every worker's gRPC address, in worker-id order."""
    with grpc.insecure_channel(stack.scheduler_address) as channel:
        snapshot = scheduler_pb2_grpc.SchedulerStub(channel).Snapshot(scheduler_pb2.SnapshotRequest(), timeout=5)
    return [w.address for w in sorted(snapshot.workers, key=lambda w: w.worker_id)]


def http_path(client: httpx.AsyncClient, urls: list[str], max_tokens: int) -> Send:
    """POST /v1/chat/completions to ``urls`` in turn."""
    body = {"model": MODEL, "messages": MESSAGES, "max_tokens": max_tokens, "temperature": 0.0, "ignore_eos": True}
    turn = itertools.cycle(urls)

    async def send() -> None:
        response = await client.post(f"{next(turn)}/v1/chat/completions", json=body)
        response.raise_for_status()
        if response.json()["usage"]["completion_tokens"] != max_tokens:
            raise RuntimeError(f"unexpected reply: {response.text[:200]}")

    return send


def sampling(max_tokens: int) -> common_pb2.SamplingParams:
    return common_pb2.SamplingParams(max_tokens=max_tokens, temperature=0.0, ignore_eos=True)


def worker_grpc_path(channels: list[grpc.aio.Channel], max_tokens: int) -> Send:
    """Worker.Generate on ``channels`` in turn."""
    turn = itertools.cycle([worker_pb2_grpc.WorkerStub(channel) for channel in channels])
    chat = worker_pb2.ChatMessages(messages=[common_pb2.ChatMessage(role=m["role"], content=m["content"]) for m in MESSAGES])

    async def send() -> None:
        request = worker_pb2.GenerateRequest(request_id=f"bench-{uuid.uuid4().hex}", model=MODEL, chat=chat,
                                             sampling=sampling(max_tokens))
        tokens = 0
        async for reply in next(turn).Generate(request, timeout=30):
            tokens += len(reply.token_ids)
        if tokens != max_tokens:
            raise RuntimeError(f"worker gRPC returned {tokens} tokens")

    return send


def gateway_grpc_path(channel: grpc.aio.Channel, max_tokens: int) -> Send:
    stub = gateway_pb2_grpc.GatewayStub(channel)
    request = gateway_pb2.ChatCompletionRequest(
        model=MODEL, messages=[common_pb2.ChatMessage(role=m["role"], content=m["content"]) for m in MESSAGES], sampling=sampling(max_tokens))

    async def send() -> None:
        reply = await stub.ChatCompletion(request, timeout=30)
        if reply.usage.completion_tokens != max_tokens:
            raise RuntimeError(f"gateway gRPC returned {reply.usage.completion_tokens} tokens")

    return send


async def drive(paths: dict[str, Send], rate: float, duration: float) -> tuple[dict[str, list[float]], dict[str, int], float]:
    """Open loop: request k starts at k / (rate * len(paths)) on path k mod len(paths).

    Returns latencies (seconds) per path, errors per path, and the worst start lag behind schedule.
    """
    names = list(paths)
    interval = 1.0 / (rate * len(names))
    total = int(duration * rate) * len(names)
    latencies: dict[str, list[float]] = {n: [] for n in names}
    errors = dict.fromkeys(names, 0)
    worst_lag = 0.0

    async def one(name: str) -> None:
        start = time.perf_counter()
        try:
            await paths[name]()
        except Exception as exc:  # counted and reported; one failure must not stop the run
            errors[name] += 1
            if errors[name] == 1:
                progress(f"{name}: first error: {exc!r}"[:300])
            return
        latencies[name].append(time.perf_counter() - start)

    tasks: list[asyncio.Task[None]] = []
    t0 = time.perf_counter()
    for k in range(total):
        delay = t0 + k * interval - time.perf_counter()
        if delay > 0:
            await asyncio.sleep(delay)
        worst_lag = max(worst_lag, -delay)
        tasks.append(asyncio.create_task(one(names[k % len(names)])))
    await asyncio.gather(*tasks)
    return latencies, errors, worst_lag


async def measure(stack: Stack, args: argparse.Namespace) -> tuple[dict[str, list[float]], dict[str, int], float]:
    limits = httpx.Limits(max_connections=64, max_keepalive_connections=64)
    gateway_grpc = f"127.0.0.1:{stack.config.gateway_grpc_port}"
    worker_channels = [grpc.aio.insecure_channel(address) for address in worker_grpc_addresses(stack)]
    async with (
        httpx.AsyncClient(timeout=30, limits=limits) as gw_client,
        httpx.AsyncClient(timeout=30, limits=limits) as worker_client,
        grpc.aio.insecure_channel(gateway_grpc) as gw_channel,
    ):
        paths = {
            "gateway HTTP": http_path(gw_client, [stack.gateway_url], args.max_tokens),
            "worker HTTP (direct)": http_path(worker_client, stack.worker_http_urls, args.max_tokens),
            "gateway gRPC": gateway_grpc_path(gw_channel, args.max_tokens),
            "worker gRPC (direct)": worker_grpc_path(worker_channels, args.max_tokens),
        }
        try:
            progress(f"warm-up: {args.warmup:.0f} s")
            await drive(paths, args.rate, args.warmup)
            progress(f"measuring: {args.rate:g} req/s per path x {len(paths)} paths for {args.duration:.0f} s")
            return await drive(paths, args.rate, args.duration)
        finally:
            for channel in worker_channels:
                await channel.close()


@BENCHMARKS.register("gateway-overhead")
class GatewayOverhead:
    help = "p50/p99 latency added by the gateway over calling a worker directly (HTTP and gRPC)"

    def add_arguments(self, parser: argparse.ArgumentParser) -> None:
        parser.add_argument("--rate", type=float, default=20.0, help="requests/s on each path")
        parser.add_argument("--duration", type=float, default=20.0, help="measured seconds")
        parser.add_argument("--warmup", type=float, default=3.0, help="seconds sent first and discarded")
        parser.add_argument("--max-tokens", type=int, default=1)
        parser.add_argument("--workers", type=int, default=2)
        parser.add_argument("--worker-threads", type=int, default=1, help="CV_TORCH_THREADS of each worker")
        parser.add_argument("--quick", action="store_true", help="5 s at 10 req/s per path")

    def run(self, args: argparse.Namespace) -> BenchResult:
        if args.quick:
            args.duration, args.rate, args.warmup = min(args.duration, 5.0), min(args.rate, 10.0), 1.0
        with tempfile.TemporaryDirectory(prefix="cv-bench-") as tmp:
            progress(f"starting the stack ({args.workers} x {MODEL}) in {tmp} ...")
            stack = start_stack(Path(tmp), args.workers, args.worker_threads)
            try:
                progress(f"stack ready: gateway {stack.gateway_url}, workers {', '.join(stack.worker_http_urls)}")
                latencies, errors, worst_lag = asyncio.run(measure(stack, args))
            finally:
                stack.stop()
        p50 = {name: percentile(v, 50) * 1e3 for name, v in latencies.items()}
        p99 = {name: percentile(v, 99) * 1e3 for name, v in latencies.items()}
        rows = [[name, len(v), errors[name], p50[name], percentile(v, 90) * 1e3, p99[name],
                 sum(v) * 1e3 / max(1, len(v))] for name, v in latencies.items()]
        summary: dict[str, object] = {}
        for proto in ("HTTP", "gRPC"):
            gateway, direct = f"gateway {proto}", f"worker {proto} (direct)"
            summary[f"added_p50_ms_{proto}"] = p50[gateway] - p50[direct]
            summary[f"added_p99_ms_{proto}"] = p99[gateway] - p99[direct]
        summary["goal_added_p50_ms"] = GOAL_ADDED_P50_MS
        summary["goal_met_HTTP"] = p50["gateway HTTP"] - p50["worker HTTP (direct)"] <= GOAL_ADDED_P50_MS
        summary["worst_send_lag_ms"] = worst_lag * 1e3
        notes = [
            "added = gateway minus direct, same protocol, same percentile",
            "client, gateway, scheduler, NATS and both workers share this machine's CPUs",
            "worst_send_lag_ms: how late the open-loop client started its most delayed request",
        ]
        return BenchResult(
            name="gateway-overhead",
            columns=["path", "requests", "errors", "p50 ms", "p90 ms", "p99 ms", "mean ms"],
            rows=rows,
            summary=summary,
            notes=notes,
            params={k: v for k, v in vars(args).items() if k not in ("command", "out_dir")},
        )
