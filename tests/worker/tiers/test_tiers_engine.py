"""KV tiers in the engine core: L1 evictions demoted to L2, promoted back at admission, written to
and fetched from L3; hits reported per tier; outputs equal to computing from scratch."""

from __future__ import annotations

import pytest

from clairvoyant.worker.core.engine import EngineConfig, EngineRequest, LLMEngine
from clairvoyant.worker.core.l3 import MemoryL3
from clairvoyant.worker.core.sampling import SamplingParams
from clairvoyant.worker.core.tiers import Directive, TierConfig
from clairvoyant.worker.core.types import Lineage
from clairvoyant.worker.runners.loader import load_runner
from tests.worker.fakes import drain

pytestmark = pytest.mark.unit
BS = 16


def engine(num_blocks: int = 12, host_blocks: int = 32, l3: MemoryL3 | None = None, **tier_args: object) -> LLMEngine:
    runner = load_runner("tiny-random", max_model_len=512)
    tiers = TierConfig(num_host_blocks=host_blocks, prefetch_threshold_tokens=BS, **tier_args)  # type: ignore[arg-type]
    config = EngineConfig(block_size=BS, num_blocks=num_blocks, max_num_seqs=4, tiers=tiers)
    return LLMEngine(runner, config, l3=l3, kv_events=True)


def request(request_id: str, prompt: list[int], tenant: str = "acme", max_tokens: int = 8) -> EngineRequest:
    return EngineRequest(
        request_id, prompt, SamplingParams(max_tokens=max_tokens, temperature=0.0, ignore_eos=True),
        lineage=Lineage(tenant, "wf", "agent", request_id),
    )  # fmt: skip


def run(e: LLMEngine, req: EngineRequest) -> tuple[list[int], int]:
    e.add_request(req)
    result = drain(e)[req.request_id]
    e.check_integrity()
    return result.token_ids, result.final.cached_tokens


SHARED = [(7 * i + 3) % 200 for i in range(80)]  # 5 whole blocks
OTHER = [(11 * i + 5) % 200 for i in range(180)]  # with its output: all 12 blocks


def test_an_evicted_prefix_is_demoted_to_l2_and_promoted_back_with_the_same_tokens() -> None:
    reference, _ = run(engine(num_blocks=64), request("ref", SHARED + [1, 2, 3]))
    e = engine()
    run(e, request("a", SHARED + [9]))
    run(e, request("b", OTHER))  # needs the whole 12-block pool: evicts every cached block of "a"
    assert e.stats().demoted_blocks_total >= 5
    tokens, cached = run(e, request("c", SHARED + [1, 2, 3]))
    assert cached == 80 and tokens == reference
    stats = e.stats()
    assert stats.promoted_blocks_total == 5
    assert stats.hit_tokens == (0, 80, 0)  # L1, L2, L3


def test_a_prefix_written_to_l3_serves_another_engine() -> None:
    store = MemoryL3()
    writer = engine(l3=store)
    expected, _ = run(writer, request("a", SHARED + [1, 2, 3]))
    assert len(store) >= 5  # write_through: every cached block
    reader = engine(l3=store)
    tokens, cached = run(reader, request("b", SHARED + [1, 2, 3]))
    assert cached == 80 and tokens == expected
    stats = reader.stats()
    assert stats.hit_tokens == (0, 0, 80) and stats.l3_fetched_blocks_total == 5


def test_tenants_do_not_share_l3_pages() -> None:
    store = MemoryL3()
    run(engine(l3=store), request("a", SHARED + [1]))
    _, cached = run(engine(l3=store), request("b", SHARED + [1], tenant="globex"))
    assert cached == 0


def test_a_request_that_ends_in_its_prefill_step_is_written_through() -> None:
    store = MemoryL3()
    run(engine(l3=store), request("a", SHARED + [1], max_tokens=1))
    assert len(store) == 5


def test_a_path_longer_than_l2_leaves_its_head_there() -> None:
    e = engine(host_blocks=3)
    run(e, request("a", SHARED + [9]))
    run(e, request("b", OTHER))  # evicts the 5-block path; L2 holds 3 blocks
    _, cached = run(e, request("c", SHARED + [1, 2, 3]))
    l1, l2, _ = e.stats().hit_tokens
    assert 0 < l2 <= 3 * BS and cached == l1 + l2


def test_retaining_a_chains_last_block_pins_its_whole_prefix_and_a_full_pool_still_allocates() -> None:
    """A retain by hash names one block; its ancestors are pinned with it, so no cached-only block
    is left unevictable under a pinned tail, and a request needing every other block still runs."""
    e = engine(num_blocks=12)
    run(e, request("a", SHARED + [9]))  # 5 whole prompt blocks cached
    cache = e.kv.cache
    assert cache is not None
    last = max(cache.nodes("acme"), key=lambda n: len(n.path()))
    assert len(last.path()) >= 5
    pinned = e.apply_directive(Directive("retain", "acme", block_hashes=(last.block_hash,), ttl_s=60.0))
    assert pinned == len(last.path())
    tokens, _ = run(e, request("b", OTHER[: (12 - pinned - 1) * BS]))  # every block the pins leave
    assert len(tokens) == 8
    assert e.tiers is not None and {n.block_id for n in last.path()} <= set(e.tiers.retained_blocks(1))
    # Dropping the chain's head drops the pinned tail with it (it is useless without its prefix),
    # and the pool is whole again.
    head = last.path()[0]
    e.apply_directive(Directive("drop", "acme", block_hashes=(head.block_hash,), target_tier=1))
    assert e.tiers.retained_blocks(1) == []
    run(e, request("c", OTHER))  # needs all 12 blocks


def test_a_pre_prefill_is_cache_work_and_counts_in_no_request_hit() -> None:
    """A pre-prefill that reuses a cached prefix neither adds a prompt nor a hit; the request it
    prepares then counts its whole hit once (the hit ratio stays a share of request prompts)."""
    e = engine(num_blocks=64)
    run(e, request("a", SHARED + [9]))
    before = e.stats()
    assert (before.prompt_tokens_total, before.hit_tokens, before.cached_prompt_tokens_total) == (81, (0, 0, 0), 0)
    e.pre_prefill("acme", SHARED + OTHER[:32] + [1], Lineage("acme", "wf"))
    drain(e)
    after = e.stats()
    assert (after.prompt_tokens_total, after.hit_tokens, after.cached_prompt_tokens_total) == (81, (0, 0, 0), 0)
    _, cached = run(e, request("b", SHARED + OTHER[:32] + [2]))
    assert cached == 112  # the 80 of "a" and the 32 the pre-prefill computed
    stats = e.stats()
    assert (stats.prompt_tokens_total, stats.hit_tokens, stats.cached_prompt_tokens_total) == (81 + 113, (112, 0, 0), 112)
