"""ExportKV -> ImportKV between two real in-process workers over grpc.aio, and the errors."""

from __future__ import annotations

from collections.abc import AsyncIterator, Iterable
from contextlib import asynccontextmanager
from dataclasses import dataclass

import grpc
import pytest
import torch

from clairvoyant.contracts.v1 import common_pb2, worker_pb2, worker_pb2_grpc
from clairvoyant.core.grpcutil import channel, new_server
from clairvoyant.worker.config import WorkerSettings
from clairvoyant.worker.core.engine import EngineConfig, LLMEngine
from clairvoyant.worker.engine_loop import AsyncEngine
from clairvoyant.worker.frontend import WorkerFrontend
from clairvoyant.worker.grpc_api import WorkerServicer
from clairvoyant.worker.heartbeat import Heartbeat
from clairvoyant.worker.runners.base import ModelRunner
from clairvoyant.worker.runners.emulated import EmulatedRunner
from clairvoyant.worker.runners.loader import load_runner

pytestmark = [pytest.mark.integration, pytest.mark.timeout(120)]
PROMPT = [(7 * i + 3) % 200 for i in range(40)]  # 2 whole blocks of 16 + 8 tokens


@dataclass
class Worker:
    stub: worker_pb2_grpc.WorkerStub
    engine: AsyncEngine
    slept: list[float]  # the transfer times an import waited out


@asynccontextmanager
async def serve(runner: ModelRunner, worker_id: str, num_blocks: int = 32) -> AsyncIterator[Worker]:
    engine = AsyncEngine(
        LLMEngine(runner, EngineConfig(block_size=16, num_blocks=num_blocks, max_num_seqs=4))
    )
    engine.start()
    slept: list[float] = []

    async def record(seconds: float) -> None:
        slept.append(seconds)

    settings = WorkerSettings(worker_id=worker_id, block_size=16)
    service = WorkerFrontend(runner, engine, worker_id, transfer_sleep=record)
    server = new_server()
    port = server.add_insecure_port("127.0.0.1:0")
    worker_pb2_grpc.add_WorkerServicer_to_server(
        WorkerServicer(service, Heartbeat(settings, runner, engine, "127.0.0.1:0", "")), server
    )
    await server.start()
    try:
        async with channel(f"127.0.0.1:{port}") as chan:
            yield Worker(worker_pb2_grpc.WorkerStub(chan), engine, slept)
    finally:
        await server.stop(None)
        engine.stop()


def tiny() -> ModelRunner:
    return load_runner("tiny-random", max_model_len=256)


def emulated() -> ModelRunner:
    return EmulatedRunner("llama-3.1-8b", "H100-80G", sleep=lambda _: None, distinct_tokens=True)


def generate(request_id: str, prompt: list[int], workflow: str = "wf-1") -> worker_pb2.GenerateRequest:
    return worker_pb2.GenerateRequest(
        request_id=request_id,
        token_ids=worker_pb2.TokenIds(ids=prompt),
        sampling=common_pb2.SamplingParams(max_tokens=4, temperature=0.0, ignore_eos=True),
        tenant="acme",
        app_metadata=common_pb2.AppMetadata(workflow_type_id="t", workflow_id=workflow, agent_id="a"),
    )


async def run(worker: Worker, request: worker_pb2.GenerateRequest) -> tuple[list[int], int]:
    """(generated tokens, cached prompt tokens)."""
    replies = [reply async for reply in worker.stub.Generate(request)]
    return [t for r in replies for t in r.token_ids], replies[-1].usage.cached_tokens


async def export(worker: Worker, **fields: object) -> list[worker_pb2.KVChunk]:
    request = worker_pb2.ExportKVRequest(request_id="move-1", tenant="acme", **fields)  # type: ignore[arg-type]
    return [chunk async for chunk in worker.stub.ExportKV(request)]


async def stream(chunks: Iterable[worker_pb2.KVChunk]) -> AsyncIterator[worker_pb2.KVChunk]:
    for chunk in chunks:
        yield chunk


async def cached_kv(worker: Worker, tokens: list[int]) -> torch.Tensor:
    def read(engine: LLMEngine) -> torch.Tensor:
        assert engine.kv.cache is not None
        blocks = engine.kv.cache.match("acme", tokens, len(tokens) // 16)
        return engine.runner.read_kv(blocks, len(blocks) * 16)  # type: ignore[attr-defined,no-any-return]

    return await worker.engine.call(read)


async def test_a_migrated_prefix_has_equal_tensors_and_hits_on_the_thief() -> None:
    async with serve(tiny(), "victim") as victim, serve(tiny(), "thief") as thief:
        expected, cached = await run(victim, generate("r1", PROMPT))
        assert cached == 0
        chunks = await export(victim, workflow_id="wf-1", model="tiny-random")
        info = load_runner("tiny-random").info
        assert [c.layer for c in chunks] == list(range(info.num_layers))
        assert list(chunks[0].token_ids) == PROMPT[:32] and chunks[0].num_layers == info.num_layers
        assert list(chunks[0].shape) == [2, 32, info.num_kv_heads, info.head_dim]
        assert all(len(c.data) == 2 * 32 * info.num_kv_heads * info.head_dim * 4 for c in chunks)  # float32

        reply = await thief.stub.ImportKV(stream(chunks))
        assert (reply.tokens, reply.imported_tokens) == (32, 32)
        assert thief.slept == []  # real tensors moved: no modelled time
        assert torch.equal(await cached_kv(thief, PROMPT), await cached_kv(victim, PROMPT))

        tokens, cached = await run(thief, generate("r2", PROMPT))
        assert cached == 32
        assert tokens == expected
        again = await thief.stub.ImportKV(stream(chunks))  # already there: nothing written
        assert (again.tokens, again.imported_tokens) == (32, 0)


async def test_emulated_workers_move_the_accounting_and_charge_the_cost_model() -> None:
    async with serve(emulated(), "victim", 64) as victim, serve(emulated(), "thief", 64) as thief:
        prompt = list(range(60, 160))  # 100 tokens -> 6 whole blocks cached
        await run(victim, generate("r1", prompt))
        chunks = await export(victim, token_ids=prompt)
        assert len(chunks) == 32 and all(c.data == b"" for c in chunks)
        assert list(chunks[0].shape) == [2, 96, 8, 128] and chunks[0].dtype == "bfloat16"
        reply = await thief.stub.ImportKV(stream(chunks))
        assert (reply.tokens, reply.imported_tokens) == (96, 96)
        # 96 tokens x 128 KiB of bf16 K/V over one H100's 50 GB/s x 0.8 link, plus the set-up.
        assert thief.slept == [50e-6 + 96 * 131_072 / 40e9]
        assert (await run(thief, generate("r2", prompt)))[1] == 96


async def test_export_errors() -> None:
    async with serve(tiny(), "victim") as victim:
        await run(victim, generate("r1", PROMPT))
        for fields, code in (
            ({"workflow_id": "nobody"}, grpc.StatusCode.NOT_FOUND),
            ({"token_ids": [9] * 40}, grpc.StatusCode.NOT_FOUND),
            ({"workflow_id": "wf-1", "model": "llama-3.1-8b"}, grpc.StatusCode.INVALID_ARGUMENT),
            ({}, grpc.StatusCode.INVALID_ARGUMENT),  # names no prefix
        ):
            with pytest.raises(grpc.aio.AioRpcError) as info:
                await export(victim, **fields)
            assert info.value.code() == code, fields


async def test_import_errors_change_nothing() -> None:
    async with serve(tiny(), "victim") as victim, serve(tiny(), "thief", num_blocks=3) as thief:
        await run(victim, generate("r1", PROMPT + PROMPT))  # 80 tokens -> 5 whole blocks
        chunks = await export(victim, workflow_id="wf-1")
        other_model = [worker_pb2.KVChunk(), *chunks[1:]]
        other_model[0].CopyFrom(chunks[0])
        other_model[0].model = "llama-3.1-8b"
        bad_shape = [worker_pb2.KVChunk(), *chunks[1:]]
        bad_shape[0].CopyFrom(chunks[0])
        bad_shape[0].shape[:] = [2, 80, 4, 32]
        cases = {
            "another model": (other_model, grpc.StatusCode.INVALID_ARGUMENT),
            "a wrong shape": (bad_shape, grpc.StatusCode.INVALID_ARGUMENT),
            "an early end": (chunks[:-1], grpc.StatusCode.INVALID_ARGUMENT),
            "layers out of order": (
                [chunks[0], chunks[2], chunks[1], *chunks[3:]],
                grpc.StatusCode.INVALID_ARGUMENT,
            ),
            "an empty stream": ([], grpc.StatusCode.INVALID_ARGUMENT),
            "no room (5 blocks into 3)": (chunks, grpc.StatusCode.RESOURCE_EXHAUSTED),
        }
        for name, (sent, code) in cases.items():
            with pytest.raises(grpc.aio.AioRpcError) as info:
                await thief.stub.ImportKV(stream(sent))
            assert info.value.code() == code, name
            stats = await thief.engine.call(lambda engine: engine.stats())
            assert (stats.kv_blocks_used, stats.kv_blocks_cached) == (0, 0), name
