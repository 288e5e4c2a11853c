"""The worker's gRPC adapter over a real engine (tiny-random) and a real grpc.aio server."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from dataclasses import dataclass

import grpc
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc
from opentelemetry import trace
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from clairvoyant.contracts.v1 import cachemgr_pb2, common_pb2, worker_pb2, worker_pb2_grpc
from clairvoyant.core.blockhash import BLOCK_TOKENS, sequence_hashes
from clairvoyant.core.errors import ContextLengthExceeded
from clairvoyant.core.grpc_errors import from_rpc_error
from clairvoyant.core.grpcutil import add_health, channel, mark_serving, new_server
from clairvoyant.core.telemetry import setup_tracing
from clairvoyant.worker.config import WorkerSettings
from clairvoyant.worker.core.engine import EngineConfig, LLMEngine
from clairvoyant.worker.engine_loop import AsyncEngine
from clairvoyant.worker.frontend import WorkerFrontend
from clairvoyant.worker.grpc_api import WorkerServicer
from clairvoyant.worker.heartbeat import Heartbeat
from clairvoyant.worker.runners.loader import load_runner

pytestmark = [pytest.mark.integration, pytest.mark.timeout(120)]
TRACE_ID = "4bf92f3577b34da6a3ce929d0e0e4736"


@dataclass
class Running:
    stub: worker_pb2_grpc.WorkerStub
    health: health_pb2_grpc.HealthStub
    engine: AsyncEngine


@pytest.fixture(scope="module")
def spans() -> InMemorySpanExporter:
    exporter = InMemorySpanExporter()
    provider = trace.get_tracer_provider()
    if not isinstance(provider, TracerProvider):  # else another test installed one: listen in
        provider = setup_tracing("worker-test")
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    return exporter


@pytest.fixture
async def worker() -> AsyncIterator[Running]:
    runner = load_runner("tiny-random", max_model_len=256)
    engine = AsyncEngine(LLMEngine(runner, EngineConfig(block_size=16, num_blocks=64, max_num_seqs=4)))
    engine.start()
    settings = WorkerSettings(worker_id="w-test", block_size=16, heartbeat_interval_s=0.5)
    heartbeat = Heartbeat(settings, runner, engine, "127.0.0.1:0", "")
    server = new_server()
    port = server.add_insecure_port("127.0.0.1:0")
    worker_pb2_grpc.add_WorkerServicer_to_server(WorkerServicer(WorkerFrontend(runner, engine, "w-test"), heartbeat), server)
    health = add_health(server, ["clairvoyant.v1.Worker"])
    await server.start()
    await mark_serving(health, ["clairvoyant.v1.Worker"])
    async with channel(f"127.0.0.1:{port}") as chan:
        yield Running(worker_pb2_grpc.WorkerStub(chan), health_pb2_grpc.HealthStub(chan), engine)
    await server.stop(None)
    engine.stop()


def chat(text: str, max_tokens: int, **extra: object) -> worker_pb2.GenerateRequest:
    return worker_pb2.GenerateRequest(
        request_id=f"r-{text}",
        chat=worker_pb2.ChatMessages(messages=[common_pb2.ChatMessage(role="user", content=text)]),
        sampling=common_pb2.SamplingParams(max_tokens=max_tokens, temperature=0.0, ignore_eos=True),
        tenant="acme",
        app_metadata=common_pb2.AppMetadata(workflow_type_id="t", workflow_id="wf", agent_id="a"),
        **extra,
    )


async def test_generate_streams_tokens_usage_and_a_child_span(worker: Running, spans: InMemorySpanExporter) -> None:
    metadata = (("traceparent", f"00-{TRACE_ID}-00f067aa0ba902b7-01"),)
    replies = [r async for r in worker.stub.Generate(chat("hello", 7), metadata=metadata)]
    tokens = [t for r in replies for t in r.token_ids]
    assert len(tokens) == 7
    assert replies[0].prompt_tokens > 0
    last = replies[-1]
    assert last.finish_reason == "length"
    assert (last.usage.completion_tokens, last.usage.prompt_tokens) == (7, replies[0].prompt_tokens)
    assert all(not r.HasField("finish_reason") for r in replies[:-1])
    generate = [s for s in spans.get_finished_spans() if s.name == "worker.generate"]
    assert generate and format(generate[-1].context.trace_id, "032x") == TRACE_ID
    assert generate[-1].attributes["cv.completion_tokens"] == 7


async def test_prompt_over_the_context_window_is_invalid_argument(worker: Running) -> None:
    with pytest.raises(grpc.aio.AioRpcError) as info:
        async for _ in worker.stub.Generate(chat("x" * 300, 4)):
            pass
    assert info.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    err = from_rpc_error(info.value)
    assert isinstance(err, ContextLengthExceeded) and err.code == "context_length_exceeded"
    assert worker.engine.stats().running == 0


async def test_cancelling_the_call_frees_the_blocks(worker: Running) -> None:
    call = worker.stub.Generate(chat("long", 200))
    first = await call.read()
    assert first.token_ids or first.prompt_tokens
    assert worker.engine.stats().kv_blocks_used > 0
    call.cancel()
    for _ in range(100):
        stats = worker.engine.stats()
        if stats.running == 0 and stats.kv_blocks_used == stats.kv_blocks_cached:
            break
        await asyncio.sleep(0.05)
    stats = worker.engine.stats()
    assert stats.running == 0 and stats.waiting == 0
    assert stats.kv_blocks_used == stats.kv_blocks_cached


async def test_prefill_caches_the_prompt_for_the_next_request(worker: Running) -> None:
    prompt = worker_pb2.PrefillRequest(request_id="p1", prompt="a" * 100, tenant="acme")
    first = await worker.stub.Prefill(prompt)
    assert (first.prompt_tokens, first.cached_tokens) == (100, 0)
    again = await worker.stub.Prefill(worker_pb2.PrefillRequest(request_id="p2", prompt="a" * 100, tenant="acme"))
    assert again.cached_tokens == 96  # full blocks only, and at least one token is computed
    other_tenant = await worker.stub.Prefill(worker_pb2.PrefillRequest(request_id="p3", prompt="a" * 100, tenant="b"))
    assert other_tenant.cached_tokens == 0


async def test_stats_health_and_directives_without_tiers(worker: Running) -> None:
    stats = await worker.stub.Stats(worker_pb2.WorkerStatsRequest())
    assert (stats.worker_id, stats.model, stats.kv_blocks_total, stats.max_batch) == ("w-test", "tiny-random", 64, 4)
    assert stats.max_model_len == 256
    health = await worker.health.Check(health_pb2.HealthCheckRequest(service="clairvoyant.v1.Worker"))
    assert health.status == health_pb2.HealthCheckResponse.SERVING
    assert [t.tier for t in stats.tiers] == [cachemgr_pb2.CACHE_TIER_L1]  # no host cache here
    assert (await worker.stub.ApplyDirectives(worker_pb2.ApplyDirectivesRequest())).applied == 0
    drop = cachemgr_pb2.CacheDirective(kind=cachemgr_pb2.DIRECTIVE_KIND_DROP)
    with pytest.raises(grpc.aio.AioRpcError) as info:
        await worker.stub.ApplyDirectives(worker_pb2.ApplyDirectivesRequest(directives=[drop]))
    assert info.value.code() == grpc.StatusCode.FAILED_PRECONDITION


def token_prompt(request_id: str, ids: list[int], max_tokens: int) -> worker_pb2.GenerateRequest:
    return worker_pb2.GenerateRequest(
        request_id=request_id,
        token_ids=worker_pb2.TokenIds(ids=ids),
        sampling=common_pb2.SamplingParams(max_tokens=max_tokens, temperature=0.0, ignore_eos=True),
        tenant="acme",
    )


async def test_final_message_carries_the_block_hashes_of_prompt_and_response(worker: Running) -> None:
    prompt = [(7 * i + 3) % 200 for i in range(40)]  # 2 full blocks and an 8-token tail
    replies = [r async for r in worker.stub.Generate(token_prompt("turn-1", prompt, 30))]
    output = [t for r in replies for t in r.token_ids]
    assert len(output) == 30
    assert all(not r.prompt_block_hashes and not r.response_block_hashes for r in replies[:-1])
    last = replies[-1]
    expected_prompt, expected_response = sequence_hashes(prompt, output)
    assert list(last.prompt_block_hashes) == expected_prompt and len(expected_prompt) == 2
    assert list(last.response_block_hashes) == expected_response and len(expected_response) == 2  # 8 + 30 = 38
    assert list(last.prompt_token_ids) == prompt  # the cache manager's history: on the last message only
    assert all(not r.prompt_token_ids for r in replies[:-1])

    # The next turn's prompt is this conversation so far plus a new message: its chain starts with
    # every full block the first turn left in the cache (prompt then response), and the worker
    # serves at least the first prompt's blocks from its prefix cache.
    follow_up = prompt + output + [(5 * i + 1) % 200 for i in range(20)]  # 90 tokens: 5 full blocks
    replies = [r async for r in worker.stub.Generate(token_prompt("turn-2", follow_up, 4))]
    second = replies[-1]
    first_chain = expected_prompt + expected_response
    assert list(second.prompt_block_hashes[: len(first_chain)]) == first_chain
    assert len(second.prompt_block_hashes) == 5
    assert list(second.prompt_block_hashes) == sequence_hashes(follow_up, [])[0]
    assert second.usage.cached_tokens >= len(expected_prompt) * BLOCK_TOKENS
