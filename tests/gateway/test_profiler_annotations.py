"""Gateway -> profiler: annotations reach the scheduler and the worker; every request the profiler
does not annotate is counted by reason; and the CompletionRecord carries the worker's block hashes.

The profiler here is a small ``ProfilerServicer`` on a real grpc.aio server that the test starts
and stops itself; the gateway talks to it with its default 5 ms deadline unless a test says
otherwise.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass, field

import grpc
import httpx
import pytest
from prometheus_client import REGISTRY

from clairvoyant.contracts.v1 import (
    common_pb2,
    gateway_pb2,
    gateway_pb2_grpc,
    profiler_pb2,
    profiler_pb2_grpc,
)
from clairvoyant.core.blockhash import sequence_hashes
from clairvoyant.gateway.clients import ProfilerClient
from clairvoyant.gateway.metrics import UNANNOTATED_REASONS
from tests.gateway.conftest import Stack, StackFactory
from tests.gateway.fakes import MODEL, TOKENS, FakeWorker, WorkerEntry

pytestmark = pytest.mark.integration

META = {"workflow_type_id": "coding_assistant", "workflow_id": "session-7", "agent_id": "reviewer"}
CHAT = [{"role": "user", "content": "review the pull request about the block hashes"}]  # 46 bytes
PREDICTION = common_pb2.SysAnnotations(
    predicted_output_len=common_pb2.LengthInterval(p50=120, p99=900),
    expected_remaining_steps=3.0,
    confidence=common_pb2.CONFIDENCE_LOW,
)


@dataclass
class ScriptedProfiler(profiler_pb2_grpc.ProfilerServicer):
    """Answers Annotate with ``PREDICTION`` after sleeping ``delay_s``."""

    delay_s: float = 0.0
    calls: list[profiler_pb2.AnnotateRequest] = field(default_factory=list)

    async def Annotate(self, request, context):  # noqa: N802
        self.calls.append(request)
        await asyncio.sleep(self.delay_s)
        return profiler_pb2.AnnotateResponse(annotations=PREDICTION)


@dataclass
class Profiler:
    servicer: ScriptedProfiler
    server: grpc.aio.Server
    address: str


@pytest.fixture
async def profiler() -> AsyncIterator[Profiler]:
    servicer = ScriptedProfiler()
    server = grpc.aio.server()
    profiler_pb2_grpc.add_ProfilerServicer_to_server(servicer, server)
    port = server.add_insecure_port("127.0.0.1:0")
    await server.start()
    yield Profiler(servicer, server, f"127.0.0.1:{port}")
    await server.stop(None)


def unannotated() -> dict[str, float]:
    """The un-annotated counter, every reason (the counter is process-wide: tests compare deltas)."""
    return {
        reason: REGISTRY.get_sample_value("cv_gateway_unannotated_requests_total", {"reason": reason}) or 0.0
        for reason in UNANNOTATED_REASONS
    }


def increase(before: dict[str, float]) -> dict[str, float]:
    after = unannotated()
    return {reason: after[reason] - before[reason] for reason in after if after[reason] != before[reason]}


def annotator_of(stack: Stack) -> ProfilerClient:
    annotator = stack.server.frontend.annotator
    assert isinstance(annotator, ProfilerClient)
    return annotator


async def wait_until(condition: object, timeout_s: float = 5.0) -> None:
    assert callable(condition)
    for _ in range(int(timeout_s / 0.01)):
        if condition():
            return
        await asyncio.sleep(0.01)
    raise AssertionError("condition not reached")


async def chat(stack: Stack, **extra: object) -> dict[str, object]:
    body = {"model": MODEL, "messages": CHAT, "app_metadata": META, "echo_annotations": True, **extra}
    async with httpx.AsyncClient(base_url=stack.url) as http:
        r = await http.post("/v1/chat/completions", json=body)
    assert r.status_code == 200, r.text
    reply: dict[str, object] = r.json()
    return reply


async def test_annotations_reach_scheduler_and_worker_and_are_echoed(
    make_stack: StackFactory, profiler: Profiler
) -> None:
    # A generous deadline: this test is about where the annotations go, not about timing.
    stack = await make_stack(profiler_address=profiler.address, profiler_timeout_s=5.0)
    before = unannotated()
    sent_at = time.time()
    reply = await chat(stack)
    assert reply["annotations"] == {
        "predicted_output_len": {"p50": 120.0, "p99": 900.0},
        "expected_remaining_steps": 3.0,
        "confidence": "CONFIDENCE_LOW",
    }
    [asked] = profiler.servicer.calls
    assert (asked.tenant, asked.model, asked.app_metadata.workflow_id, asked.app_metadata.agent_id) == (
        "default",
        MODEL,
        "session-7",
        "reviewer",
    )
    assert asked.prompt_tokens > 0
    # the arrival time on the completion records' clock (the gateway's wall clock), for the
    # profiler's progress features
    assert sent_at <= asked.arrival_time <= time.time()
    assert stack.scheduler.schedule_calls[0].annotations == PREDICTION
    assert stack.worker.calls[0].annotations == PREDICTION

    # The gRPC edge too.
    async with grpc.aio.insecure_channel(stack.grpc_address) as channel:
        stub = gateway_pb2_grpc.GatewayStub(channel)
        request = gateway_pb2.ChatCompletionRequest(
            model=MODEL,
            messages=[common_pb2.ChatMessage(role="user", content="again")],
            app_metadata=common_pb2.AppMetadata(**META),
            echo_annotations=True,
        )
        echoed = await stub.ChatCompletion(request)
        chunks = [chunk async for chunk in stub.ChatCompletionStream(request)]  # echoed on the last chunk
        request.echo_annotations = False
        plain = await stub.ChatCompletion(request)
    assert echoed.annotations == PREDICTION and not plain.HasField("annotations")
    assert chunks[-1].annotations == PREDICTION and chunks[-1].finish_reason
    assert not any(c.HasField("annotations") for c in chunks[:-1])
    assert len(profiler.servicer.calls) == 4
    assert [c.annotations == PREDICTION for c in stack.scheduler.schedule_calls] == [True] * 4
    assert [c.annotations == PREDICTION for c in stack.worker.calls] == [True] * 4
    assert increase(before) == {}  # all were annotated


async def test_a_profiler_past_the_deadline_is_counted_as_a_timeout(
    make_stack: StackFactory, profiler: Profiler
) -> None:
    profiler.servicer.delay_s = 0.5  # against the default 5 ms deadline
    stack = await make_stack(profiler_address=profiler.address)
    assert stack.server.settings.profiler_timeout_s == 0.005
    await wait_until(annotator_of(stack).connected)  # the gateway connects at start
    before = unannotated()
    reply = await chat(stack)
    assert reply["annotations"] == {}
    assert reply["choices"][0]["message"]["content"] == "".join(TOKENS)  # type: ignore[index]
    assert increase(before) == {"timeout": 1.0}
    assert len(profiler.servicer.calls) == 1  # asked, once; the answer came too late
    assert not stack.scheduler.schedule_calls[0].HasField("annotations")
    assert not stack.worker.calls[0].HasField("annotations")
    record = await stack.records.next()
    assert record.status == common_pb2.REQUEST_STATUS_OK


async def test_a_stopped_profiler_is_counted_as_unavailable(
    make_stack: StackFactory, profiler: Profiler
) -> None:
    stack = await make_stack(profiler_address=profiler.address)
    annotator = annotator_of(stack)
    await wait_until(annotator.connected)
    await profiler.server.stop(None)
    await wait_until(lambda: not annotator.connected())
    before = unannotated()
    replies = [await chat(stack) for _ in range(3)]
    assert [r["annotations"] for r in replies] == [{}, {}, {}]
    assert increase(before) == {"unavailable": 3.0}
    assert profiler.servicer.calls == []
    assert [c.HasField("annotations") for c in stack.scheduler.schedule_calls] == [False, False, False]
    assert [(await stack.records.next()).status for _ in range(3)] == [common_pb2.REQUEST_STATUS_OK] * 3


async def test_no_metadata_and_no_profiler_are_counted(make_stack: StackFactory, profiler: Profiler) -> None:
    with_profiler = await make_stack(profiler_address=profiler.address, profiler_timeout_s=5.0)
    before = unannotated()
    async with httpx.AsyncClient(base_url=with_profiler.url) as http:
        r = await http.post("/v1/chat/completions", json={"model": MODEL, "messages": CHAT})
    assert r.status_code == 200
    assert increase(before) == {"no_metadata": 1.0}
    assert profiler.servicer.calls == []  # nothing to look up: not asked

    without = await make_stack()
    before = unannotated()
    await chat(without)
    await chat(without)
    assert increase(before) == {"no_profiler": 2.0}
    async with httpx.AsyncClient(base_url=without.url) as http:
        text = (await http.get("/metrics")).text
    for reason in UNANNOTATED_REASONS:
        assert f'cv_gateway_unannotated_requests_total{{reason="{reason}"}}' in text


async def test_the_record_carries_the_workers_block_hashes(stack: Stack) -> None:
    reply = await chat(stack)
    record = await stack.records.next()
    assert record.request_id == str(reply["id"]).removeprefix("chatcmpl-")
    expected_prompt, expected_response = sequence_hashes(
        list(CHAT[0]["content"].encode()), [100 + i for i in range(len(TOKENS))]
    )
    assert len(expected_prompt) == 2 and len(expected_response) == 1  # 46 prompt bytes, then 4 tokens
    assert list(record.prompt_block_hashes) == expected_prompt
    assert list(record.response_block_hashes) == expected_response


async def test_requests_without_a_final_worker_message_have_no_hashes(
    make_stack: StackFactory, unused_port: int, free_port: int
) -> None:
    # Both placements land on addresses where nothing listens: the request fails before any
    # worker answers (one ERROR record).
    dead = [
        WorkerEntry("dead-1", f"127.0.0.1:{unused_port}"),
        WorkerEntry("dead-2", f"127.0.0.1:{free_port}"),
    ]
    stack = await make_stack(workers=[], extra_entries=dead)
    async with httpx.AsyncClient(base_url=stack.url) as http:
        r = await http.post("/v1/chat/completions", json={"model": MODEL, "messages": CHAT})
    assert r.status_code == 503
    record = await stack.records.next()
    assert record.status == common_pb2.REQUEST_STATUS_ERROR
    assert (list(record.prompt_block_hashes), list(record.response_block_hashes)) == ([], [])

    # A worker that dies mid-stream never sends its last message either.
    failing = await make_stack(workers=[FakeWorker(fail_after=2)])
    async with httpx.AsyncClient(base_url=failing.url) as http:
        await http.post("/v1/chat/completions", json={"model": MODEL, "messages": CHAT})
    record = await failing.records.next()
    assert (record.status, record.output_tokens) == (common_pb2.REQUEST_STATUS_ERROR, 2)
    assert (list(record.prompt_block_hashes), list(record.response_block_hashes)) == ([], [])
