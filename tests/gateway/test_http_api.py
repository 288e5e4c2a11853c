"""The OpenAI-compatible HTTP API, driven with the openai SDK and httpx against fake backends."""

from __future__ import annotations

import asyncio
import json

import httpx
import pytest

from clairvoyant.contracts.v1 import common_pb2
from tests.gateway.conftest import Stack, StackFactory
from tests.gateway.fakes import ANNOTATIONS, MODEL, FakeProfiler, FakeWorker

pytestmark = pytest.mark.integration

META = {"workflow_type_id": "coding_assistant", "workflow_id": "session-42", "agent_id": "engineer"}
CHAT = [{"role": "system", "content": "be brief"}, {"role": "user", "content": "say hello to the world"}]


def sse_payloads(raw: str) -> list[str]:
    """The ``data:`` payloads of an SSE body, checking the framing on the way."""
    events = raw.split("\n\n")
    assert events[-1] == "", "the stream ends with a blank line"
    assert all(e.startswith("data: ") for e in events[:-1])
    return [e.removeprefix("data: ") for e in events[:-1]]


async def test_chat_completion_publishes_a_record(stack: Stack) -> None:
    client = stack.openai()
    reply = await client.chat.completions.create(
        model=MODEL,
        messages=CHAT,
        max_tokens=50,
        temperature=0.5,
        top_p=0.9,
        seed=7,
        stop=["END"],
        extra_body={"app_metadata": META},
    )
    assert reply.id.startswith("chatcmpl-") and len(reply.id) == len("chatcmpl-") + 32
    assert reply.object == "chat.completion"
    assert reply.choices[0].message.role == "assistant"
    assert reply.choices[0].message.content == "Hello, world!"
    assert reply.choices[0].finish_reason == "stop"
    assert (reply.usage.prompt_tokens, reply.usage.completion_tokens, reply.usage.total_tokens) == (7, 4, 11)
    assert reply.usage.prompt_tokens_details.cached_tokens == 3
    assert not hasattr(reply, "annotations") or reply.annotations is None  # only when asked for

    record = await stack.records.next()
    assert record.request_id == reply.id.removeprefix("chatcmpl-")
    assert record.tenant == "default"
    assert (
        record.app_metadata.workflow_type_id,
        record.app_metadata.workflow_id,
        record.app_metadata.agent_id,
    ) == (
        "coding_assistant",
        "session-42",
        "engineer",
    )
    assert (record.model, record.worker_id) == (MODEL, "worker-1")
    assert (record.prompt_tokens, record.cached_tokens, record.output_tokens) == (7, 3, 4)
    assert record.status == common_pb2.REQUEST_STATUS_OK
    assert (record.finish_reason, record.endpoint, record.stream) == ("stop", "chat.completions", False)
    t = record.timing
    assert 0 < t.arrival_time <= t.scheduled_time <= t.first_token_time <= t.end_time

    # What the backends were asked: the scheduler (once) and the worker, with the same request id.
    [scheduled] = stack.scheduler.schedule_calls
    assert (scheduled.request_id, scheduled.tenant, scheduled.model, scheduled.max_tokens) == (
        record.request_id,
        "default",
        MODEL,
        50,
    )
    assert scheduled.app_metadata.agent_id == "engineer" and scheduled.prompt_tokens > 0
    [generate] = stack.worker.calls
    assert [(m.role, m.content) for m in generate.chat.messages] == [(m["role"], m["content"]) for m in CHAT]
    s = generate.sampling
    assert (s.max_tokens, s.temperature, s.top_p, s.seed, list(s.stop)) == (50, 0.5, 0.9, 7, ["END"])
    assert generate.base_priority == 1.5 and generate.tenant == "default"
    [complete] = stack.scheduler.complete_calls
    assert (complete.request_id, complete.worker_id, complete.status, complete.output_tokens) == (
        record.request_id,
        "worker-1",
        common_pb2.REQUEST_STATUS_OK,
        4,
    )


async def test_streaming_chat_with_usage(stack: Stack) -> None:
    client = stack.openai()
    stream = await client.chat.completions.create(
        model=MODEL,
        messages=CHAT,
        stream=True,
        stream_options={"include_usage": True},
        extra_body={"app_metadata": META},
    )
    chunks = [chunk async for chunk in stream]
    assert chunks[0].choices[0].delta.role == "assistant"
    assert "".join(c.choices[0].delta.content or "" for c in chunks if c.choices) == "Hello, world!"
    finishes = [c.choices[0].finish_reason for c in chunks if c.choices and c.choices[0].finish_reason]
    assert finishes == ["stop"]
    assert chunks[-1].choices == [] and chunks[-1].usage.completion_tokens == 4
    assert {c.id for c in chunks} == {chunks[0].id} and chunks[0].object == "chat.completion.chunk"

    record = await stack.records.next()
    assert record.stream and record.status == common_pb2.REQUEST_STATUS_OK and record.output_tokens == 4
    assert record.app_metadata.workflow_id == "session-42"


async def test_sse_framing_without_usage(stack: Stack) -> None:
    async with httpx.AsyncClient(base_url=stack.url) as http:
        r = await http.post("/v1/chat/completions", json={"model": MODEL, "messages": CHAT, "stream": True})
    assert r.status_code == 200 and r.headers["content-type"].startswith("text/event-stream")
    payloads = sse_payloads(r.text)
    assert payloads[-1] == "[DONE]"
    chunks = [json.loads(p) for p in payloads[:-1]]
    assert chunks[0]["choices"][0]["delta"] == {"role": "assistant", "content": ""}
    assert chunks[-1]["choices"][0] == {"index": 0, "delta": {}, "finish_reason": "stop", "logprobs": None}
    assert all("usage" not in c for c in chunks)
    assert r.headers["x-request-id"] == chunks[0]["id"].removeprefix("chatcmpl-")
    assert (await stack.records.next()).request_id == r.headers["x-request-id"]


async def test_completions_endpoint(stack: Stack) -> None:
    client = stack.openai()
    reply = await client.completions.create(model=MODEL, prompt=["Once upon a time"], max_tokens=2)
    assert reply.object == "text_completion" and reply.id.startswith("cmpl-")
    assert (reply.choices[0].text, reply.choices[0].finish_reason) == ("Hello,", "length")
    assert stack.worker.calls[0].prompt == "Once upon a time"
    record = await stack.records.next()
    assert (record.endpoint, record.output_tokens, record.finish_reason) == ("completions", 2, "length")

    stream = await client.completions.create(
        model=MODEL, prompt="Once", stream=True, stream_options={"include_usage": True}
    )
    chunks = [c async for c in stream]
    assert "".join(c.choices[0].text for c in chunks if c.choices) == "Hello, world!"
    assert chunks[-1].usage.prompt_tokens == 1 and chunks[-1].choices == []
    record = await stack.records.next()
    assert record.stream and record.endpoint == "completions"


async def test_app_metadata_nested_under_extra_body(stack: Stack) -> None:
    body = {
        "model": MODEL,
        "messages": CHAT,
        "extra_body": {"app_metadata": {**META, "agent_id": "reviewer"}},
    }
    async with httpx.AsyncClient(base_url=stack.url) as http:
        r = await http.post("/v1/chat/completions", json=body)
    assert r.status_code == 200, r.text
    assert (await stack.records.next()).app_metadata.agent_id == "reviewer"


async def test_echo_annotations_only_when_asked(stack: Stack) -> None:
    async with httpx.AsyncClient(base_url=stack.url) as http:
        plain = await http.post("/v1/chat/completions", json={"model": MODEL, "messages": CHAT})
        echoed = await http.post(
            "/v1/chat/completions", json={"model": MODEL, "messages": CHAT, "echo_annotations": True}
        )
    assert "annotations" not in plain.json()
    assert echoed.json()["annotations"] == {}  # no profiler configured: the request went un-annotated


async def test_default_max_tokens_fits_a_short_context(make_stack: StackFactory) -> None:
    stack = await make_stack(default_max_tokens=256)
    stack.scheduler.workers[0].max_model_len = 64
    async with httpx.AsyncClient(base_url=stack.url) as http:
        r = await http.post("/v1/chat/completions", json={"model": MODEL, "messages": CHAT})
    assert r.status_code == 200
    assert 0 < stack.scheduler.schedule_calls[0].max_tokens < 64


async def test_worker_unavailable_is_retried_elsewhere_once(make_stack: StackFactory, free_port: int) -> None:
    from tests.gateway.fakes import WorkerEntry

    dead = WorkerEntry("dead-worker", f"127.0.0.1:{free_port}")  # nothing listens there
    stack = await make_stack(extra_entries=[dead])
    reply = await stack.openai().chat.completions.create(model=MODEL, messages=CHAT)
    assert reply.choices[0].message.content == "Hello, world!"
    first, second = stack.scheduler.schedule_calls
    assert list(first.exclude_workers) == [] and list(second.exclude_workers) == ["dead-worker"]
    assert first.request_id == second.request_id
    record = await stack.records.next()
    assert record.worker_id == "worker-1" and record.status == common_pb2.REQUEST_STATUS_OK
    await stack.records.assert_none()  # one record per request, not one per attempt
    assert sorted(c.worker_id for c in stack.scheduler.complete_calls) == ["dead-worker", "worker-1"]


async def test_worker_failing_mid_stream_ends_with_an_error_event(make_stack: StackFactory) -> None:
    stack = await make_stack(workers=[FakeWorker(fail_after=2)])
    async with httpx.AsyncClient(base_url=stack.url) as http:
        r = await http.post("/v1/chat/completions", json={"model": MODEL, "messages": CHAT, "stream": True})
    payloads = sse_payloads(r.text)
    error = json.loads(payloads[-2])["error"]
    assert error["type"] == "service_unavailable" and payloads[-1] == "[DONE]"
    record = await stack.records.next()
    assert record.status == common_pb2.REQUEST_STATUS_ERROR and record.finish_reason == "error"
    assert record.output_tokens == 2


async def test_models_health_ready_and_metrics(make_stack: StackFactory) -> None:
    stack = await make_stack()
    async with httpx.AsyncClient(base_url=stack.url) as http:
        models = (await http.get("/v1/models")).json()
        assert models["object"] == "list"
        assert [(m["id"], m["object"], m["max_model_len"]) for m in models["data"]] == [
            (MODEL, "model", 4096)
        ]
        assert (await http.get("/healthz")).json() == {"status": "ok"}
        assert (await http.get("/readyz")).status_code == 200
        await http.post("/v1/chat/completions", json={"model": MODEL, "messages": CHAT})
        text = (await http.get("/metrics")).text
        assert 'cv_gateway_requests_total{endpoint="chat.completions",status="200"}' in text
        assert "cv_gateway_ttft_seconds_bucket" in text and "cv_gateway_e2e_latency_seconds_bucket" in text
        assert 'cv_gateway_output_tokens_total{model="tiny-test-model"}' in text
        # The placement is released just after the last byte, in the background.
        for _ in range(50):
            if "cv_gateway_in_flight_requests 0.0" in text:
                break
            await asyncio.sleep(0.02)
            text = (await http.get("/metrics")).text
        assert "cv_gateway_in_flight_requests 0.0" in text

        stack.scheduler.workers.clear()
        not_ready = await http.get("/readyz")
        assert not_ready.status_code == 503 and "no worker" in not_ready.json()["reason"]
    listed = await stack.openai().models.list()
    assert listed.data == []


async def test_profiler_annotations_flow_to_scheduler_worker_and_echo(make_stack: StackFactory) -> None:
    profiler = FakeProfiler()
    stack = await make_stack(profiler=profiler, profiler_timeout_s=2.0)
    body = {"model": MODEL, "messages": CHAT, "app_metadata": META, "echo_annotations": True}
    async with httpx.AsyncClient(base_url=stack.url) as http:
        reply = (await http.post("/v1/chat/completions", json=body)).json()
    assert reply["annotations"] == {
        "predicted_output_len": {"p50": 10.0, "p99": 40.0},
        "confidence": "CONFIDENCE_HIGH",
    }
    [asked] = profiler.calls
    assert (asked.tenant, asked.model, asked.app_metadata.agent_id) == ("default", MODEL, "engineer")
    assert stack.scheduler.schedule_calls[0].annotations == ANNOTATIONS
    assert stack.worker.calls[0].annotations == ANNOTATIONS


async def test_a_slow_profiler_is_skipped(make_stack: StackFactory) -> None:
    stack = await make_stack(profiler=FakeProfiler(delay_s=1.0), profiler_timeout_s=0.05)
    body = {"model": MODEL, "messages": CHAT, "app_metadata": META, "echo_annotations": True}
    async with httpx.AsyncClient(base_url=stack.url) as http:
        reply = (await http.post("/v1/chat/completions", json=body)).json()
    assert reply["annotations"] == {} and reply["choices"][0]["message"]["content"] == "Hello, world!"
    assert not stack.scheduler.schedule_calls[0].HasField("annotations")
