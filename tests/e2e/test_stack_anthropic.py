"""Anthropic's Messages API end to end on a real stack (tiny-random) through the official anthropic
SDK: a tool-use round trip and a streamed tool_use message.  tiny-random writes random text, so each
call is forced with a tool choice; the worker's grammar is what makes its input valid."""

from __future__ import annotations

import asyncio
import json
from typing import Any

import anthropic
import jsonschema
import pytest

from clairvoyant.stack import Stack
from tests.e2e.conftest import records

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(300)]
MODEL = "tiny-random"
# Enums and booleans only: a random model under a grammar still has to finish its call soon.
SCHEMA: dict[str, Any] = {
    "type": "object",
    "properties": {"city": {"enum": ["Paris", "Tokyo", "Lima"]}, "celsius": {"type": "boolean"}},
    "required": ["city", "celsius"],
    "additionalProperties": False,
}
WEATHER = {"name": "get_weather", "description": "The weather in a city", "input_schema": SCHEMA}
FORCED = {"type": "tool", "name": "get_weather", "disable_parallel_tool_use": True}
GREEDY = {"temperature": 0}  # the SDK's create() takes no temperature: it travels in the body
ASK = [{"role": "user", "content": "What is the weather in Paris?"}]
RAW_EVENTS = {
    "message_start",
    "content_block_start",
    "content_block_delta",
    "content_block_stop",
    "message_delta",
    "message_stop",
}


def client(stack: Stack) -> anthropic.Anthropic:
    return anthropic.Anthropic(base_url=stack.gateway_url, api_key="none", max_retries=0, timeout=120)


def test_a_tool_use_round_trip(stack: Stack) -> None:
    sdk = client(stack)
    meta = {"workflow_type_id": "weather", "workflow_id": "wf-anthropic-tools", "agent_id": "forecaster"}
    first = sdk.messages.create(
        model=MODEL,
        max_tokens=128,
        messages=ASK,
        tools=[WEATHER],
        tool_choice=FORCED,
        extra_body={"app_metadata": meta, **GREEDY},
    )
    assert first.stop_reason == "tool_use", first
    [use] = [block for block in first.content if block.type == "tool_use"]  # one call: no parallel use
    assert use.name == "get_weather" and use.id.startswith("toolu_")
    jsonschema.validate(use.input, SCHEMA)

    history = [
        *ASK,
        {"role": "assistant", "content": first.content},
        {
            "role": "user",
            "content": [{"type": "tool_result", "tool_use_id": use.id, "content": "18 C, sunny"}],
        },
    ]
    second = sdk.messages.create(
        model=MODEL,
        max_tokens=12,
        messages=history,
        tools=[WEATHER],
        tool_choice={"type": "none"},
        extra_body={"app_metadata": meta, **GREEDY},
    )
    assert second.stop_reason in ("end_turn", "max_tokens")
    assert [block.type for block in second.content] == ["text"]
    assert second.usage.output_tokens >= 1
    # The answer's prompt holds the call and its result: longer than the question's.
    assert second.usage.input_tokens + second.usage.cache_read_input_tokens > (
        first.usage.input_tokens + first.usage.cache_read_input_tokens
    )

    found = asyncio.run(records(stack, 2, workflow_id="wf-anthropic-tools"))
    assert [(r.endpoint, r.finish_reason) for r in found] == [
        ("messages", "tool_calls"),
        ("messages", {"max_tokens": "length", "end_turn": "stop"}[second.stop_reason]),
    ]
    # The second call follows get_weather's result: its record names the tool.
    assert [r.app_metadata.tool if r.app_metadata.HasField("tool") else None for r in found] == [
        None,
        "get_weather",
    ]


def test_a_streamed_tool_use_message(stack: Stack) -> None:
    sdk = client(stack)
    kwargs: dict[str, Any] = {
        "model": MODEL,
        "max_tokens": 128,
        "messages": [{"role": "user", "content": "And in Lima?"}],
        "tools": [WEATHER],
        "tool_choice": FORCED,
        "extra_body": GREEDY,
    }
    with sdk.messages.stream(**kwargs) as stream:
        events = [event for event in stream if event.type in RAW_EVENTS]
        final = stream.get_final_message()
    names = [event.type for event in events]
    assert names[0] == "message_start" and names[-2:] == ["message_delta", "message_stop"]
    starts = [event.content_block for event in events if event.type == "content_block_start"]
    assert [block.type for block in starts][-1] == "tool_use"
    fragments = "".join(
        event.delta.partial_json
        for event in events
        if event.type == "content_block_delta" and event.delta.type == "input_json_delta"
    )
    [use] = [block for block in final.content if block.type == "tool_use"]
    assert json.loads(fragments) == use.input  # the fragments spell the input the SDK assembled
    jsonschema.validate(use.input, SCHEMA)
    assert final.stop_reason == "tool_use"

    # Greedy: the whole answer makes the same call.
    whole = sdk.messages.create(**kwargs)
    [again] = [block for block in whole.content if block.type == "tool_use"]
    assert (again.name, again.input) == (use.name, use.input)
