"""A preset's engine rule on live workers: the request names the preset, the worker installs its rule.

Unit tests drive the engine core with the worker's own rule factory (``worker.rules``); the
integration test runs a real scheduler (gRPC, heartbeats over NATS), a real worker (emulated
llama-3.1-8b on H100-80G, one seat) and the gateway in one process, and restarts only the
scheduler to switch presets.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from pathlib import Path

import openai
import pytest
from openai import AsyncOpenAI
from opentelemetry import trace
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from clairvoyant.contracts.v1 import worker_pb2_grpc
from clairvoyant.core.bus import EventBus
from clairvoyant.core.grpcutil import new_server
from clairvoyant.core.telemetry import setup_tracing
from clairvoyant.gateway.app import GatewayApp
from clairvoyant.gateway.config import GatewaySettings
from clairvoyant.policy import PRESETS, PRIORITY_POLICIES, engine_rule_of
from clairvoyant.policy.autellix import KQueueRule
from clairvoyant.policy.pythia import PythiaAgingRule
from clairvoyant.scheduler.app import SchedulerApp
from clairvoyant.scheduler.config import SchedulerSettings
from clairvoyant.stack.natsserver import free_port
from clairvoyant.worker.app import build_engine, engine_config
from clairvoyant.worker.config import WorkerSettings
from clairvoyant.worker.core.engine import LLMEngine
from clairvoyant.worker.engine_loop import AsyncEngine
from clairvoyant.worker.frontend import WorkerFrontend
from clairvoyant.worker.grpc_api import WorkerServicer
from clairvoyant.worker.heartbeat import Heartbeat
from clairvoyant.worker.rules import preset_rule
from clairvoyant.worker.runners.emulated import EmulatedRunner
from tests.worker.fakes import Clock, letters, make_engine, request

MODEL = "llama-3.1-8b"


def _engine(clock: Clock | None = None, **config: object) -> LLMEngine:
    engine, _ = make_engine(clock=clock, **config)
    engine.scheduler.rule_factory = preset_rule
    return engine


def _drain(engine: LLMEngine, clock: Clock | None = None, step_s: float = 0.0) -> list[str]:
    """Request ids in the order they finish."""
    finished: list[str] = []
    while engine.has_unfinished():
        finished += [out.request_id for out in engine.step() if out.finished]
        if clock is not None:
            clock.now += step_s
    return finished


# ---- the engine core with the worker's rule factory --------------------------------------------


@pytest.mark.unit
@pytest.mark.parametrize("preset", PRESETS.names())
def test_every_preset_installs_its_priority_policys_engine_rule(preset: str) -> None:
    engine = _engine(block_size=4, num_blocks=64)
    engine.add_request(request("r", letters(6, 1), max_tokens=2, scheduler_preset=preset))
    policy = PRIORITY_POLICIES.create(PRESETS.create(preset).priority)
    expected = type(engine_rule_of(policy))
    assert engine.scheduler.preset == preset
    assert type(engine.scheduler.rule) is expected
    assert _drain(engine) == ["r"]


@pytest.mark.unit
def test_the_rule_follows_the_latest_preset_one_instance_per_preset() -> None:
    engine = _engine(block_size=4, num_blocks=64)
    scheduler = engine.scheduler
    engine.add_request(request("a", letters(6, 1), max_tokens=2, scheduler_preset="autellix"))
    kqueue = scheduler.rule
    assert isinstance(kqueue, KQueueRule)
    engine.add_request(request("b", letters(6, 2), max_tokens=2))  # names no preset: nothing changes
    assert scheduler.rule is kqueue and scheduler.preset == "autellix"
    engine.add_request(request("c", letters(6, 3), max_tokens=2, scheduler_preset="pythia"))
    assert isinstance(scheduler.rule, PythiaAgingRule) and scheduler.preset == "pythia"
    engine.add_request(request("d", letters(6, 4), max_tokens=2, scheduler_preset="fcfs-rr"))
    assert scheduler.rule is None
    engine.add_request(request("e", letters(6, 5), max_tokens=2, scheduler_preset="autellix"))
    assert scheduler.rule is kqueue  # switching back resumes the engine's one K-queue rule
    assert sorted(_drain(engine)) == ["a", "b", "c", "d", "e"]


@pytest.mark.unit
def test_an_unknown_preset_is_served_by_base_priority_and_warned_about_once(caplog: pytest.LogCaptureFixture) -> None:
    clock = Clock(0.0)
    engine = _engine(clock, block_size=4, num_blocks=64, max_num_seqs=1)
    engine.add_request(request("warm", letters(6, 9), max_tokens=1, scheduler_preset="autellix"))
    _drain(engine, clock, 1.0)
    with caplog.at_level(logging.WARNING, logger="clairvoyant.worker.rules"):
        engine.add_request(request("low", letters(6, 1), max_tokens=2, priority=0.0, scheduler_preset="from-the-future"))
        engine.add_request(request("high", letters(6, 2), max_tokens=2, priority=3.0, scheduler_preset="from-the-future"))
        assert engine.scheduler.rule is None
        assert _drain(engine, clock, 1.0) == ["high", "low"]  # base priority decides
    warnings = [r for r in caplog.records if "from-the-future" in r.getMessage()]
    assert len(warnings) == 1 and warnings[0].levelno == logging.WARNING


@pytest.mark.unit
@pytest.mark.parametrize(("preset", "order"), [("autellix", ["new", "long"]), ("fcfs-rr", ["long", "new"])])
def test_autellix_demotes_a_long_call_so_a_later_one_overtakes(preset: str, order: list[str]) -> None:
    # One seat.  "long" runs 0.25 s per step; after 1 s of service (Q1's quantum) the K-queue rule
    # demotes it to Q2, so "new" (Q1) takes its seat.  Without the rule equal priorities keep FCFS.
    clock = Clock(0.0)
    engine = _engine(clock, block_size=4, num_blocks=64, max_num_seqs=1)
    engine.add_request(request("long", letters(6, 1), max_tokens=12, scheduler_preset=preset))
    for _ in range(6):
        engine.step()
        clock.now += 0.25
    engine.add_request(request("new", letters(6, 2), max_tokens=2, scheduler_preset=preset))
    assert _drain(engine, clock, 0.25) == order
    assert engine.stats().preemptions_total == (1 if preset == "autellix" else 0)


# ---- the live path: scheduler -> gateway -> worker ---------------------------------------------


@pytest.fixture(scope="module")
def spans() -> InMemorySpanExporter:
    exporter = InMemorySpanExporter()
    provider = trace.get_tracer_provider()
    if not isinstance(provider, TracerProvider):  # else another test installed one: listen in
        provider = setup_tracing("rules-live-test")
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    return exporter


@dataclass
class LiveStack:
    nats_url: str
    scheduler_port: int
    engine: LLMEngine
    client: AsyncOpenAI
    scheduler: SchedulerApp | None = None
    cleanups: list[object] = field(default_factory=list)

    async def restart_scheduler(self, policy: str) -> None:
        """Stop the scheduler and start one with ``policy`` on the same port; nothing else changes."""
        if self.scheduler is not None:
            await self.scheduler.stop()
        settings = SchedulerSettings(
            policy=policy, host="127.0.0.1", scheduler_port=self.scheduler_port, nats_url=self.nats_url,
            expiry_interval_s=0.2, shutdown_grace_s=0.5,
        )  # fmt: skip
        self.scheduler = SchedulerApp(settings, tracer=trace.get_tracer("rules-live-test"))
        await self.scheduler.start()
        deadline = time.monotonic() + 10
        while not self.scheduler.core.workers():  # the worker's next heartbeat registers it
            assert time.monotonic() < deadline, "the worker never registered"
            await asyncio.sleep(0.05)
        while True:  # the gateway's channel reconnects after its backoff; until then it answers 503
            try:
                if MODEL in {m.id for m in (await self.client.models.list()).data}:
                    return
            except openai.APIStatusError:
                pass
            assert time.monotonic() < deadline, "the gateway never saw the new scheduler"
            await asyncio.sleep(0.1)


@pytest.fixture
async def live(nats_server: str, tmp_path: Path, spans: InMemorySpanExporter) -> AsyncIterator[LiveStack]:
    settings = WorkerSettings(
        worker_id="w-rules", runner="emulated", model=MODEL, gpu="H100-80G", max_num_seqs=1,
        max_num_batched_tokens=2048, heartbeat_interval_s=0.2, nats_url=nats_server,
    )  # fmt: skip
    runner = EmulatedRunner(MODEL, "H100-80G", absorb_host_time=True)
    core = build_engine(runner, engine_config(settings, runner))  # the worker's own wiring
    engine = AsyncEngine(core)
    engine.start()
    server = new_server()
    port = server.add_insecure_port("127.0.0.1:0")
    heartbeat = Heartbeat(settings, runner, engine, f"127.0.0.1:{port}", "")
    service = WorkerFrontend(runner, engine, settings.worker_id)
    worker_pb2_grpc.add_WorkerServicer_to_server(WorkerServicer(service, heartbeat), server)
    await server.start()
    worker_bus = EventBus(nats_server, "worker-rules-test", connect_timeout_s=1.0)
    assert await worker_bus.connect()
    beating = asyncio.create_task(heartbeat.run(worker_bus))
    scheduler_port = free_port()
    gateway_bus = EventBus(nats_server, "gateway-rules-test", connect_timeout_s=1.0)
    assert await gateway_bus.connect()
    await gateway_bus.ensure_stream()
    gateway = GatewayApp(
        GatewaySettings(
            host="127.0.0.1", gateway_port=0, gateway_grpc_port=0, scheduler_address=f"127.0.0.1:{scheduler_port}",
            database_url=f"sqlite:///{tmp_path / 'gateway.db'}", nats_url=nats_server, model_cache_s=0.0,
            shutdown_grace_s=1.0,
        ),
        gateway_bus,
    )  # fmt: skip
    await gateway.start()
    client = AsyncOpenAI(base_url=f"http://127.0.0.1:{gateway.http_port}/v1", api_key="x", max_retries=0, timeout=30)
    stack = LiveStack(nats_server, scheduler_port, core, client)
    try:
        yield stack
    finally:
        await client.close()
        await gateway.stop()
        if stack.scheduler is not None:
            await stack.scheduler.stop()
        beating.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await beating
        await server.stop(None)
        await worker_bus.close()
        await gateway_bus.close()
        engine.stop()


async def _call(
    client: AsyncOpenAI, workflow: str, max_tokens: int, finished: list[str], name: str,
    progress: asyncio.Event | None = None, after_tokens: int = 0,
) -> str:  # fmt: skip
    """Stream one call; appends ``name`` to ``finished`` when its stream ends; returns the request id."""
    stream = await client.completions.create(
        model=MODEL, prompt=f"{name}: " + "x" * 64, max_tokens=max_tokens, temperature=0.0, stream=True,
        extra_body={"ignore_eos": True, "app_metadata": {"workflow_type_id": "rules", "workflow_id": workflow,
                                                         "agent_id": name}},
    )  # fmt: skip
    request_id, chunks = "", 0
    async for chunk in stream:
        request_id = chunk.id or request_id
        chunks += bool(chunk.choices and chunk.choices[0].text)
        if progress is not None and chunks >= after_tokens:
            progress.set()
    finished.append(name)
    return request_id.removeprefix("cmpl-")


async def _long_then_short(client: AsyncOpenAI, tag: str) -> tuple[list[str], str]:
    """A 320-token call, then (once it has streamed 200 tokens, over 1.2 s of service on an H100) a
    4-token call of another workflow; returns the finishing order and the long call's request id."""
    finished: list[str] = []
    progress = asyncio.Event()
    long = asyncio.create_task(_call(client, f"wf-long-{tag}", 320, finished, "long", progress, 200))
    await asyncio.wait_for(progress.wait(), 30)
    await _call(client, f"wf-short-{tag}", 4, finished, "short")
    return finished, await long


def _span_priority(spans: InMemorySpanExporter, name: str, request_id: str) -> float:
    found: list[ReadableSpan] = [
        s for s in spans.get_finished_spans()
        if s.name == name and s.attributes is not None and s.attributes.get("cv.request_id") == request_id
    ]  # fmt: skip
    assert len(found) == 1, f"{len(found)} {name} spans for {request_id}"
    attributes = found[0].attributes
    assert attributes is not None
    return float(attributes["cv.base_priority"])  # type: ignore[arg-type]


@pytest.mark.integration
@pytest.mark.timeout(90)
async def test_a_scheduler_restart_switches_the_workers_rule_and_its_order(
    live: LiveStack, spans: InMemorySpanExporter
) -> None:
    rules = live.engine.scheduler
    await live.restart_scheduler("autellix")
    finished, long_id = await _long_then_short(live.client, "a")
    assert rules.preset == "autellix" and isinstance(rules.rule, KQueueRule)
    assert finished == ["short", "long"]  # the demoted long call gave its seat to the later one
    kqueue = rules.rule

    # The base priority reaches the worker: a later call of the long call's program has attained
    # over 1 s of service, so ATLAS ranks it below Q1; the worker sees what the scheduler sent.
    follow_up = await _call(live.client, "wf-long-a", 2, [], "follow-up")
    sent = _span_priority(spans, "scheduler.queue_wait", follow_up)
    assert sent <= -1.0 and _span_priority(spans, "worker.generate", follow_up) == sent
    assert _span_priority(spans, "worker.generate", long_id) == 0.0

    await live.restart_scheduler("fcfs-rr")
    finished, _ = await _long_then_short(live.client, "b")
    assert rules.preset == "fcfs-rr" and rules.rule is None
    assert finished == ["long", "short"]

    await live.restart_scheduler("pythia")
    await _call(live.client, "wf-p", 2, [], "pythia")
    assert rules.preset == "pythia" and isinstance(rules.rule, PythiaAgingRule)

    await live.restart_scheduler("autellix")
    await _call(live.client, "wf-back", 2, [], "back")
    assert rules.rule is kqueue  # one rule instance per engine and preset
