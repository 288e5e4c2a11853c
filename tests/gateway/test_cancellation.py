"""A client that goes away cancels the worker call (freeing its KV) and leaves a CANCELLED record."""

from __future__ import annotations

import asyncio

import grpc
import httpx
import pytest

from clairvoyant.contracts.v1 import common_pb2, gateway_pb2, gateway_pb2_grpc
from tests.gateway.conftest import Stack, StackFactory
from tests.gateway.fakes import MODEL, FakeWorker

pytestmark = pytest.mark.integration

SLOW = dict(tokens=tuple(f" t{i}" for i in range(50)), delay_s=0.1)
BODY = {"model": MODEL, "messages": [{"role": "user", "content": "write a long story"}]}


async def slow_stack(make_stack: StackFactory) -> Stack:
    return await make_stack(workers=[FakeWorker(**SLOW)])


async def assert_cancelled(
    stack: Stack, stream: bool, endpoint: str = "chat.completions"
) -> common_pb2.CompletionRecord:
    await asyncio.wait_for(stack.worker.cancelled.wait(), timeout=5)
    record = await stack.records.next()
    assert record.status == common_pb2.REQUEST_STATUS_CANCELLED
    assert (record.finish_reason, record.error_code) == ("abort", "client_disconnected")
    assert (record.stream, record.endpoint) == (stream, endpoint)
    assert record.output_tokens < 50 and stack.worker.finished == 0
    for _ in range(50):  # the placement is released too
        if stack.scheduler.complete_calls:
            break
        await asyncio.sleep(0.02)
    [released] = stack.scheduler.complete_calls
    assert (released.request_id, released.status) == (record.request_id, common_pb2.REQUEST_STATUS_CANCELLED)
    return record


async def test_streaming_client_disconnect_cancels_the_worker(make_stack: StackFactory) -> None:
    stack = await slow_stack(make_stack)
    async with (
        httpx.AsyncClient(base_url=stack.url) as http,
        http.stream("POST", "/v1/chat/completions", json={**BODY, "stream": True}) as response,
    ):
        assert response.status_code == 200
        seen = 0
        async for line in response.aiter_lines():
            seen += line.startswith("data: ")
            if seen == 3:  # the role chunk and two tokens
                break
    record = await assert_cancelled(stack, stream=True)
    assert record.output_tokens >= 2
    assert record.timing.first_token_time > 0


async def test_non_streaming_client_disconnect_cancels_the_worker(make_stack: StackFactory) -> None:
    stack = await slow_stack(make_stack)
    async with httpx.AsyncClient(base_url=stack.url, timeout=0.5) as http:
        with pytest.raises(httpx.ReadTimeout):
            await http.post("/v1/completions", json={"model": MODEL, "prompt": "once"})
    await assert_cancelled(stack, stream=False, endpoint="completions")


async def test_grpc_cancel_cancels_the_worker(make_stack: StackFactory) -> None:
    stack = await slow_stack(make_stack)
    async with grpc.aio.insecure_channel(stack.grpc_address) as channel:
        stub = gateway_pb2_grpc.GatewayStub(channel)
        call = stub.ChatCompletionStream(
            gateway_pb2.ChatCompletionRequest(
                model=MODEL, messages=[common_pb2.ChatMessage(role="user", content="go")]
            )
        )
        first = await call.read()
        assert first.delta == " t0"
        call.cancel()
    await assert_cancelled(stack, stream=True, endpoint="grpc")
