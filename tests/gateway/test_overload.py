"""Busy is 429 with Retry-After, down is 503: a full queue (answered by the gateway itself for a
short hold after the scheduler said so), a call the scheduler's gRPC server shed, a scheduler that
is gone (logged at WARNING, its address kept out of the client's message)."""

from __future__ import annotations

import logging

import grpc
import httpx
import openai
import pytest

from clairvoyant.core.errors import QueueFull
from clairvoyant.gateway.ratelimit import FullQueues
from tests.gateway.conftest import StackFactory
from tests.gateway.fakes import MODEL, FakeScheduler, WorkerEntry, start_server

pytestmark = pytest.mark.integration

BODY = {"model": MODEL, "messages": [{"role": "user", "content": "hi"}]}


class Clock:
    def __init__(self) -> None:
        self.now = 50.0

    def __call__(self) -> float:
        return self.now


class SheddingScheduler(FakeScheduler):
    """Ends every Schedule with a bare CANCELLED, as gRPC's pending-call limit does."""

    async def Schedule(self, request, context):  # noqa: N802
        self.schedule_calls.append(request)
        await context.abort(grpc.StatusCode.CANCELLED, "CANCELLED")


@pytest.mark.unit
def test_full_queue_hold_is_bounded_by_the_retry_hint() -> None:
    clock = Clock()
    queues = FullQueues(hold_s=0.25, now=clock)
    queues.mark(MODEL, QueueFull("the queue is full", retry_after_s=0.1))
    clock.now += 0.09
    held = queues.refusal(MODEL)
    assert held is not None and (held.message, held.retry_after_s, held.http_status) == (
        "the queue is full",
        0.1,
        429,
    )
    assert queues.refusal("another-model") is None
    clock.now += 0.01
    assert queues.refusal(MODEL) is None  # 0.1 s: the hint, shorter than the hold
    queues.mark(MODEL, QueueFull("the queue is full", retry_after_s=5.0))
    clock.now += 0.249
    assert queues.refusal(MODEL) is not None
    clock.now += 0.001
    assert queues.refusal(MODEL) is None  # 0.25 s: the hold, shorter than the hint
    FullQueues(hold_s=0.0, now=clock).mark(MODEL, QueueFull("full", retry_after_s=1.0))  # 0: never held


async def test_a_full_queue_is_429_with_retry_after_and_held_briefly(make_stack: StackFactory) -> None:
    stack = await make_stack()
    clock = Clock()
    stack.server.frontend.scheduler.full_queues = FullQueues(hold_s=0.25, now=clock)
    stack.scheduler.reject = QueueFull(
        f"the queue for model {MODEL!r} is full (1024 requests)", retry_after_s=2.0
    )
    client = stack.openai()
    with pytest.raises(openai.RateLimitError) as first:
        await client.chat.completions.create(**BODY)
    assert (first.value.code, first.value.type) == ("queue_full", "rate_limit_error")
    assert first.value.response.headers["retry-after"] == "2"
    assert len(stack.scheduler.schedule_calls) == 1

    # Within the hold the gateway answers for the scheduler: same refusal, no call.
    async with httpx.AsyncClient(base_url=stack.url) as http:
        held = await http.post("/v1/chat/completions", json=BODY)
    assert held.status_code == 429 and held.headers["retry-after"] == "2"
    assert held.json()["error"] == first.value.body
    assert len(stack.scheduler.schedule_calls) == 1

    clock.now += 0.25  # the hold is over: the next request asks again, and is served
    stack.scheduler.reject = None
    reply = await client.chat.completions.create(**BODY)
    assert reply.choices[0].message.content == "Hello, world!"
    assert len(stack.scheduler.schedule_calls) == 2
    await stack.records.next()  # the served one is recorded; the refused ones are not
    await stack.records.assert_none()


async def test_a_call_the_scheduler_shed_is_429_not_503(make_stack: StackFactory) -> None:
    shedding = SheddingScheduler()
    shedding.workers.append(WorkerEntry("worker-1", "127.0.0.1:1"))
    server, address = await start_server(shedding)
    try:
        stack = await make_stack(scheduler_address=address)
        stack.server.frontend.scheduler.full_queues = FullQueues(hold_s=0.25, now=Clock())
        with pytest.raises(openai.RateLimitError) as refused:
            await stack.openai().chat.completions.create(**BODY)
        assert refused.value.code == "overloaded"
        assert refused.value.body["message"] == "the scheduler is overloaded; retry shortly"  # type: ignore[index]
        assert refused.value.response.headers["retry-after"] == "1"
        # Shedding is not a full queue: the next request still asks the scheduler.
        with pytest.raises(openai.RateLimitError):
            await stack.openai().chat.completions.create(**BODY)
        assert len(shedding.schedule_calls) == 2
    finally:
        await server.stop(None)


async def test_a_scheduler_that_is_down_is_503_logged_at_warning(
    make_stack: StackFactory, free_port: int, caplog: pytest.LogCaptureFixture
) -> None:
    stack = await make_stack(scheduler_address=f"127.0.0.1:{free_port}")  # nothing listens there
    with caplog.at_level(logging.WARNING, logger="clairvoyant.gateway.clients"):
        async with httpx.AsyncClient(base_url=stack.url, timeout=30) as http:
            reply = await http.post("/v1/chat/completions", json=BODY)
    assert reply.status_code == 503 and reply.headers["retry-after"] == "1"
    error = reply.json()["error"]
    assert (error["type"], error["code"]) == ("service_unavailable", "unavailable")
    assert error["message"] == "the scheduler is unavailable; retry shortly"
    assert str(free_port) not in reply.text  # the address stays internal...
    warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert any("the scheduler failed: UNAVAILABLE" in w and str(free_port) in w for w in warnings), warnings
