"""Refused requests: the right OpenAI error, and no state changed -- no Schedule call, no record."""

from __future__ import annotations

import json
from typing import Any, NamedTuple

import httpx
import openai
import pytest

from clairvoyant.core.errors import NoWorkers, QueueFull
from clairvoyant.core.openai_schema import DEFAULT_LIMITS
from tests.gateway.conftest import Stack, StackFactory
from tests.gateway.fakes import MODEL, FakeWorker

pytestmark = pytest.mark.integration

MSG = [{"role": "user", "content": "hi"}]
META = {"workflow_type_id": "wf", "workflow_id": "w1", "agent_id": "a1"}
CHAT = "/v1/chat/completions"
COMPLETIONS = "/v1/completions"
LONE = "\ud800"  # a lone UTF-16 surrogate; json.dumps writes it as the escape \ud800


def chat(**fields: Any) -> dict[str, Any]:
    return {"model": MODEL, "messages": MSG, **fields}


class Refusal(NamedTuple):
    name: str
    body: Any  # a JSON value (sent as json.dumps writes it: ASCII, escapes kept), or raw bytes
    status: int
    kind: str  # error.type
    code: str  # error.code
    param: str | None  # error.param
    path: str = CHAT

    def content(self) -> bytes:
        return self.body if isinstance(self.body, bytes) else json.dumps(self.body).encode()


def catalogue(model: str) -> list[Refusal]:
    """Bodies every gateway refuses under default settings, whatever serves ``model``; the context
    window of ``model`` must be under 5,000 tokens."""

    def body(**fields: Any) -> dict[str, Any]:
        return {"model": model, "messages": MSG, **fields}

    def user(content: Any, **fields: Any) -> dict[str, Any]:
        return body(messages=[{"role": "user", "content": content, **fields}])

    bad = "invalid_request_error"
    deep = b'{"model": "%s", "messages": [{"role": "user", "content": "x"}], "x": %s}' % (
        model.encode(),
        b"[" * 5000 + b"]" * 5000,
    )
    return [
        Refusal("missing model", {"messages": MSG}, 400, bad, "missing_required_parameter", "model"),
        Refusal("missing messages", {"model": model}, 400, bad, "missing_required_parameter", "messages"),
        Refusal("empty messages", body(messages=[]), 400, bad, "invalid_value", "messages"),
        Refusal(
            "bad role",
            body(messages=[{"role": "wizard", "content": "hi"}]),
            400,
            bad,
            "invalid_value",
            "messages[0].role",
        ),
        Refusal(
            "image part", user([{"type": "image_url"}]), 400, bad, "invalid_value", "messages[0].content"
        ),
        Refusal("temperature 3", body(temperature=3), 400, bad, "invalid_value", "temperature"),
        Refusal("temperature a string", body(temperature="0.5"), 400, bad, "invalid_type", "temperature"),
        Refusal("top_p 0", body(top_p=0), 400, bad, "invalid_value", "top_p"),
        Refusal("n 9", body(n=9), 400, bad, "invalid_value", "n"),
        Refusal("max_tokens -1", body(max_tokens=-1), 400, bad, "invalid_value", "max_tokens"),
        Refusal("max_tokens over limit", body(max_tokens=40_000), 400, bad, "invalid_value", "max_tokens"),
        Refusal(
            "max_completion_tokens over limit",
            body(max_completion_tokens=40_000),
            400,
            bad,
            "invalid_value",
            "max_completion_tokens",
        ),
        Refusal(
            "max_tokens past context",
            body(max_tokens=5000),
            400,
            bad,
            "context_length_exceeded",
            "max_tokens",
        ),
        Refusal("min_tokens over limit", body(min_tokens=2**40), 400, bad, "invalid_value", "min_tokens"),
        Refusal("seed past int64", body(seed=2**63), 400, bad, "invalid_value", "seed"),
        Refusal("stream not a bool", body(stream="yes"), 400, bad, "invalid_type", "stream"),
        Refusal(
            "five stops", body(stop=["a", "b", "c", "d", "e"]), 400, bad, "array_above_max_length", "stop"
        ),
        Refusal(
            "app_metadata id with a space",
            body(app_metadata={**META, "agent_id": "a b"}),
            400,
            bad,
            "invalid_app_metadata",
            "app_metadata.agent_id",
        ),
        Refusal(
            "app_metadata id too long",
            body(app_metadata={**META, "workflow_id": "w" * 129}),
            400,
            bad,
            "invalid_app_metadata",
            "app_metadata.workflow_id",
        ),
        Refusal(
            "app_metadata without agent_id",
            body(app_metadata={"workflow_type_id": "wf", "workflow_id": "w1"}),
            400,
            bad,
            "invalid_app_metadata",
            "app_metadata.agent_id",
        ),
        Refusal(
            "extra_body app_metadata bad",
            body(extra_body={"app_metadata": {**META, "agent_id": ""}}),
            400,
            bad,
            "invalid_app_metadata",
            "app_metadata.agent_id",
        ),
        Refusal("body not an object", [1, 2], 400, bad, "invalid_body", None),
        Refusal("unknown model", body(model="gpt-17"), 404, "not_found_error", "model_not_found", "model"),
        Refusal(
            "empty prompt", {"model": model, "prompt": ""}, 400, bad, "invalid_value", "prompt", COMPLETIONS
        ),
        # What a fuzzer working from the schema does not write: text that is not Unicode, bytes
        # that are not UTF-8, bodies past the input limits.
        Refusal(
            "lone surrogate in content",
            user(f"a{LONE}b"),
            400,
            bad,
            "invalid_encoding",
            "messages[0].content",
        ),
        Refusal(
            "lone surrogate in a text part",
            user([{"type": "text", "text": "fine"}, {"type": "text", "text": "\udfff"}]),
            400,
            bad,
            "invalid_encoding",
            "messages[0].content[1].text",
        ),
        Refusal(
            "lone surrogate in name", user("hi", name=LONE), 400, bad, "invalid_encoding", "messages[0].name"
        ),
        Refusal("lone surrogate in stop", body(stop=["ok", LONE]), 400, bad, "invalid_encoding", "stop[1]"),
        Refusal(
            "lone surrogate in app_metadata",
            body(app_metadata={**META, "agent_id": LONE}),
            400,
            bad,
            "invalid_encoding",
            "app_metadata.agent_id",
        ),
        Refusal(
            "lone surrogate in prompt",
            {"model": model, "prompt": f"x{LONE}"},
            400,
            bad,
            "invalid_encoding",
            "prompt",
            COMPLETIONS,
        ),
        Refusal("lone surrogate in a key", body(**{LONE: 1}), 400, bad, "invalid_encoding", None),
        Refusal("nested 5,000 deep", deep, 400, bad, "nesting_too_deep", None),
        Refusal("array nested 5,000 deep", b"[" * 5000 + b"]" * 5000, 400, bad, "nesting_too_deep", None),
        Refusal(
            "invalid UTF-8",
            b'{"model": "%s", "messages": [{"role": "user", "content": "\xff\xfe"}]}' % model.encode(),
            400,
            bad,
            "invalid_encoding",
            None,
        ),
        Refusal(
            "a surrogate encoded as UTF-8 bytes",
            b'{"model": "%s", "prompt": "\xed\xa0\x80"}' % model.encode(),
            400,
            bad,
            "invalid_encoding",
            None,
            COMPLETIONS,
        ),
        Refusal(
            "20 MB body",
            user("x" * 20_000_000),
            413,
            bad,
            "request_too_large",
            None,
        ),
        Refusal(
            "too many messages",
            body(messages=MSG * (DEFAULT_LIMITS.max_messages + 1)),
            400,
            bad,
            "array_above_max_length",
            "messages",
        ),
        Refusal(
            "string too long",
            user("x" * (DEFAULT_LIMITS.max_string_chars + 1)),
            400,
            bad,
            "string_above_max_length",
            "messages[0].content",
        ),
        Refusal(
            "prompt too long",
            {"model": model, "prompt": ["y" * (DEFAULT_LIMITS.max_string_chars + 1)]},
            400,
            bad,
            "string_above_max_length",
            "prompt[0]",
            COMPLETIONS,
        ),
    ]


CASES = catalogue(MODEL)


async def post(http: httpx.AsyncClient, case: Refusal) -> httpx.Response:
    return await http.post(case.path, content=case.content(), headers={"content-type": "application/json"})


def assert_openai_error(response: httpx.Response, case: Refusal) -> None:
    assert response.status_code == case.status, response.text
    error = response.json()["error"]
    assert set(error) == {"message", "type", "param", "code"}
    assert (error["type"], error["code"], error["param"]) == (case.kind, case.code, case.param)
    assert error["message"]


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


@pytest.mark.parametrize("case", CASES, ids=[c.name for c in CASES])
async def test_refused_bodies(stack: Stack, case: Refusal) -> None:
    async with httpx.AsyncClient(base_url=stack.url, timeout=30) as http:
        response = await post(http, case)
    assert_openai_error(response, case)
    assert stack.scheduler.schedule_calls == []
    assert stack.worker.calls == []
    await stack.records.assert_none()


async def test_input_limits_follow_the_settings(make_stack: StackFactory) -> None:
    # Lenient: the bodies carry their deep and long values in an unknown field, x.
    stack = await make_stack(
        max_json_depth=6,
        max_string_chars=16,
        max_messages=2,
        max_stop_sequences=1,
        gateway_lenient_parameters=True,
    )

    def user(content: Any) -> dict[str, Any]:
        return {"role": "user", "content": content}

    nested = {"a": {"b": {"c": {"d": [1]}}}}  # six levels deep in a body
    longest, too_long = "x" * 16, "x" * 17
    at_the_limits = chat(
        messages=[user(longest), user([{"type": "text", "text": "hi"}])], stop=[longest], x=nested
    )
    one_past = [
        ("too deep", chat(x={"deeper": nested}), "nesting_too_deep", None),
        ("long content", chat(messages=[user(too_long)]), "string_above_max_length", "messages[0].content"),
        ("long stop", chat(stop=too_long), "string_above_max_length", "stop"),
        ("long key", chat(x={too_long: 1}), "string_above_max_length", "x"),
        ("three messages", chat(messages=MSG * 3), "array_above_max_length", "messages"),
        ("two stops", chat(stop=["a", "b"]), "array_above_max_length", "stop"),
    ]
    async with httpx.AsyncClient(base_url=stack.url) as http:
        for name, body, code, param in one_past:
            response = await http.post(CHAT, json=body)
            error = response.json()["error"]
            assert (response.status_code, error["code"], error["param"]) == (400, code, param), name
        assert stack.scheduler.schedule_calls == []
        accepted = await http.post(CHAT, json=at_the_limits)
        assert accepted.status_code == 200, accepted.text
        # Only what a completion request uses is capped: "messages" there is an unknown field.
        prompt = await http.post(COMPLETIONS, json={"model": MODEL, "prompt": "hi", "messages": MSG * 3})
        assert prompt.status_code == 200, prompt.text
    assert len(stack.scheduler.schedule_calls) == 2


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


async def test_prompt_too_long_on_completions_names_the_prompt(make_stack: StackFactory) -> None:
    # The worker names whatever it was given "messages"; on /v1/completions that is the prompt.
    stack = await make_stack(workers=[FakeWorker(max_prompt_chars=10)])
    async with httpx.AsyncClient(base_url=stack.url) as http:
        response = await http.post(COMPLETIONS, json={"model": MODEL, "prompt": "far too long a prompt"})
    assert response.status_code == 400
    error = response.json()["error"]
    assert (error["code"], error["param"]) == ("context_length_exceeded", "prompt")
    assert len(stack.scheduler.complete_calls) == 1  # the placement is given back


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
