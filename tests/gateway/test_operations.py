"""Operating the gateway: trace propagation, a dead NATS, and the real process (start, serve, SIGTERM)."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import sys
from collections.abc import Iterator
from pathlib import Path

import httpx
import nats
import pytest
from opentelemetry import trace
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from prometheus_client import REGISTRY

from clairvoyant.contracts.v1 import common_pb2
from clairvoyant.core.bus import COMPLETIONS_SUBJECT
from clairvoyant.core.telemetry import setup_tracing
from clairvoyant.stack.natsserver import NatsServer, free_port
from tests.gateway.conftest import StackFactory, add_completions_stream
from tests.gateway.fakes import MODEL, FakeScheduler, FakeWorker, WorkerEntry, start_server

pytestmark = pytest.mark.integration

CHAT = [{"role": "user", "content": "hello there"}]


@pytest.fixture(scope="module")
def spans() -> Iterator[InMemorySpanExporter]:
    exporter = InMemorySpanExporter()
    provider = trace.get_tracer_provider()
    if isinstance(provider, TracerProvider):  # another test installed one already: listen in
        provider.add_span_processor(SimpleSpanProcessor(exporter))
    else:
        provider = setup_tracing("gateway-test")
        provider.add_span_processor(SimpleSpanProcessor(exporter))
    yield exporter


async def test_trace_context_reaches_scheduler_and_worker(
    make_stack: StackFactory, spans: InMemorySpanExporter
) -> None:
    stack = await make_stack()
    trace_id = "4bf92f3577b34da6a3ce929d0e0e4736"
    async with httpx.AsyncClient(base_url=stack.url) as http:
        r = await http.post(
            "/v1/chat/completions",
            json={"model": MODEL, "messages": CHAT},
            headers={"traceparent": f"00-{trace_id}-00f067aa0ba902b7-01"},
        )
    assert r.status_code == 200
    await stack.server.frontend.pipeline.aclose()  # the release and the record finish after the reply
    assert stack.scheduler.schedule_metadata[0]["traceparent"].split("-")[1] == trace_id
    assert stack.worker.metadata[0]["traceparent"].split("-")[1] == trace_id
    ours = {s.name: s for s in spans.get_finished_spans() if format(s.context.trace_id, "032x") == trace_id}
    assert {"gateway.request", "gateway.schedule", "gateway.generate"} <= set(ours)
    request_span = ours["gateway.request"]
    assert ours["gateway.schedule"].parent.span_id == request_span.context.span_id
    assert request_span.attributes["cv.status"] == "REQUEST_STATUS_OK"
    assert request_span.attributes["cv.request_id"] == r.headers["x-request-id"]


async def test_dead_nats_degrades_to_the_outbox(make_stack: StackFactory, tmp_path: Path) -> None:
    port = free_port()
    stack = await make_stack(bus_url=f"nats://127.0.0.1:{port}")
    bus = stack.server.frontend.pipeline.records
    assert bus.outbox_depth == 0
    client = stack.openai()
    first = await client.chat.completions.create(model=MODEL, messages=CHAT)
    assert first.choices[0].message.content == "Hello, world!"
    await stack.server.frontend.pipeline.aclose()  # the record is published just after the reply
    # The gauge is the process's (one bus per service); earlier tests' buses set it too.
    assert bus.outbox_depth == 1 and REGISTRY.get_sample_value("cv_bus_outbox_depth") == 1

    server = NatsServer(tmp_path / "late-nats", port=port).start()  # NATS comes back
    try:
        nc = await nats.connect(server.url)
        await add_completions_stream(nc)
        sub = await nc.jetstream().subscribe(COMPLETIONS_SUBJECT, ordered_consumer=True)
        for _ in range(100):
            if bus.connected:
                break
            await asyncio.sleep(0.1)
        second = await client.chat.completions.create(model=MODEL, messages=CHAT)
        ids = [
            common_pb2.CompletionRecord.FromString((await sub.next_msg(timeout=5)).data).request_id
            for _ in range(2)
        ]
        assert ids == [
            first.id.removeprefix("chatcmpl-"),
            second.id.removeprefix("chatcmpl-"),
        ]  # none lost, in order
        await nc.close()
    finally:
        server.stop()


async def test_process_serves_and_stops_on_sigterm(nats_server: str, tmp_path: Path) -> None:
    scheduler, worker = FakeScheduler(), FakeWorker()
    sched_server, sched_address = await start_server(scheduler)
    worker_server, worker_address = await start_server(worker)
    scheduler.workers.append(WorkerEntry(worker.worker_id, worker_address))
    http_port, grpc_port = free_port(), free_port()
    env = {
        **os.environ,
        "CV_HOST": "127.0.0.1",
        "CV_GATEWAY_PORT": str(http_port),
        "CV_GATEWAY_GRPC_PORT": str(grpc_port),
        "CV_SCHEDULER_ADDRESS": sched_address,
        "CV_NATS_URL": nats_server,
        "CV_DATABASE_URL": f"sqlite:///{tmp_path / 'var' / 'gateway.db'}",
    }
    log_path = tmp_path / "gateway.log"
    with log_path.open("wb") as log:
        proc = await asyncio.create_subprocess_exec(
            sys.executable, "-m", "clairvoyant.gateway", env=env, stderr=log
        )
    try:
        async with httpx.AsyncClient(base_url=f"http://127.0.0.1:{http_port}") as http:
            for _ in range(200):
                try:
                    if (await http.get("/readyz")).status_code == 200:
                        break
                except httpx.TransportError:
                    pass
                assert proc.returncode is None, log_path.read_text()
                await asyncio.sleep(0.1)
            reply = await http.post("/v1/chat/completions", json={"model": MODEL, "messages": CHAT})
            assert reply.json()["choices"][0]["message"]["content"] == "Hello, world!"
        proc.send_signal(signal.SIGTERM)
        assert await asyncio.wait_for(proc.wait(), timeout=20) == 0
    finally:
        if proc.returncode is None:
            proc.kill()
            await proc.wait()
        await sched_server.stop(None)
        await worker_server.stop(None)
    logs = [json.loads(line) for line in log_path.read_text().splitlines() if line.startswith("{")]
    messages = [entry["msg"] for entry in logs]
    assert any(f"http://127.0.0.1:{http_port}/v1" in m for m in messages)
    assert any(f"127.0.0.1:{grpc_port}" in m for m in messages)
    assert any("OPEN" in m for m in messages)  # no keys: the warning says so
    assert messages[-1] == "gateway stopped"
    assert (tmp_path / "var" / "gateway.db").exists()
    assert len(scheduler.complete_calls) == 1
