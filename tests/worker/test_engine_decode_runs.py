"""Decode runs (``plan_decode_run`` + ``advance_decode``) leave the engine exactly as ``step()`` does.

Two engines with the emulated runner get the same requests at the same moments; one only steps,
the other takes every decode run it can, cut at a random step.  After each action the whole block
state must be identical: block tables, reference counts, the free list in order, every radix node
(content, parent, block, LRU time, tag) and the cache's clock.  Small pools make allocations evict;
shared prompt heads make several sequences fill blocks below one cached block; with the fixed
placeholder token, responses repeat, so filled blocks duplicate cached ones (the path that cannot
go in bulk).
"""

from __future__ import annotations

import random
from typing import Any

import pytest

from clairvoyant.worker.core.decode_run import Allocations
from clairvoyant.worker.core.engine import EngineConfig, EngineRequest, Lineage, LLMEngine
from clairvoyant.worker.core.sampling import SamplingParams
from clairvoyant.worker.runners.emulated import EmulatedRunner

pytestmark = pytest.mark.unit


def _engine(distinct_tokens: bool, prefix_cache: bool) -> LLMEngine:
    runner = EmulatedRunner(sleep=lambda seconds: None, distinct_tokens=distinct_tokens, max_model_len=512)
    config = EngineConfig(block_size=4, num_blocks=72, max_num_seqs=6, max_num_batched_tokens=48,
                          enable_prefix_cache=prefix_cache)  # fmt: skip
    return LLMEngine(runner, config, clock=lambda: 0.0)


def _state(engine: LLMEngine) -> dict[str, Any]:
    kv = engine.kv
    seqs = sorted(
        (s.request_id, tuple(s.token_ids), tuple(s.block_table), s.num_computed_tokens, s.num_cached_blocks)
        for s in engine.scheduler.running + engine.scheduler.waiting
    )
    state: dict[str, Any] = {"seqs": seqs, "free": list(kv._free), "refs": list(kv._ref_counts),
                             "cached_only": kv.num_cached_only_blocks, "stats": engine.stats()}  # fmt: skip
    if kv.cache is not None:
        nodes = kv.cache._node_of_block.items()
        state["nodes"] = sorted((b, n.key, n.parent.block_id, n.last_access, n.tag) for b, n in nodes)  # type: ignore[union-attr]
        state["clock"] = kv.cache._clock
    return state


def _request(rng: random.Random, index: int, heads: list[list[int]]) -> EngineRequest:
    prompt = rng.choice(heads) + [rng.randrange(33, 127) for _ in range(rng.randrange(0, 9))]
    return EngineRequest(
        request_id=f"r{index}",
        prompt_token_ids=prompt,
        sampling=SamplingParams(max_tokens=rng.randrange(2, 40), temperature=0.0, ignore_eos=True),
        lineage=Lineage("tenant", f"w{index % 3}", "agent"),
        detokenize=False,
    )


@pytest.mark.parametrize("seed", range(12))
@pytest.mark.parametrize(("distinct_tokens", "prefix_cache"), [(True, True), (False, True), (True, False)])
def test_decode_runs_leave_the_same_state_as_steps(seed: int, distinct_tokens: bool, prefix_cache: bool) -> None:
    rng = random.Random(seed)
    stepped, ran = _engine(distinct_tokens, prefix_cache), _engine(distinct_tokens, prefix_cache)
    heads = [[rng.randrange(33, 127) for _ in range(rng.randrange(1, 14))] for _ in range(3)]
    tokens: dict[str, list[int]] = {}
    runs = count = 0
    for _ in range(160):
        if rng.random() < 0.25:
            for engine in (stepped, ran):
                engine.add_request(_request(random.Random(count), count, heads))
            count += 1
        plan = ran.plan_decode_run()
        steps = 1
        if plan is not None:
            steps = rng.randrange(1, plan.num_steps + 1)
            for out in ran.advance_decode(plan, steps):
                tokens.setdefault(out.request_id, []).extend(out.new_token_ids)
            runs += 1
        else:
            for out in ran.step():
                tokens.setdefault(out.request_id, []).extend(out.new_token_ids)
        for _ in range(steps):
            stepped.step()
        assert _state(ran) == _state(stepped)
        ran.check_integrity()
    assert runs > 10 and count > 20  # the loop did take decode runs, on a pool under pressure
    assert stepped.stats().generated_tokens_total == sum(len(t) for t in tokens.values())


@pytest.mark.parametrize("seed", range(20))
def test_allocations_count_and_place_a_batch_blocks_as_enumerated(seed: int) -> None:
    """``Allocations.before`` / ``step_of`` (the plan's O(log n) view) against listing every
    allocation step of every sequence."""
    rng = random.Random(seed)
    block_size, batch = rng.choice([1, 4, 16]), rng.randrange(1, 12)
    phases = [rng.randrange(block_size) for _ in range(batch)]
    allocations = Allocations(tuple(phases), tuple(sorted(phases)), block_size)
    listed = sorted(p + r * block_size for p in phases for r in range(40))[: batch * 30]
    for step in range(30 * block_size):
        assert allocations.before(step) == sum(1 for s in listed if s < step)
    for k, step in enumerate(listed):
        assert allocations.step_of(k) == step
