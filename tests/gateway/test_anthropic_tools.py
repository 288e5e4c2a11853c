"""Tools on Anthropic's Messages API (POST /v1/messages), driven with the official anthropic SDK and
httpx against the fake scheduler and a fake worker that streams ToolCallDelta pieces."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Any

import anthropic
import httpx
import pytest

from clairvoyant.contracts.v1 import common_pb2, worker_pb2
from clairvoyant.gateway.anthropic_response import tool_input, tool_use_id
from clairvoyant.gateway.anthropic_stream import ContentEvents
from clairvoyant.gateway.generation import Piece
from tests.gateway.conftest import Stack, StackFactory
from tests.gateway.fakes import MODEL, FakeWorker, prompt_text

WEATHER = {
    "name": "get_weather",
    "description": "The weather in a city",
    "input_schema": {
        "type": "object",
        "properties": {"city": {"type": "string"}, "unit": {"enum": ["C", "F"]}},
        "required": ["city"],
    },
}
TIME = {"name": "get_time", "input_schema": {"type": "object", "properties": {"zone": {"type": "string"}}}}
ASK = [{"role": "user", "content": "weather in Paris and the time in Tokyo?"}]
TAGGED = {"workflow_type_id": "travel", "workflow_id": "trip-1", "agent_id": "planner"}


@dataclass(frozen=True)
class ScriptedCall:
    """One call the fake makes: its id, tool name and argument fragments."""

    id: str
    name: str
    fragments: tuple[str, ...]

    @property
    def arguments(self) -> str:
        return "".join(self.fragments)


PARIS = ScriptedCall("call_paris01", "get_weather", ('{"city": ', '"Paris"', ', "unit": "C"}'))
TOKYO = ScriptedCall("call_tokyo02", "get_time", ('{"zone"', ': "Asia/Tokyo"}'))


@dataclass
class ToolWorker(FakeWorker):
    """A worker that answers with ``text`` pieces, then ``script``'s calls as ToolCallDelta pieces,
    one message each: call k's first piece carries index k, its id and name (and its first argument
    fragment when ``name_with_arguments``), each later one a fragment.  The last message has
    finish_reason "tool_calls" (the worker's rule: the choice made a call) and the usage."""

    text: tuple[str, ...] = ("Let me ", "check.")
    script: tuple[ScriptedCall, ...] = (PARIS, TOKYO)
    name_with_arguments: bool = False

    def _messages(self, request_id: str) -> list[worker_pb2.GenerateResponse]:
        out = [worker_pb2.GenerateResponse(request_id=request_id, text=piece) for piece in self.text]
        for index, call in enumerate(self.script):
            fragments = list(call.fragments)
            first = common_pb2.ToolCallDelta(index=index, id=call.id, name=call.name)
            if self.name_with_arguments and fragments:
                first.arguments = fragments.pop(0)
            out.append(worker_pb2.GenerateResponse(request_id=request_id, tool_calls=[first]))
            out.extend(
                worker_pb2.GenerateResponse(
                    request_id=request_id,
                    tool_calls=[common_pb2.ToolCallDelta(index=index, arguments=fragment)],
                )
                for fragment in fragments
            )
        return out

    async def Generate(self, request, context) -> AsyncIterator[worker_pb2.GenerateResponse]:  # noqa: N802
        self.calls.append(request)
        prompt_tokens = len(prompt_text(request).split())
        replies = self._messages(request.request_id)
        for i, reply in enumerate(replies):
            reply.token_ids.append(100 + i)
            if i == 0:
                reply.prompt_tokens = prompt_tokens
            if i == len(replies) - 1:
                reply.finish_reason = "tool_calls" if self.script else "stop"
                reply.usage.CopyFrom(
                    common_pb2.Usage(
                        prompt_tokens=prompt_tokens,
                        completion_tokens=len(replies),
                        total_tokens=prompt_tokens + len(replies),
                        cached_tokens=0,
                    )
                )
            await asyncio.sleep(0)
            yield reply
        self.finished += 1


def client(stack: Stack) -> anthropic.AsyncAnthropic:
    sdk = anthropic.AsyncAnthropic(base_url=stack.url, api_key="unused", max_retries=0, timeout=10)
    stack.cleanups.append(sdk.close)
    return sdk


async def post(stack: Stack, body: dict[str, Any]) -> httpx.Response:
    async with httpx.AsyncClient(base_url=stack.url) as http:
        return await http.post("/v1/messages", json=body)


def sse_events(raw: str) -> list[dict[str, Any]]:
    """The data of each event of an SSE body, checking that each names its own type."""
    events = []
    for block in raw.split("\n\n")[:-1]:
        name, data = block.split("\n")
        payload = json.loads(data.removeprefix("data: "))
        assert name == f"event: {payload['type']}", block
        events.append(payload)
    return events


@pytest.fixture
async def tool_stack(make_stack: StackFactory) -> Stack:
    return await make_stack(workers=[ToolWorker()])


# ---- the request reaching the worker -------------------------------------------------------------


@pytest.mark.integration
async def test_tools_reach_the_worker(tool_stack: Stack) -> None:
    strict = {**TIME, "strict": True, "cache_control": {"type": "ephemeral"}, "type": "custom"}
    await client(tool_stack).messages.create(
        model=MODEL, max_tokens=64, messages=ASK, tools=[WEATHER, strict]
    )
    [call] = tool_stack.worker.calls
    assert [(t.name, t.description, json.loads(t.parameters_json), t.strict) for t in call.tools] == [
        ("get_weather", "The weather in a city", WEATHER["input_schema"], False),
        ("get_time", "", TIME["input_schema"], True),
    ]
    # No tool_choice: the worker's default (auto); parallel calls allowed.
    assert not call.HasField("tool_choice")
    assert call.HasField("parallel_tool_calls") and call.parallel_tool_calls is True


@pytest.mark.integration
@pytest.mark.parametrize(
    ("tool_choice", "mode", "function", "parallel"),
    [
        ({"type": "auto"}, common_pb2.ToolChoice.AUTO, "", True),
        ({"type": "any"}, common_pb2.ToolChoice.REQUIRED, "", True),
        ({"type": "tool", "name": "get_time"}, common_pb2.ToolChoice.FUNCTION, "get_time", True),
        ({"type": "none"}, common_pb2.ToolChoice.NONE, "", True),
        ({"type": "auto", "disable_parallel_tool_use": True}, common_pb2.ToolChoice.AUTO, "", False),
        ({"type": "any", "disable_parallel_tool_use": False}, common_pb2.ToolChoice.REQUIRED, "", True),
        (
            {"type": "tool", "name": "get_weather", "disable_parallel_tool_use": True},
            common_pb2.ToolChoice.FUNCTION,
            "get_weather",
            False,
        ),
    ],
)
async def test_tool_choice_maps_onto_the_worker_request(
    tool_stack: Stack, tool_choice: dict[str, Any], mode: int, function: str, parallel: bool
) -> None:
    await client(tool_stack).messages.create(
        model=MODEL, max_tokens=64, messages=ASK, tools=[WEATHER, TIME], tool_choice=tool_choice
    )
    [call] = tool_stack.worker.calls
    assert (call.tool_choice.mode, call.tool_choice.function_name, call.parallel_tool_calls) == (
        mode,
        function,
        parallel,
    )


@pytest.mark.integration
async def test_no_tools_send_no_tool_fields(tool_stack: Stack) -> None:
    # Values that ask for nothing: no tools, and a choice that needs none.
    body = {"model": MODEL, "max_tokens": 8, "messages": ASK}
    assert (await post(tool_stack, {**body, "tools": [], "tool_choice": {"type": "auto"}})).status_code == 200
    assert (await post(tool_stack, {**body, "tool_choice": {"type": "none"}})).status_code == 200
    for call in tool_stack.worker.calls:
        assert list(call.tools) == [] and not call.HasField("tool_choice")
    assert len(tool_stack.worker.calls) == 2


HISTORY: list[dict[str, Any]] = [
    {"role": "user", "content": "weather in Paris and the time in Tokyo?"},
    {
        "role": "assistant",
        "content": [
            {"type": "text", "text": "Let me check."},
            {"type": "tool_use", "id": "toolu_paris01", "name": "get_weather", "input": {"city": "Paris"}},
            {"type": "tool_use", "id": "toolu_tokyo02", "name": "get_time", "input": {"zone": "Tōkyō"}},
        ],
    },
    {
        "role": "user",
        "content": [
            {"type": "tool_result", "tool_use_id": "toolu_paris01", "content": "18 C, sunny"},
            {
                "type": "tool_result",
                "tool_use_id": "toolu_tokyo02",
                "content": [{"type": "text", "text": "no such"}, {"type": "text", "text": "zone"}],
                "is_error": True,
            },
            {"type": "text", "text": "Summarise, please."},
        ],
    },
]


@pytest.mark.integration
async def test_tool_use_and_tool_result_turns_reach_the_worker(tool_stack: Stack) -> None:
    await client(tool_stack).messages.create(
        model=MODEL, max_tokens=64, messages=HISTORY, tools=[WEATHER, TIME], system="Be terse."
    )
    [call] = tool_stack.worker.calls
    turns = [
        (m.role, m.content, m.tool_call_id, [(c.id, c.name, json.loads(c.arguments)) for c in m.tool_calls])
        for m in call.chat.messages
    ]
    assert turns == [
        ("system", "Be terse.", "", []),
        ("user", "weather in Paris and the time in Tokyo?", "", []),
        (
            "assistant",
            "Let me check.",
            "",
            [
                ("toolu_paris01", "get_weather", {"city": "Paris"}),
                ("toolu_tokyo02", "get_time", {"zone": "Tōkyō"}),
            ],
        ),
        # The results first, in their order, then the message's text as a user turn.
        ("tool", "18 C, sunny", "toolu_paris01", []),
        ("tool", "Error: no such\nzone", "toolu_tokyo02", []),  # is_error reaches the model as a prefix
        ("user", "Summarise, please.", "", []),
    ]
    assert [m.name for m in call.chat.messages[3:5]] == ["get_weather", "get_time"]
    # The arguments are the input's JSON text, unicode kept.
    assert call.chat.messages[2].tool_calls[1].arguments == '{"zone": "Tōkyō"}'


@pytest.mark.integration
async def test_consecutive_messages_merge_with_their_tool_blocks(tool_stack: Stack) -> None:
    messages = [
        ASK[0],
        {"role": "assistant", "content": "Checking."},
        {
            "role": "assistant",
            "content": [{"type": "tool_use", "id": "toolu_a", "name": "get_weather", "input": {}}],
        },
        {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "toolu_a"}]},
        {"role": "user", "content": "and then?"},
    ]
    await client(tool_stack).messages.create(model=MODEL, max_tokens=8, messages=messages, tools=[WEATHER])
    [call] = tool_stack.worker.calls
    assert [(m.role, m.content, [c.id for c in m.tool_calls]) for m in call.chat.messages] == [
        ("user", ASK[0]["content"], []),
        ("assistant", "Checking.", ["toolu_a"]),
        ("tool", "", []),  # a result without content
        ("user", "and then?", []),
    ]
    assert call.chat.messages[1].tool_calls[0].arguments == "{}"


# ---- refusals ----------------------------------------------------------------------------------


def _with(**change: Any) -> dict[str, Any]:
    return {"model": MODEL, "max_tokens": 8, "messages": ASK, "tools": [WEATHER], **change}


def _turns(*content: list[dict[str, Any]], assistant_first: bool = False) -> dict[str, Any]:
    """A body whose messages alternate user/assistant from ASK, with ``content`` as the later ones."""
    roles = ["assistant", "user"] if not assistant_first else ["user", "assistant"]
    messages = [ASK[0], *({"role": roles[i % 2], "content": c} for i, c in enumerate(content))]
    return _with(messages=messages)


USE = {"type": "tool_use", "id": "toolu_1", "name": "get_weather", "input": {"city": "Paris"}}
RESULT = {"type": "tool_result", "tool_use_id": "toolu_1", "content": "sunny"}
TEXT = {"type": "text", "text": "hi"}


@pytest.mark.integration
@pytest.mark.parametrize(
    ("body", "expected"),
    [
        (
            _with(tools=[WEATHER, {"type": "web_search_20250305", "name": "web_search"}]),
            "tools[1] is the server tool 'web_search_20250305', which is not supported here",
        ),
        (
            _with(tools=[{"type": "bash_20250124", "name": "bash"}]),
            "tools[0] is the server tool 'bash_20250124'",
        ),
        (
            _with(tools=[{**WEATHER, "name": "get weather"}]),
            "invalid tools[0].name: String should match pattern",
        ),
        (_with(tools=[{**WEATHER, "name": "x" * 129}]), "invalid tools[0].name: String should match pattern"),
        (_with(tools=[{"name": "f"}]), "tools[0].input_schema is required"),
        (
            _with(tools=[{"name": "f", "input_schema": {"type": "string"}}]),
            "invalid tools[0].input_schema: must be",
        ),
        (
            _with(tools=[{"name": "f", "input_schema": "{}"}]),
            "invalid tools[0].input_schema: Input should be",
        ),
        (
            _with(tools=[WEATHER, WEATHER]),
            "tools[1].name: tool names must be unique; 'get_weather' is repeated",
        ),
        (_with(tools={"name": "f"}), "invalid tools: Input should be a valid list"),
        (_with(tools=[{**WEATHER, "defer_loading": True}]), "tools[0].defer_loading is not supported here"),
        (
            _with(tools=[{**WEATHER, "allowed_callers": ["code_execution_20250825"]}]),
            "tools[0].allowed_callers is not supported here",
        ),
        (
            _with(tool_choice={"type": "tool", "name": "get_time"}),
            "tool_choice.name: 'get_time' names none of the tools",
        ),
        (_with(tool_choice={"type": "tool"}), "tool_choice.name: None names none of the tools"),
        (_with(tools=[], tool_choice={"type": "any"}), "tool_choice {'type': 'any'} needs tools"),
        (
            _with(tools=None, tool_choice={"type": "tool", "name": "f"}),
            "tool_choice {'type': 'tool'} needs tools",
        ),
        (_with(tool_choice={"type": "sometimes"}), "invalid tool_choice.type: Input should be"),
        (_with(tool_choice="auto"), "invalid tool_choice: Input should be a valid dictionary"),
        (
            _with(tool_choice={"type": "auto", "disable_parallel_tool_use": "yes"}),
            "invalid tool_choice.disable_parallel_tool_use: Input should be a valid boolean",
        ),
        (_turns([USE]), "messages[1]: a final assistant message"),
        (
            _turns([USE], [TEXT]),
            "messages[1]: tool_use ids were found without tool_result blocks right after: toolu_1",
        ),
        (
            _turns([USE, {**USE, "id": "toolu_2"}], [RESULT]),
            "messages[1]: tool_use ids were found without tool_result blocks right after: toolu_2",
        ),
        (
            _with(messages=[{"role": "user", "content": [USE]}]),
            "messages[0].content[0] must be a 'text' or 'tool_result' block",
        ),
        (_turns([RESULT]), "messages[1].content[0] must be a 'text' or 'tool_use' block in an assistant"),
        (
            _with(messages=[{"role": "user", "content": [RESULT]}]),
            "messages[0].content[0].tool_use_id must answer a tool_use block of the assistant message right before it; 'toolu_1' does not",
        ),
        (
            _turns([USE], [{**RESULT, "tool_use_id": "toolu_9"}]),
            "messages[2].content[0].tool_use_id must answer a tool_use block of the assistant message right before it; 'toolu_9' does not",
        ),
        (
            _turns([USE], [RESULT, RESULT]),
            "messages[2].content[1].tool_use_id answers 'toolu_1' a second time",
        ),
        (
            _turns([USE], [TEXT, RESULT]),
            "messages[2].content[1]: tool_result blocks must come before any text",
        ),
        (
            _turns([USE], [RESULT], [{**USE, "name": "get_weather"}], [RESULT]),
            "messages[3].content[0].id repeats the id 'toolu_1' of an earlier tool_use block",
        ),
        (
            _turns([USE], [RESULT], [{**USE, "id": "toolu_2"}], [RESULT]),
            "messages[4].content[0].tool_use_id must answer a tool_use block of the assistant message right before it; 'toolu_1' does not",
        ),
        (
            _turns([{**USE, "id": "toolu 1"}], [RESULT]),
            "messages[1].content[0].id must be a string of A-Z a-z 0-9 _ -",
        ),
        (
            _turns([{**USE, "name": "get.weather"}], [RESULT]),
            "messages[1].content[0].name must be a tool name",
        ),
        (_turns([{**USE, "input": "Paris"}], [RESULT]), "messages[1].content[0].input must be an object"),
        (_turns([{**USE, "input": None}], [RESULT]), "messages[1].content[0].input must be an object"),
        (
            _turns([USE], [{**RESULT, "content": [{"type": "image", "source": {}}]}]),
            "messages[2].content[0].content[0] must be {'type': 'text', 'text': <string>}",
        ),
        (
            _turns([USE], [{**RESULT, "content": 5}]),
            "messages[2].content[0].content must be a string or a list of text blocks",
        ),
        (_turns([USE], [{**RESULT, "is_error": "yes"}]), "messages[2].content[0].is_error must be a boolean"),
        (_turns([USE], [{**RESULT, "tool_use_id": 7}]), "messages[2].content[0].tool_use_id must be the id"),
        (_with(system=[RESULT]), "system[0] must be {'type': 'text', 'text': <string>}"),
        (
            _with(messages=[{"role": "user", "content": [{"type": "image", "source": {}}]}]),
            "messages[0].content[0] must be a 'text' or 'tool_result' block in a user message; got 'image'",
        ),
        (_with(thinking={"type": "enabled", "budget_tokens": 1024}), "unsupported parameter: 'thinking'"),
        (_with(tools=[WEATHER], top_k=5), "unsupported parameter: 'top_k'"),
    ],
)
async def test_bad_tool_requests_are_refused_before_scheduling(
    tool_stack: Stack, body: dict[str, Any], expected: str
) -> None:
    body = {key: value for key, value in body.items() if value is not None}
    response = await post(tool_stack, body)
    assert response.status_code == 400, response.text
    error = response.json()
    assert error["type"] == "error" and error["error"]["type"] == "invalid_request_error"
    assert error["error"]["message"].startswith(expected), error["error"]["message"]
    assert tool_stack.scheduler.schedule_calls == []


@pytest.mark.integration
async def test_the_sdk_raises_bad_request_for_a_server_tool(tool_stack: Stack) -> None:
    with pytest.raises(anthropic.BadRequestError) as caught:
        await client(tool_stack).messages.create(
            model=MODEL,
            max_tokens=8,
            messages=ASK,
            tools=[{"type": "web_search_20250305", "name": "web_search", "max_uses": 2}],
        )
    assert caught.value.status_code == 400
    assert caught.value.body["error"]["message"].startswith(
        "tools[0] is the server tool 'web_search_20250305'"
    )


# ---- answers -----------------------------------------------------------------------------------


def block_tuples(content: list[Any]) -> list[tuple[Any, ...]]:
    return [(b.type, b.text) if b.type == "text" else (b.type, b.id, b.name, b.input) for b in content]


EXPECTED_BLOCKS = [
    ("text", "Let me check."),
    ("tool_use", "toolu_paris01", "get_weather", {"city": "Paris", "unit": "C"}),
    ("tool_use", "toolu_tokyo02", "get_time", {"zone": "Asia/Tokyo"}),
]


@pytest.mark.integration
async def test_calls_answer_as_tool_use_blocks(tool_stack: Stack) -> None:
    reply = await client(tool_stack).messages.create(
        model=MODEL, max_tokens=64, messages=ASK, tools=[WEATHER, TIME]
    )
    assert block_tuples(reply.content) == EXPECTED_BLOCKS
    assert (reply.stop_reason, reply.stop_sequence) == ("tool_use", None)
    assert reply.usage.output_tokens == 2 + 4 + 3  # the fake sends a token a message
    record = await tool_stack.records.next()
    assert (record.finish_reason, record.endpoint) == ("tool_calls", "messages")


@pytest.mark.integration
@pytest.mark.parametrize("name_with_arguments", [False, True])
async def test_a_streamed_tool_use_equals_the_whole_answer(
    make_stack: StackFactory, name_with_arguments: bool
) -> None:
    stack = await make_stack(workers=[ToolWorker(name_with_arguments=name_with_arguments)])
    sdk = client(stack)
    kwargs: dict[str, Any] = {"model": MODEL, "max_tokens": 64, "messages": ASK, "tools": [WEATHER, TIME]}
    whole = await sdk.messages.create(**kwargs)
    async with sdk.messages.stream(**kwargs) as stream:
        texts = [text async for text in stream.text_stream]
        final = await stream.get_final_message()
    assert texts == ["Let me ", "check."]
    assert block_tuples(final.content) == block_tuples(whole.content) == EXPECTED_BLOCKS
    assert final.model_dump(exclude={"id"}) == whole.model_dump(exclude={"id"})
    assert final.stop_reason == "tool_use"
    assert [(await stack.records.next()).stream for _ in range(2)] == [False, True]


@pytest.mark.integration
async def test_the_tool_use_events_in_order(tool_stack: Stack) -> None:
    response = await post(tool_stack, {**_with(tools=[WEATHER, TIME]), "max_tokens": 64, "stream": True})
    assert response.status_code == 200, response.text
    events = sse_events(response.text)
    summary = [
        (e["type"], e.get("index"), (e.get("content_block") or e.get("delta") or {}).get("type"))
        for e in events
    ]
    assert summary == [
        ("message_start", None, None),
        ("content_block_start", 0, "text"),
        ("ping", None, None),
        ("content_block_delta", 0, "text_delta"),
        ("content_block_delta", 0, "text_delta"),
        ("content_block_stop", 0, None),  # the text closes before the first tool_use opens
        ("content_block_start", 1, "tool_use"),
        *[("content_block_delta", 1, "input_json_delta")] * 3,
        ("content_block_stop", 1, None),
        ("content_block_start", 2, "tool_use"),
        *[("content_block_delta", 2, "input_json_delta")] * 2,
        ("content_block_stop", 2, None),
        ("message_delta", None, None),
        ("message_stop", None, None),
    ]
    assert events[6]["content_block"] == {
        "type": "tool_use",
        "id": "toolu_paris01",
        "name": "get_weather",
        "input": {},
    }
    assert [e["delta"]["partial_json"] for e in events[7:10]] == list(PARIS.fragments)
    assert events[-2]["delta"] == {"stop_reason": "tool_use", "stop_sequence": None}


@pytest.mark.integration
async def test_calls_without_text_open_at_index_zero(make_stack: StackFactory) -> None:
    stack = await make_stack(workers=[ToolWorker(text=(), script=(TOKYO,))])
    body = {**_with(tools=[TIME]), "tool_choice": {"type": "tool", "name": "get_time"}}
    reply = (await post(stack, body)).json()
    assert reply["content"] == [
        {"type": "tool_use", "id": "toolu_tokyo02", "name": "get_time", "input": {"zone": "Asia/Tokyo"}}
    ]
    assert reply["stop_reason"] == "tool_use"
    events = sse_events((await post(stack, {**body, "stream": True})).text)
    assert [(e["type"], e.get("index")) for e in events[:3]] == [
        ("message_start", None),
        ("content_block_start", 0),
        ("ping", None),
    ]
    assert events[1]["content_block"]["type"] == "tool_use"


@pytest.mark.integration
async def test_arguments_that_are_no_object_come_back_as_text(make_stack: StackFactory) -> None:
    broken = ScriptedCall("call_x", "get_weather", ('{"city": "Par',))
    listed = ScriptedCall("call_y", "get_weather", ("[1, 2]",))
    stack = await make_stack(workers=[ToolWorker(text=("Hm.",), script=(broken, listed))])
    response = await post(stack, _with())
    assert response.status_code == 200, response.text
    reply = response.json()
    assert reply["content"] == [{"type": "text", "text": 'Hm.\n{"city": "Par\n[1, 2]'}]
    assert reply["stop_reason"] == "end_turn"  # no tool_use block to answer


@pytest.mark.integration
async def test_a_round_trip_through_the_sdk(tool_stack: Stack) -> None:
    sdk = client(tool_stack)
    first = await sdk.messages.create(
        model=MODEL, max_tokens=64, messages=ASK, tools=[WEATHER, TIME], extra_body={"app_metadata": TAGGED}
    )
    uses = [block for block in first.content if block.type == "tool_use"]
    results = [{"type": "tool_result", "tool_use_id": use.id, "content": f"{use.name} done"} for use in uses]
    history = [*ASK, {"role": "assistant", "content": first.content}, {"role": "user", "content": results}]
    await sdk.messages.create(
        model=MODEL,
        max_tokens=64,
        messages=history,
        tools=[WEATHER, TIME],
        extra_body={"app_metadata": TAGGED},
    )
    sent = tool_stack.worker.calls[1].chat.messages
    assert [(c.id, c.name) for c in sent[1].tool_calls] == [
        ("toolu_paris01", "get_weather"),
        ("toolu_tokyo02", "get_time"),
    ]
    assert [(m.role, m.tool_call_id, m.content) for m in sent[2:]] == [
        ("tool", "toolu_paris01", "get_weather done"),
        ("tool", "toolu_tokyo02", "get_time done"),
    ]
    # The record names the tool whose result the request follows: the last one.
    records = [await tool_stack.records.next() for _ in range(2)]
    assert [r.app_metadata.HasField("tool") for r in records] == [False, True]
    assert records[1].app_metadata.tool == "get_time"
    assert tool_stack.scheduler.schedule_calls[1].app_metadata.tool == "get_time"


@pytest.mark.integration
async def test_the_tool_tag_follows_the_last_result(tool_stack: Stack) -> None:
    sdk = client(tool_stack)
    use = {"type": "tool_use", "id": "toolu_w", "name": "get_weather", "input": {"city": "Oslo"}}
    result = {"type": "tool_result", "tool_use_id": "toolu_w", "content": "cold"}
    history = [*ASK, {"role": "assistant", "content": [use]}]
    cases: list[tuple[dict[str, Any], list[dict[str, Any]], str | None]] = [
        (TAGGED, [result, {"type": "text", "text": "and now?"}], "get_weather"),  # text after the result
        ({**TAGGED, "tool": "my_tool"}, [result], "my_tool"),  # a tagged tool wins
    ]
    for meta, content, expected in cases:
        await sdk.messages.create(
            model=MODEL,
            max_tokens=8,
            messages=[*history, {"role": "user", "content": content}],
            tools=[WEATHER],
            extra_body={"app_metadata": meta},
        )
        assert (await tool_stack.records.next()).app_metadata.tool == expected
    # A session header's derived tags get the tool too.
    await sdk.messages.create(
        model=MODEL,
        max_tokens=8,
        messages=[*history, {"role": "user", "content": [result]}],
        tools=[WEATHER],
        extra_headers={"X-Claude-Code-Session-Id": "sess-1"},
    )
    meta = (await tool_stack.records.next()).app_metadata
    assert (meta.workflow_id, meta.tool) == ("sess-1", "get_weather")
    # A conversation that does not end in a tool result leaves it unset.
    await sdk.messages.create(
        model=MODEL,
        max_tokens=8,
        messages=[
            *history,
            {"role": "user", "content": [result]},
            {"role": "assistant", "content": "Cold."},
            {"role": "user", "content": "ok"},
        ],
        tools=[WEATHER],
        extra_body={"app_metadata": TAGGED},
    )
    assert not (await tool_stack.records.next()).app_metadata.HasField("tool")


# ---- the pure parts ----------------------------------------------------------------------------


@pytest.mark.unit
@pytest.mark.parametrize(
    ("call_id", "expected"),
    [("call_abc123", "toolu_abc123"), ("toolu_kept", "toolu_kept"), ("xyz", "toolu_xyz")],
)
def test_tool_use_ids_keep_the_workers_suffix(call_id: str, expected: str) -> None:
    assert tool_use_id(call_id) == expected


@pytest.mark.unit
@pytest.mark.parametrize("call_id", ["", "call_", "call_has space"])
def test_a_missing_or_malformed_call_id_gets_a_fresh_one(call_id: str) -> None:
    fresh = {tool_use_id(call_id) for _ in range(3)}
    assert len(fresh) == 3 and all(i.startswith("toolu_") and len(i) == len("toolu_") + 24 for i in fresh)


@pytest.mark.unit
@pytest.mark.parametrize(
    ("arguments", "expected"),
    [
        ('{"a": [1, {"b": null}]}', {"a": [1, {"b": None}]}),
        ("", {}),
        ("  ", {}),
        ("[1]", None),
        ("{", None),
        ("3", None),
    ],
)
def test_tool_input_is_a_json_object_or_none(arguments: str, expected: dict[str, Any] | None) -> None:
    assert tool_input(arguments) == expected


@pytest.mark.unit
def test_content_events_interleave_text_after_calls_in_a_new_block() -> None:
    """Text after a call (an engine without a grammar may write some) opens a block of its own."""
    blocks = ContentEvents()
    delta = common_pb2.ToolCallDelta
    out = [
        *blocks.feed(Piece(0, "", (), [delta(index=0, id="call_1", name="f", arguments="{}")], None)),
        *blocks.feed(Piece(0, "done", (), [], "tool_calls")),
        *blocks.finish(),
    ]
    events = [json.loads(e.decode().split("data: ")[1]) for e in out]
    assert [(e["type"], e.get("index")) for e in events] == [
        ("content_block_start", 0),
        ("ping", None),
        ("content_block_delta", 0),
        ("content_block_stop", 0),
        ("content_block_start", 1),
        ("content_block_delta", 1),
        ("content_block_stop", 1),
    ]
    assert events[0]["content_block"]["id"] == "toolu_1" and blocks.called
    empty = ContentEvents()
    assert [json.loads(e.decode().split("data: ")[1])["type"] for e in empty.finish()] == [
        "content_block_start",
        "ping",
        "content_block_stop",
    ]
    assert not empty.called
