"""End to end through the official openai SDK: gateway -> scheduler -> worker -> JetStream record."""

from __future__ import annotations

import asyncio
import json
import time

import httpx
import openai
import pytest
from openai import AsyncOpenAI, OpenAI

from clairvoyant.contracts.v1 import common_pb2
from clairvoyant.stack import Stack
from tests.e2e.conftest import records  # noqa: F401  (other e2e tests import it from here)

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(300)]
MODEL = "tiny-random"
META = {"workflow_type_id": "coding_assistant", "workflow_id": "wf-e2e-1", "agent_id": "engineer"}


def client(stack: Stack) -> OpenAI:
    return OpenAI(base_url=f"{stack.gateway_url}/v1", api_key="none", max_retries=0)


def worker_load(stack: Stack) -> list[dict[str, int]]:
    return [httpx.get(f"{url}/get_server_info", timeout=5).json() for url in stack.worker_http_urls]


def test_models_lists_the_served_model(stack: Stack) -> None:
    models = client(stack).models.list()
    assert [m.id for m in models.data] == [MODEL]


def test_chat_non_streaming_and_record(stack: Stack) -> None:
    meta = {**META, "workflow_id": "wf-nonstream"}
    reply = client(stack).chat.completions.create(
        model=MODEL,
        messages=[{"role": "user", "content": "hello there"}],
        max_tokens=12,
        temperature=0,
        extra_body={"app_metadata": meta, "ignore_eos": True},
    )
    assert reply.choices[0].finish_reason == "length"
    assert reply.usage.completion_tokens == 12
    assert reply.usage.prompt_tokens > 0
    assert reply.choices[0].message.role == "assistant"
    found = asyncio.run(records(stack, 1, workflow_id="wf-nonstream"))
    assert len(found) == 1
    record = found[0]
    assert record.tenant == "default"
    assert (record.app_metadata.workflow_type_id, record.app_metadata.agent_id) == (
        "coding_assistant",
        "engineer",
    )
    assert record.model == MODEL
    assert record.worker_id in ("worker-1", "worker-2")
    assert record.output_tokens == 12 and record.prompt_tokens == reply.usage.prompt_tokens
    assert record.status == common_pb2.REQUEST_STATUS_OK and record.finish_reason == "length"
    t = record.timing
    assert 0 < t.arrival_time <= t.scheduled_time <= t.first_token_time <= t.end_time


def test_greedy_is_deterministic_and_streaming_matches(stack: Stack) -> None:
    kwargs = dict(
        model=MODEL,
        messages=[{"role": "user", "content": "stream me"}],
        max_tokens=10,
        temperature=0,
        extra_body={"ignore_eos": True},
    )
    whole = client(stack).chat.completions.create(**kwargs).choices[0].message.content
    stream = client(stack).chat.completions.create(
        stream=True, stream_options={"include_usage": True}, **kwargs
    )
    pieces, finish, usage = [], None, None
    for chunk in stream:
        if chunk.usage is not None:
            usage = chunk.usage
        for choice in chunk.choices:
            pieces.append(choice.delta.content or "")
            finish = choice.finish_reason or finish
    assert "".join(pieces) == whole
    assert finish == "length"
    assert usage is not None and usage.completion_tokens == 10


def test_completions_endpoint(stack: Stack) -> None:
    reply = client(stack).completions.create(
        model=MODEL, prompt="abc", max_tokens=5, temperature=0, extra_body={"ignore_eos": True}
    )
    assert reply.choices[0].finish_reason == "length"
    assert reply.usage.completion_tokens == 5


def test_32_concurrent_requests_complete_on_both_workers(stack: Stack) -> None:
    async def run() -> list[int]:
        api = AsyncOpenAI(base_url=f"{stack.gateway_url}/v1", api_key="none", max_retries=0, timeout=120)
        replies = await asyncio.gather(
            *[
                api.chat.completions.create(
                    model=MODEL,
                    messages=[{"role": "user", "content": f"request {i}"}],
                    max_tokens=8,
                    temperature=0,
                    extra_body={"ignore_eos": True, "app_metadata": {**META, "workflow_id": "wf-burst"}},
                )
                for i in range(32)
            ]
        )
        await api.close()
        return [r.usage.completion_tokens for r in replies]

    assert asyncio.run(run()) == [8] * 32
    burst = asyncio.run(records(stack, 32, workflow_id="wf-burst"))
    assert len(burst) == 32
    assert {r.worker_id for r in burst} == {"worker-1", "worker-2"}


def test_cancelled_stream_frees_worker_blocks(stack: Stack) -> None:
    before = sum(w["running"] for w in worker_load(stack))
    assert before == 0
    with httpx.stream(
        "POST",
        f"{stack.gateway_url}/v1/chat/completions",
        timeout=30,
        json={
            "model": MODEL,
            "messages": [{"role": "user", "content": "long one"}],
            "max_tokens": 1500,
            "ignore_eos": True,
            "stream": True,
            "app_metadata": {**META, "workflow_id": "wf-cancel"},
        },
    ) as response:
        assert response.status_code == 200
        lines = response.iter_lines()
        for line in lines:
            if line.startswith("data: ") and json.loads(line[6:])["choices"][0]["delta"].get("content"):
                break
        busy = sum(w["running"] for w in worker_load(stack))
        assert busy == 1
    # Leaving the block closed the connection; the worker must abort the sequence promptly.
    deadline = time.monotonic() + 10
    while sum(w["running"] for w in worker_load(stack)) and time.monotonic() < deadline:
        time.sleep(0.1)
    load = worker_load(stack)
    assert sum(w["running"] for w in load) == 0
    # Only the prefix cache may still hold blocks; nothing belongs to a live sequence.
    assert [w["kv_blocks_used"] for w in load] == [w["kv_blocks_cached"] for w in load]
    cancelled = asyncio.run(records(stack, 1, workflow_id="wf-cancel"))
    assert len(cancelled) == 1
    assert cancelled[0].status == common_pb2.REQUEST_STATUS_CANCELLED
    assert 0 < cancelled[0].output_tokens < 1500


def test_logit_bias_and_penalties_reach_the_engine(stack: Stack) -> None:
    forced = 42
    reply = client(stack).completions.create(
        model=MODEL, prompt="bias me", max_tokens=6, temperature=0, logit_bias={str(forced): 100},
        extra_body={"ignore_eos": True, "app_metadata": {**META, "workflow_id": "wf-bias"}},
    )  # fmt: skip
    assert reply.usage.completion_tokens == 6
    (record,) = asyncio.run(records(stack, 1, workflow_id="wf-bias"))
    assert list(record.output_token_ids) == [forced] * 6
    # The same greedy request with a frequency penalty cannot repeat a token 6 times over.
    penalised = client(stack).completions.create(
        model=MODEL, prompt="bias me", max_tokens=6, temperature=0, logit_bias={str(forced): 2},
        frequency_penalty=2, presence_penalty=2,
        extra_body={"ignore_eos": True, "app_metadata": {**META, "workflow_id": "wf-penalty"}},
    )  # fmt: skip
    assert penalised.usage.completion_tokens == 6
    (record,) = asyncio.run(records(stack, 1, workflow_id="wf-penalty"))
    assert len(set(record.output_token_ids)) > 1


def test_a_logit_bias_past_the_vocabulary_is_a_400_naming_it(stack: Stack) -> None:
    with pytest.raises(openai.BadRequestError) as caught:
        client(stack).completions.create(model=MODEL, prompt="x", max_tokens=2, logit_bias={"99999999": 5})
    assert caught.value.status_code == 400 and caught.value.body["param"] == "logit_bias"  # type: ignore[index]
    with pytest.raises(openai.BadRequestError) as caught:
        client(stack).completions.create(model=MODEL, prompt="x", max_tokens=2, logit_bias={"5": 500})
    assert caught.value.body["param"] == "logit_bias"  # type: ignore[index]


def test_logprobs_on_chat_and_completions_streamed_or_not(stack: Stack) -> None:
    messages = [{"role": "user", "content": "log my probabilities"}]
    whole = client(stack).chat.completions.create(
        model=MODEL, messages=messages, max_tokens=5, temperature=0, logprobs=True, top_logprobs=2,
        extra_body={"ignore_eos": True},
    )  # fmt: skip
    content = whole.choices[0].logprobs.content  # type: ignore[union-attr]
    assert len(content) == whole.usage.completion_tokens == 5
    for entry in content:
        assert len(entry.top_logprobs) == 2 and entry.top_logprobs[0].logprob == entry.logprob <= 0  # greedy
        assert entry.bytes == list(entry.token.encode())
    stream = client(stack).chat.completions.create(
        model=MODEL, messages=messages, max_tokens=5, temperature=0, logprobs=True, top_logprobs=2, stream=True,
        extra_body={"ignore_eos": True},
    )  # fmt: skip
    streamed = [
        e
        for chunk in stream
        if chunk.choices and chunk.choices[0].logprobs
        for e in chunk.choices[0].logprobs.content
    ]
    assert [(e.token, e.logprob) for e in streamed] == [(e.token, e.logprob) for e in content]

    text = client(stack).completions.create(
        model=MODEL, prompt="log my probabilities", max_tokens=5, temperature=0, logprobs=1,
        extra_body={"ignore_eos": True},
    )  # fmt: skip
    lp = text.choices[0].logprobs
    assert lp is not None and len(lp.tokens) == len(lp.token_logprobs) == len(lp.text_offset) == 5
    assert lp.text_offset == [sum(len(t) for t in lp.tokens[:i]) for i in range(5)]
    assert all(len(top) >= 1 for top in lp.top_logprobs or [])
    plain = client(stack).completions.create(model=MODEL, prompt="x", max_tokens=2)
    assert plain.choices[0].logprobs is None  # only when asked for
