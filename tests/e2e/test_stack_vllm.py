"""The whole stack over a real vLLM server (CPU build, SmolLM2-135M-Instruct), driven with the
official openai SDK: our gateway, scheduler (``plas``) and one worker that fronts vLLM
(``CV_ENGINE=vllm``) with a single running slot.

Needs ``make install-vllm`` (var/vllm-venv and var/models/smollm2-135m-instruct).  Without it the
module skips, except under CI, where the install is part of the run and its absence is a failure.
"""

from __future__ import annotations

import asyncio
import json
import os
import time
from collections.abc import Iterator
from pathlib import Path

import anthropic
import grpc
import httpx
import jsonschema
import nats
import pytest
from openai import AsyncOpenAI, OpenAI

from clairvoyant.contracts.v1 import cachemgr_pb2, common_pb2, worker_pb2, worker_pb2_grpc
from clairvoyant.core.bus import KV_RESYNC_SUBJECT
from clairvoyant.stack import Stack, StackConfig
from tests.e2e.conftest import records

pytestmark = [pytest.mark.e2e, pytest.mark.vllm, pytest.mark.slow, pytest.mark.timeout(600)]

ROOT = Path(__file__).resolve().parents[2]
VLLM_PYTHON = ROOT / "var/vllm-venv/bin/python"
CHECKPOINT = ROOT / "var/models/smollm2-135m-instruct"
MODEL = "smollm2-135m-instruct"
# Long enough to fill several 32-token vLLM blocks (two of our 16-token blocks each).
SYSTEM = (
    "You are the planner of a software team. You read the task, split it into steps, and hand each "
    "step to the engineer with a short rationale. Keep every answer under three sentences. "
)


def vllm_installed() -> bool:
    return VLLM_PYTHON.exists() and (CHECKPOINT / "model.safetensors").exists()


@pytest.fixture(scope="module")
def stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Stack]:
    if not vllm_installed():
        message = f"vLLM is not installed ({VLLM_PYTHON}, {CHECKPOINT}): run make install-vllm"
        if os.environ.get("CI"):
            pytest.fail(message)
        pytest.skip(message)
    var = tmp_path_factory.mktemp("vllm-stack")
    config = StackConfig.on_free_ports(
        var,
        model=MODEL,
        workers=1,
        policy="plas",
        log_dir=var / "logs",
        worker_env={
            "CV_ENGINE": "vllm",
            "CV_ENGINE_PYTHON": str(VLLM_PYTHON),
            "CV_ENGINE_MODEL": str(CHECKPOINT),
            "CV_ENGINE_LOG": str(var / "logs" / "vllm.log"),
            "CV_MAX_NUM_SEQS": "1",
            "CV_MAX_MODEL_LEN": "2048",
            # vLLM runs a float32 checkpoint in bfloat16 on a CPU unless told; the greedy answers
            # asserted below are the checkpoint's own (in bfloat16 SmolLM2 misses "Paris").
            "CV_ENGINE_ARGS": "--dtype float32",
        },
    )
    stack = Stack(config).start(ready_timeout=420)
    try:
        yield stack
    finally:
        stack.stop()


def worker_address(stack: Stack) -> str:
    return f"127.0.0.1:{stack.config.worker_grpc_base}"


async def worker_stats(stack: Stack) -> worker_pb2.WorkerStats:
    async with grpc.aio.insecure_channel(worker_address(stack)) as channel:
        return await worker_pb2_grpc.WorkerStub(channel).Stats(worker_pb2.WorkerStatsRequest(), timeout=5)


def vllm_metric(url: str, name: str) -> float:
    """One of vLLM's own Prometheus counters, summed over its label sets."""
    text = httpx.get(f"{url}/metrics", timeout=5).text
    return sum(float(line.rsplit(" ", 1)[1]) for line in text.splitlines() if line.startswith(name + "{"))


def chat(stack: Stack) -> OpenAI:
    return OpenAI(base_url=f"{stack.gateway_url}/v1", api_key="none", max_retries=0, timeout=120)


def meta(workflow_id: str, agent_id: str = "planner") -> dict[str, str]:
    return {"workflow_type_id": "planning", "workflow_id": workflow_id, "agent_id": agent_id}


def test_the_worker_reports_vllm_and_what_it_cannot_do(stack: Stack) -> None:
    stats = asyncio.run(worker_stats(stack))
    assert stats.engine == "vllm" and stats.model == MODEL
    assert set(stats.unsupported_directives) == {"drop", "retain", "write_back", "promote"}
    assert stats.max_batch == 1 and stats.block_size == 32  # vLLM's CPU block, as vLLM reports it
    assert stats.kv_blocks_total > 0 and stats.http_address.startswith("http://127.0.0.1:")
    assert vllm_metric(stats.http_address, "vllm:num_requests_running") == 0


def test_streamed_completion_and_its_record(stack: Stack) -> None:
    stream = chat(stack).chat.completions.create(
        model=MODEL,
        messages=[{"role": "user", "content": "What is the capital of France?"}],
        max_tokens=12,
        temperature=0,
        stream=True,
        stream_options={"include_usage": True},
        extra_body={"app_metadata": meta("wf-vllm-stream")},
    )
    pieces, finish, usage = [], None, None
    for chunk in stream:
        if chunk.choices:
            pieces.append(chunk.choices[0].delta.content or "")
            finish = chunk.choices[0].finish_reason or finish
        usage = chunk.usage or usage
    text = "".join(pieces)
    assert "Paris" in text  # SmolLM2 at temperature 0
    assert len([p for p in pieces if p]) > 1  # streamed in pieces, not one block
    assert usage is not None and 0 < usage.completion_tokens <= 12
    (record,) = asyncio.run(records(stack, 1, workflow_id="wf-vllm-stream"))
    assert record.status == common_pb2.REQUEST_STATUS_OK
    assert (record.app_metadata.workflow_type_id, record.app_metadata.agent_id) == ("planning", "planner")
    assert record.worker_id == "worker-1" and record.model == MODEL
    assert record.output_tokens == usage.completion_tokens and record.prompt_tokens == usage.prompt_tokens
    assert len(record.prompt_block_hashes) == usage.prompt_tokens // 16


def test_second_call_of_a_workflow_hits_vllms_prefix_cache(stack: Stack) -> None:
    url = asyncio.run(worker_stats(stack)).http_address
    client = chat(stack)
    history = [
        {"role": "system", "content": SYSTEM * 2},
        {"role": "user", "content": "Task: add a login page."},
    ]
    first = client.chat.completions.create(
        model=MODEL, messages=history, max_tokens=16, temperature=0,
        extra_body={"app_metadata": meta("wf-vllm-prefix")},
    )  # fmt: skip
    hits_before = vllm_metric(url, "vllm:prefix_cache_hits_total")
    history += [
        {"role": "assistant", "content": first.choices[0].message.content or ""},
        {"role": "user", "content": "Now the engineer's step."},
    ]
    second = client.chat.completions.create(
        model=MODEL, messages=history, max_tokens=16, temperature=0,
        extra_body={"app_metadata": meta("wf-vllm-prefix", "engineer")},
    )  # fmt: skip
    hits = vllm_metric(url, "vllm:prefix_cache_hits_total") - hits_before
    # Every full 32-token block of the first call's prompt is a hit for the second (vLLM's count).
    assert hits >= (first.usage.prompt_tokens // 32) * 32 >= 64
    found = asyncio.run(records(stack, 2, workflow_id="wf-vllm-prefix"))
    second_record = next(r for r in found if r.app_metadata.agent_id == "engineer")
    assert second_record.cached_tokens == hits
    assert second.usage.prompt_tokens > first.usage.prompt_tokens


def test_kv_events_arrive_on_our_stream_in_our_hashes(stack: Stack) -> None:
    async def run() -> tuple[list[worker_pb2.KvEventBatch], common_pb2.CompletionRecord]:
        nc = await nats.connect(stack.nats_url)
        batches: list[worker_pb2.KvEventBatch] = []

        async def collect(msg: nats.aio.msg.Msg) -> None:
            batches.append(worker_pb2.KvEventBatch.FromString(msg.data))

        await nc.subscribe("cv.kv.events.worker-1", cb=collect)
        async with AsyncOpenAI(base_url=f"{stack.gateway_url}/v1", api_key="none", max_retries=0) as client:
            await client.chat.completions.create(
                model=MODEL, max_tokens=8, temperature=0,
                messages=[{"role": "system", "content": "KV events: " + SYSTEM}, {"role": "user", "content": "Go."}],
                extra_body={"app_metadata": meta("wf-vllm-kv")},
            )  # fmt: skip
        (record,) = await records(stack, 1, workflow_id="wf-vllm-kv")
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline and not any(
            e.lineage.workflow_id == "wf-vllm-kv" for b in batches for e in b.events
        ):
            await asyncio.sleep(0.1)
        await nc.close()
        return batches, record

    batches, record = asyncio.run(run())
    stored = [e for b in batches for e in b.events if e.kind == worker_pb2.KvEvent.STORED]
    ours = [e for e in stored if e.lineage.workflow_id == "wf-vllm-kv"]
    assert ours, f"no STORED event of the request among {len(stored)}"
    assert all(b.worker_id == "worker-1" and b.block_size == 16 for b in batches)
    sequences = [b.sequence for b in batches]
    assert sequences == sorted(sequences) and len(set(sequences)) == len(sequences)
    published = [h for e in ours for h in e.block_hashes]
    # A prompt vLLM has not seen from its first token: it stores every full 32-token block of the
    # sequence, which are, as our 16-token hashes, the head of the record's prompt + response chain.
    chain = [*record.prompt_block_hashes, *record.response_block_hashes]
    assert published == chain[: len(published)] and len(published) >= (record.prompt_tokens // 32) * 2
    prompt_blocks = len(record.prompt_block_hashes)
    assert [h for e in ours if not e.response for h in e.block_hashes] == published[:prompt_blocks]
    assert all(e.tenant == "default" for e in ours)
    assert ours[0].lineage.agent_id == "planner" and ours[0].lineage.request_id == record.request_id


def test_vllm_serves_higher_priority_first_with_one_slot(stack: Stack) -> None:
    """The worker's contract: ``base_priority`` (larger first) becomes vLLM's request priority."""
    url = asyncio.run(worker_stats(stack)).http_address

    async def generate(stub: worker_pb2_grpc.WorkerStub, rid: str, tokens: int, priority: float) -> float:
        request = worker_pb2.GenerateRequest(
            request_id=rid, model=MODEL, prompt=f"Count slowly, request {rid}:",
            sampling=common_pb2.SamplingParams(max_tokens=tokens, temperature=0, ignore_eos=True),
            base_priority=priority,
        )  # fmt: skip
        async for reply in stub.Generate(request, timeout=300):
            if reply.finish_reason:
                assert reply.usage.completion_tokens == tokens
        return time.monotonic()

    async def run() -> dict[str, float]:
        async with grpc.aio.insecure_channel(worker_address(stack)) as channel:
            stub = worker_pb2_grpc.WorkerStub(channel)
            first = asyncio.create_task(generate(stub, "prio-a", 160, 0.0))
            await wait_for(lambda: vllm_metric(url, "vllm:num_requests_running") == 1)
            low = asyncio.create_task(generate(stub, "prio-low", 8, 0.0))
            await wait_for(lambda: vllm_metric(url, "vllm:num_requests_waiting") == 1)
            high = asyncio.create_task(generate(stub, "prio-high", 8, 5.0))
            ends = await asyncio.gather(first, low, high)
            return dict(zip(("a", "low", "high"), ends, strict=True))

    ends = asyncio.run(run())
    assert ends["high"] < ends["low"]  # arrived last, served first


def test_the_gateway_path_serves_a_new_program_before_an_old_one(stack: Stack) -> None:
    """``plas`` ranks a program by the service it has had: with the one slot busy, a call of a
    program that has run already waits behind a later call of a new program."""
    url = asyncio.run(worker_stats(stack)).http_address

    async def call(client: AsyncOpenAI, workflow_id: str, tokens: int) -> float:
        await client.completions.create(
            model=MODEL, prompt=f"Write a list of fruits for {workflow_id}:", max_tokens=tokens, temperature=0,
            extra_body={"app_metadata": meta(workflow_id), "ignore_eos": True},
        )  # fmt: skip
        return time.monotonic()

    async def run() -> dict[str, float]:
        async with AsyncOpenAI(
            base_url=f"{stack.gateway_url}/v1", api_key="none", max_retries=0, timeout=300
        ) as c:
            await call(c, "wf-old", 48)  # the old program's service so far
            busy = asyncio.create_task(call(c, "wf-busy", 160))
            await wait_for(lambda: vllm_metric(url, "vllm:num_requests_running") == 1)
            old = asyncio.create_task(call(c, "wf-old", 8))
            await asyncio.sleep(1.0)
            new = asyncio.create_task(call(c, "wf-new", 8))
            ends = await asyncio.gather(busy, old, new)
            return dict(zip(("busy", "old", "new"), ends, strict=True))

    ends = asyncio.run(run())
    assert ends["new"] < ends["old"]


def test_directives_vllm_cannot_do_are_refused_and_kv_export_is_unimplemented(stack: Stack) -> None:
    async def run() -> tuple[grpc.StatusCode, str, grpc.StatusCode]:
        async with grpc.aio.insecure_channel(worker_address(stack)) as channel:
            stub = worker_pb2_grpc.WorkerStub(channel)
            drop = cachemgr_pb2.CacheDirective(kind=cachemgr_pb2.DIRECTIVE_KIND_DROP, block_hashes=["1"])
            with pytest.raises(grpc.aio.AioRpcError) as refused:
                await stub.ApplyDirectives(worker_pb2.ApplyDirectivesRequest(directives=[drop]), timeout=5)
            with pytest.raises(grpc.aio.AioRpcError) as export:
                async for _ in stub.ExportKV(worker_pb2.ExportKVRequest(workflow_id="wf"), timeout=5):
                    pass
            return refused.value.code(), refused.value.details() or "", export.value.code()

    refused, details, export = asyncio.run(run())
    assert refused == grpc.StatusCode.FAILED_PRECONDITION and "drop" in details and "vllm" in details
    assert export == grpc.StatusCode.UNIMPLEMENTED


def test_a_pre_prefill_directive_warms_vllms_cache(stack: Stack) -> None:
    url = asyncio.run(worker_stats(stack)).http_address
    text = SYSTEM * 3 + "Directive warm-up."
    ids = httpx.post(f"{url}/tokenize", json={"model": MODEL, "prompt": text}, timeout=10).json()["tokens"]

    async def prefill() -> int:
        async with grpc.aio.insecure_channel(worker_address(stack)) as channel:
            directive = cachemgr_pb2.CacheDirective(
                kind=cachemgr_pb2.DIRECTIVE_KIND_PRE_PREFILL, token_ids=ids
            )
            reply = await worker_pb2_grpc.WorkerStub(channel).ApplyDirectives(
                worker_pb2.ApplyDirectivesRequest(directives=[directive]), timeout=5
            )
            return reply.applied

    done = vllm_metric(url, "vllm:request_success_total")
    assert asyncio.run(prefill()) == 1
    asyncio.run(wait_for(lambda: vllm_metric(url, "vllm:request_success_total") > done))
    hits = vllm_metric(url, "vllm:prefix_cache_hits_total")
    reply = chat(stack).completions.create(model=MODEL, prompt=text, max_tokens=4, temperature=0)
    assert reply.usage.prompt_tokens == len(ids)
    # All of the prompt but its last token can come from the cache, in whole 32-token blocks.
    assert vllm_metric(url, "vllm:prefix_cache_hits_total") - hits == ((len(ids) - 1) // 32) * 32 > 0


async def wait_for(condition: object, timeout: float = 60.0) -> None:
    deadline = time.monotonic() + timeout
    while not condition():  # type: ignore[operator]
        if time.monotonic() > deadline:
            raise TimeoutError("condition not met")
        await asyncio.sleep(0.05)


def test_a_resync_is_answered_from_the_mirror_of_vllms_blocks(stack: Stack) -> None:
    async def run() -> tuple[list[worker_pb2.KvEvent], common_pb2.CompletionRecord]:
        async with AsyncOpenAI(base_url=f"{stack.gateway_url}/v1", api_key="none", max_retries=0) as client:
            await client.completions.create(
                model=MODEL, prompt="Resync: " + SYSTEM, max_tokens=4, temperature=0,
                extra_body={"app_metadata": meta("wf-vllm-resync")},
            )  # fmt: skip
        (record,) = await records(stack, 1, workflow_id="wf-vllm-resync")
        nc = await nats.connect(stack.nats_url)
        snapshots: list[worker_pb2.KvEventBatch] = []

        async def collect(msg: nats.aio.msg.Msg) -> None:
            batch = worker_pb2.KvEventBatch.FromString(msg.data)
            if batch.events and batch.events[0].kind == worker_pb2.KvEvent.CLEARED:
                snapshots.append(batch)

        await nc.subscribe("cv.kv.events.worker-1", cb=collect)
        await nc.publish(KV_RESYNC_SUBJECT, b"worker-1")
        deadline = time.monotonic() + 10
        while not snapshots and time.monotonic() < deadline:
            await asyncio.sleep(0.05)
        await nc.close()
        assert snapshots, "no snapshot after a resync request"
        return list(snapshots[0].events), record

    events, record = asyncio.run(run())
    assert [e.kind for e in events[:2]] == [worker_pb2.KvEvent.CLEARED] * 2
    held = {h for e in events[2:] for h in e.block_hashes}
    assert all(e.kind == worker_pb2.KvEvent.STORED for e in events[2:])
    head = list(record.prompt_block_hashes)[: (record.prompt_tokens // 32) * 2]
    assert head and set(head) <= held  # the request's blocks, in our hashes


def test_logit_bias_and_penalties_reach_vllm(stack: Stack) -> None:
    forced = 28  # "," in SmolLM2's vocabulary
    reply = chat(stack).completions.create(
        model=MODEL, prompt="Name three colours:", max_tokens=5, temperature=0, logit_bias={str(forced): 100},
        frequency_penalty=0.5, extra_body={"ignore_eos": True, "app_metadata": meta("wf-vllm-bias")},
    )  # fmt: skip
    assert reply.choices[0].text == "," * 5
    (record,) = asyncio.run(records(stack, 1, workflow_id="wf-vllm-bias"))
    assert list(record.output_token_ids) == [forced] * 5


def test_logprobs_come_back_from_vllm(stack: Stack) -> None:
    reply = chat(stack).completions.create(
        model=MODEL, prompt="The capital of France is", max_tokens=4, temperature=0, logprobs=2,
        extra_body={"ignore_eos": True},
    )  # fmt: skip
    lp = reply.choices[0].logprobs
    assert lp is not None and len(lp.tokens) == len(lp.token_logprobs) == 4
    assert "".join(lp.tokens) == reply.choices[0].text
    assert all(value <= 0 for value in lp.token_logprobs)
    for token, value, top in zip(lp.tokens, lp.token_logprobs, lp.top_logprobs or [], strict=True):
        assert max(top.values()) == pytest.approx(value, abs=1e-4) and token in top  # greedy: the top one


def test_anthropics_sdk_over_vllm_names_the_stop_sequence(stack: Stack) -> None:
    """POST /v1/messages through the gateway to vLLM: vLLM's stop_reason becomes Anthropic's."""
    sdk = anthropic.Anthropic(base_url=stack.gateway_url, api_key="none", max_retries=0, timeout=120)
    question = [{"role": "user", "content": "What is the capital of France?"}]
    greedy = {"temperature": 0}  # through extra_body: this SDK's create() takes no temperature
    reply = sdk.messages.create(
        model=MODEL, max_tokens=16, messages=question, stop_sequences=["Paris"], extra_body=greedy
    )
    assert (reply.stop_reason, reply.stop_sequence) == ("stop_sequence", "Paris")
    assert reply.content[0].text == "The capital of France is "  # cut before the stop sequence
    free = sdk.messages.create(model=MODEL, max_tokens=16, messages=question, extra_body=greedy)
    assert free.stop_reason == "end_turn" and "Paris" in free.content[0].text


WEATHER = {
    "type": "object",
    "properties": {"city": {"enum": ["Paris", "Lyon"]}, "days": {"type": "integer", "minimum": 1, "maximum": 7}},
    "required": ["city", "days"],
    "additionalProperties": False,
}


def test_a_json_schema_response_is_held_to_its_schema_by_vllm(stack: Stack) -> None:
    """response_format travels as vLLM's structured_outputs: vLLM's own grammar holds the answer."""
    reply = chat(stack).chat.completions.create(
        model=MODEL, messages=[{"role": "user", "content": "The weather where?"}], max_tokens=64, temperature=0,
        response_format={"type": "json_schema", "json_schema": {"name": "weather", "schema": WEATHER}},
    )  # fmt: skip
    choice = reply.choices[0]
    assert choice.finish_reason == "stop"
    jsonschema.validate(json.loads(choice.message.content or ""), WEATHER)


def test_a_named_tool_call_over_vllm_parses_into_tool_calls(stack: Stack) -> None:
    """The worker's tool grammar (a structural tag) runs in vLLM; the worker parses the call out."""
    tool = {"type": "function", "function": {"name": "get_weather", "parameters": WEATHER}}
    reply = chat(stack).chat.completions.create(
        model=MODEL, messages=[{"role": "user", "content": "Weather in Paris for 3 days?"}], max_tokens=96,
        temperature=0, tools=[tool], tool_choice={"type": "function", "function": {"name": "get_weather"}},
    )  # fmt: skip
    choice = reply.choices[0]
    assert choice.finish_reason == "tool_calls", choice
    (call,) = choice.message.tool_calls or []
    assert call.function.name == "get_weather" and call.id.startswith("call_")
    jsonschema.validate(json.loads(call.function.arguments), WEATHER)
