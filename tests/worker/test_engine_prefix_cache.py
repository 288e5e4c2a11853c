"""Prefix cache: hits skip prefill work, results match the uncached engine, tenants are isolated."""

from __future__ import annotations

import pytest

from clairvoyant.worker.core.engine import Lineage, LLMEngine
from tests.worker.fakes import drain, letters, make_engine, request

pytestmark = pytest.mark.unit

PREFIX = letters(64, seed=7)


def _two_turns(engine: LLMEngine) -> tuple[list[int], list[int], int, int]:
    """A (prefix + 10) runs to completion, then B (prefix + 20); returns tokens and cached counts."""
    engine.add_request(request("a", PREFIX + letters(10, seed=1), max_tokens=8))
    a = drain(engine)["a"]
    engine.add_request(request("b", PREFIX + letters(20, seed=2), max_tokens=8))
    b = drain(engine)["b"]
    return a.token_ids, b.token_ids, a.final.cached_tokens, b.final.cached_tokens


def test_shared_prefix_is_computed_once_and_outputs_match_uncached() -> None:
    cached_engine, _ = make_engine(block_size=16, num_blocks=64)
    plain_engine, _ = make_engine(block_size=16, num_blocks=64, enable_prefix_cache=False)

    a_tokens, b_tokens, a_cached, b_cached = _two_turns(cached_engine)
    ref_a, ref_b, ref_a_cached, ref_b_cached = _two_turns(plain_engine)

    assert (a_tokens, b_tokens) == (ref_a, ref_b)
    assert (a_cached, b_cached) == (0, 64)
    assert (ref_a_cached, ref_b_cached) == (0, 0)
    stats = cached_engine.stats()
    assert stats.prompt_tokens_total == 74 + 84
    assert stats.computed_prompt_tokens_total == 74 + 20
    assert stats.cached_prompt_tokens_total == 64
    assert plain_engine.stats().computed_prompt_tokens_total == 74 + 84
    # Everything finished: only the cache holds blocks.  A: 81 computed tokens -> 5 full blocks;
    # B (84 + 8 tokens, 91 computed -> 5 full blocks) shares A's first 4 and adds 1 of its own.
    assert stats.kv_blocks_used == stats.kv_blocks_cached == 6
    assert plain_engine.stats().kv_blocks_used == 0


def test_follow_up_turn_hits_generated_blocks_and_tags_them() -> None:
    engine, _ = make_engine(block_size=16, num_blocks=64)
    lineage = Lineage("acme", "wf-1", "agent-1", "turn-1")
    prompt = PREFIX + letters(10, seed=1)
    engine.add_request(request("t1", prompt, max_tokens=8, lineage=lineage))
    t1 = drain(engine)["t1"]
    # 74 + 8 tokens, 81 computed (the last sampled token never is): 5 full blocks, the 5th mixed.
    follow_up = prompt + t1.token_ids + letters(5, seed=3)
    engine.add_request(request("t2", follow_up, max_tokens=4, lineage=Lineage("acme", "wf-1", "agent-2")))
    t2 = drain(engine)["t2"]
    assert t2.final.cached_tokens == 80

    cache = engine.kv.cache
    assert cache is not None
    tags = {b: cache.tag_of(b) for b in cache.cached_blocks()}
    by_source = sorted((t.source, t.lineage.request_id if t.lineage else None) for t in tags.values() if t)
    # t1 created 4 prompt blocks + 1 response block; t2 (87 + 4 tokens, 90 computed) added 0 new
    # full blocks beyond the 5 it matched.
    assert by_source == [("prompt", "turn-1")] * 4 + [("response", "turn-1")]


def test_tenants_do_not_share_blocks() -> None:
    engine, _ = make_engine(block_size=16, num_blocks=64)
    prompt = PREFIX + letters(10, seed=1)
    engine.add_request(request("a", prompt, max_tokens=4, lineage=Lineage("tenant-a")))
    drain(engine)
    engine.add_request(request("b", prompt, max_tokens=4, lineage=Lineage("tenant-b")))
    engine.add_request(request("anon", prompt, max_tokens=4))
    results = drain(engine)
    assert results["b"].final.cached_tokens == 0
    assert results["anon"].final.cached_tokens == 0
    engine.add_request(request("a2", prompt, max_tokens=4, lineage=Lineage("tenant-a", "other-wf")))
    assert drain(engine)["a2"].final.cached_tokens == 64


def test_lookup_leaves_at_least_one_prompt_token_to_compute() -> None:
    engine, runner = make_engine(block_size=16, num_blocks=64)
    prompt = letters(32, seed=5)  # exactly two full blocks
    engine.add_request(request("a", prompt, max_tokens=2))
    first = drain(engine)["a"].token_ids
    engine.add_request(request("b", prompt, max_tokens=2))
    runner.calls.clear()
    second = drain(engine)["b"]
    assert second.token_ids == first
    assert second.final.cached_tokens == 16  # block-aligned, at most len(prompt) - 1 tokens
    assert runner.calls[0] == [(1, 16, 16, True)]


def test_identical_concurrent_prompts_converge_on_one_copy() -> None:
    engine, _ = make_engine(block_size=4, num_blocks=64)
    prompt = letters(16, seed=9)
    for rid in ("x", "y", "z"):
        engine.add_request(request(rid, prompt, max_tokens=1))
    results = drain(engine)
    assert len({tuple(r.token_ids) for r in results.values()}) == 1
    # 16 computed prompt tokens each -> 4 full blocks each, deduplicated to one copy in the cache.
    assert engine.stats().kv_blocks_used == engine.stats().kv_blocks_cached == 4


def test_eviction_takes_least_recently_used_leaves_first() -> None:
    engine, _ = make_engine(block_size=4, num_blocks=10)
    a, b = letters(12, seed=21), letters(12, seed=22)
    for rid, prompt in (("a", a), ("b", b)):
        engine.add_request(request(rid, prompt, max_tokens=1))
        drain(engine)
    assert engine.stats().kv_blocks_cached == 6  # 3 full blocks each
    engine.add_request(request("c", letters(21, seed=23), max_tokens=1))  # needs 6 blocks, 4 free
    drain(engine)
    # a's deepest block went first, then its parent (now a leaf, still older than all of b's).
    engine.add_request(request("b2", b, max_tokens=1))
    engine.add_request(request("a2", a, max_tokens=1))
    results = drain(engine)
    assert (results["b2"].final.cached_tokens, results["a2"].final.cached_tokens) == (8, 4)
