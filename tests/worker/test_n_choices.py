"""n choices of one prompt (``SamplingParams.n``): prefilled once, seeded per choice, streamed and
aborted as one request."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator

import jsonschema
import pytest

from clairvoyant.contracts.v1 import common_pb2, worker_pb2, worker_pb2_grpc
from clairvoyant.core.grpcutil import channel, new_server
from clairvoyant.core.structured import OutputConstraint
from clairvoyant.worker.config import WorkerSettings
from clairvoyant.worker.core.engine import (
    EngineConfig,
    EngineRequest,
    LLMEngine,
    RequestOutput,
    SamplingParams,
)
from clairvoyant.worker.engine_loop import AsyncEngine
from clairvoyant.worker.frontend import WorkerFrontend
from clairvoyant.worker.grpc_api import WorkerServicer
from clairvoyant.worker.heartbeat import Heartbeat
from clairvoyant.worker.runners.emulated import EmulatedRunner
from clairvoyant.worker.runners.loader import load_runner
from clairvoyant.worker.runners.torch_runner import TorchRunner

BLOCK = 16
PROMPT = list(b"The quick brown fox jumps over the lazy dog, twice!")  # 51 tokens: 3 whole blocks + 3


@pytest.fixture(scope="module")
def runner() -> TorchRunner:
    return load_runner("tiny-random", max_model_len=512)


def new_engine(runner: TorchRunner, *, prefix_cache: bool = True, num_blocks: int = 128) -> LLMEngine:
    config = EngineConfig(
        block_size=BLOCK, num_blocks=num_blocks, max_num_seqs=8, enable_prefix_cache=prefix_cache
    )
    return LLMEngine(runner, config)


def drain(engine: LLMEngine) -> list[RequestOutput]:
    outputs = []
    while engine.has_unfinished():
        outputs += engine.step()
        engine.check_integrity()
    return outputs


def tokens_by_choice(outputs: list[RequestOutput], request_id: str) -> dict[int, list[int]]:
    choices: dict[int, list[int]] = {}
    for out in outputs:
        if out.request_id == request_id:
            choices.setdefault(out.index, []).extend(out.new_token_ids)
    return choices


@pytest.mark.unit
def test_four_choices_are_distinct_and_the_prompt_is_prefilled_once(runner: TorchRunner) -> None:
    engine = new_engine(runner)
    engine.add_request(
        EngineRequest(
            "r", list(PROMPT), SamplingParams(max_tokens=12, temperature=1.0, seed=7, n=4, ignore_eos=True)
        )
    )
    outputs = drain(engine)
    choices = tokens_by_choice(outputs, "r")
    assert sorted(choices) == [0, 1, 2, 3]
    assert all(len(tokens) == 12 for tokens in choices.values())
    assert len({tuple(tokens) for tokens in choices.values()}) == 4
    finals = [out for out in outputs if out.finished]
    assert sorted(out.index for out in finals) == [0, 1, 2, 3]  # one final output per choice
    assert all(out.finish_reason == "length" and out.prompt_tokens == len(PROMPT) for out in finals)
    stats = engine.stats()
    # Choice 0 computes all 51 prompt tokens; each sibling takes the 3 whole blocks from the cache
    # and recomputes only the last, partial block's 3 tokens.
    assert len(PROMPT) % BLOCK == 3
    assert stats.computed_prompt_tokens_total == len(PROMPT) + 3 * 3
    assert stats.computed_prompt_tokens_total <= len(PROMPT) + 3 * BLOCK
    assert stats.prompt_tokens_total == len(PROMPT)  # one request
    assert stats.generated_tokens_total == 4 * 12
    assert (stats.running, stats.waiting, stats.kv_blocks_used - stats.kv_blocks_cached) == (0, 0, 0)


@pytest.mark.unit
def test_without_the_prefix_cache_every_choice_computes_the_prompt(runner: TorchRunner) -> None:
    engine = new_engine(runner, prefix_cache=False)
    engine.add_request(
        EngineRequest("r", list(PROMPT), SamplingParams(max_tokens=3, temperature=1.0, seed=1, n=3))
    )
    drain(engine)
    assert engine.stats().computed_prompt_tokens_total == 3 * len(PROMPT)


@pytest.mark.unit
def test_choice_i_samples_with_seed_plus_i_and_seeded_n_is_reproducible(runner: TorchRunner) -> None:
    params = SamplingParams(max_tokens=10, temperature=0.9, top_p=0.95, seed=100, n=4)
    first = new_engine(runner)
    first.add_request(EngineRequest("a", list(PROMPT), params))
    together = tokens_by_choice(drain(first), "a")
    again = new_engine(runner)
    again.add_request(EngineRequest("a", list(PROMPT), params))
    assert tokens_by_choice(drain(again), "a") == together
    alone = new_engine(runner)
    for i in range(4):
        single = SamplingParams(max_tokens=10, temperature=0.9, top_p=0.95, seed=100 + i)
        alone.add_request(EngineRequest(f"s{i}", list(PROMPT), single))
    outputs = drain(alone)
    assert {i: tokens_by_choice(outputs, f"s{i}")[0] for i in range(4)} == together


@pytest.mark.unit
def test_unseeded_choices_differ_and_depend_on_the_engine_seed(runner: TorchRunner) -> None:
    params = SamplingParams(max_tokens=8, temperature=1.0, n=3)
    runs = []
    for _ in range(2):
        engine = new_engine(runner)
        engine.add_request(EngineRequest("u", list(PROMPT), params))
        runs.append(tokens_by_choice(drain(engine), "u"))
    assert runs[0] == runs[1]  # derived from the engine's seed and the request id: reproducible
    assert len({tuple(tokens) for tokens in runs[0].values()}) == 3


@pytest.mark.unit
def test_aborting_the_request_aborts_every_choice(runner: TorchRunner) -> None:
    engine = new_engine(runner)
    engine.add_request(
        EngineRequest("r", list(PROMPT), SamplingParams(max_tokens=50, temperature=1.0, seed=3, n=4))
    )
    engine.step()  # choice 0 prefills; the others are released to the queue
    engine.step()
    engine.check_integrity()
    assert engine.abort_request("r")
    outputs = engine.step()
    engine.check_integrity()
    assert sorted((out.index, out.finish_reason, out.finished) for out in outputs) == [
        (i, "abort", True) for i in range(4)
    ]
    assert not engine.has_unfinished()
    stats = engine.stats()
    assert stats.kv_blocks_used == stats.kv_blocks_cached  # nothing held but the cache


@pytest.mark.unit
def test_aborting_before_the_prompt_is_computed_ends_the_deferred_choices_too(runner: TorchRunner) -> None:
    engine = new_engine(runner)
    engine.add_request(EngineRequest("r", list(PROMPT), SamplingParams(max_tokens=5, n=3)))
    engine.check_integrity()
    assert engine.abort_request("r")
    outputs = engine.step()
    assert sorted(out.index for out in outputs if out.finish_reason == "abort") == [0, 1, 2]
    assert not engine.has_unfinished()
    engine.check_integrity()


@pytest.mark.unit
def test_an_unstarted_request_with_choices_is_withdrawn_whole(runner: TorchRunner) -> None:
    engine = new_engine(runner)
    engine.add_request(EngineRequest("r", list(PROMPT), SamplingParams(max_tokens=5, n=3)))
    assert engine.withdraw_unstarted() == ["r"]
    assert not engine.has_unfinished()
    engine.check_integrity()
    engine.add_request(EngineRequest("r2", list(PROMPT), SamplingParams(max_tokens=5, n=3)))
    engine.step()  # choice 0 sampled its first token: started
    assert engine.withdraw_unstarted() == []
    assert {out.index for out in drain(engine) if out.finished} == {0, 1, 2}


@pytest.mark.unit
def test_every_constrained_choice_matches_the_schema(runner: TorchRunner) -> None:
    schema = {
        "type": "object",
        "properties": {"ok": {"type": "boolean"}, "n": {"type": "integer", "minimum": 0, "maximum": 9}},
        "required": ["ok", "n"],
        "additionalProperties": False,
    }
    engine = new_engine(runner)
    params = SamplingParams(
        max_tokens=60, temperature=1.0, seed=5, n=4, constraint=OutputConstraint.of_schema(schema)
    )
    engine.add_request(EngineRequest("c", list(PROMPT), params))
    outputs = drain(engine)
    texts: dict[int, str] = {}
    for out in outputs:
        texts[out.index] = texts.get(out.index, "") + out.new_text
    assert sorted(texts) == [0, 1, 2, 3]
    for text in texts.values():
        jsonschema.validate(json.loads(text), schema)
    assert {out.index: out.finish_reason for out in outputs if out.finished} == {i: "stop" for i in range(4)}


@pytest.mark.unit
def test_n_on_the_emulated_runner(runner: TorchRunner) -> None:
    emulated = EmulatedRunner(sleep=lambda _: None, distinct_tokens=True, max_model_len=512)
    engine = LLMEngine(emulated, EngineConfig(block_size=BLOCK, num_blocks=64, max_num_seqs=8))
    engine.add_request(EngineRequest("e", list(range(1, 41)), SamplingParams(max_tokens=20, n=3)))
    outputs = []
    while engine.has_unfinished():
        run = engine.plan_decode_run()
        outputs += engine.advance_decode(run, run.num_steps) if run is not None else engine.step()
        engine.check_integrity()
    choices = tokens_by_choice(outputs, "e")
    assert sorted(choices) == [0, 1, 2] and all(len(tokens) == 20 for tokens in choices.values())
    assert engine.stats().computed_prompt_tokens_total == 40 + 2 * 8


@pytest.mark.integration
@pytest.mark.timeout(60)
async def test_the_stream_ends_when_the_last_choice_finishes(runner: TorchRunner) -> None:
    engine = AsyncEngine(new_engine(runner))
    engine.start()
    frontend = WorkerFrontend(runner, engine, "w-n")
    try:
        params = SamplingParams(max_tokens=16, temperature=1.0, seed=11, n=4, ignore_eos=True)
        request = frontend.build_request("r", list(PROMPT), params)
        outputs = [out async for out in frontend.run(request)]
        assert sorted(out.index for out in outputs if out.finished) == [0, 1, 2, 3]
        assert outputs[-1].finished
        assert sum(len(out.new_token_ids) for out in outputs) == 4 * 16
        # Leaving early aborts every choice and frees their blocks.
        request = frontend.build_request(
            "q", list(PROMPT), SamplingParams(max_tokens=200, temperature=1.0, n=3)
        )
        stream = frontend.run(request)
        async for out in stream:
            if out.new_token_ids:
                break
        await stream.aclose()  # type: ignore[attr-defined]
        for _ in range(100):
            stats = await engine.call(lambda core: core.stats())
            if stats.running == stats.waiting == 0:
                break
            await asyncio.sleep(0.01)
        assert (stats.running, stats.waiting) == (0, 0)
        assert not await engine.call(lambda core: core.has_unfinished())
    finally:
        engine.stop()


# ---- the worker's gRPC server ------------------------------------------------------------------------
@pytest.fixture
async def grpc_worker(runner: TorchRunner) -> AsyncIterator[tuple[worker_pb2_grpc.WorkerStub, AsyncEngine]]:
    engine = AsyncEngine(new_engine(runner))
    engine.start()
    settings = WorkerSettings(worker_id="w-n", block_size=BLOCK, heartbeat_interval_s=0.5)
    heartbeat = Heartbeat(settings, runner, engine, "127.0.0.1:0", "")
    server = new_server()
    port = server.add_insecure_port("127.0.0.1:0")
    worker_pb2_grpc.add_WorkerServicer_to_server(
        WorkerServicer(WorkerFrontend(runner, engine, "w-n"), heartbeat), server
    )
    await server.start()
    async with channel(f"127.0.0.1:{port}") as chan:
        yield worker_pb2_grpc.WorkerStub(chan), engine
    await server.stop(None)
    engine.stop()


@pytest.mark.integration
@pytest.mark.timeout(60)
async def test_grpc_n_streams_every_choice_and_counts_the_prompt_once(
    grpc_worker: tuple[worker_pb2_grpc.WorkerStub, AsyncEngine],
) -> None:
    stub, engine = grpc_worker
    sampling = common_pb2.SamplingParams(max_tokens=9, temperature=1.0, seed=21, n=4, ignore_eos=True)

    async def generate(request_id: str) -> list[worker_pb2.GenerateResponse]:
        request = worker_pb2.GenerateRequest(
            request_id=request_id, token_ids=worker_pb2.TokenIds(ids=PROMPT), sampling=sampling
        )
        return [reply async for reply in stub.Generate(request)]

    replies = await generate("g1")
    by_choice: dict[int, list[int]] = {}
    for reply in replies:
        by_choice.setdefault(reply.index, []).extend(reply.token_ids)
    assert sorted(by_choice) == [0, 1, 2, 3]
    assert all(len(tokens) == 9 for tokens in by_choice.values())
    assert len({tuple(tokens) for tokens in by_choice.values()}) == 4
    finals = [reply for reply in replies if reply.HasField("finish_reason")]
    assert sorted(reply.index for reply in finals) == [0, 1, 2, 3]
    assert all(reply.finish_reason == "length" for reply in finals)
    last = replies[-1]
    assert last.HasField("usage") and sum(reply.HasField("usage") for reply in replies) == 1
    assert (last.usage.prompt_tokens, last.usage.completion_tokens) == (len(PROMPT), 4 * 9)
    stats = await engine.call(lambda core: core.stats())
    assert stats.computed_prompt_tokens_total == len(PROMPT) + 3 * (len(PROMPT) % BLOCK)
    again = await generate("g2")  # another id, the same seed: the same choices
    repeat: dict[int, list[int]] = {}
    for reply in again:
        repeat.setdefault(reply.index, []).extend(reply.token_ids)
    assert repeat == by_choice
