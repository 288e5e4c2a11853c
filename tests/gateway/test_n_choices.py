"""n choices through the gateway's OpenAI APIs: one Generate call asks the worker for all of
them, the answer lists them in index order (streamed: each chunk tagged with its choice, each
choice closed by its own finish chunk), and the usage counts them all."""

from __future__ import annotations

import json
from collections import defaultdict
from collections.abc import Sequence
from typing import Any

import httpx
import pytest

from clairvoyant.contracts.v1 import worker_pb2
from tests.gateway.conftest import Stack, StackFactory
from tests.gateway.fakes import MODEL
from tests.gateway.test_tools_openai import Part, ScriptedWorker, delta

pytestmark = pytest.mark.integration

MSG = [{"role": "user", "content": "name a colour"}]


def colours(request: worker_pb2.GenerateRequest) -> Sequence[Sequence[Part]]:
    """Choice i says colour i in i + 1 pieces (so choices finish at different steps)."""
    names = ["red", "green", "blue", "cyan", "magenta", "yellow", "black", "white"]
    return [[(f"{names[i]}" if step == 0 else ".", ()) for step in range(i + 1)] for i in range(request.sampling.n)]


async def make(make_stack: StackFactory, script: Any = colours) -> Stack:
    return await make_stack(workers=[ScriptedWorker(script=script)])


async def events(http: httpx.AsyncClient, path: str, body: dict[str, Any]) -> list[dict[str, Any]]:
    response = await http.post(path, json={**body, "stream": True})
    assert response.status_code == 200, response.text
    lines = [line.removeprefix("data: ") for line in response.text.split("\n\n") if line.startswith("data: ")]
    assert lines[-1] == "[DONE]"
    return [json.loads(line) for line in lines[:-1]]


async def test_chat_choices_in_index_order(make_stack: StackFactory) -> None:
    stack = await make(make_stack)
    answer = await stack.openai().chat.completions.create(model=MODEL, messages=MSG, n=3, seed=7, temperature=0.8)
    assert [(c.index, c.message.content, c.finish_reason) for c in answer.choices] == [
        (0, "red", "stop"), (1, "green.", "stop"), (2, "blue..", "stop"),
    ]  # fmt: skip
    [sent] = stack.worker.calls  # one call for every choice: the worker prefills the prompt once
    assert (sent.sampling.n, sent.sampling.seed) == (3, 7)
    assert answer.usage is not None
    assert (answer.usage.prompt_tokens, answer.usage.completion_tokens) == (5, 1 + 2 + 3)
    assert len(stack.scheduler.schedule_calls) == 1
    record = await stack.records.next()
    assert (record.output_tokens, record.finish_reason) == (6, "stop")


async def test_one_choice_is_the_default(make_stack: StackFactory) -> None:
    stack = await make(make_stack)
    answer = await stack.openai().chat.completions.create(model=MODEL, messages=MSG)
    assert [c.message.content for c in answer.choices] == ["red"]
    assert stack.worker.calls[0].sampling.n == 1


async def test_streamed_chat_choices(make_stack: StackFactory) -> None:
    stack = await make(make_stack)
    async with httpx.AsyncClient(base_url=stack.url, timeout=30) as http:
        chunks = await events(
            http, "/v1/chat/completions", {"model": MODEL, "messages": MSG, "n": 3, "stream_options": {"include_usage": True}}
        )
    *choice_chunks, usage = chunks
    assert usage["choices"] == [] and usage["usage"]["completion_tokens"] == 6
    assert all(len(c["choices"]) == 1 for c in choice_chunks)
    by_index: dict[int, list[dict[str, Any]]] = defaultdict(list)
    for chunk in choice_chunks:
        by_index[chunk["choices"][0]["index"]].append(chunk["choices"][0])
    assert sorted(by_index) == [0, 1, 2]
    for index, pieces in by_index.items():
        assert pieces[0]["delta"] == {"role": "assistant", "content": ""}
        text = "".join(p["delta"].get("content", "") for p in pieces)
        assert text == ["red", "green.", "blue.."][index]
        assert [p["finish_reason"] for p in pieces if p["finish_reason"]] == ["stop"]
        assert pieces[-1]["finish_reason"] == "stop" and pieces[-1]["delta"] == {}
    # The choices interleave as the worker decodes them: the shortest (choice 0) ends first.
    order = [(c["choices"][0]["index"], c["choices"][0]["finish_reason"]) for c in choice_chunks]
    assert order.index((0, "stop")) < order.index((2, "stop"))


async def test_the_sdk_streams_n_choices(make_stack: StackFactory) -> None:
    stack = await make(make_stack)
    stream = await stack.openai().chat.completions.create(model=MODEL, messages=MSG, n=2, stream=True)
    texts: dict[int, str] = defaultdict(str)
    finish: dict[int, str] = {}
    async for chunk in stream:
        for choice in chunk.choices:
            texts[choice.index] += choice.delta.content or ""
            if choice.finish_reason:
                finish[choice.index] = choice.finish_reason
    assert dict(texts) == {0: "red", 1: "green."}
    assert finish == {0: "stop", 1: "stop"}


async def test_completions_choices_whole_and_streamed(make_stack: StackFactory) -> None:
    stack = await make(make_stack)
    client = stack.openai()
    answer = await client.completions.create(model=MODEL, prompt="a colour:", n=2)
    assert [(c.index, c.text, c.finish_reason) for c in answer.choices] == [(0, "red", "stop"), (1, "green.", "stop")]
    assert answer.usage is not None and answer.usage.completion_tokens == 3
    async with httpx.AsyncClient(base_url=stack.url, timeout=30) as http:
        chunks = await events(http, "/v1/completions", {"model": MODEL, "prompt": "a colour:", "n": 2})
    texts: dict[int, str] = defaultdict(str)
    finishes = []
    for chunk in chunks:
        [choice] = chunk["choices"]
        texts[choice["index"]] += choice["text"]
        if choice["finish_reason"]:
            finishes.append((choice["index"], choice["finish_reason"]))
    assert dict(texts) == {0: "red", 1: "green."}
    assert sorted(finishes) == [(0, "stop"), (1, "stop")]
    assert [call.sampling.n for call in stack.worker.calls] == [2, 2]


def mixed(request: worker_pb2.GenerateRequest) -> Sequence[Sequence[Part]]:
    """Choice 0 answers in text; choice 1 calls a tool."""
    return [
        [("It is sunny.", ())],
        [("", [delta(0, '{"city":', "call_n1", "get_weather")]), ("", [delta(0, '"Nice"}')])],
    ]


async def test_each_choice_has_its_own_calls_and_finish_reason(make_stack: StackFactory) -> None:
    stack = await make(make_stack, mixed)
    tools = [{"type": "function", "function": {"name": "get_weather", "parameters": {"type": "object"}}}]
    client = stack.openai()
    answer = await client.chat.completions.create(model=MODEL, messages=MSG, n=2, tools=tools)  # type: ignore[list-item]
    first, second = answer.choices
    assert (first.message.content, first.message.tool_calls, first.finish_reason) == ("It is sunny.", None, "stop")
    assert second.finish_reason == "tool_calls" and second.message.content is None
    [call] = second.message.tool_calls or []
    assert (call.id, call.function.name, call.function.arguments) == ("call_n1", "get_weather", '{"city":"Nice"}')  # type: ignore[union-attr]
    async with httpx.AsyncClient(base_url=stack.url, timeout=30) as http:
        chunks = await events(http, "/v1/chat/completions", {"model": MODEL, "messages": MSG, "n": 2, "tools": tools})
    finishes = {c["choices"][0]["index"]: c["choices"][0]["finish_reason"] for c in chunks if c["choices"][0]["finish_reason"]}
    assert finishes == {0: "stop", 1: "tool_calls"}
    calls = [c["choices"][0] for c in chunks if c["choices"][0]["delta"].get("tool_calls")]
    assert {c["index"] for c in calls} == {1}
