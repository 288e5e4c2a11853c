"""``gateway-breakdown``: where a request through the gateway spends its time, stage by stage.

The stack runs with its OpenTelemetry spans exported to a small OTLP receiver inside this process;
each client request is matched to its trace by ``X-Request-Id``.  All timestamps come from the one
machine clock (``time.time_ns`` in every process), so the stages of one request line up::

    client send | HTTP in | gateway.request ........................................... |
                          | admission | gateway.schedule | hop | worker.generate | after | HTTP out |
                                        (Scheduler RPC)          (worker span)      |         client
                                                                      "last_message" event    has it

The request span lasts beyond the answer (the placement's release and the CompletionRecord
follow it in the background), so the answer's end is the ``last_message`` event of the
``gateway.generate`` span: the worker's final message is in and the reply can be written.

Span export costs the services some CPU, so absolute figures are a little higher than in
``gateway-overhead``; the point is the split.  Means are additive, so their shares sum to 100%.
"""

from __future__ import annotations

import argparse
import asyncio
import tempfile
import threading
import time
from concurrent import futures
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import grpc
import httpx
from opentelemetry.proto.collector.trace.v1 import trace_service_pb2, trace_service_pb2_grpc

from clairvoyant.bench.common import BENCHMARKS, BenchResult, percentile, progress
from clairvoyant.bench.gateway_overhead import MESSAGES, MODEL, start_stack
from clairvoyant.stack.natsserver import free_port

STAGES = (
    "HTTP in: client send -> gateway.request starts",
    "admission: -> Scheduler.Schedule sent",
    "Scheduler.Schedule RPC",
    "hop: -> worker.generate starts",
    "worker.generate (tokenize, engine, stream)",
    "after the worker: -> its last message read",
    "HTTP out: last message read -> client has it",
)


@dataclass(frozen=True)
class Span:
    name: str
    start_ns: int
    end_ns: int
    request_id: str  # the cv.request_id attribute; empty on spans that do not carry it
    events: dict[str, int]  # event name -> its time (the first of that name)


class SpanReceiver(trace_service_pb2_grpc.TraceServiceServicer):
    """Keeps every exported span, grouped by trace id."""

    def __init__(self) -> None:
        self.traces: dict[bytes, list[Span]] = {}
        self._lock = threading.Lock()

    def Export(self, request: Any, context: Any) -> Any:  # noqa: N802 - OTLP method name
        with self._lock:
            for resource in request.resource_spans:
                for scope in resource.scope_spans:
                    for span in scope.spans:
                        attrs = {a.key: a.value.string_value for a in span.attributes}
                        events: dict[str, int] = {}
                        for event in span.events:
                            events.setdefault(event.name, event.time_unix_nano)
                        self.traces.setdefault(span.trace_id, []).append(
                            Span(span.name, span.start_time_unix_nano, span.end_time_unix_nano,
                                 attrs.get("cv.request_id", ""), events))
        return trace_service_pb2.ExportTraceServiceResponse()


async def send_all(url: str, rate: float, duration: float) -> dict[str, tuple[int, int]]:
    """Open-loop requests; request id -> (send, receive) in ``time.time_ns``."""
    body = {"model": MODEL, "messages": MESSAGES, "max_tokens": 1, "temperature": 0.0, "ignore_eos": True}
    seen: dict[str, tuple[int, int]] = {}

    async def one(client: httpx.AsyncClient) -> None:
        sent = time.time_ns()
        response = await client.post(f"{url}/v1/chat/completions", json=body)
        received = time.time_ns()
        if response.status_code == 200:
            seen[response.headers["x-request-id"]] = (sent, received)

    async with httpx.AsyncClient(timeout=30) as client:
        tasks: list[asyncio.Task[None]] = []
        t0 = time.perf_counter()
        for k in range(int(rate * duration)):
            delay = t0 + k / rate - time.perf_counter()
            if delay > 0:
                await asyncio.sleep(delay)
            tasks.append(asyncio.create_task(one(client)))
        await asyncio.gather(*tasks)
    return seen


def stages(spans: list[Span], sent: int, received: int) -> list[float] | None:
    """The seven stage durations (ms) of one request, or None when a span is missing."""
    by_name = {span.name: span for span in spans}
    try:
        req, sched, work = by_name["gateway.request"], by_name["gateway.schedule"], by_name["worker.generate"]
        answered = by_name["gateway.generate"].events["last_message"]
    except KeyError:
        return None
    marks = [sent, req.start_ns, sched.start_ns, sched.end_ns, work.start_ns, work.end_ns, answered, received]
    return [(b - a) / 1e6 for a, b in zip(marks, marks[1:], strict=False)]


@BENCHMARKS.register("gateway-breakdown")
class GatewayBreakdown:
    help = "per-stage latency of requests through the gateway, from the stack's trace spans"

    def add_arguments(self, parser: argparse.ArgumentParser) -> None:
        parser.add_argument("--rate", type=float, default=20.0, help="requests/s")
        parser.add_argument("--duration", type=float, default=15.0, help="measured seconds")
        parser.add_argument("--quick", action="store_true", help="5 s")

    def run(self, args: argparse.Namespace) -> BenchResult:
        if args.quick:
            args.duration = min(args.duration, 5.0)
        receiver = SpanReceiver()
        server = grpc.server(futures.ThreadPoolExecutor(max_workers=4))
        trace_service_pb2_grpc.add_TraceServiceServicer_to_server(receiver, server)
        port = free_port()
        env = {"OTEL_EXPORTER_OTLP_ENDPOINT": f"http://127.0.0.1:{port}", "OTEL_EXPORTER_OTLP_INSECURE": "true",
               "OTEL_BSP_SCHEDULE_DELAY": "200"}
        with tempfile.TemporaryDirectory(prefix="cv-bench-") as tmp:
            progress(f"starting the stack ({MODEL}, spans exported to 127.0.0.1:{port}) ...")
            stack = start_stack(Path(tmp), workers=2, worker_threads=1, env=env)
            try:
                # Only now: gRPC threads alive in this process while the stack forks its children
                # have crashed a child at start-up ("skipping fork() handlers").
                server.add_insecure_port(f"127.0.0.1:{port}")
                server.start()
                asyncio.run(send_all(stack.gateway_url, args.rate, 2.0))  # warm-up
                progress(f"measuring: {args.rate:g} req/s for {args.duration:.0f} s")
                timings = asyncio.run(send_all(stack.gateway_url, args.rate, args.duration))
                time.sleep(1.5)  # let the batch span processors flush
            finally:
                stack.stop()
                server.stop(0)
        by_request = {s.request_id: spans for spans in receiver.traces.values() for s in spans if s.request_id}
        matched = [row for rid, (sent, got) in timings.items()
                   if (row := stages(by_request.get(rid, []), sent, got)) is not None]
        totals = [sum(row) for row in matched]
        mean_total = sum(totals) / max(1, len(totals))
        rows: list[list[object]] = []
        for i, name in enumerate(STAGES):
            values = [row[i] for row in matched]
            mean = sum(values) / max(1, len(values))
            rows.append([name, percentile(values, 50), percentile(values, 90), mean, f"{mean / mean_total:.0%}"])
        rows.append(["total (client-observed)", percentile(totals, 50), percentile(totals, 90), mean_total, "100%"])
        return BenchResult(
            name="gateway-breakdown",
            columns=["stage", "p50 ms", "p90 ms", "mean ms", "share of mean"],
            rows=rows,
            summary={"requests_sent": int(args.rate * args.duration), "requests_matched": len(matched)},
            notes=["span export is on for every service here, which adds a little CPU to each request"],
            params={k: v for k, v in vars(args).items() if k not in ("command", "out_dir")},
        )
