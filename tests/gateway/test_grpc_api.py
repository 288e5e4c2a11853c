"""The Gateway gRPC service through its generated stub: same pipeline, errors as status codes."""

from __future__ import annotations

import grpc
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc

from clairvoyant.contracts.v1 import common_pb2, gateway_pb2, gateway_pb2_grpc
from clairvoyant.core.grpc_errors import ERROR_TRAILER
from clairvoyant.gateway.cli import create_key
from tests.gateway.conftest import Stack, StackFactory
from tests.gateway.fakes import MODEL, FakeWorker

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
