"""Refused requests: the right OpenAI error, and no state changed -- no Schedule call, no record."""

from __future__ import annotations

import json
from typing import Any

import httpx
import openai
import pytest

from clairvoyant.core.errors import NoWorkers, QueueFull
from tests.gateway.conftest import Stack, StackFactory
from tests.gateway.fakes import MODEL, FakeWorker

pytestmark = pytest.mark.integration

MSG = [{"role": "user", "content": "hi"}]
META = {"workflow_type_id": "wf", "workflow_id": "w1", "agent_id": "a1"}


def chat(**fields: Any) -> dict[str, Any]:
    return {"model": MODEL, "messages": MSG, **fields}


# (name, body, HTTP status, error.type, error.code, error.param)
CASES: list[tuple[str, Any, int, str, str, str | None]] = [
    ("missing model", {"messages": MSG}, 400, "invalid_request_error", "missing_required_parameter", "model"),
    (
        "missing messages",
        {"model": MODEL},
        400,
        "invalid_request_error",
        "missing_required_parameter",
        "messages",
    ),
    ("empty messages", chat(messages=[]), 400, "invalid_request_error", "invalid_value", "messages"),
    (
        "bad role",
        chat(messages=[{"role": "wizard", "content": "hi"}]),
        400,
        "invalid_request_error",
        "invalid_value",
        "messages[0].role",
    ),
    (
        "image part",
        chat(messages=[{"role": "user", "content": [{"type": "image_url"}]}]),
        400,
        "invalid_request_error",
        "invalid_value",
        "messages[0].content",
    ),
    ("temperature 3", chat(temperature=3), 400, "invalid_request_error", "invalid_value", "temperature"),
    (
        "temperature a string",
        chat(temperature="0.5"),
        400,
        "invalid_request_error",
        "invalid_type",
        "temperature",
    ),
    ("top_p 0", chat(top_p=0), 400, "invalid_request_error", "invalid_value", "top_p"),
    ("n 2", chat(n=2), 400, "invalid_request_error", "invalid_value", "n"),
    ("max_tokens -1", chat(max_tokens=-1), 400, "invalid_request_error", "invalid_value", "max_tokens"),
    (
        "max_tokens over limit",
        chat(max_tokens=40_000),
        400,
        "invalid_request_error",
        "invalid_value",
        "max_tokens",
    ),
    (
        "max_completion_tokens over limit",
        chat(max_completion_tokens=40_000),
        400,
        "invalid_request_error",
        "invalid_value",
        "max_completion_tokens",
    ),
    (
        "max_tokens past context",
        chat(max_tokens=5000),
        400,
        "invalid_request_error",
        "context_length_exceeded",
        "max_tokens",
    ),
    ("stream not a bool", chat(stream="yes"), 400, "invalid_request_error", "invalid_type", "stream"),
    (
        "five stops",
        chat(stop=["a", "b", "c", "d", "e"]),
        400,
        "invalid_request_error",
        "invalid_value",
        "stop",
    ),
    (
        "app_metadata id with a space",
        chat(app_metadata={**META, "agent_id": "a b"}),
        400,
        "invalid_request_error",
        "invalid_app_metadata",
        "app_metadata.agent_id",
    ),
    (
        "app_metadata id too long",
        chat(app_metadata={**META, "workflow_id": "w" * 129}),
        400,
        "invalid_request_error",
        "invalid_app_metadata",
        "app_metadata.workflow_id",
    ),
    (
        "app_metadata without agent_id",
        chat(app_metadata={"workflow_type_id": "wf", "workflow_id": "w1"}),
        400,
        "invalid_request_error",
        "invalid_app_metadata",
        "app_metadata.agent_id",
    ),
    (
        "extra_body app_metadata bad",
        chat(extra_body={"app_metadata": {**META, "agent_id": ""}}),
        400,
        "invalid_request_error",
        "invalid_app_metadata",
        "app_metadata.agent_id",
    ),
    ("body not an object", [1, 2], 400, "invalid_request_error", "invalid_body", None),
    ("unknown model", chat(model="gpt-17"), 404, "not_found_error", "model_not_found", "model"),
]


async def assert_refused(
    stack: Stack, response: httpx.Response, status: int, kind: str, code: str, param: str | None
) -> None:
    assert response.status_code == status, response.text
    error = response.json()["error"]
    assert (error["type"], error["code"], error["param"]) == (kind, code, param)
    assert error["message"]
    assert stack.scheduler.schedule_calls == []
    assert stack.worker.calls == []
    await stack.records.assert_none()


@pytest.mark.parametrize(
    ("name", "body", "status", "kind", "code", "param"), CASES, ids=[c[0] for c in CASES]
)
async def test_refused_chat_bodies(
    stack: Stack, name: str, body: Any, status: int, kind: str, code: str, param: str | None
) -> None:
    async with httpx.AsyncClient(base_url=stack.url) as http:
        response = await http.post("/v1/chat/completions", json=body)
    await assert_refused(stack, response, status, kind, code, param)


async def test_refused_transport_level_mistakes(make_stack: StackFactory) -> None:
    stack = await make_stack(max_request_bytes=2_000)
    async with httpx.AsyncClient(base_url=stack.url) as http:
        bad_json = await http.post(
            "/v1/chat/completions", content=b'{"model": ', headers={"content-type": "application/json"}
        )
        await assert_refused(stack, bad_json, 400, "invalid_request_error", "invalid_json", None)
        form = await http.post("/v1/chat/completions", data={"model": MODEL})
        await assert_refused(stack, form, 400, "invalid_request_error", "invalid_content_type", None)
        big = await http.post(
            "/v1/chat/completions", json=chat(messages=[{"role": "user", "content": "x" * 5_000}])
        )
        await assert_refused(stack, big, 413, "invalid_request_error", "request_too_large", None)

        async def chunked():  # no Content-Length: the limit is enforced while reading
            for _ in range(10):
                yield b" " * 500

        streamed = await http.post(
            "/v1/chat/completions", content=chunked(), headers={"content-type": "application/json"}
        )
        await assert_refused(stack, streamed, 413, "invalid_request_error", "request_too_large", None)
        prompts = await http.post("/v1/completions", json={"model": MODEL, "prompt": ["a", "b"]})
        await assert_refused(stack, prompts, 400, "invalid_request_error", "invalid_value", "prompt")
        not_found = await http.get("/v1/nothing-here")
        assert not_found.status_code == 404 and not_found.json()["error"]["type"] == "not_found_error"


async def test_prompt_too_long_is_refused_by_the_worker(make_stack: StackFactory) -> None:
    stack = await make_stack(workers=[FakeWorker(max_prompt_chars=10)])
    client = stack.openai()
    with pytest.raises(openai.BadRequestError) as caught:
        await client.chat.completions.create(
            model=MODEL, messages=[{"role": "user", "content": "far too long a prompt"}]
        )
    assert caught.value.status_code == 400
    assert caught.value.code == "context_length_exceeded" and caught.value.type == "invalid_request_error"
    await stack.records.assert_none()
    [scheduled] = stack.scheduler.schedule_calls
    [released] = stack.scheduler.complete_calls  # the placement is given back
    assert released.request_id == scheduled.request_id


async def test_queue_full_is_429_with_retry_after(stack: Stack) -> None:
    stack.scheduler.reject = QueueFull("the queue for this model is full", retry_after_s=2.5)
    async with httpx.AsyncClient(base_url=stack.url) as http:
        response = await http.post("/v1/chat/completions", json=chat())
    assert response.status_code == 429 and response.headers["retry-after"] == "3"
    error = response.json()["error"]
    assert (error["type"], error["code"]) == ("rate_limit_error", "queue_full")
    assert len(stack.scheduler.schedule_calls) == 1 and stack.worker.calls == []
    await stack.records.assert_none()


async def test_no_workers_is_503(make_stack: StackFactory) -> None:
    stack = await make_stack(workers=[])
    async with httpx.AsyncClient(base_url=stack.url) as http:
        response = await http.post("/v1/chat/completions", json=chat())
    assert response.status_code == 503 and response.headers["retry-after"] == "1"
    assert response.json()["error"]["code"] == "no_workers"
    assert stack.scheduler.schedule_calls == []
    await stack.records.assert_none()


async def test_scheduler_saying_no_workers_is_503(stack: Stack) -> None:
    stack.scheduler.reject = NoWorkers("every worker is draining")
    with pytest.raises(openai.InternalServerError) as caught:
        await stack.openai().chat.completions.create(model=MODEL, messages=MSG)
    assert caught.value.status_code == 503 and caught.value.code == "no_workers"
    await stack.records.assert_none()


async def test_sdk_sees_openai_shaped_errors(stack: Stack) -> None:
    with pytest.raises(openai.BadRequestError) as caught:
        await stack.openai().chat.completions.create(model=MODEL, messages=MSG, temperature=3)
    assert caught.value.param == "temperature" and caught.value.type == "invalid_request_error"
    body = caught.value.response.json()
    assert set(body["error"]) == {"message", "type", "param", "code"}
    assert json.dumps(body)  # plain JSON, no server-side objects
    assert stack.scheduler.schedule_calls == []
