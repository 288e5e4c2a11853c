"""NATS dies under load and comes back: serving goes on, and no completion record is lost.

A whole stack (scheduler, profiler, two emulated workers, gateway) runs on a nats-server of the
test's own, which the test kills while clients keep sending requests, then restarts on the same
port and store.  Heartbeats ride NATS, so for the outage the scheduler keeps its workers by asking
them for Stats over gRPC; records wait in the gateway's outbox and reach JetStream afterwards.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import httpx
import nats
import openai
import pytest
from nats.js.api import DeliverPolicy

from clairvoyant.contracts.v1 import common_pb2
from clairvoyant.core.bus import COMPLETIONS_SUBJECT
from clairvoyant.stack import Stack, StackConfig
from clairvoyant.stack.natsserver import NatsServer

pytestmark = [pytest.mark.e2e, pytest.mark.slow]

MODEL = "llama-3.1-8b"
WORKFLOW_TYPE = "nats_outage"
CLIENTS = 6


@dataclass
class Outage:
    stack: Stack
    nats: NatsServer


@pytest.fixture(scope="module")
def outage(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Outage]:
    var: Path = tmp_path_factory.mktemp("nats-outage")
    server = NatsServer(var / "nats").start()
    config = StackConfig.on_free_ports(
        var,
        model=MODEL,
        workers=2,
        nats_url=server.url,
        worker_env={"CV_RUNNER": "emulated", "CV_GPU": "H100-80G", "CV_TORCH_THREADS": "1"},
    )
    stack = Stack(config).start(ready_timeout=120)
    holder = Outage(stack, server)
    try:
        yield holder
    finally:
        stack.stop()
        holder.nats.stop()


@dataclass
class Load:
    """What the clients saw, by phase: (request id, latency) of successes, and failures."""

    ok: dict[str, list[tuple[str, float]]] = field(default_factory=dict)
    failed: dict[str, list[str]] = field(default_factory=dict)
    phase: str = "before"


async def client_loop(client: openai.AsyncOpenAI, load: Load, index: int, stop: asyncio.Event) -> None:
    n = 0
    while not stop.is_set():
        n += 1
        phase, started = load.phase, time.monotonic()
        try:
            reply = await client.chat.completions.create(
                model=MODEL,
                messages=[{"role": "user", "content": f"client {index} request {n}: summarise the log"}],
                max_tokens=12,
                extra_body={"app_metadata": {"workflow_type_id": WORKFLOW_TYPE,
                                             "workflow_id": f"c{index}-{n}", "agent_id": "summariser"}},
            )  # fmt: skip
        except openai.APIError as err:
            load.failed.setdefault(phase, []).append(f"{type(err).__name__}: {err}")
            continue
        request_id = reply.id.removeprefix("chatcmpl-")
        load.ok.setdefault(phase, []).append((request_id, time.monotonic() - started))


async def recorded_ids(nats_url: str, expected: set[str], timeout_s: float) -> set[str]:
    """The request ids of this test's records in the completions stream, once all are there."""
    nc = await nats.connect(nats_url)
    try:
        sub = await nc.jetstream().subscribe(
            COMPLETIONS_SUBJECT, ordered_consumer=True, deliver_policy=DeliverPolicy.ALL
        )
        seen: set[str] = set()
        deadline = time.monotonic() + timeout_s
        while not expected <= seen and time.monotonic() < deadline:
            try:
                msg = await sub.next_msg(timeout=1.0)
            except nats.errors.TimeoutError:
                continue
            record = common_pb2.CompletionRecord.FromString(msg.data)
            if record.app_metadata.workflow_type_id == WORKFLOW_TYPE:
                seen.add(record.request_id)
        return seen
    finally:
        await nc.close()


def p99(latencies: list[float]) -> float:
    ordered = sorted(latencies)
    return ordered[min(len(ordered) - 1, int(0.99 * len(ordered)))]


async def test_serving_continues_through_a_nats_outage_and_no_record_is_lost(outage: Outage) -> None:
    stack = outage.stack
    load, stop = Load(), asyncio.Event()
    clients = [openai.AsyncOpenAI(base_url=f"{stack.gateway_url}/v1", api_key="x", max_retries=0, timeout=30)]
    loops = [asyncio.create_task(client_loop(clients[0], load, i, stop)) for i in range(CLIENTS)]
    try:
        await asyncio.sleep(4.0)
        load.phase = "outage"
        outage.nats.stop()  # SIGTERM; the port stays free for the restart below
        await asyncio.sleep(8.0)  # well past the 3 s after which silent workers used to be dropped
        load.phase = "after"
        outage.nats = NatsServer(outage.nats.store_dir, port=outage.nats.port).start()
        await asyncio.sleep(4.0)
    finally:
        stop.set()
        await asyncio.gather(*loops)
        await clients[0].close()

    served = {phase: len(ok) for phase, ok in load.ok.items()}
    failures = {phase: len(failed) for phase, failed in load.failed.items()}
    total_ok, total_failed = sum(served.values()), sum(failures.values())
    print(f"served {served}, failed {failures}, failures: {load.failed}")
    assert served.get("outage", 0) >= 20, "requests must keep completing while NATS is down"
    assert total_ok / (total_ok + total_failed) >= 0.99
    normal = [latency for _, latency in load.ok["before"]]
    during = [latency for _, latency in load.ok["outage"]]
    print(f"p99 before {p99(normal):.3f} s, during the outage {p99(during):.3f} s")

    expected = {request_id for ok in load.ok.values() for request_id, _ in ok}
    recorded = await recorded_ids(outage.nats.url, expected, timeout_s=30.0)
    assert expected - recorded == set(), f"{len(expected - recorded)} completion records lost"
    # The profiler's durable consumer catches up on everything once NATS is back.
    metrics_url = f"http://127.0.0.1:{stack.config.profiler_metrics_port}/metrics"
    deadline = time.monotonic() + 30.0
    while (learned := await profiler_accepted(metrics_url)) < len(expected):
        assert time.monotonic() < deadline, f"the profiler learned {learned} of {len(expected)} records"
        await asyncio.sleep(0.5)


async def profiler_accepted(metrics_url: str) -> float:
    async with httpx.AsyncClient() as client:
        text = (await client.get(metrics_url, timeout=5)).text
    for line in text.splitlines():
        if line.startswith('cv_profiler_records_total{outcome="accepted"}'):
            return float(line.split()[-1])
    return 0.0
