"""KV migration in the engine core: a cached prefix exported from one engine and imported by another."""

from __future__ import annotations

import pytest
import torch

from clairvoyant.worker.core.block_manager import BlockManager
from clairvoyant.worker.core.engine import EngineConfig, EngineRequest, LLMEngine
from clairvoyant.worker.core.kv_transfer import KvPrefix, KvTransferError, export_prefix, import_prefix
from clairvoyant.worker.core.radix_cache import BlockTag, RadixCache
from clairvoyant.worker.core.sampling import SamplingParams
from clairvoyant.worker.core.types import Lineage
from clairvoyant.worker.runners.emulated import EmulatedRunner
from clairvoyant.worker.runners.loader import load_runner
from tests.worker.fakes import drain

pytestmark = pytest.mark.unit
BS = 16


def torch_engine(num_blocks: int = 32) -> LLMEngine:
    runner = load_runner("tiny-random", max_model_len=256)
    return LLMEngine(runner, EngineConfig(block_size=BS, num_blocks=num_blocks, max_num_seqs=4))


def request(request_id: str, prompt: list[int], workflow: str = "wf", max_tokens: int = 4) -> EngineRequest:
    return EngineRequest(
        request_id,
        prompt,
        SamplingParams(max_tokens=max_tokens, temperature=0.0, ignore_eos=True),
        lineage=Lineage("acme", workflow, "agent", request_id),
    )


def run(engine: LLMEngine, req: EngineRequest) -> tuple[list[int], int]:
    """(generated tokens, cached prompt tokens) of ``req`` run alone."""
    engine.add_request(req)
    result = drain(engine)[req.request_id]
    return result.token_ids, result.final.cached_tokens


PROMPT = [(7 * i + 3) % 200 for i in range(40)]  # 2 whole blocks + 8 tokens


def test_export_then_import_copies_the_tensors_and_the_next_request_hits() -> None:
    source, target = torch_engine(), torch_engine()
    expected, cached = run(source, request("a1", PROMPT))
    assert cached == 0
    prefix = export_prefix(source.kv, source.runner, "acme", workflow_id="wf")
    assert prefix is not None
    # The session's deepest block: prompt (40) + 3 computed output tokens = 43 -> 2 whole blocks.
    assert prefix.token_ids == tuple(PROMPT[:32])
    info = source.runner.info
    assert prefix.kv is not None
    assert (
        tuple(prefix.kv.shape)
        == (info.num_layers, 2, 32, info.num_kv_heads, info.head_dim)
        == (4, 2, 32, 2, 64)
    )

    result = import_prefix(target.kv, target.runner, prefix)
    assert result is not None and (result.cached_tokens, result.imported_tokens) == (32, 32)
    target.check_integrity()
    assert target.stats().kv_blocks_cached == 2
    blocks = target.kv.cache.match("acme", PROMPT, 2)  # type: ignore[union-attr]
    assert torch.equal(target.runner.read_kv(blocks, 32), prefix.kv)  # type: ignore[attr-defined]

    tokens, cached = run(target, request("b1", PROMPT))
    assert cached == 32  # the imported prefix hits
    assert tokens == expected  # and computes what the source computed
    target.check_integrity()


def test_an_import_skips_the_head_already_cached_and_another_tenant_misses() -> None:
    source, target = torch_engine(), torch_engine()
    long_prompt = PROMPT + [(5 * i + 1) % 200 for i in range(24)]  # 64 tokens
    run(source, request("a1", long_prompt, max_tokens=2))
    run(target, request("b0", PROMPT[:20], max_tokens=2))  # caches block 0 of the prefix
    prefix = export_prefix(source.kv, source.runner, "acme", token_ids=long_prompt)
    assert prefix is not None and prefix.num_tokens == 64
    result = import_prefix(target.kv, target.runner, prefix)
    assert result is not None and (result.cached_tokens, result.imported_tokens) == (64, 48)
    target.check_integrity()
    other = request("b2", long_prompt)
    other.lineage = Lineage("other", "wf")
    assert run(target, other)[1] == 0  # namespaces stay apart


def test_export_finds_nothing_for_an_unknown_session_or_uncached_tokens() -> None:
    engine = torch_engine()
    run(engine, request("a1", PROMPT))
    assert export_prefix(engine.kv, engine.runner, "acme", workflow_id="nobody") is None
    assert export_prefix(engine.kv, engine.runner, "other", workflow_id="wf") is None
    assert export_prefix(engine.kv, engine.runner, "acme", token_ids=[1] * 40) is None


def test_no_room_and_a_wrong_layout_change_nothing() -> None:
    source = torch_engine()
    run(source, request("a1", PROMPT + PROMPT, max_tokens=2))  # 5 whole blocks cached
    prefix = export_prefix(source.kv, source.runner, "acme", workflow_id="wf")
    assert prefix is not None and prefix.num_tokens == 80
    small = torch_engine(num_blocks=6)
    small.add_request(request("hold", [250 - i % 40 for i in range(70)], max_tokens=10))
    small.step()  # the running request holds 5 of the 6 blocks: the prefix needs 5
    assert small.stats().kv_blocks_used == 5
    before = (small.stats(), len(small.kv.cache))  # type: ignore[arg-type]
    assert import_prefix(small.kv, small.runner, prefix) is None
    assert (small.stats(), len(small.kv.cache)) == before  # type: ignore[arg-type]
    small.check_integrity()

    target = torch_engine()
    assert prefix.kv is not None
    for bad in (
        KvPrefix("acme", prefix.token_ids, prefix.kv[:1]),  # one layer
        KvPrefix("acme", prefix.token_ids[:64], prefix.kv),  # tokens and tensors disagree
        KvPrefix("acme", prefix.token_ids, None),  # no tensors for a runner that holds them
    ):
        with pytest.raises(KvTransferError):
            import_prefix(target.kv, target.runner, bad)
    assert len(target.kv.cache) == 0  # type: ignore[arg-type]
    target.check_integrity()


def test_the_emulated_runner_moves_the_accounting_only() -> None:
    def engine() -> LLMEngine:
        runner = EmulatedRunner("llama-3.1-8b", "H100-80G", sleep=lambda _: None, distinct_tokens=True)
        return LLMEngine(runner, EngineConfig(block_size=BS, num_blocks=64, max_num_seqs=4))

    source, target = engine(), engine()
    prompt = list(range(60, 160))  # 100 tokens
    run(source, request("a1", prompt))
    prefix = export_prefix(source.kv, source.runner, "acme", workflow_id="wf")
    assert prefix is not None and prefix.kv is None and prefix.num_tokens == 96
    with pytest.raises(KvTransferError):  # tensors for a runner that holds none
        import_prefix(target.kv, target.runner, KvPrefix("acme", prefix.token_ids, torch.zeros(1)))
    result = import_prefix(target.kv, target.runner, prefix)
    assert result is not None and result.imported_tokens == 96
    assert run(target, request("b1", prompt))[1] == 96
    target.check_integrity()
    # The transfer's modelled time: each H100's share of the KV over its 50 GB/s x 0.8 link.
    runner = target.runner
    assert isinstance(runner, EmulatedRunner)
    kv_bytes = 96 * 32 * 2 * 8 * 128 * 2  # tokens x layers x (K, V) x KV heads x head_dim x bf16
    assert runner.kv_transfer_seconds(96) == pytest.approx(50e-6 + kv_bytes / (50e9 * 0.8), rel=1e-12)


def test_import_into_another_block_size_keeps_its_own_whole_blocks() -> None:
    source = torch_engine()
    run(source, request("a1", PROMPT + PROMPT[:8]))  # 48 prompt tokens -> 3 whole blocks of 16
    prefix = export_prefix(source.kv, source.runner, "acme", workflow_id="wf")
    assert prefix is not None and prefix.num_tokens == 48
    runner = load_runner("tiny-random", max_model_len=256)
    target = LLMEngine(runner, EngineConfig(block_size=32, num_blocks=16, max_num_seqs=4))
    result = import_prefix(target.kv, target.runner, prefix)
    assert result is not None and (result.cached_tokens, result.imported_tokens) == (32, 32)
    target.check_integrity()


def test_reserve_commit_and_release_keep_the_reference_counts() -> None:
    kv = BlockManager(num_blocks=4, block_size=2)
    tag = BlockTag(Lineage("t", "wf"), "prompt")
    first = kv.reserve_prefix("t", [1, 2, 3, 4, 5])
    assert first is not None and (first.cached, len(first.new), first.token_ids) == ((), 2, (1, 2, 3, 4))
    kv.commit_prefix(first, tag)
    kv.check_integrity([])
    assert (kv.num_used_blocks, kv.num_cached_only_blocks) == (2, 2)
    second = kv.reserve_prefix("t", [1, 2, 3, 4, 9, 9])
    assert second is not None and second.cached == first.new and len(second.new) == 1
    kv.release_prefix(second)  # abandoned: the fresh block goes back, the cached ones stay
    kv.check_integrity([])
    assert (kv.num_used_blocks, kv.num_cached_only_blocks) == (2, 2)
    assert kv.reserve_prefix("u", list(range(10))) is None  # 5 blocks > 4: no room, no change
    kv.check_integrity([])
    assert (kv.num_used_blocks, kv.num_cached_only_blocks) == (2, 2)


def test_session_path_is_the_deepest_path_with_a_block_of_the_session() -> None:
    cache = RadixCache(2)
    mine, theirs = BlockTag(Lineage("t", "wf"), "prompt"), BlockTag(Lineage("t", "other"), "prompt")
    cache.insert("t", None, [1, 1], [0], [theirs])  # a shared head computed by another session
    cache.insert("t", 0, [2, 2, 3, 3], [1, 2], [mine, mine])
    cache.insert("t", 0, [4, 4, 5, 5, 6, 6], [3, 4, 5], [theirs] * 3)  # deeper, not the session's
    cache.insert("t", 1, [7, 7], [6], [mine])  # a sibling of block 2 at the same depth, used later
    assert cache.session_path("t", "wf") == ([0, 1, 6], [1, 1, 2, 2, 7, 7])
    assert cache.session_path("t", "other") == ([0, 3, 4, 5], [1, 1, 4, 4, 5, 5, 6, 6])
    assert cache.session_path("t", "none") == ([], [])
    assert cache.session_path("u", "wf") == ([], [])
