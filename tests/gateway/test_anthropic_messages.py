"""Anthropic's Messages API (POST /v1/messages), driven with the official anthropic SDK and httpx
against the fake scheduler and worker."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import Any

import anthropic
import httpx
import pytest

from clairvoyant.gateway.anthropic_api import claude_code_session
from clairvoyant.gateway.anthropic_request import ENDPOINT
from clairvoyant.gateway.keys import KeyStore
from tests.gateway.conftest import Stack, StackFactory
from tests.gateway.fakes import MODEL, FakeWorker

SYSTEM = "You are the planner. Break the task into steps."
SESSION = "54c1eb09-bc4c-4d2f-98eb-6d2ab2d5e2fe"
USER = [{"role": "user", "content": "say hello to the world"}]
TAGGED = {"workflow_type_id": "coding_assistant", "workflow_id": "tagged-1", "agent_id": "engineer"}


def client(stack: Stack, **auth: str) -> anthropic.AsyncAnthropic:
    """An SDK client of the stack: ``api_key`` (sent as x-api-key) or ``auth_token`` (as a bearer)."""
    sdk = anthropic.AsyncAnthropic(
        base_url=stack.url, max_retries=0, timeout=10, **(auth or {"api_key": "unused"})
    )
    stack.cleanups.append(sdk.close)
    return sdk


def sys_agent(system: str) -> str:
    return "sys-" + hashlib.sha256(system.encode()).hexdigest()[:12]


def sse_events(raw: str) -> list[tuple[str, dict[str, Any]]]:
    """(event name, data) of each event of an SSE body, checking the framing on the way."""
    blocks = raw.split("\n\n")
    assert blocks[-1] == "", "the stream ends with a blank line"
    events = []
    for block in blocks[:-1]:
        name, data = block.split("\n")
        assert name.startswith("event: ") and data.startswith("data: "), block
        payload = json.loads(data.removeprefix("data: "))
        assert payload["type"] == name.removeprefix("event: ")
        events.append((payload["type"], payload))
    return events


async def post(stack: Stack, body: dict[str, Any], **headers: str) -> httpx.Response:
    async with httpx.AsyncClient(base_url=stack.url) as http:
        return await http.post("/v1/messages", json=body, headers=headers)


def error_of(exc: anthropic.APIStatusError) -> tuple[str, str]:
    """(type, message) of the Anthropic error object the SDK raised for."""
    assert isinstance(exc.body, dict), exc.body
    return exc.body["error"]["type"], exc.body["error"]["message"]


def refusal(response: httpx.Response, status: int, kind: str) -> str:
    """The message of an Anthropic error object, after checking its status and shape."""
    assert response.status_code == status, response.text
    body = response.json()
    assert body["type"] == "error" and set(body["error"]) == {"type", "message"}, body
    assert body["error"]["type"] == kind, body
    message: str = body["error"]["message"]
    return message


# ---- the session in metadata.user_id --------------------------------------------------------------


@pytest.mark.unit
@pytest.mark.parametrize(
    ("user_id", "session"),
    [
        (json.dumps({"device_id": "d1", "account_uuid": "", "session_id": SESSION}), SESSION),
        (f"user_{'ab' * 32}_account__session_{SESSION}", SESSION),
        (f"user_{'ab' * 32}_account_0c1d_session_{SESSION}", SESSION),
        ("user-7", None),  # a plain user id names a person, not a session
        (json.dumps({"device_id": "d1"}), None),
        (json.dumps({"session_id": "has spaces"}), None),  # not a valid id
        (json.dumps({"session_id": {"nested": "x"}}), None),
        ("{not json", None),
        (f"user_x_session_{SESSION} trailing", None),
        ("", None),
        (None, None),
    ],
)
def test_claude_code_session_in_user_id(user_id: str | None, session: str | None) -> None:
    assert claude_code_session(user_id) == session


# ---- answers -------------------------------------------------------------------------------------


@pytest.mark.integration
async def test_a_message_answers_in_anthropic_shape(stack: Stack) -> None:
    reply = await client(stack).messages.create(model=MODEL, max_tokens=64, messages=USER)
    assert reply.type == "message" and reply.role == "assistant" and reply.model == MODEL
    assert reply.id.startswith("msg_") and len(reply.id) == len("msg_") + 32
    assert [(block.type, block.text) for block in reply.content] == [("text", "Hello, world!")]
    assert (reply.stop_reason, reply.stop_sequence) == ("end_turn", None)
    # The fake counts a word a token and caches half of the prompt: Anthropic's input_tokens leaves
    # the cached ones out.
    prompt_tokens = len(USER[0]["content"].split())
    cached = prompt_tokens // 2
    usage = reply.usage
    assert (usage.input_tokens, usage.cache_read_input_tokens, usage.output_tokens) == (
        prompt_tokens - cached,
        cached,
        4,
    )
    assert usage.cache_creation_input_tokens == 0

    record = await stack.records.next()
    assert record.endpoint == ENDPOINT and record.stream is False
    assert (record.prompt_tokens, record.cached_tokens, record.output_tokens) == (prompt_tokens, cached, 4)
    assert (record.finish_reason, record.tenant) == ("stop", "default")
    [call] = stack.worker.calls
    assert call.sampling.max_tokens == 64


@pytest.mark.integration
async def test_a_matched_stop_sequence_is_named(make_stack: StackFactory) -> None:
    stack = await make_stack(workers=[FakeWorker(stop_sequence="END")])
    reply = await client(stack).messages.create(model=MODEL, max_tokens=64, messages=USER, stop_sequences=["END"])
    assert (reply.stop_reason, reply.stop_sequence) == ("stop_sequence", "END")
    async with client(stack).messages.stream(
        model=MODEL, max_tokens=64, messages=USER, stop_sequences=["END"]
    ) as stream:
        final = await stream.get_final_message()
    assert (final.stop_reason, final.stop_sequence) == ("stop_sequence", "END")


@pytest.mark.integration
async def test_a_stream_reassembles_in_the_sdk(stack: Stack) -> None:
    sdk = client(stack)
    async with sdk.messages.stream(model=MODEL, max_tokens=64, messages=USER) as stream:
        pieces = [text async for text in stream.text_stream]
        final = await stream.get_final_message()
    assert pieces == ["Hello", ",", " world", "!"]
    assert final.content[0].text == "Hello, world!"
    assert final.stop_reason == "end_turn"
    assert (final.usage.input_tokens, final.usage.cache_read_input_tokens, final.usage.output_tokens) == (
        3,
        2,
        4,
    )
    assert (await stack.records.next()).stream is True


@pytest.mark.integration
async def test_the_stream_events_in_order(stack: Stack) -> None:
    response = await post(stack, {"model": MODEL, "max_tokens": 64, "messages": USER, "stream": True})
    assert response.status_code == 200, response.text
    assert response.headers["content-type"].startswith("text/event-stream")
    events = sse_events(response.text)
    assert [name for name, _ in events] == [
        "message_start",
        "content_block_start",
        "ping",
        *["content_block_delta"] * 4,
        "content_block_stop",
        "message_delta",
        "message_stop",
    ]
    start = events[0][1]["message"]
    assert (start["content"], start["stop_reason"], start["model"]) == ([], None, MODEL)
    # The prompt's count arrives with the first token; its cached part only with the last.
    assert (start["usage"]["input_tokens"], start["usage"]["cache_read_input_tokens"]) == (5, 0)
    assert events[1][1] == {
        "type": "content_block_start",
        "index": 0,
        "content_block": {"type": "text", "text": ""},
    }
    assert [data["delta"] for _, data in events[3:7]] == [
        {"type": "text_delta", "text": piece} for piece in ("Hello", ",", " world", "!")
    ]
    final = events[-2][1]
    assert final["delta"] == {"stop_reason": "end_turn", "stop_sequence": None}
    assert final["usage"] == {
        "input_tokens": 3,
        "output_tokens": 4,
        "cache_creation_input_tokens": 0,
        "cache_read_input_tokens": 2,
    }


@pytest.mark.integration
async def test_claude_codes_beta_path_and_headers_are_accepted(stack: Stack) -> None:
    headers = {"anthropic-version": "2099-01-01", "anthropic-beta": "interleaved-thinking-2025-05-14"}
    async with httpx.AsyncClient(base_url=stack.url) as http:
        body = {"model": MODEL, "max_tokens": 8, "messages": USER}
        response = await http.post("/v1/messages?beta=true", json=body, headers=headers)
    assert response.status_code == 200, response.text
    assert response.json()["content"] == [{"type": "text", "text": "Hello, world!"}]


@pytest.mark.integration
async def test_max_tokens_stops_with_max_tokens(stack: Stack) -> None:
    sdk = client(stack)
    reply = await sdk.messages.create(model=MODEL, max_tokens=2, messages=USER)
    assert (reply.content[0].text, reply.stop_reason, reply.usage.output_tokens) == (
        "Hello,",
        "max_tokens",
        2,
    )
    async with sdk.messages.stream(model=MODEL, max_tokens=3, messages=USER) as stream:
        final = await stream.get_final_message()
    assert (final.content[0].text, final.stop_reason, final.usage.output_tokens) == (
        "Hello, world",
        "max_tokens",
        3,
    )
    assert [(await stack.records.next()).finish_reason for _ in range(2)] == ["length", "length"]


@pytest.mark.integration
async def test_system_prompt_and_turns_reach_the_worker_in_order(stack: Stack) -> None:
    messages = [
        {
            "role": "user",
            "content": [
                {"type": "text", "text": "<reminder>be brief</reminder>"},
                {"type": "text", "text": "plan"},
            ],
        },
        {"role": "assistant", "content": "1. read 2. fix"},
        {"role": "user", "content": "go on"},
        {
            "role": "user",
            "content": [{"type": "text", "text": "and test", "cache_control": {"type": "ephemeral"}}],
        },
        {"role": "system", "content": "reminder: 2 steps left"},
        {"role": "user", "content": "next"},
    ]
    system = [
        {"type": "text", "text": "You are the planner."},
        {"type": "text", "text": "Break the task into steps."},
    ]
    await client(stack).messages.create(model=MODEL, max_tokens=16, system=system, messages=messages)
    [call] = stack.worker.calls
    assert [(m.role, m.content) for m in call.chat.messages] == [
        ("system", "You are the planner.\nBreak the task into steps."),
        ("user", "<reminder>be brief</reminder>\nplan"),
        ("assistant", "1. read 2. fix"),
        ("user", "go on\nand test"),  # consecutive user turns merge, as Anthropic's API combines them
        ("system", "reminder: 2 steps left"),
        ("user", "next"),
    ]

    await client(stack).messages.create(model=MODEL, max_tokens=16, system=SYSTEM, messages=USER)
    assert [(m.role, m.content) for m in stack.worker.calls[1].chat.messages] == [
        ("system", SYSTEM),
        ("user", USER[0]["content"]),
    ]


@pytest.mark.integration
async def test_sampling_parameters_reach_the_worker(stack: Stack) -> None:
    await client(stack).messages.create(
        model=MODEL,
        max_tokens=20,
        messages=USER,
        stop_sequences=["END", "\n\nHuman:"],
        extra_body={"temperature": 0.25, "top_p": 0.5},
    )
    sampling = stack.worker.calls[0].sampling
    assert list(sampling.stop) == ["END", "\n\nHuman:"]
    assert (sampling.max_tokens, sampling.temperature, sampling.top_p) == (20, 0.25, 0.5)
    await client(stack).messages.create(model=MODEL, max_tokens=20, messages=USER)
    unset = stack.worker.calls[1].sampling
    assert not unset.HasField("temperature") and not unset.HasField("top_p") and list(unset.stop) == []


# ---- sessions -------------------------------------------------------------------------------------


@pytest.mark.integration
async def test_the_session_in_user_id_tags_scheduler_and_record(stack: Stack) -> None:
    sdk = client(stack)
    user_id = json.dumps({"device_id": "d1", "account_uuid": "", "session_id": SESSION})
    await sdk.messages.create(
        model=MODEL, max_tokens=8, system=SYSTEM, messages=USER, metadata={"user_id": user_id}
    )
    [scheduled] = stack.scheduler.schedule_calls
    meta = scheduled.app_metadata
    assert (meta.workflow_type_id, meta.workflow_id, meta.agent_id) == ("session", SESSION, sys_agent(SYSTEM))
    record = (await stack.records.next()).app_metadata
    assert (record.workflow_type_id, record.workflow_id, record.agent_id) == (
        "session",
        SESSION,
        sys_agent(SYSTEM),
    )

    # The legacy form, with the workflow type from its header.
    legacy = f"user_{'ab' * 32}_account__session_{SESSION}"
    await sdk.messages.create(
        model=MODEL,
        max_tokens=8,
        messages=USER,
        metadata={"user_id": legacy},
        extra_headers={"x-workflow-type-id": "claude_code"},
    )
    meta = stack.scheduler.schedule_calls[1].app_metadata
    assert (meta.workflow_type_id, meta.workflow_id, meta.agent_id) == ("claude_code", SESSION, "default")
    await stack.records.next()

    # A session header wins over user_id, and app_metadata over both.
    headers = {"X-Claude-Code-Session-Id": "header-session"}
    await sdk.messages.create(
        model=MODEL, max_tokens=8, messages=USER, metadata={"user_id": user_id}, extra_headers=headers
    )
    assert (await stack.records.next()).app_metadata.workflow_id == "header-session"
    await sdk.messages.create(
        model=MODEL,
        max_tokens=8,
        messages=USER,
        metadata={"user_id": user_id},
        extra_headers=headers,
        extra_body={"app_metadata": TAGGED},
    )
    record = (await stack.records.next()).app_metadata
    assert (record.workflow_type_id, record.workflow_id, record.agent_id) == (
        "coding_assistant",
        "tagged-1",
        "engineer",
    )
    assert stack.scheduler.schedule_calls[3].app_metadata.workflow_id == "tagged-1"

    # A user id with no session in it leaves the request untagged.
    await sdk.messages.create(model=MODEL, max_tokens=8, messages=USER, metadata={"user_id": "user-7"})
    assert not (await stack.records.next()).HasField("app_metadata")
    assert not stack.scheduler.schedule_calls[4].HasField("app_metadata")


@pytest.mark.integration
async def test_session_tagging_off_ignores_user_id(make_stack: StackFactory) -> None:
    stack = await make_stack(gateway_session_headers="")
    user_id = json.dumps({"session_id": SESSION})
    await client(stack).messages.create(
        model=MODEL, max_tokens=8, messages=USER, metadata={"user_id": user_id}
    )
    assert not (await stack.records.next()).HasField("app_metadata")


# ---- authentication -----------------------------------------------------------------------------


@pytest.mark.integration
async def test_x_api_key_and_bearer_authenticate(make_stack: StackFactory, tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'keys.db'}"
    store = KeyStore(url)
    key, _ = store.create("acme")
    stack = await make_stack(database_url=url)

    reply = await client(stack, api_key=key).messages.create(model=MODEL, max_tokens=8, messages=USER)
    assert reply.content[0].text == "Hello, world!"
    assert (await stack.records.next()).tenant == "acme"
    await client(stack, auth_token=key).messages.create(model=MODEL, max_tokens=8, messages=USER)
    assert (await stack.records.next()).tenant == "acme"

    with pytest.raises(anthropic.AuthenticationError) as caught:
        await client(stack, api_key="cv-not-a-key").messages.create(model=MODEL, max_tokens=8, messages=USER)
    assert (caught.value.status_code, error_of(caught.value)) == (
        401,
        ("authentication_error", "invalid API key"),
    )
    body = {"model": MODEL, "max_tokens": 8, "messages": USER}
    assert "missing API key" in refusal(await post(stack, body), 401, "authentication_error")
    assert len(stack.scheduler.schedule_calls) == 2
    await stack.records.assert_none()
    store.close()


# ---- refusals -----------------------------------------------------------------------------------


@pytest.mark.integration
@pytest.mark.parametrize(
    ("change", "expected"),
    [
        ({"max_tokens": None}, "max_tokens is required"),
        ({"frobnicate": 1}, "unrecognized request argument supplied: 'frobnicate'"),
        ({"top_k": 40}, "unsupported parameter: 'top_k' is not supported here; leave it unset"),
        ({"thinking": {"type": "enabled", "budget_tokens": 2048}}, "unsupported parameter: 'thinking'"),
        ({"max_tokens": 0}, "invalid max_tokens: Input should be greater than or equal to 1"),
        ({"max_tokens": 40000}, "max_tokens must be at most 32768"),
        ({"temperature": 1.5}, "invalid temperature: Input should be less than or equal to 1"),
        ({"stop_sequences": [""]}, "invalid stop_sequences: stop sequences must not be empty"),
        ({"stop_sequences": ["a", "b", "c", "d", "e"]}, "stop_sequences has 5 items; at most 4 are allowed"),
        (
            {"metadata": {"user_id": "u", "tier": "gold"}},
            "invalid metadata.tier: Extra inputs are not permitted",
        ),
        (
            {"messages": [{"role": "tool", "content": "x"}]},
            "invalid messages[0].role: Input should be 'user', 'assistant' or 'system'",
        ),
        ({"messages": [{"role": "user", "content": [{"type": "image"}]}]}, "messages[0].content[0] must be"),
        ({"system": 5}, "system must be a string or a list of text blocks"),
        (
            {"messages": [*USER, {"role": "assistant", "content": "Sure"}]},
            "messages[1]: a final assistant message",
        ),
        ({"app_metadata": {"workflow_id": "w"}}, "app_metadata.workflow_type_id is required"),
    ],
)
async def test_bad_bodies_are_refused_before_scheduling(
    stack: Stack, change: dict[str, Any], expected: str
) -> None:
    body = {
        k: v
        for k, v in {"model": MODEL, "max_tokens": 8, "messages": USER, **change}.items()
        if v is not None
    }
    message = refusal(await post(stack, body), 400, "invalid_request_error")
    assert message.startswith(expected), message
    assert stack.scheduler.schedule_calls == []


@pytest.mark.integration
async def test_lenient_mode_drops_unknown_fields_only(make_stack: StackFactory) -> None:
    stack = await make_stack(gateway_lenient_parameters=True)
    body = {"model": MODEL, "max_tokens": 8, "messages": USER}
    assert (await post(stack, {**body, "frobnicate": 1})).status_code == 200
    refusal(await post(stack, {**body, "top_k": 40}), 400, "invalid_request_error")


@pytest.mark.integration
async def test_other_failures_keep_anthropic_shape(stack: Stack) -> None:
    with pytest.raises(anthropic.NotFoundError) as caught:
        await client(stack).messages.create(model="no-such-model", max_tokens=8, messages=USER)
    assert error_of(caught.value)[0] == "not_found_error"
    async with httpx.AsyncClient(base_url=stack.url) as http:
        r = await http.post("/v1/messages", content=b"{", headers={"content-type": "application/json"})
    assert refusal(r, 400, "invalid_request_error").startswith("the body is not valid JSON")


@pytest.mark.integration
async def test_a_worker_failing_mid_stream_ends_with_an_error_event(make_stack: StackFactory) -> None:
    stack = await make_stack(workers=[FakeWorker(fail_after=2)])
    response = await post(stack, {"model": MODEL, "max_tokens": 64, "messages": USER, "stream": True})
    assert response.status_code == 200
    events = sse_events(response.text)
    assert [name for name, _ in events] == [
        "message_start",
        "content_block_start",
        "ping",
        "content_block_delta",
        "content_block_delta",
        "error",
    ]
    assert events[-1][1]["error"]["type"] == "overloaded_error"
    assert (await stack.records.next()).finish_reason == "error"


@pytest.mark.integration
async def test_the_route_is_documented(stack: Stack) -> None:
    async with httpx.AsyncClient(base_url=stack.url) as http:
        document = (await http.get("/openapi.json")).json()
    operation = document["paths"]["/v1/messages"]["post"]
    body = operation["requestBody"]["content"]["application/json"]["schema"]
    assert (
        set(body["required"]) == {"model", "messages", "max_tokens"} and body["additionalProperties"] is False
    )
    roles = body["properties"]["messages"]["items"]["properties"]["role"]["enum"]
    assert roles == ["user", "assistant", "system"]
    assert set(operation["responses"]) == {"200", "400", "401", "404", "413", "429", "500", "503"}
    schemas = document["components"]["schemas"]
    assert operation["responses"]["400"]["content"]["application/json"]["schema"]["$ref"].endswith(
        "AnthropicErrorOut"
    )
    assert set(schemas["MessageOut"]["required"]) >= {"id", "model", "content", "stop_reason", "usage"}
