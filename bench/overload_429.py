"""How fast is overload answered?  Time to a 429 with the model's queue full.

Starts NATS (or reuses ``--nats-url``), a real scheduler (``CV_MAX_QUEUE_PER_MODEL`` = ``--queue``)
and, unless ``--scheduler-only``, a real gateway, all as subprocesses on free ports.  One emulated
worker (NATS heartbeats with ``max_batch`` 1, and a gRPC Generate that never answers) keeps every request
queued.  Then ``--clients`` calls are sent at once:

* ``--scheduler-only``: Schedule RPCs straight at the scheduler, over ``--channels`` channels;
* otherwise: POST /v1/chat/completions at the gateway, one HTTP connection per client.

The first ``queue + 1`` calls fill the queue (one is placed); the rest must be refused.  Prints the
latency of the refusals (p50/p90/p99/max) and how many calls ended in each status, then saves the
figures to ``bench/results/overload-429[-scheduler].json``, with the CPU seconds the gateway and
the scheduler spent on the burst and the gateway's ``cv_gateway_busy_refusals_total``.  Not a
test: nothing fails on a number.  The clients are raw HTTP/1.1 on asyncio streams: an HTTP
library costs about as much per request as the gateway, and on the same machine would mostly
measure itself.  To compare with another version of the gateway, put its ``src`` first on
``PYTHONPATH`` (the services are started with this environment).

    .venv/bin/python bench/overload_429.py --clients 2000 --queue 1024
    .venv/bin/python bench/overload_429.py --scheduler-only     # Schedule RPCs, no gateway
    .venv/bin/python bench/overload_429.py --profile-gateway /tmp/gateway.prof
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import socket
import subprocess
import sys
import tempfile
import time
import uuid
from collections import Counter
from pathlib import Path

import grpc
import nats

from clairvoyant.contracts.v1 import scheduler_pb2, scheduler_pb2_grpc, worker_pb2, worker_pb2_grpc
from clairvoyant.stack.natsserver import NatsServer, free_port

MODEL = "bench-model"
RESULTS = Path(__file__).resolve().parent / "results"


def percentile(values: list[float], q: float) -> float:
    if not values:
        return float("nan")
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q / 100 * len(ordered)))]


def wait_port(port: int, timeout_s: float = 30.0) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        with socket.socket() as sock:
            if sock.connect_ex(("127.0.0.1", port)) == 0:
                return
        time.sleep(0.1)
    raise RuntimeError(f"nothing listens on port {port} after {timeout_s:g} s")


def cpu_seconds(pid: int) -> float:
    """User + system CPU time of a process so far (Linux)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def busy_reasons(port: int) -> dict[str, float]:
    """cv_gateway_busy_refusals_total by reason (empty for a gateway without that metric)."""
    with socket.create_connection(("127.0.0.1", port)) as sock:
        sock.sendall(b"GET /metrics HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
        text = b"".join(iter(lambda: sock.recv(65536), b"")).decode()
    reasons = {}
    for line in text.splitlines():
        if line.startswith("cv_gateway_busy_refusals_total{"):
            labels, value = line.rsplit(" ", 1)
            reasons[labels.split('"')[1]] = float(value)
    return reasons


def start(
    module: str, env: dict[str, str], log: Path, profile: Path | None = None
) -> subprocess.Popen[bytes]:
    out = log.open("wb")
    profiler = ["-m", "cProfile", "-o", str(profile)] if profile else []
    return subprocess.Popen(
        [sys.executable, *profiler, "-m", module],
        env={**os.environ, **env},
        stdout=out,
        stderr=subprocess.STDOUT,
    )


class StuckWorker(worker_pb2_grpc.WorkerServicer):
    """Accepts Generate and never answers (until the caller goes away)."""

    async def Generate(self, request, context):  # type: ignore[no-untyped-def]  # noqa: N802
        await asyncio.Event().wait()
        yield worker_pb2.GenerateResponse()


async def heartbeat_forever(nats_url: str, worker_address: str, stop: asyncio.Event) -> None:
    """An emulated worker: one slot, never frees it."""
    nc = await nats.connect(nats_url)
    stats = worker_pb2.WorkerStats(
        worker_id="slow-1",
        model=MODEL,
        grpc_address=worker_address,
        max_batch=1,
        max_model_len=4096,
        heartbeat_interval_s=0.5,
    )
    try:
        while not stop.is_set():
            stats.timestamp = time.time()
            await nc.publish("cv.workers.slow-1.stats", stats.SerializeToString())
            await nc.flush()
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(stop.wait(), 0.5)
    finally:
        await nc.close()


async def wait_registered(scheduler_address: str) -> None:
    async with grpc.aio.insecure_channel(scheduler_address) as chan:
        stub = scheduler_pb2_grpc.SchedulerStub(chan)
        for _ in range(100):
            snap = await stub.Snapshot(scheduler_pb2.SnapshotRequest(), timeout=2)
            if any(w.model == MODEL for w in snap.workers):
                return
            await asyncio.sleep(0.1)
    raise RuntimeError("the emulated worker never registered")


Outcome = tuple[str, float]  # (status, seconds from the burst's start)


async def burst_scheduler(address: str, clients: int, channels: int) -> tuple[list[Outcome], float]:
    chans = [grpc.aio.insecure_channel(address) for _ in range(channels)]
    stubs = [scheduler_pb2_grpc.SchedulerStub(c) for c in chans]
    for c in chans:
        await c.channel_ready()
    outcomes: list[Outcome] = []
    details: Counter[str] = Counter()
    t0 = time.perf_counter()

    async def one(i: int) -> None:
        req = scheduler_pb2.ScheduleRequest(
            request_id=uuid.uuid4().hex, tenant="bench", model=MODEL, prompt_tokens=10, max_tokens=10
        )
        try:
            await stubs[i % channels].Schedule(req, timeout=60)
            outcomes.append(("placed", time.perf_counter() - t0))
        except grpc.aio.AioRpcError as err:
            outcomes.append((err.code().name, time.perf_counter() - t0))
            if err.code() != grpc.StatusCode.RESOURCE_EXHAUSTED:
                details[err.details() or ""] += 1

    tasks = [asyncio.create_task(one(i)) for i in range(clients)]
    await asyncio.wait(tasks, timeout=30)  # the queued ones wait for the deadline: stop at 30 s
    elapsed = time.perf_counter() - t0
    for task in tasks:
        task.cancel()
    await asyncio.gather(*tasks, return_exceptions=True)
    for c in chans:
        await c.close(None)
    for detail, count in details.most_common():
        print(f"{count} x {detail}")
    return outcomes, elapsed


async def burst_gateway(port: int, clients: int, expected: int) -> tuple[list[Outcome], float]:
    """Open ``clients`` connections first, then send one request on each at once.

    Raw HTTP/1.1 over asyncio streams: an HTTP client library costs about as much per request as
    the gateway does, and with both on one machine it would measure itself.
    """
    body = json.dumps({"model": MODEL, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 4})
    request = (
        f"POST /v1/chat/completions HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\n"
        f"Content-Type: application/json\r\nContent-Length: {len(body)}\r\nConnection: close\r\n\r\n{body}"
    ).encode()
    connections = []
    for _ in range(clients):  # one connection per client, as with many independent agents
        connections.append(await asyncio.open_connection("127.0.0.1", port))
    outcomes: list[Outcome] = []
    t0 = time.perf_counter()

    async def one(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            writer.write(request)
            head = await reader.readuntil(b"\r\n\r\n")
            elapsed = time.perf_counter() - t0
            status = head.split(b" ", 2)[1].decode()
            reply = await reader.read()
            if status != "200":
                status += " " + json.loads(reply)["error"]["code"]
                if b"retry-after" not in head.lower():
                    status += " (no Retry-After)"
            outcomes.append((status, elapsed))
        except (OSError, asyncio.IncompleteReadError) as exc:
            outcomes.append((type(exc).__name__, time.perf_counter() - t0))
        finally:
            writer.close()

    tasks = [asyncio.create_task(one(reader, writer)) for reader, writer in connections]
    # The queued requests never finish: stop once every other one has been answered (or at 40 s).
    while len(outcomes) < expected and time.perf_counter() - t0 < 40:
        await asyncio.sleep(0.05)
    await asyncio.sleep(0.5)  # stragglers beyond the expected count
    elapsed = time.perf_counter() - t0
    for task in tasks:
        task.cancel()
    await asyncio.gather(*tasks, return_exceptions=True)
    return outcomes, elapsed


async def run(args: argparse.Namespace, tmp: Path) -> dict[str, object]:
    nats_server = None
    nats_url = args.nats_url
    if not nats_url:
        nats_server = NatsServer(store_dir=tmp / "nats").start()
        nats_url = nats_server.url
    sched_port, gw_port, gw_grpc = free_port(), free_port(), free_port()
    common = {"CV_NATS_URL": nats_url, "CV_LOG_LEVEL": "WARNING"}
    procs = [
        start(
            "clairvoyant.scheduler",
            {
                **common,
                "CV_SCHEDULER_PORT": str(sched_port),
                "CV_METRICS_PORT": "0",
                "CV_MAX_QUEUE_PER_MODEL": str(args.queue),
            },
            tmp / "scheduler.log",
        )
    ]
    stop = asyncio.Event()
    beat = None
    busy: dict[str, float] = {}
    worker = grpc.aio.server()
    worker_pb2_grpc.add_WorkerServicer_to_server(StuckWorker(), worker)
    worker_port = worker.add_insecure_port("127.0.0.1:0")
    await worker.start()
    try:
        wait_port(sched_port)
        beat = asyncio.create_task(heartbeat_forever(nats_url, f"127.0.0.1:{worker_port}", stop))
        await wait_registered(f"127.0.0.1:{sched_port}")
        if args.scheduler_only:
            cpu = {"scheduler": cpu_seconds(procs[0].pid)}
            outcomes, elapsed = await burst_scheduler(f"127.0.0.1:{sched_port}", args.clients, args.channels)
            cpu = {"scheduler": cpu_seconds(procs[0].pid) - cpu["scheduler"]}
            refused = "RESOURCE_EXHAUSTED"
        else:
            procs.append(
                start(
                    "clairvoyant.gateway",
                    {
                        **common,
                        "CV_GATEWAY_PORT": str(gw_port),
                        "CV_GATEWAY_GRPC_PORT": str(gw_grpc),
                        "CV_SCHEDULER_ADDRESS": f"127.0.0.1:{sched_port}",
                        "CV_DATABASE_URL": f"sqlite:///{tmp / 'gateway.db'}",
                    },
                    tmp / "gateway.log",
                    profile=args.profile_gateway,
                )
            )
            wait_port(gw_port)
            cpu = {"gateway": cpu_seconds(procs[1].pid), "scheduler": cpu_seconds(procs[0].pid)}
            outcomes, elapsed = await burst_gateway(gw_port, args.clients, args.clients - args.queue - 1)
            cpu = {
                "gateway": cpu_seconds(procs[1].pid) - cpu["gateway"],
                "scheduler": cpu_seconds(procs[0].pid) - cpu["scheduler"],
            }
            busy = busy_reasons(gw_port)
            refused = "429 queue_full"
    finally:
        stop.set()
        if beat is not None:
            await beat
        await worker.stop(None)
        for proc in reversed(procs):
            proc.terminate()
            proc.wait(10)
        if nats_server is not None:
            nats_server.stop()
    counts = Counter(status for status, _ in outcomes)
    refusals = [t for status, t in outcomes if status == refused]
    pending = args.clients - len(outcomes)
    figures = {
        "clients": args.clients,
        "queue": args.queue,
        "mode": "scheduler" if args.scheduler_only else "gateway",
        "statuses": dict(counts.most_common()),
        "still_waiting_at_end": pending,
        "refusals": len(refusals),
        "refusal_p50_s": percentile(refusals, 50),
        "refusal_p90_s": percentile(refusals, 90),
        "refusal_p99_s": percentile(refusals, 99),
        "refusal_max_s": max(refusals, default=float("nan")),
        "burst_s": elapsed,
        "cpu_s": cpu,
        "gateway_busy_refusals": busy,
        "other_p50_s": {
            s: percentile([t for st, t in outcomes if st == s], 50) for s in counts if s != refused
        },
    }
    if not args.scheduler_only:
        figures["gateway_log_tail"] = (tmp / "gateway.log").read_text()[-2000:]
    return figures


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--clients", type=int, default=2000)
    parser.add_argument("--queue", type=int, default=1024, help="CV_MAX_QUEUE_PER_MODEL")
    parser.add_argument("--scheduler-only", action="store_true", help="Schedule RPCs, no gateway")
    parser.add_argument("--channels", type=int, default=1, help="--scheduler-only: gRPC channels")
    parser.add_argument("--nats-url", default="", help="reuse this NATS server")
    parser.add_argument("--profile-gateway", type=Path, help="run the gateway under cProfile, stats here")
    parser.add_argument("--label", default="", help="saved with the figures (e.g. before/after)")
    parser.add_argument("--no-save", action="store_true")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="cv-overload-") as tmp:
        figures = asyncio.run(run(args, Path(tmp)))
    figures["label"] = args.label
    log_tail = figures.pop("gateway_log_tail", "")
    for key, value in figures.items():
        print(f"{key:>22}: {value:.3f}" if isinstance(value, float) else f"{key:>22}: {value}")
    if log_tail and any(not str(s).startswith(("429", "placed")) for s in figures["statuses"]):  # type: ignore[union-attr]
        print("--- gateway log (tail) ---\n" + log_tail)
    if not args.no_save:
        name = "overload-429" + ("-scheduler" if args.scheduler_only else "")
        RESULTS.mkdir(exist_ok=True)
        (RESULTS / f"{name}.json").write_text(json.dumps(figures, indent=2) + "\n")


if __name__ == "__main__":
    main()
