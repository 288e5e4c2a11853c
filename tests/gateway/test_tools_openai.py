"""Tools, tool choices and output constraints through the gateway's OpenAI chat API, with the
official SDK as the client: what reaches the worker's GenerateRequest, every refusal, the
tool_calls shapes (whole and streamed), and app_metadata.tool derived from the messages."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator, Callable, Sequence
from dataclasses import dataclass
from typing import Any

import httpx
import openai
import pytest

from clairvoyant.contracts.v1 import common_pb2, worker_pb2
from clairvoyant.core.structured import OutputConstraint, ToolChoice, ToolSpec
from clairvoyant.core.wire import constraint_from_proto, tool_choice_from_proto, tool_from_proto
from tests.gateway.conftest import Stack, StackFactory
from tests.gateway.fakes import MODEL, FakeWorker

pytestmark = pytest.mark.integration

# A choice's script: what each of its messages carries (text, tool-call pieces).
Part = tuple[str, Sequence[common_pb2.ToolCallDelta]]
Script = Callable[[worker_pb2.GenerateRequest], Sequence[Sequence[Part]]]


def delta(index: int, arguments: str, call_id: str = "", name: str = "") -> common_pb2.ToolCallDelta:
    return common_pb2.ToolCallDelta(index=index, id=call_id, name=name, arguments=arguments)


WEATHER_CALL: list[Part] = [
    ("", [delta(0, '{"city": ', "call_w1", "get_weather")]),
    ("", [delta(0, '"Paris"}')]),
]


def one_choice(parts: Sequence[Part]) -> Script:
    return lambda request: [parts] * max(1, request.sampling.n)


@dataclass
class ScriptedWorker(FakeWorker):
    """Answers every choice of a request with its script's parts, choices interleaved round-robin
    as an engine decodes them side by side.  A choice's last message has its finish_reason
    ("tool_calls" when it made any call); the request's last one the usage of every choice."""

    script: Script = one_choice([("Hello", ()), (" there", ())])

    async def Generate(self, request, context) -> AsyncIterator[worker_pb2.GenerateResponse]:  # noqa: N802
        self.calls.append(request)
        choices = [list(parts) for parts in self.script(request)]
        prompt_tokens = 5
        total = sum(len(parts) for parts in choices)
        sent = 0
        finished: set[int] = set()
        for step in range(max(len(parts) for parts in choices)):
            for index, parts in enumerate(choices):
                if step >= len(parts):
                    continue
                text, calls = parts[step]
                reply = worker_pb2.GenerateResponse(
                    request_id=request.request_id, text=text, tool_calls=calls, index=index, token_ids=[100 + sent]
                )
                sent += 1
                if sent == 1:
                    reply.prompt_tokens = prompt_tokens
                if step == len(parts) - 1:
                    made_calls = any(c for _, c in parts)
                    reply.finish_reason = "tool_calls" if made_calls else "stop"
                    finished.add(index)
                if sent == total:
                    reply.usage.CopyFrom(
                        common_pb2.Usage(
                            prompt_tokens=prompt_tokens, completion_tokens=total, total_tokens=prompt_tokens + total
                        )
                    )
                yield reply
        self.finished += 1


WEATHER_TOOL = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "The weather in a city",
        "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]},
        "strict": True,
    },
}
TIME_TOOL = {"type": "function", "function": {"name": "get_time", "parameters": {"type": "object"}}}
MSG = [{"role": "user", "content": "weather in Paris?"}]
META = {"workflow_type_id": "travel", "workflow_id": "t-1", "agent_id": "planner"}
# A conversation whose last turn answers call_t2 (get_time), after an earlier get_weather call.
HISTORY: list[dict[str, Any]] = [
    {"role": "user", "content": "weather and time in Paris?"},
    {
        "role": "assistant",
        "content": None,
        "tool_calls": [
            {"id": "call_w1", "type": "function", "function": {"name": "get_weather", "arguments": '{"city":"Paris"}'}},
            {"id": "call_t2", "type": "function", "function": {"name": "get_time", "arguments": "{}"}},
        ],
    },
    {"role": "tool", "tool_call_id": "call_w1", "content": "sunny"},
    {"role": "tool", "tool_call_id": "call_t2", "content": "12:00"},
]


async def make(make_stack: StackFactory, script: Script | None = None) -> Stack:
    worker = ScriptedWorker() if script is None else ScriptedWorker(script=script)
    return await make_stack(workers=[worker])


# What reaches the worker.


@pytest.mark.parametrize(
    ("fields", "choice", "parallel"),
    [
        ({}, None, True),
        ({"tool_choice": "auto", "parallel_tool_calls": False}, ToolChoice("auto"), False),
        ({"tool_choice": "required"}, ToolChoice("required"), True),
        ({"tool_choice": "none"}, ToolChoice("none"), True),
        ({"tool_choice": {"type": "function", "function": {"name": "get_time"}}}, ToolChoice("function", "get_time"), True),
    ],
)
async def test_tools_and_the_tool_choice_reach_the_worker(
    make_stack: StackFactory, fields: dict[str, Any], choice: ToolChoice | None, parallel: bool
) -> None:
    stack = await make(make_stack)
    client = stack.openai()
    await client.chat.completions.create(model=MODEL, messages=MSG, tools=[WEATHER_TOOL, TIME_TOOL], **fields)
    [sent] = stack.worker.calls
    assert [tool_from_proto(tool) for tool in sent.tools] == [
        ToolSpec("get_weather", "The weather in a city", WEATHER_TOOL["function"]["parameters"], True),
        ToolSpec("get_time", "", {"type": "object"}, False),
    ]
    assert (tool_choice_from_proto(sent.tool_choice) if sent.HasField("tool_choice") else None) == choice
    assert sent.parallel_tool_calls is parallel
    assert not sent.sampling.HasField("constraint")


SCHEMA = {"type": "object", "properties": {"answer": {"type": "integer"}}, "required": ["answer"]}


@pytest.mark.parametrize(
    ("fields", "constraint"),
    [
        (
            {"response_format": {"type": "json_schema", "json_schema": {"name": "answer", "schema": SCHEMA, "strict": True}}},
            OutputConstraint.of_schema(SCHEMA),
        ),
        ({"response_format": {"type": "json_object"}}, OutputConstraint("json_object")),
        ({"response_format": {"type": "text"}}, None),
        ({"extra_body": {"guided_json": SCHEMA}}, OutputConstraint.of_schema(SCHEMA)),
        ({"extra_body": {"guided_json": json.dumps(SCHEMA)}}, OutputConstraint.of_schema(SCHEMA)),
        ({"extra_body": {"guided_regex": "[0-9]{3}"}}, OutputConstraint("regex", "[0-9]{3}")),
        ({"extra_body": {"guided_choice": ["yes", "no"]}}, OutputConstraint("choice", '["yes", "no"]')),
        ({"extra_body": {"guided_grammar": 'root ::= "a" | "b"'}}, OutputConstraint("ebnf", 'root ::= "a" | "b"')),
        ({"extra_body": {"structured_outputs": {"choice": ["x", "y"]}}}, OutputConstraint("choice", '["x", "y"]')),
        ({"extra_body": {"structured_outputs": {"json_object": True}}}, OutputConstraint("json_object")),
        (
            {"extra_body": {"structural_tag": {"type": "structural_tag", "format": {"type": "const_string", "value": "ok"}}}},
            OutputConstraint(
                "structural_tag", json.dumps({"type": "structural_tag", "format": {"type": "const_string", "value": "ok"}})
            ),
        ),
        # A constraint beside tools the model may not call is allowed.
        ({"tools": [WEATHER_TOOL], "tool_choice": "none", "response_format": {"type": "json_object"}}, OutputConstraint("json_object")),
    ],
)
async def test_a_constraint_reaches_the_worker(
    make_stack: StackFactory, fields: dict[str, Any], constraint: OutputConstraint | None
) -> None:
    stack = await make(make_stack)
    await stack.openai().chat.completions.create(model=MODEL, messages=MSG, **fields)
    [sent] = stack.worker.calls
    assert constraint_from_proto(sent.sampling.constraint) == constraint


async def test_guided_fields_reach_the_worker_on_completions(make_stack: StackFactory) -> None:
    stack = await make(make_stack)
    await stack.openai().completions.create(model=MODEL, prompt="pick", extra_body={"guided_choice": ["a", "b"]})
    assert constraint_from_proto(stack.worker.calls[0].sampling.constraint) == OutputConstraint("choice", '["a", "b"]')


async def test_an_assistant_turns_calls_and_tool_results_reach_the_worker(make_stack: StackFactory) -> None:
    stack = await make(make_stack)
    await stack.openai().chat.completions.create(model=MODEL, messages=HISTORY, tools=[WEATHER_TOOL, TIME_TOOL])
    messages = stack.worker.calls[0].chat.messages
    assert [(m.role, m.content) for m in messages] == [
        ("user", "weather and time in Paris?"), ("assistant", ""), ("tool", "sunny"), ("tool", "12:00"),
    ]  # fmt: skip
    assert [(c.id, c.name, c.arguments) for c in messages[1].tool_calls] == [
        ("call_w1", "get_weather", '{"city":"Paris"}'),
        ("call_t2", "get_time", "{}"),
    ]
    assert [m.tool_call_id for m in messages[2:]] == ["call_w1", "call_t2"]
    assert not messages[0].HasField("tool_call_id") and not messages[3].tool_calls


# Refusals.

FUNCTION_CALL = {"id": "call_1", "type": "function", "function": {"name": "get_weather", "arguments": "{}"}}
BAD: list[tuple[str, dict[str, Any], str, str]] = [
    # (case, fields, param, code)
    ("tool type", {"tools": [{"type": "custom", "custom": {"name": "x"}}]}, "tools[0].type", "invalid_value"),
    ("tool name", {"tools": [{"type": "function", "function": {"name": "get weather"}}]}, "tools[0].function.name", "invalid_value"),
    ("long name", {"tools": [{"type": "function", "function": {"name": "x" * 65}}]}, "tools[0].function.name", "invalid_value"),
    ("no name", {"tools": [{"type": "function", "function": {}}]}, "tools[0].function.name", "missing_required_parameter"),
    ("names twice", {"tools": [TIME_TOOL, TIME_TOOL]}, "tools", "invalid_value"),
    ("parameters", {"tools": [{"type": "function", "function": {"name": "f", "parameters": "{}"}}]}, "tools[0].function.parameters", "invalid_type"),
    ("strict", {"tools": [{"type": "function", "function": {"name": "f", "strict": "yes"}}]}, "tools[0].function.strict", "invalid_type"),
    ("tool_choice word", {"tools": [TIME_TOOL], "tool_choice": "any"}, "tool_choice", "invalid_value"),
    ("tool_choice shape", {"tools": [TIME_TOOL], "tool_choice": {"type": "function"}}, "tool_choice", "invalid_value"),
    ("tool_choice unknown", {"tools": [TIME_TOOL], "tool_choice": {"type": "function", "function": {"name": "nope"}}}, "tool_choice", "invalid_value"),
    ("required, no tools", {"tool_choice": "required"}, "tool_choice", "invalid_value"),
    ("named, no tools", {"tool_choice": {"type": "function", "function": {"name": "get_time"}}}, "tool_choice", "invalid_value"),
    ("parallel type", {"tools": [TIME_TOOL], "parallel_tool_calls": "yes"}, "parallel_tool_calls", "invalid_type"),
    ("format type", {"response_format": {"type": "xml"}}, "response_format", "invalid_value"),
    ("format schema", {"response_format": {"type": "json_schema", "json_schema": {"name": "a"}}}, "response_format", "invalid_value"),
    ("format name", {"response_format": {"type": "json_schema", "json_schema": {"name": "a b", "schema": {}}}}, "response_format", "invalid_value"),
    ("format strict", {"response_format": {"type": "json_schema", "json_schema": {"name": "a", "schema": {}, "strict": 1}}}, "response_format", "invalid_value"),
    ("constraint + tools", {"tools": [TIME_TOOL], "response_format": {"type": "json_object"}}, "response_format", "invalid_value"),
    ("guided + required", {"tools": [TIME_TOOL], "tool_choice": "required", "guided_regex": "a"}, "guided_regex", "invalid_value"),
    ("two constraints", {"response_format": {"type": "json_object"}, "guided_choice": ["a"]}, "guided_choice", "invalid_value"),
    ("two guided", {"guided_regex": "a", "guided_grammar": "root ::= \"a\""}, "guided_grammar", "invalid_value"),
    ("guided_json text", {"guided_json": "{not json"}, "guided_json", "invalid_value"),
    ("guided_json list", {"guided_json": [1]}, "guided_json", "invalid_value"),
    ("guided_choice empty", {"guided_choice": []}, "guided_choice", "invalid_value"),
    ("guided_choice item", {"guided_choice": ["a", ""]}, "guided_choice[1]", "invalid_value"),
    ("guided_regex empty", {"guided_regex": ""}, "guided_regex", "invalid_value"),
    ("structured key", {"structured_outputs": {"xml": "<a/>"}}, "structured_outputs.xml", "unsupported_parameter"),
    ("structured two", {"structured_outputs": {"regex": "a", "choice": ["b"]}}, "structured_outputs.choice", "invalid_value"),
    ("structured choice", {"structured_outputs": {"choice": "ab"}}, "structured_outputs.choice", "invalid_type"),
    ("n zero", {"n": 0}, "n", "invalid_value"),
    ("n nine", {"n": 9}, "n", "invalid_value"),
    ("tool turn, no id", {"messages": [*MSG, {"role": "tool", "content": "5"}]}, "messages[1].tool_call_id", "missing_required_parameter"),
    ("calls on a user turn", {"messages": [{"role": "user", "content": "x", "tool_calls": [FUNCTION_CALL]}]}, "messages[0].tool_calls", "invalid_value"),
    ("id on a user turn", {"messages": [{"role": "user", "content": "x", "tool_call_id": "c"}]}, "messages[0].tool_call_id", "invalid_value"),
    ("empty call id", {"messages": [*MSG, {"role": "assistant", "tool_calls": [{**FUNCTION_CALL, "id": ""}]}]}, "messages[1].tool_calls[0].id", "invalid_value"),
    ("call name", {"messages": [*MSG, {"role": "assistant", "tool_calls": [{**FUNCTION_CALL, "function": {"name": "a.b", "arguments": "{}"}}]}]}, "messages[1].tool_calls[0].function.name", "invalid_value"),
    ("call arguments", {"messages": [*MSG, {"role": "assistant", "tool_calls": [{**FUNCTION_CALL, "function": {"name": "f", "arguments": {}}}]}]}, "messages[1].tool_calls[0].function.arguments", "invalid_type"),
    ("call type", {"messages": [*MSG, {"role": "assistant", "tool_calls": [{**FUNCTION_CALL, "type": "custom"}]}]}, "messages[1].tool_calls[0].type", "invalid_value"),
    ("legacy functions", {"functions": [TIME_TOOL["function"]]}, "functions", "unsupported_parameter"),
]  # fmt: skip


async def test_every_bad_value_is_a_400_naming_it(make_stack: StackFactory) -> None:
    stack = await make(make_stack)
    wrong = []
    async with httpx.AsyncClient(base_url=stack.url, timeout=30) as http:
        for case, fields, param, code in BAD:
            response = await http.post("/v1/chat/completions", json={"model": MODEL, "messages": MSG, **fields})
            error = response.json().get("error", {})
            got = (response.status_code, error.get("param"), error.get("code"))
            if got != (400, param, code) or error.get("type") != "invalid_request_error":
                wrong.append(f"{case}: {got} {error.get('message')}")
    assert wrong == []
    assert stack.scheduler.schedule_calls == []  # nothing refused reached the scheduler


async def test_a_refusal_message_says_what_is_wrong(make_stack: StackFactory) -> None:
    stack = await make(make_stack)
    client = stack.openai()
    cases = [
        ({"tools": [TIME_TOOL], "tool_choice": {"type": "function", "function": {"name": "nope"}}},
         "tool_choice names 'nope', which is not one of the tools"),
        ({"tools": [TIME_TOOL], "response_format": {"type": "json_object"}},
         'response_format cannot be combined with tools the model may call; set tool_choice to "none" '
         "or leave one of them out"),
        ({"tools": [TIME_TOOL, TIME_TOOL]}, "invalid tools: function names must be unique; repeated: ['get_time']"),
        ({"n": 9}, "invalid n: Input should be less than or equal to 8"),
    ]  # fmt: skip
    for fields, message in cases:
        with pytest.raises(openai.BadRequestError) as caught:
            await client.chat.completions.create(model=MODEL, messages=MSG, **fields)
        assert caught.value.body["message"] == message  # type: ignore[index]


# Output shapes.


async def test_a_whole_answer_carries_the_calls(make_stack: StackFactory) -> None:
    stack = await make(make_stack, one_choice(WEATHER_CALL))
    answer = await stack.openai().chat.completions.create(model=MODEL, messages=MSG, tools=[WEATHER_TOOL])
    [choice] = answer.choices
    assert (choice.finish_reason, choice.message.content) == ("tool_calls", None)
    [call] = choice.message.tool_calls or []
    assert (call.id, call.type, call.function.name) == ("call_w1", "function", "get_weather")
    assert json.loads(call.function.arguments) == {"city": "Paris"}
    assert answer.usage is not None and answer.usage.completion_tokens == 2


async def test_text_beside_calls_and_two_calls(make_stack: StackFactory) -> None:
    parts: list[Part] = [
        ("Let me check.", ()),
        ("", [delta(0, '{"city":"Oslo"}', "call_a", "get_weather")]),
        ("", [delta(1, "", "call_b", "get_time"), delta(1, "{}")]),
    ]
    stack = await make(make_stack, one_choice(parts))
    async with httpx.AsyncClient(base_url=stack.url, timeout=30) as http:
        response = await http.post(
            "/v1/chat/completions", json={"model": MODEL, "messages": MSG, "tools": [WEATHER_TOOL, TIME_TOOL]}
        )
    [choice] = response.json()["choices"]
    assert choice == {
        "index": 0,
        "message": {
            "role": "assistant",
            "content": "Let me check.",
            "tool_calls": [
                {"id": "call_a", "type": "function", "function": {"name": "get_weather", "arguments": '{"city":"Oslo"}'}},
                {"id": "call_b", "type": "function", "function": {"name": "get_time", "arguments": "{}"}},
            ],
        },
        "finish_reason": "tool_calls",
        "logprobs": None,
    }


async def test_a_plain_answer_has_no_tool_calls_field(make_stack: StackFactory) -> None:
    stack = await make(make_stack)
    async with httpx.AsyncClient(base_url=stack.url, timeout=30) as http:
        response = await http.post("/v1/chat/completions", json={"model": MODEL, "messages": MSG, "tools": [TIME_TOOL]})
    [choice] = response.json()["choices"]
    assert choice["message"] == {"role": "assistant", "content": "Hello there"}
    assert choice["finish_reason"] == "stop"


async def sse_chunks(http: httpx.AsyncClient, body: dict[str, Any]) -> list[dict[str, Any]]:
    response = await http.post("/v1/chat/completions", json={**body, "stream": True})
    assert response.status_code == 200, response.text
    lines = [line.removeprefix("data: ") for line in response.text.split("\n\n") if line.startswith("data: ")]
    assert lines[-1] == "[DONE]"
    return [json.loads(line) for line in lines[:-1]]


async def test_streamed_calls_in_openais_chunk_format(make_stack: StackFactory) -> None:
    stack = await make(make_stack, one_choice(WEATHER_CALL))
    async with httpx.AsyncClient(base_url=stack.url, timeout=30) as http:
        chunks = await sse_chunks(http, {"model": MODEL, "messages": MSG, "tools": [WEATHER_TOOL]})
    deltas = [c["choices"][0] for c in chunks]
    assert deltas == [
        {"index": 0, "delta": {"role": "assistant", "content": ""}, "finish_reason": None, "logprobs": None},
        {
            "index": 0,
            "delta": {
                "tool_calls": [
                    {"index": 0, "id": "call_w1", "type": "function", "function": {"name": "get_weather", "arguments": '{"city": '}}
                ]
            },
            "finish_reason": None,
            "logprobs": None,
        },
        {"index": 0, "delta": {"tool_calls": [{"index": 0, "function": {"arguments": '"Paris"}'}}]}, "finish_reason": None, "logprobs": None},
        {"index": 0, "delta": {}, "finish_reason": "tool_calls", "logprobs": None},
    ]  # fmt: skip


async def test_the_sdk_reassembles_a_streamed_call_into_the_whole_answer(make_stack: StackFactory) -> None:
    parts: list[Part] = [
        ("", [delta(0, "", "call_x", "get_weather")]),
        ("", [delta(0, '{"ci')]),
        ("", [delta(0, 'ty": "Rome"}'), delta(1, '{"', "call_y", "get_time")]),
        ("", [delta(1, '"}')]),
    ]
    stack = await make(make_stack, one_choice(parts))
    client = stack.openai()
    whole = await client.chat.completions.create(model=MODEL, messages=MSG, tools=[WEATHER_TOOL, TIME_TOOL])
    calls: dict[int, dict[str, str]] = {}
    finish = None
    stream = await client.chat.completions.create(
        model=MODEL, messages=MSG, tools=[WEATHER_TOOL, TIME_TOOL], stream=True
    )
    async for chunk in stream:
        for choice in chunk.choices:
            for piece in choice.delta.tool_calls or ():
                entry = calls.setdefault(piece.index, {"id": "", "name": "", "arguments": ""})
                entry["id"] += piece.id or ""
                entry["name"] += (piece.function and piece.function.name) or ""
                entry["arguments"] += (piece.function and piece.function.arguments) or ""
            finish = choice.finish_reason or finish
    expected = [
        {"id": c.id, "name": c.function.name, "arguments": c.function.arguments}
        for c in whole.choices[0].message.tool_calls or ()
    ]
    assert [calls[i] for i in sorted(calls)] == expected
    assert expected == [
        {"id": "call_x", "name": "get_weather", "arguments": '{"city": "Rome"}'},
        {"id": "call_y", "name": "get_time", "arguments": '{""}'},
    ]
    assert finish == whole.choices[0].finish_reason == "tool_calls"


# app_metadata.tool.


async def test_the_tool_of_the_last_result_reaches_the_record(make_stack: StackFactory) -> None:
    stack = await make(make_stack)
    client = stack.openai()
    await client.chat.completions.create(model=MODEL, messages=HISTORY, extra_body={"app_metadata": META})
    record = await stack.records.next()
    assert (record.app_metadata.agent_id, record.app_metadata.tool) == ("planner", "get_time")
    assert stack.scheduler.schedule_calls[-1].app_metadata.tool == "get_time"
    assert stack.worker.calls[-1].app_metadata.tool == "get_time"
    # A value the application sent wins.
    await client.chat.completions.create(
        model=MODEL, messages=HISTORY, extra_body={"app_metadata": {**META, "tool": "my-tool"}}
    )
    assert (await stack.records.next()).app_metadata.tool == "my-tool"
    # A last turn that is not a tool result names no tool.
    await client.chat.completions.create(model=MODEL, messages=[*HISTORY, {"role": "user", "content": "thanks"}],
                                         extra_body={"app_metadata": META})  # fmt: skip
    assert not (await stack.records.next()).app_metadata.HasField("tool")


async def test_the_tool_is_derived_for_a_session_tagged_by_headers(make_stack: StackFactory) -> None:
    stack = await make(make_stack)
    async with httpx.AsyncClient(base_url=stack.url, timeout=30) as http:
        response = await http.post(
            "/v1/chat/completions",
            json={"model": MODEL, "messages": HISTORY[:3]},
            headers={"x-session-id": "sess-9"},
        )
    assert response.status_code == 200
    record = await stack.records.next()
    assert (record.app_metadata.workflow_id, record.app_metadata.tool) == ("sess-9", "get_weather")
