"""The Gateway gRPC service against POST /v1/chat/completions: the same request reaches the
worker the same way, is refused with the same message, and answers with the same choices and
calls; docs/grpc-client.md's example runs as written."""

from __future__ import annotations

import asyncio
import json
import re
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import grpc
import httpx
import pytest

from clairvoyant.contracts.v1 import common_pb2, gateway_pb2, gateway_pb2_grpc, worker_pb2
from tests.gateway.conftest import Stack, StackFactory
from tests.gateway.fakes import MODEL
from tests.gateway.test_grpc_api import detail
from tests.gateway.test_tools_openai import Part, ScriptedWorker, delta

pytestmark = pytest.mark.integration

DOC = Path(__file__).resolve().parents[2] / "docs" / "grpc-client.md"
SCHEMA = {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}
TOOL_JSON = {"type": "function", "function": {"name": "get_weather", "description": "w", "parameters": SCHEMA}}
TOOL = common_pb2.Tool(name="get_weather", description="w", parameters_json=json.dumps(SCHEMA))
USER = common_pb2.ChatMessage(role="user", content="weather?")
CALL = common_pb2.ToolCall(id="call_1", name="get_weather", arguments='{"city":"Oslo"}')
FUNCTION = common_pb2.ToolChoice.FUNCTION


def answers(request: worker_pb2.GenerateRequest) -> Sequence[Sequence[Part]]:
    """A call when the request has tools the model may call, else JSON text; choice i of n."""
    may_call = request.tools and request.tool_choice.mode != common_pb2.ToolChoice.NONE
    if may_call:
        one: list[Part] = [("", [delta(0, '{"city":', "call_g1", "get_weather")]), ("", [delta(0, '"Oslo"}')])]
    else:
        one = [('{"city": ', ()), ('"Oslo", "sunny": true}', ())]
    return [one if i % 2 == 0 else [("plain", ())] for i in range(max(1, request.sampling.n))]


async def make(make_stack: StackFactory) -> Stack:
    return await make_stack(workers=[ScriptedWorker(script=answers)])


# (case, gRPC request fields, the same request's HTTP body fields)
SAME: list[tuple[str, dict[str, Any], dict[str, Any]]] = [
    (
        "named tool",
        {"tools": [TOOL], "tool_choice": common_pb2.ToolChoice(mode=FUNCTION, function_name="get_weather"),
         "parallel_tool_calls": False},
        {"tools": [TOOL_JSON], "tool_choice": {"type": "function", "function": {"name": "get_weather"}},
         "parallel_tool_calls": False},
    ),
    ("required", {"tools": [TOOL], "tool_choice": common_pb2.ToolChoice(mode=common_pb2.ToolChoice.REQUIRED)},
     {"tools": [TOOL_JSON], "tool_choice": "required"}),
    ("auto", {"tools": [TOOL]}, {"tools": [TOOL_JSON]}),
    (
        "schema and n",
        {"sampling": common_pb2.SamplingParams(
            n=3, seed=4, temperature=0.5, max_tokens=20,
            constraint=common_pb2.OutputConstraint(json_schema=json.dumps(SCHEMA, separators=(",", ":"))))},
        {"n": 3, "seed": 4, "temperature": 0.5, "max_tokens": 20,
         "response_format": {"type": "json_schema", "json_schema": {"name": "weather", "schema": SCHEMA}}},
    ),
    ("json object", {"sampling": common_pb2.SamplingParams(constraint=common_pb2.OutputConstraint(json_object=True))},
     {"response_format": {"type": "json_object"}}),
    ("regex", {"sampling": common_pb2.SamplingParams(constraint=common_pb2.OutputConstraint(regex="[a-z]+"))},
     {"guided_regex": "[a-z]+"}),
    ("choice", {"sampling": common_pb2.SamplingParams(
        constraint=common_pb2.OutputConstraint(choice=common_pb2.ChoiceList(choices=["yes", "no"])))},
     {"guided_choice": ["yes", "no"]}),
    ("grammar", {"sampling": common_pb2.SamplingParams(constraint=common_pb2.OutputConstraint(ebnf='root ::= "a"'))},
     {"guided_grammar": 'root ::= "a"'}),
    (
        "a call and its result",
        {"messages": [USER, common_pb2.ChatMessage(role="assistant", tool_calls=[CALL]),
                      common_pb2.ChatMessage(role="tool", tool_call_id="call_1", content="sunny")],
         "tools": [TOOL], "tool_choice": common_pb2.ToolChoice(mode=common_pb2.ToolChoice.NONE)},
        {"messages": [{"role": "user", "content": "weather?"},
                      {"role": "assistant", "content": "", "tool_calls": [
                          {"id": "call_1", "type": "function",
                           "function": {"name": "get_weather", "arguments": '{"city":"Oslo"}'}}]},
                      {"role": "tool", "tool_call_id": "call_1", "content": "sunny"}],
         "tools": [TOOL_JSON], "tool_choice": "none"},
    ),
]  # fmt: skip


def grpc_request(**fields: Any) -> gateway_pb2.ChatCompletionRequest:
    return gateway_pb2.ChatCompletionRequest(**{"model": MODEL, "messages": [USER], **fields})


def http_body(fields: dict[str, Any]) -> dict[str, Any]:
    return {"model": MODEL, "messages": [{"role": "user", "content": "weather?"}], **fields}


def asked(call: worker_pb2.GenerateRequest) -> worker_pb2.GenerateRequest:
    """What the worker was asked, without what differs per request (its id)."""
    msg = worker_pb2.GenerateRequest()
    msg.CopyFrom(call)
    msg.request_id = ""
    return msg


@pytest.mark.parametrize(("case", "grpc_fields", "http_fields"), SAME, ids=[c[0] for c in SAME])
async def test_the_worker_is_asked_the_same(
    make_stack: StackFactory, case: str, grpc_fields: dict[str, Any], http_fields: dict[str, Any]
) -> None:
    stack = await make(make_stack)
    async with grpc.aio.insecure_channel(stack.grpc_address) as channel:
        await gateway_pb2_grpc.GatewayStub(channel).ChatCompletion(grpc_request(**grpc_fields))
    async with httpx.AsyncClient(base_url=stack.url, timeout=30) as http:
        response = await http.post("/v1/chat/completions", json=http_body(http_fields))
    assert response.status_code == 200, response.text
    over_grpc, over_http = stack.worker.calls
    assert asked(over_grpc) == asked(over_http)
    assert over_grpc.sampling.n == (grpc_fields.get("sampling", common_pb2.SamplingParams()).n or 1)


# (case, gRPC request fields, HTTP body fields, param)
REFUSED: list[tuple[str, dict[str, Any], dict[str, Any], str]] = [
    ("unknown function", {"tools": [TOOL], "tool_choice": common_pb2.ToolChoice(mode=FUNCTION, function_name="nope")},
     {"tools": [TOOL_JSON], "tool_choice": {"type": "function", "function": {"name": "nope"}}}, "tool_choice"),
    ("required, no tools", {"tool_choice": common_pb2.ToolChoice(mode=common_pb2.ToolChoice.REQUIRED)},
     {"tool_choice": "required"}, "tool_choice"),
    ("tool name", {"tools": [common_pb2.Tool(name="a b")]},
     {"tools": [{"type": "function", "function": {"name": "a b", "description": "", "strict": False}}]},
     "tools[0].function.name"),
    ("tools twice", {"tools": [TOOL, TOOL]}, {"tools": [TOOL_JSON, TOOL_JSON]}, "tools"),
    ("parameters", {"tools": [common_pb2.Tool(name="f", parameters_json="[1]")]},
     {"tools": [{"type": "function", "function": {"name": "f", "parameters": [1]}}]}, "tools[0].function.parameters"),
    ("constraint beside tools", {"tools": [TOOL], "sampling": common_pb2.SamplingParams(
        constraint=common_pb2.OutputConstraint(regex="a"))},
     {"tools": [TOOL_JSON], "guided_regex": "a"}, "guided_regex"),
    ("schema text", {"sampling": common_pb2.SamplingParams(constraint=common_pb2.OutputConstraint(json_schema="{x"))},
     {"guided_json": "{x"}, "guided_json"),
    ("n", {"sampling": common_pb2.SamplingParams(n=9)}, {"n": 9}, "n"),
    ("tool turn without id", {"messages": [USER, common_pb2.ChatMessage(role="tool", content="5")]},
     {"messages": [{"role": "user", "content": "weather?"}, {"role": "tool", "content": "5"}]},
     "messages[1].tool_call_id"),
    ("call name", {"messages": [USER, common_pb2.ChatMessage(
        role="assistant", tool_calls=[common_pb2.ToolCall(id="c", name="a.b", arguments="{}")])]},
     {"messages": [{"role": "user", "content": "weather?"}, {"role": "assistant", "content": "", "tool_calls": [
         {"id": "c", "type": "function", "function": {"name": "a.b", "arguments": "{}"}}]}]},
     "messages[1].tool_calls[0].function.name"),
]  # fmt: skip


async def test_refusals_carry_the_same_message(make_stack: StackFactory) -> None:
    stack = await make(make_stack)
    wrong = []
    async with (
        grpc.aio.insecure_channel(stack.grpc_address) as channel,
        httpx.AsyncClient(base_url=stack.url, timeout=30) as http,
    ):
        stub = gateway_pb2_grpc.GatewayStub(channel)
        for case, grpc_fields, http_fields, param in REFUSED:
            response = await http.post("/v1/chat/completions", json=http_body(http_fields))
            error = response.json()["error"]
            with pytest.raises(grpc.aio.AioRpcError) as caught:
                await stub.ChatCompletion(grpc_request(**grpc_fields))
            got = detail(caught.value)
            if (
                response.status_code != 400
                or caught.value.code() != grpc.StatusCode.INVALID_ARGUMENT
                or (got.param, got.code, got.message) != (error["param"], error["code"], error["message"])
                or error["param"] != param
            ):
                wrong.append(f"{case}: http {response.status_code} {error}; grpc {caught.value.code()} {got}")
    assert wrong == []
    assert stack.scheduler.schedule_calls == []


async def test_choices_and_calls_whole_and_streamed(make_stack: StackFactory) -> None:
    stack = await make(make_stack)
    request = grpc_request(tools=[TOOL], sampling=common_pb2.SamplingParams(n=2), include_usage=True)
    async with grpc.aio.insecure_channel(stack.grpc_address) as channel:
        stub = gateway_pb2_grpc.GatewayStub(channel)
        reply = await stub.ChatCompletion(request)
        chunks = [chunk async for chunk in stub.ChatCompletionStream(request)]
    assert [(c.index, c.content, c.finish_reason) for c in reply.choices] == [(0, "", "tool_calls"), (1, "plain", "stop")]
    [call] = reply.choices[0].tool_calls
    assert (call.id, call.name, call.arguments) == ("call_g1", "get_weather", '{"city":"Oslo"}')
    assert list(reply.tool_calls) == [call] and reply.finish_reason == "tool_calls"
    assert reply.usage.completion_tokens == 3
    pieces = [d for c in chunks if c.index == 0 for d in c.tool_calls]
    assert [(d.index, d.id, d.name, d.arguments) for d in pieces] == [
        (0, "call_g1", "get_weather", '{"city":'), (0, "", "", '"Oslo"}'),
    ]  # fmt: skip
    assert "".join(c.delta for c in chunks if c.index == 1) == "plain"
    finishes = [(c.index, c.finish_reason) for c in chunks if c.HasField("finish_reason")]
    assert sorted(finishes) == [(0, "tool_calls"), (1, "stop")]
    assert [c.HasField("usage") for c in chunks] == [False] * (len(chunks) - 1) + [True]
    assert chunks[-1].usage.completion_tokens == 3


def doc_example() -> str:
    blocks = re.findall(r"```python\n(.*?)```", DOC.read_text(), re.DOTALL)
    return str(blocks[0])


async def test_the_documented_client_runs(make_stack: StackFactory) -> None:
    stack = await make(make_stack)
    namespace: dict[str, Any] = {"__name__": "grpc_client_example"}
    exec(compile(doc_example(), str(DOC), "exec"), namespace)  # noqa: S102 - our own doc's example
    # The example is synchronous grpcio; the gateway serves on this event loop.
    result = await asyncio.to_thread(namespace["main"], stack.grpc_address, "not-needed", MODEL)
    assert result == {
        "call": {"id": "call_g1", "name": "get_weather", "arguments": {"city": "Oslo"}},
        "answer": '{"city": "Oslo", "sunny": true}',
        "finish_reason": "stop",
    }
    first, second = stack.worker.calls
    assert (first.tool_choice.mode, first.tool_choice.function_name) == (FUNCTION, "get_weather")
    assert second.sampling.constraint.WhichOneof("kind") == "json_schema"
    assert json.loads(second.sampling.constraint.json_schema)["required"] == ["city", "sunny"]
    assert [(m.role, m.tool_call_id) for m in second.chat.messages] == [
        ("user", ""), ("assistant", ""), ("tool", "call_g1"),
    ]  # fmt: skip
    assert [c.id for c in second.chat.messages[1].tool_calls] == ["call_g1"]
