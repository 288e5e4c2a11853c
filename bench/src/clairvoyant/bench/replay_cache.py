"""Caches replayed over an ``AccessTrace``: Belady's optimum and a cache policy's eviction order.

Each cache of the trace holds at most ``capacity`` blocks.  A read of a block the cache holds is a
hit; any other read is a miss, and the block is computed and offered to the cache.  A write (a
response's blocks) offers them without counting.  An offered block enters a full cache only by
evicting another:

    candidates = the cache's blocks, less those the current access has read or written (the
                 request being served pins its own blocks)  +  the offered block itself
    Belady:  the candidate whose next read is farthest (never read again, or written again before
             its next read: the write recreates it for free, counts as farthest)
    policy:  the candidate with the lowest ``eviction_rank(block, now)``; ties go to the block
             cached first, and the offered block is cached last

When the offered block is the one chosen, it is not cached (it bypasses the cache).  Both replays
face the same pins, so Belady's misses bound every policy's from below.

``replay(trace, capacity, policy)`` also tells ``policy`` of each completion
(``on_completion(call, view, now)``, just after the call's response is written), ticks it every
``tick_s`` of trace time (``on_tick``), and has it ``forget`` each workflow after its last call.
Of its directives only ``drop`` changes the replay (the blocks named leave the cache; a drop aimed
at L3 alone does nothing, the replay having one tier); retain, write back, promote and pre-prefill
are ignored, so a policy is scored on its eviction order and its drops.
"""

from __future__ import annotations

import heapq
import math
from collections.abc import Sequence
from typing import NamedTuple

from clairvoyant.bench.access_trace import Access, AccessTrace
from clairvoyant.bench.replay_view import ReplayCache, ReplayState, ReplayView
from clairvoyant.policy.cache import BlockUse, CacheDirective, CachePolicy, CompletedCall, lineage_key

NEVER = math.inf  # the next read of a block never read again


class ReplayResult(NamedTuple):
    """One replay of a trace at one capacity (summed over the trace's caches)."""

    reads: int  # block reads
    misses: int  # reads of a block the cache did not hold
    evictions: int
    dropped: int  # blocks removed by drop directives
    directives: int  # every directive the policy issued (0 for Belady)

    @property
    def hits(self) -> int:
        return self.reads - self.misses


def next_reads(trace: AccessTrace) -> list[list[float]]:
    """For each block of each access, the flat position of the block's next read on the same
    cache: ``NEVER`` when it is not read again, or is written again before (a write recreates it).

        flat position:  access 0: blocks 0..n0-1, access 1: blocks n0..n0+n1-1, ...
    """
    following: dict[tuple[str, int], float] = {}
    out: list[list[float]] = [[] for _ in trace.accesses]
    position = sum(len(access.blocks) for access in trace.accesses)
    for index in range(len(trace.accesses) - 1, -1, -1):
        access = trace.accesses[index]
        position -= len(access.blocks)
        row = [NEVER] * len(access.blocks)
        for offset in range(len(access.blocks) - 1, -1, -1):
            key = (access.cache, access.blocks[offset])
            row[offset] = following.get(key, NEVER)
            following[key] = NEVER if access.write else position + offset
        out[index] = row
    return out


def belady(trace: AccessTrace, capacity: int) -> ReplayResult:
    """Belady's optimum: on a full cache, evict the candidate read farthest in the future."""
    if capacity < 0:
        raise ValueError(f"capacity must be >= 0, got {capacity}")
    nexts = next_reads(trace)
    resident: dict[str, dict[int, float]] = {}  # cache -> block -> its next read
    heaps: dict[str, list[tuple[float, int]]] = {}  # cache -> (-next read, block), stale entries skipped
    reads = misses = evictions = 0
    for access, row in zip(trace.accesses, nexts, strict=True):
        blocks = resident.setdefault(access.cache, {})
        heap = heaps.setdefault(access.cache, [])
        pinned: set[int] = set()
        held: list[tuple[float, int]] = []  # the pinned blocks' entries, off the heap until the access ends
        for block, upcoming in zip(access.blocks, row, strict=True):
            if not access.write:
                reads += 1
            if block not in blocks:
                misses += not access.write
                if len(blocks) >= capacity:
                    victim = _farthest(heap, blocks, pinned)
                    if victim is None or blocks[victim] <= upcoming:
                        continue  # the offered block is read last (or nothing can go): it bypasses
                    del blocks[victim]
                    heapq.heappop(heap)
                    evictions += 1
            blocks[block] = upcoming
            held.append((-upcoming, block))
            pinned.add(block)
        for entry in held:
            heapq.heappush(heap, entry)
    return ReplayResult(reads, misses, evictions, dropped=0, directives=0)


def _farthest(heap: list[tuple[float, int]], blocks: dict[int, float], pinned: set[int]) -> int | None:
    """The unpinned block of ``blocks`` read farthest ahead, at the top of ``heap``; or None.
    Entries of evicted blocks, of blocks read since, and of pinned ones (whose current entries wait
    off the heap) are discarded on the way."""
    while heap:
        key, block = heap[0]
        if blocks.get(block) == -key and block not in pinned:
            return block
        heapq.heappop(heap)
    return None


def replay(trace: AccessTrace, capacity: int, policy: CachePolicy, tick_s: float = 1.0) -> ReplayResult:
    """``policy``'s eviction order and drops over ``trace`` (the module docstring has the rules)."""
    if capacity < 0:
        raise ValueError(f"capacity must be >= 0, got {capacity}")
    state = ReplayState(trace, capacity)
    view = ReplayView(state)
    last_call = _last_calls(trace.calls)
    reads = misses = evictions = dropped = directives = 0
    next_tick = trace.accesses[0].time + tick_s if trace.accesses else 0.0
    for access in trace.accesses:
        while tick_s > 0 and access.time >= next_tick:
            issued = policy.on_tick(view, next_tick)
            directives += len(issued)
            dropped += _apply(state, issued)
            next_tick += tick_s
        call = trace.calls[access.call]
        read, missed, evicted = _serve(state, policy, access, call)
        reads, misses, evictions = reads + read, misses + missed, evictions + evicted
        if access.write:
            state.completed(call)
            issued = policy.on_completion(call, view, access.time)
            directives += len(issued)
            dropped += _apply(state, issued)
            key = lineage_key(call)
            if key is not None and last_call.get(key) == access.call:
                policy.forget(*key)
                state.ended(key)
    return ReplayResult(reads, misses, evictions, dropped, directives)


def _serve(
    state: ReplayState, policy: CachePolicy, access: Access, call: CompletedCall
) -> tuple[int, int, int]:
    """One access on its cache; (reads, misses, evictions)."""
    now, cache = access.time, state.cache(access.cache)
    pinned: set[int] = set()
    order: list[tuple[float, int, int]] | None = None  # (rank, cached order, block), lowest last
    reads = misses = evictions = 0
    for block in access.blocks:
        reads += not access.write
        if block in cache.blocks:
            cache.touch(block, now, hit=not access.write)
            pinned.add(block)
            continue
        misses += not access.write
        offered = state.lineage(block, call, now, response=access.write)
        if len(cache.blocks) >= state.capacity:
            if order is None:  # ranked once per access, at its time
                order = _lowest(policy, cache, pinned, now, len(access.blocks))
            while order and (order[-1][2] not in cache.blocks or order[-1][2] in pinned):
                order.pop()  # evicted, or read by this access since it was ranked
            if not order or policy.eviction_rank(offered, now) < order[-1][0]:
                continue  # the offered block ranks lowest (or nothing can go): it bypasses
            state.evict(cache, order.pop()[2])
            evictions += 1
        state.insert(cache, offered)
        pinned.add(block)
    return reads, misses, evictions


def _lowest(
    policy: CachePolicy, cache: ReplayCache, pinned: set[int], now: float, count: int
) -> list[tuple[float, int, int]]:
    """The ``count`` lowest (rank, cached order, block) of the unpinned blocks, lowest last.  An
    access of ``count`` blocks evicts at most one per miss and skips at most one per hit, so it
    never needs more."""
    ranked = (
        (policy.eviction_rank(use, now), seq, b) for b, (use, seq) in cache.blocks.items() if b not in pinned
    )
    return heapq.nsmallest(count, ranked)[::-1]


def _apply(state: ReplayState, issued: Sequence[CacheDirective]) -> int:
    """Apply the drops among ``issued``; the blocks removed."""
    removed = 0
    for directive in issued:
        if directive.kind == "drop" and directive.target_tier != 3:
            removed += state.drop(directive)
    return removed


def _last_calls(calls: Sequence[CompletedCall]) -> dict[tuple[str, str], int]:
    """(tenant, workflow) -> the index of its call that ends last."""
    last: dict[tuple[str, str], int] = {}
    for index, call in enumerate(calls):
        key = lineage_key(call)
        if key is not None and (key not in last or calls[last[key]].end <= call.end):
            last[key] = index
    return last


def competitive_ratio(misses: int, optimal_misses: int) -> float:
    """A policy's misses over Belady's on the same trace and capacity (SAGA's Eq. 15: online cost
    over the offline optimum's, in tokens prefilled, which for whole blocks is misses x block size).
    1.0 when both are 0; infinite when only the optimum is 0."""
    if optimal_misses == 0:
        return 1.0 if misses == 0 else math.inf
    return misses / optimal_misses


__all__ = ["NEVER", "BlockUse", "ReplayResult", "belady", "competitive_ratio", "next_reads", "replay"]
