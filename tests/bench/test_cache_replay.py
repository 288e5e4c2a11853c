"""The offline cache replay: Belady's optimum bounds every policy, exact counts on small traces, drops
that matter, and the ``cache-replay`` command end to end on a tiny simulated run."""

from __future__ import annotations

import json
import math
import random
from pathlib import Path

import pytest

from clairvoyant.bench import cache_replay
from clairvoyant.bench.access_trace import CLUSTER, AccessTrace
from clairvoyant.bench.replay_cache import NEVER, belady, competitive_ratio, next_reads, replay
from clairvoyant.bench.replay_view import ReplayState, ReplayView
from clairvoyant.core.app_metadata import AppMetadata
from clairvoyant.policy import CACHE_POLICIES
from clairvoyant.policy.cache import (
    BlockUse,
    CacheDirective,
    CachePolicy,
    CacheView,
    CompletedCall,
    DirectiveKind,
)

pytestmark = [pytest.mark.unit, pytest.mark.timeout(120)]


def call(
    index: int, start: float, prompt: tuple[int, ...], response: tuple[int, ...] = (), *, worker: str = "w0",
    workflow: str = "wf", end: float | None = None, last: bool = False,
) -> CompletedCall:  # fmt: skip
    return CompletedCall(
        request_id=f"{workflow}/{index}", tenant="t", model="m", worker_id=worker, start=start,
        end=start + 0.5 if end is None else end, prompt_tokens=16 * len(prompt), output_tokens=16 * len(response),
        app_metadata=AppMetadata("type", workflow, f"agent{index % 2}", workflow_end=last or None),
        prompt_block_hashes=prompt, response_block_hashes=response,
    )  # fmt: skip


def cyclic(blocks: tuple[int, ...], rounds: int) -> AccessTrace:
    """One single-block read a second, cycling through ``blocks``."""
    order = [b for _ in range(rounds) for b in blocks]
    return AccessTrace.of([call(i, float(i), (b,)) for i, b in enumerate(order)])


class RandomRank:
    """Evicts in a fixed random order of blocks: an arbitrary online policy."""

    def __init__(self, seed: int) -> None:
        self.rng = random.Random(seed)
        self.ranks: dict[int, float] = {}

    def on_completion(self, call: CompletedCall, view: CacheView, now: float) -> list[CacheDirective]:
        return []

    def on_tick(self, view: CacheView, now: float) -> list[CacheDirective]:
        return []

    def eviction_rank(self, block: BlockUse, now: float) -> float:
        return self.ranks.setdefault(block.block_hash, self.rng.random())

    def forget(self, tenant: str, workflow_id: str) -> None:
        return None


class MostRecentFirst(RandomRank):
    def eviction_rank(self, block: BlockUse, now: float) -> float:
        return -block.last_access


class DropEnded(RandomRank):
    """LRU, and drops a workflow's blocks when its last call completes (workflow_end)."""

    def __init__(self, kind: DirectiveKind = "drop") -> None:
        super().__init__(0)
        self.kind = kind

    def on_completion(self, call: CompletedCall, view: CacheView, now: float) -> list[CacheDirective]:
        meta = call.app_metadata
        if meta is None or not meta.workflow_end:
            return []
        return [CacheDirective(self.kind, call.worker_id, call.tenant, workflow_id=meta.workflow_id,
                               ttl_s=10.0 if self.kind == "retain" else None)]  # fmt: skip

    def eviction_rank(self, block: BlockUse, now: float) -> float:
        return block.last_access


def random_trace(seed: int, *, scope: str = "worker", calls: int = 60, universe: int = 24) -> AccessTrace:
    """Calls on two workers reading chains drawn from a small universe, some writing responses
    (blocks that later calls read, or write again); random starts and durations, so calls overlap."""
    rng = random.Random(seed)
    out = []
    for i in range(calls):
        start = rng.uniform(0, 30)
        prompt = tuple(rng.sample(range(universe + 8), rng.randint(1, 4)))  # responses are read again too
        response = tuple(rng.sample(range(universe, universe + 8), rng.randint(0, 2)))
        out.append(call(i, start, prompt, response, worker=f"w{rng.randint(0, 1)}", workflow=f"wf{i % 5}",
                        end=start + rng.uniform(0, 3)))  # fmt: skip
    return AccessTrace.of(out, scope)  # type: ignore[arg-type]


def policy_named(name: str, seed: int) -> CachePolicy:
    """A fresh registered policy, or one of the test's own."""
    if name == "random":
        return RandomRank(seed)
    if name == "mru":
        return MostRecentFirst(seed)
    return CACHE_POLICIES.create(name)


@pytest.mark.parametrize("name", [*CACHE_POLICIES.names(), "random", "mru"])
@pytest.mark.parametrize("scope", ["worker", "cluster"])
def test_belady_misses_no_more_than_any_policy(name: str, scope: str) -> None:
    for seed in range(6):
        trace = random_trace(seed, scope=scope)
        for capacity in (4, 6, 10):
            optimum = belady(trace, capacity)
            result = replay(trace, capacity, policy_named(name, seed))
            assert optimum.reads == result.reads == trace.reads()
            assert optimum.misses <= result.misses, (seed, capacity)
            assert competitive_ratio(result.misses, optimum.misses) >= 1.0


def test_lru_and_belady_on_a_cyclic_trace() -> None:
    # 1 2 3 4 three times into 3 blocks: LRU always evicts the block needed next (12 misses).
    # Belady keeps 1 2 3 and lets each 4 bypass: 3 first misses + 3 of 4 = 6.
    trace = cyclic((1, 2, 3, 4), rounds=3)
    lru = replay(trace, 3, CACHE_POLICIES.create("lru"))
    optimum = belady(trace, 3)
    assert (lru.reads, lru.misses, lru.evictions) == (12, 12, 9)
    assert (optimum.misses, optimum.evictions) == (6, 0)
    assert competitive_ratio(lru.misses, optimum.misses) == 2.0
    # 1 2 3 twice into 2 blocks: LRU misses all 6, Belady 4 (3 bypasses, then 1 and 2 hit).
    assert replay(cyclic((1, 2, 3), 2), 2, CACHE_POLICIES.create("lru")).misses == 6
    assert belady(cyclic((1, 2, 3), 2), 2).misses == 4
    # Room for every block: only the first reads miss.
    assert belady(trace, 4).misses == replay(trace, 4, CACHE_POLICIES.create("lru")).misses == 4


def dead_workflow_trace() -> AccessTrace:
    """B reads its context, A runs its only call, C reads its context (the cache of 4 is full),
    then B reads its context again.  LRU evicts B's context for C's; dropping ended A's makes room."""
    return AccessTrace.of([
        call(0, 0.0, (1, 2), workflow="B"),
        call(0, 1.0, (3, 4), workflow="A", last=True),
        call(0, 2.0, (5, 6), workflow="C"),
        call(1, 3.0, (1, 2), workflow="B"),
    ])  # fmt: skip


def test_drops_of_dead_blocks_save_misses() -> None:
    trace = dead_workflow_trace()
    lru = replay(trace, 4, CACHE_POLICIES.create("lru"))
    dropping = replay(trace, 4, DropEnded())
    assert (lru.misses, lru.evictions, lru.dropped) == (8, 4, 0)  # 1 2 for 5 6, then 3 4 for 1 2
    assert (dropping.misses, dropping.evictions, dropping.dropped, dropping.directives) == (6, 0, 2, 1)
    assert belady(trace, 4).misses == 6
    # Directives other than drop do nothing in the replay.
    retaining = replay(trace, 4, DropEnded("retain"))
    assert (retaining.misses, retaining.dropped, retaining.directives) == (8, 0, 1)


def test_pinned_blocks_of_the_access_are_not_evicted() -> None:
    # A 3-block chain into a cache of 2: the third block bypasses (the first two are pinned),
    # for Belady as for LRU; the next read of the chain then hits its first two blocks.
    trace = AccessTrace.of([call(0, 0.0, (1, 2, 3)), call(1, 1.0, (1, 2, 3))])
    assert belady(trace, 2).misses == replay(trace, 2, CACHE_POLICIES.create("lru")).misses == 4


def test_trace_order_and_next_reads() -> None:
    # The parent's response is written at t=1, the moment its child reads it: write first.
    parent = call(0, 0.0, (1,), (2,), end=1.0)
    child = call(1, 1.0, (1, 2), end=2.0)
    rewrite = call(2, 3.0, (9,), (2,), end=4.0)  # writes block 2 again before anyone reads it
    last = call(3, 5.0, (2,), end=6.0)
    trace = AccessTrace.of([child, parent, rewrite, last])
    kinds = [(a.time, a.write, a.blocks) for a in trace.accesses]
    assert kinds[:4] == [(0.0, False, (1,)), (1.0, True, (2,)), (1.0, False, (1, 2)), (2.0, True, ())]
    nexts = next_reads(trace)
    assert nexts[0] == [2]  # block 1 at flat position 0, read next at position 2
    assert nexts[2] == [NEVER, NEVER]  # 1 never again; 2 is written again before its next read
    assert trace.working_set() == 3 and trace.reads() == 5
    assert AccessTrace.of([parent, call(1, 1.0, (5,), worker="w1")], "cluster").caches() == [CLUSTER]
    with pytest.raises(ValueError, match="unknown scope"):
        AccessTrace.of([parent], "rack")  # type: ignore[arg-type]


def test_replay_view_answers_from_the_replay_state() -> None:
    a0 = call(0, 0.0, (1, 2), (3,), workflow="A")
    b0 = call(0, 0.5, (1, 7), workflow="B", worker="w1")
    trace = AccessTrace.of([a0, b0])
    state = ReplayState(trace, capacity=8)
    view = ReplayView(state)
    for access in trace.accesses:
        cache = state.cache(access.cache)
        for block in access.blocks:
            if block not in cache.blocks:
                state.insert(
                    cache, state.lineage(block, trace.calls[access.call], access.time, response=access.write)
                )
        if access.write:
            state.completed(trace.calls[access.call])
    assert [load.worker_id for load in view.workers("")] == ["w0", "w1"]
    assert view.workers("m")[0].l1_used == 3 and view.workers("m")[0].l1_total == 8
    assert [r.l1_blocks for r in view.residency("t", "m", (1, 2, 3))] == [3, 1]
    assert view.residency("other", "m", (1, 2))[0].l1_blocks == 0  # tenant-scoped
    assert [(w, use.block_hash, use.response) for w, _, use in view.blocks("t", "A")] == [
        ("w0", 1, False), ("w0", 2, False), ("w0", 3, True)]  # fmt: skip
    assert view.references("t", 1) == 1  # B read A's block 1
    assert view.references("t", 2) == 0
    assert view.history_agents("t", "A") == ["agent0"]
    assert view.chains("t", "A", "agent0") == [(1, 2, 3)] and view.chains("t", "A", "agent1") == []
    assert view.assemble("t", "A", "${new}") is None
    state.ended(("t", "B"))
    assert view.references("t", 1) == 0
    dropped = state.drop(CacheDirective("drop", "w0", "t", workflow_id="A", agent_id="agent0"))
    assert dropped == 3 and view.blocks("t", "A") == []


def test_parse_capacities() -> None:
    assert cache_replay.parse_capacities("0.1,0.3", 1000) == [100, 300]
    assert cache_replay.parse_capacities("64, 0.5", 10) == [64, 5]
    assert cache_replay.parse_capacities("0.001", 10) == [1]
    for bad in ("1.5", "-3", "", "0"):
        with pytest.raises(ValueError):
            cache_replay.parse_capacities(bad, 10)
    assert competitive_ratio(0, 0) == 1.0 and math.isinf(competitive_ratio(3, 0))


def test_command_on_a_tiny_run(tmp_path: Path) -> None:
    from clairvoyant.bench.__main__ import main as bench_main

    argv = ["cache-replay", "--workload", "coding_assistant", "--workflows", "3", "--concurrency", "3",
            "--capacities", "0.05,0.2"]  # fmt: skip
    assert bench_main(["--out-dir", str(tmp_path), *argv]) == 0
    saved = json.loads((tmp_path / "cache-replay.json").read_text())
    assert {"benchmark", "params", "columns", "rows", "summary", "notes"} <= saved.keys()
    replays = saved["params"]["replays"]
    assert len(replays) == 2 * len(CACHE_POLICIES.names()) == len(saved["rows"])
    trace = saved["params"]["traces"]["coding_assistant"]
    assert trace["calls"] > 0 and trace["reads"] > 0
    for result in replays:
        assert {
            "capacity",
            "policy",
            "reads",
            "misses",
            "belady_misses",
            "competitive_ratio",
        } <= result.keys()
        assert result["reads"] == trace["reads"]
        assert 0 < result["belady_misses"] <= result["misses"] <= result["reads"]
        assert result["competitive_ratio"] >= 1.0
    small, large = sorted({r["capacity"] for r in replays})
    assert small == round(0.05 * trace["working_set"]) and large == round(0.2 * trace["working_set"])
