"""Tools, structured outputs, n and logprobs on the real stack (tiny-random workers), through the
official openai SDK: whatever the random model writes, the grammar keeps calls and answers valid."""

from __future__ import annotations

import asyncio
import json
import random
import re
import uuid
from collections.abc import Awaitable, Callable
from typing import Any, TypeVar

import httpx
import jsonschema
import pytest
from openai import AsyncOpenAI

from clairvoyant.stack import Stack

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(900)]
MODEL = "tiny-random"
SCHEMAS = 50
CONCURRENCY = 8  # requests in flight: the workers batch them
T = TypeVar("T")


def client(stack: Stack) -> AsyncOpenAI:
    return AsyncOpenAI(base_url=f"{stack.gateway_url}/v1", api_key="none", max_retries=0, timeout=300)


def random_schema(rng: random.Random) -> dict[str, Any]:
    """An object schema whose every value is bounded (so a call always fits max_tokens): short
    strings, enums, integers in a range, short arrays of small integers, booleans."""
    properties: dict[str, Any] = {}
    for k in range(rng.randint(1, 3)):
        kind = rng.choice(["string", "enum", "integer", "array", "boolean"])
        if kind == "string":
            spec: dict[str, Any] = {"type": "string", "maxLength": rng.randint(1, 6)}
        elif kind == "enum":
            spec = {"enum": rng.sample(["red", "green", "blue", "north", "south", "x1"], rng.randint(1, 4))}
        elif kind == "integer":
            low = rng.randint(-50, 50)
            spec = {"type": "integer", "minimum": low, "maximum": low + rng.randint(0, 100)}
        elif kind == "array":
            spec = {
                "type": "array",
                "items": {"type": "integer", "minimum": 0, "maximum": 9},
                "maxItems": rng.randint(1, 3),
            }
        else:
            spec = {"type": "boolean"}
        properties[f"p{k}_{kind}"] = spec
    names = list(properties)
    required = sorted(rng.sample(names, rng.randint(1, len(names))))
    return {"type": "object", "properties": properties, "required": required, "additionalProperties": False}


def tool(name: str, schema: dict[str, Any]) -> dict[str, Any]:
    return {"type": "function", "function": {"name": name, "description": f"the {name} tool", "parameters": schema}}


async def bounded(calls: list[Callable[[], Awaitable[T]]]) -> list[T]:
    gate = asyncio.Semaphore(CONCURRENCY)

    async def run(call: Callable[[], Awaitable[T]]) -> T:
        async with gate:
            return await call()

    return await asyncio.gather(*(run(call) for call in calls))


def test_forced_calls_always_match_the_tools_schema(stack: Stack) -> None:
    """A named tool choice and "required", over random bounded schemas: every call parses, names
    a tool it may, and its arguments validate against that tool's schema."""
    rng = random.Random(20260101)
    schemas = [random_schema(rng) for _ in range(SCHEMAS)]
    other = {"type": "object", "properties": {"q": {"type": "string", "maxLength": 4}}, "required": ["q"],
             "additionalProperties": False}  # fmt: skip

    async def ask(i: int, choice: Any) -> tuple[int, Any, Any]:
        tools = [tool(f"tool_{i}", schemas[i]), tool("lookup", other)]
        async with client(stack) as openai:
            answer = await openai.chat.completions.create(
                model=MODEL,
                messages=[{"role": "user", "content": f"call a tool ({i})"}],
                tools=tools,  # type: ignore[arg-type]
                tool_choice=choice,
                parallel_tool_calls=False,
                max_tokens=256,
                temperature=1.0,
                seed=i,
            )
        return i, choice, answer.choices[0]

    named = [lambda i=i: ask(i, {"type": "function", "function": {"name": f"tool_{i}"}}) for i in range(SCHEMAS)]
    required = [lambda i=i: ask(i, "required") for i in range(SCHEMAS)]
    results = asyncio.run(bounded([*named, *required]))
    wrong = []
    for i, choice, answer in results:
        calls = answer.message.tool_calls or []
        allowed = {f"tool_{i}": schemas[i], "lookup": other}
        if choice != "required":
            allowed = {f"tool_{i}": schemas[i]}
        problem = None
        if answer.finish_reason != "tool_calls" or len(calls) != 1:
            problem = f"finish {answer.finish_reason}, {len(calls)} calls, content {answer.message.content!r}"
        else:
            call = calls[0]
            if call.function.name not in allowed or not call.id:
                problem = f"called {call.function.name!r} (id {call.id!r})"
            else:
                try:
                    jsonschema.validate(json.loads(call.function.arguments), allowed[call.function.name])
                except (ValueError, jsonschema.ValidationError) as exc:
                    problem = f"arguments {call.function.arguments!r}: {str(exc)[:200]}"
        if problem:
            wrong.append(f"schema {i} {choice}: {problem}")
    assert wrong == []
    assert len(results) == 2 * SCHEMAS


def test_streamed_call_pieces_put_together_equal_the_whole_answer(stack: Stack) -> None:
    rng = random.Random(7)
    schemas = [random_schema(rng) for _ in range(5)]

    async def compare(i: int) -> tuple[list[tuple[str, str]], list[tuple[str, str]], list[str]]:
        kwargs: dict[str, Any] = {
            "model": MODEL,
            "messages": [{"role": "user", "content": f"stream a call ({i})"}],
            "tools": [tool("act", schemas[i])],
            "tool_choice": {"type": "function", "function": {"name": "act"}},
            "max_tokens": 256,
            "temperature": 0.9,
            "seed": 1000 + i,
        }
        async with client(stack) as openai:
            whole = await openai.chat.completions.create(**kwargs)
            pieces: dict[int, dict[str, str]] = {}
            firsts: list[str] = []
            stream = await openai.chat.completions.create(**kwargs, stream=True)
            async for chunk in stream:
                deltas = [piece for choice in chunk.choices for piece in choice.delta.tool_calls or ()]
                for piece in deltas:
                    if piece.index not in pieces:
                        # A call's first piece names it.
                        firsts.append(f"{piece.id and 'id'}:{piece.type}:{piece.function and piece.function.name}")
                    entry = pieces.setdefault(piece.index, {"name": "", "arguments": ""})
                    entry["name"] += (piece.function and piece.function.name) or ""
                    entry["arguments"] += (piece.function and piece.function.arguments) or ""
        streamed = [(pieces[k]["name"], pieces[k]["arguments"]) for k in sorted(pieces)]
        calls = [(c.function.name, c.function.arguments) for c in whole.choices[0].message.tool_calls or ()]
        return streamed, calls, firsts

    for streamed, calls, firsts in asyncio.run(bounded([lambda i=i: compare(i) for i in range(len(schemas))])):
        assert calls and streamed == calls
        assert firsts == ["id:function:act"] * len(calls)


def test_a_json_schema_answer_validates(stack: Stack) -> None:
    rng = random.Random(11)
    schemas = [random_schema(rng) for _ in range(10)]

    async def ask(i: int) -> tuple[Any, str | None]:
        async with client(stack) as openai:
            answer = await openai.chat.completions.create(
                model=MODEL,
                messages=[{"role": "user", "content": f"answer in JSON ({i})"}],
                response_format={
                    "type": "json_schema",
                    "json_schema": {"name": f"answer_{i}", "schema": schemas[i], "strict": True},
                },
                max_tokens=256,
                temperature=1.0,
                seed=i,
            )
        return answer.choices[0].finish_reason, answer.choices[0].message.content

    for i, (finish, content) in enumerate(asyncio.run(bounded([lambda i=i: ask(i) for i in range(len(schemas))]))):
        assert finish == "stop", (i, content)
        jsonschema.validate(json.loads(content or ""), schemas[i])


def test_guided_choice_and_regex(stack: Stack) -> None:
    async def ask(extra: dict[str, Any]) -> str:
        async with client(stack) as openai:
            answer = await openai.chat.completions.create(
                model=MODEL, messages=[{"role": "user", "content": "pick"}], max_tokens=32, temperature=1.0,
                seed=3, extra_body=extra,
            )  # fmt: skip
        return answer.choices[0].message.content or ""

    async def both() -> tuple[str, str]:
        return await ask({"guided_choice": ["alpha", "beta", "gamma"]}), await ask({"guided_regex": "[0-9]{3}-[a-z]{2}"})

    picked, matched = asyncio.run(both())
    assert picked in ("alpha", "beta", "gamma")
    assert re.fullmatch("[0-9]{3}-[a-z]{2}", matched), matched


def cached_prompt_tokens(stack: Stack) -> int:
    """``cv_worker_cached_prompt_tokens_total`` summed over the workers (Prometheus text)."""
    total = 0.0
    for url in stack.worker_http_urls:
        text = httpx.get(f"{url}/metrics", timeout=5).text
        [value] = re.findall(r"^cv_worker_cached_prompt_tokens_total (\S+)$", text, re.MULTILINE)
        total += float(value)
    return int(total)


def test_n_choices_share_one_prefill(stack: Stack) -> None:
    """n = 4: four choices, and the prompt is computed once: the three other choices take its whole
    blocks from the prefix cache (each recomputes at most the prompt's last, partial block)."""
    block_size = int(httpx.get(f"{stack.worker_http_urls[0]}/get_server_info", timeout=5).json()["page_size"])
    words = " ".join(uuid.uuid4().hex for _ in range(24))  # a prompt no earlier request shares
    messages = [{"role": "user", "content": f"continue: {words}"}]

    async def ask(n: int) -> Any:
        async with client(stack) as openai:
            return await openai.chat.completions.create(
                model=MODEL, messages=messages, n=n, max_tokens=8, temperature=1.0, seed=5,
                extra_body={"ignore_eos": True},
            )  # fmt: skip

    before = cached_prompt_tokens(stack)
    answer = asyncio.run(ask(4))
    cached = cached_prompt_tokens(stack) - before
    prompt = answer.usage.prompt_tokens
    assert [c.index for c in answer.choices] == [0, 1, 2, 3]
    assert all(c.finish_reason == "length" for c in answer.choices)
    assert answer.usage.completion_tokens == 4 * 8
    assert prompt > 2 * block_size
    computed = 4 * prompt - cached
    assert prompt <= computed <= prompt + 3 * block_size, (prompt, cached, block_size)
    # The same prompt once more, alone: the usage counts it once, as for n = 4.
    assert asyncio.run(ask(1)).usage.prompt_tokens == prompt


def test_logprobs_agree_with_the_engines_scores(stack: Stack) -> None:
    """Greedy: each token is its position's most likely one, so its logprob is the top of its
    top_logprobs; a second scoring of the same text (the prompt then cached, and as two choices)
    gives the same per-token logprobs, hence the same sum."""
    words = " ".join(uuid.uuid4().hex[:8] for _ in range(6))

    async def ask(n: int) -> Any:
        async with client(stack) as openai:
            return await openai.chat.completions.create(
                model=MODEL, messages=[{"role": "user", "content": f"score {words}"}], n=n, max_tokens=12,
                temperature=0, logprobs=True, top_logprobs=5, extra_body={"ignore_eos": True},
            )  # fmt: skip

    first = asyncio.run(ask(1))
    tokens = first.choices[0].logprobs.content
    assert len(tokens) == 12
    for token in tokens:
        best = max(top.logprob for top in token.top_logprobs)
        assert token.logprob == pytest.approx(best, abs=1e-6)
        assert token.top_logprobs[0].logprob == pytest.approx(best, abs=1e-6)
        assert token.logprob <= 0
    total = sum(token.logprob for token in tokens)
    again = asyncio.run(ask(2))
    for choice in again.choices:
        rescored = choice.logprobs.content
        assert [t.token for t in rescored] == [t.token for t in tokens]
        assert [t.logprob for t in rescored] == pytest.approx([t.logprob for t in tokens], abs=1e-4)
        assert sum(t.logprob for t in rescored) == pytest.approx(total, abs=1e-3)
        assert choice.message.content == first.choices[0].message.content
