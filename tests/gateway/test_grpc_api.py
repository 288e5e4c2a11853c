"""The Gateway gRPC service through its generated stub: same pipeline, errors as status codes."""

from __future__ import annotations

import grpc
import openai
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc

from clairvoyant.contracts.v1 import common_pb2, gateway_pb2, gateway_pb2_grpc
from clairvoyant.core.errors import QueueFull
from clairvoyant.core.grpc_errors import ERROR_TRAILER
from clairvoyant.gateway.cli import create_key
from clairvoyant.gateway.ratelimit import FullQueues, RateLimiter
from tests.gateway.conftest import Stack, StackFactory
from tests.gateway.fakes import MODEL, FakeProfiler, FakeWorker
from tests.gateway.test_rate_limits import Clock

pytestmark = pytest.mark.integration

META = common_pb2.AppMetadata(workflow_type_id="research", workflow_id="r-1", agent_id="planner")


def request(**fields: object) -> gateway_pb2.ChatCompletionRequest:
    base: dict[str, object] = {
        "model": MODEL,
        "messages": [common_pb2.ChatMessage(role="user", content="plan the trip")],
        "app_metadata": META,
    }
    return gateway_pb2.ChatCompletionRequest(**{**base, **fields})


def detail(err: grpc.aio.AioRpcError) -> common_pb2.ErrorDetail:
    [value] = [v for k, v in err.trailing_metadata() or () if k == ERROR_TRAILER]
    return common_pb2.ErrorDetail.FromString(value)


async def test_unary_and_streaming(stack: Stack) -> None:
    async with grpc.aio.insecure_channel(stack.grpc_address) as channel:
        stub = gateway_pb2_grpc.GatewayStub(channel)
        reply = await stub.ChatCompletion(
            request(sampling=common_pb2.SamplingParams(max_tokens=3, temperature=0.0))
        )
        assert (reply.content, reply.finish_reason, reply.model) == ("Hello, world", "length", MODEL)
        assert reply.id.startswith("chatcmpl-") and reply.usage.completion_tokens == 3
        assert not reply.HasField("annotations")
        record = await stack.records.next()
        assert (record.endpoint, record.stream, record.tenant, record.app_metadata.agent_id) == (
            "grpc",
            False,
            "default",
            "planner",
        )
        assert stack.worker.calls[0].sampling.temperature == 0.0

        chunks = [
            c async for c in stub.ChatCompletionStream(request(include_usage=True, echo_annotations=True))
        ]
        assert "".join(c.delta for c in chunks) == "Hello, world!"
        assert [c.finish_reason for c in chunks if c.HasField("finish_reason")] == ["stop"]
        assert chunks[-1].usage.total_tokens == 3 + 4 and not chunks[0].HasField("usage")
        record = await stack.records.next()
        assert record.stream and record.status == common_pb2.REQUEST_STATUS_OK

        health = health_pb2_grpc.HealthStub(channel)
        for service in ("", "clairvoyant.v1.Gateway"):
            status = await health.Check(health_pb2.HealthCheckRequest(service=service))
            assert status.status == health_pb2.HealthCheckResponse.SERVING


async def test_invalid_argument(make_stack: StackFactory) -> None:
    stack = await make_stack(workers=[FakeWorker(max_prompt_chars=5)])
    async with grpc.aio.insecure_channel(stack.grpc_address) as channel:
        stub = gateway_pb2_grpc.GatewayStub(channel)
        with pytest.raises(grpc.aio.AioRpcError) as caught:
            await stub.ChatCompletion(request(sampling=common_pb2.SamplingParams(temperature=3.0)))
        assert caught.value.code() == grpc.StatusCode.INVALID_ARGUMENT
        assert (detail(caught.value).param, detail(caught.value).type) == (
            "temperature",
            "invalid_request_error",
        )
        with pytest.raises(grpc.aio.AioRpcError) as caught:
            await stub.ChatCompletion(request(messages=[]))
        assert detail(caught.value).param == "messages"
        bad_meta = common_pb2.AppMetadata(workflow_type_id="wf", workflow_id="w 1", agent_id="a")
        with pytest.raises(grpc.aio.AioRpcError) as caught:
            await stub.ChatCompletion(request(app_metadata=bad_meta))
        assert detail(caught.value).code == "invalid_app_metadata"
        assert stack.scheduler.schedule_calls == []

        with pytest.raises(grpc.aio.AioRpcError) as caught:  # refused by the worker: too long a prompt
            [c async for c in stub.ChatCompletionStream(request())]
        assert caught.value.code() == grpc.StatusCode.INVALID_ARGUMENT
        assert detail(caught.value).code == "context_length_exceeded"
        with pytest.raises(grpc.aio.AioRpcError) as caught:
            await stub.ChatCompletion(request(model="nope"))
        assert caught.value.code() == grpc.StatusCode.NOT_FOUND
    await stack.records.assert_none()


async def test_unauthenticated(make_stack: StackFactory, tmp_path) -> None:
    url = f"sqlite:///{tmp_path / 'keys.db'}"
    key, _ = create_key(url, "acme")
    stack = await make_stack(database_url=url)
    async with grpc.aio.insecure_channel(stack.grpc_address) as channel:
        stub = gateway_pb2_grpc.GatewayStub(channel)
        for metadata in [(), (("authorization", "Bearer cv-wrong"),)]:
            with pytest.raises(grpc.aio.AioRpcError) as caught:
                await stub.ChatCompletion(request(), metadata=metadata)
            assert caught.value.code() == grpc.StatusCode.UNAUTHENTICATED
            assert detail(caught.value).type == "authentication_error"
        reply = await stub.ChatCompletion(request(), metadata=(("authorization", f"Bearer {key}"),))
        assert reply.content == "Hello, world!"
    assert (await stack.records.next()).tenant == "acme"
    assert len(stack.scheduler.schedule_calls) == 1


async def test_rate_limits_apply_over_grpc_and_share_the_keys_budget_with_http(
    make_stack: StackFactory, tmp_path
) -> None:
    url = f"sqlite:///{tmp_path / 'keys.db'}"
    key, _ = create_key(url, "acme", rpm=2)
    stack = await make_stack(database_url=url, rate_limit_rpm=0)
    clock = Clock()
    stack.server.frontend.auth.limiter = RateLimiter(clock)  # time stands still: exact budgets
    auth = (("authorization", f"Bearer {key}"),)
    async with grpc.aio.insecure_channel(stack.grpc_address) as channel:
        stub = gateway_pb2_grpc.GatewayStub(channel)
        call = stub.ChatCompletion(request(), metadata=auth)
        assert (await call).content == "Hello, world!"
        limits = dict(await call.initial_metadata())
        assert (limits["x-ratelimit-limit-requests"], limits["x-ratelimit-remaining-requests"]) == ("2", "1")
        stream = stub.ChatCompletionStream(request(), metadata=auth)
        assert "".join([c.delta async for c in stream]) == "Hello, world!"
        assert dict(await stream.initial_metadata())["x-ratelimit-remaining-requests"] == "0"

        with pytest.raises(grpc.aio.AioRpcError) as unary:
            await stub.ChatCompletion(request(), metadata=auth)
        with pytest.raises(grpc.aio.AioRpcError) as streamed:
            [c async for c in stub.ChatCompletionStream(request(), metadata=auth)]
        for caught in (unary, streamed):
            assert caught.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
            error = detail(caught.value)
            assert (error.code, error.type, error.retry_after_s) == ("rate_limit_exceeded", "requests", 30.0)
            assert error.message == (
                "rate limit reached on requests per minute: limit 2, used 2, requested 1; retry in 30s"
            )
        assert len(stack.scheduler.schedule_calls) == 2  # the refusals never reached the scheduler

        # One budget per key, whichever edge spends it.
        with pytest.raises(openai.RateLimitError):
            await stack.openai(api_key=key).chat.completions.create(
                model=MODEL, messages=[{"role": "user", "content": "hi"}]
            )
        clock.now += 30.0  # one request refilled
        assert (await stub.ChatCompletion(request(), metadata=auth)).content == "Hello, world!"
        with pytest.raises(grpc.aio.AioRpcError) as caught:
            await stub.ChatCompletion(request(), metadata=auth)
        assert caught.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
    assert len(stack.scheduler.schedule_calls) == 3


async def test_a_full_queue_is_held_over_grpc_too(make_stack: StackFactory) -> None:
    profiler = FakeProfiler()  # the pipeline's first call out: a held call must not get that far
    stack = await make_stack(profiler=profiler)
    clock = Clock()
    stack.server.frontend.scheduler.full_queues = FullQueues(hold_s=0.25, now=clock)
    stack.scheduler.reject = QueueFull(
        f"the queue for model {MODEL!r} is full (1024 requests)", retry_after_s=2.0
    )
    async with grpc.aio.insecure_channel(stack.grpc_address) as channel:
        stub = gateway_pb2_grpc.GatewayStub(channel)
        details = []
        for _ in range(2):  # the scheduler's refusal, then the gateway's own within the hold
            with pytest.raises(grpc.aio.AioRpcError) as caught:
                await stub.ChatCompletion(request())
            assert caught.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
            details.append(detail(caught.value))
        assert details[0] == details[1]
        assert (details[0].code, details[0].type, details[0].retry_after_s) == (
            "queue_full",
            "rate_limit_error",
            2.0,
        )
        assert (len(profiler.calls), len(stack.scheduler.schedule_calls)) == (1, 1)
        clock.now += 0.25  # the hold is over: the next call asks the scheduler again, and is served
        stack.scheduler.reject = None
        assert (await stub.ChatCompletion(request())).content == "Hello, world!"
    assert (len(profiler.calls), len(stack.scheduler.schedule_calls)) == (2, 2)


async def test_penalties_and_logit_bias_reach_the_worker_over_grpc(stack: Stack) -> None:
    sampling = common_pb2.SamplingParams(
        max_tokens=2, frequency_penalty=0.5, presence_penalty=-0.5, repetition_penalty=1.1, logit_bias={7: -100.0}
    )
    async with grpc.aio.insecure_channel(stack.grpc_address) as channel:
        stub = gateway_pb2_grpc.GatewayStub(channel)
        await stub.ChatCompletion(request(sampling=sampling))
        with pytest.raises(grpc.aio.AioRpcError) as caught:
            await stub.ChatCompletion(request(sampling=common_pb2.SamplingParams(frequency_penalty=3.0)))
        assert detail(caught.value).param == "frequency_penalty"
    sent = stack.worker.calls[0].sampling
    assert (sent.frequency_penalty, sent.presence_penalty, sent.repetition_penalty) == (0.5, -0.5, 1.1)
    assert dict(sent.logit_bias) == {7: -100.0}
