"""RadixCache's lazy LRU heap evicts exactly what a full scan of the evictable leaves would."""

from __future__ import annotations

import copy
import random

import pytest

from clairvoyant.worker.core.radix_cache import BlockTag, RadixCache

pytestmark = pytest.mark.unit
BS = 2  # tokens per block


def _reference_victim(cache: RadixCache, refs: dict[int, int]) -> int | None:
    """The least recently used leaf that only the cache holds (ties: lower block id), by a scan."""
    candidates = [
        (node.last_access, block)
        for block, node in cache._node_of_block.items()  # noqa: SLF001 - the reference reads the tree
        if not node.children and refs[block] == 1
    ]
    return min(candidates)[1] if candidates else None


@pytest.mark.parametrize("seed", range(25))
def test_evict_matches_a_full_scan_under_random_operations(seed: int) -> None:
    rng = random.Random(seed)
    cache = RadixCache(BS)
    refs: dict[int, int] = {}  # block -> references (the cache's own included), like the block manager's
    paths: dict[int, list[int]] = {}  # block -> the tokens from the root to its end
    next_block = 0
    tag = BlockTag(None, "prompt")
    for _ in range(400):
        op = rng.random()
        cached = list(cache._node_of_block)  # noqa: SLF001
        if op < 0.35 or not cached:  # insert a run of 1-3 new blocks under a random node (or a root)
            parent = rng.choice(cached) if cached and rng.random() < 0.7 else None
            prefix = paths[parent] if parent is not None else []
            count = rng.randint(1, 3)
            tokens = [rng.randint(0, 3) for _ in range(count * BS)]
            blocks = list(range(next_block, next_block + count))
            canonical = cache.insert("t", parent, tokens, blocks, [tag] * count)
            for i, (mine, kept) in enumerate(zip(blocks, canonical, strict=True)):
                if mine == kept:  # new: the cache's reference and the inserting sequence's
                    refs[mine] = 2
                    paths[mine] = prefix + tokens[: (i + 1) * BS]
                else:
                    refs[kept] += 1
                next_block += 1
            for b in canonical:  # the sequence finishes at once or later
                if rng.random() < 0.6:
                    refs[b] -= 1
                    if refs[b] == 1:
                        cache.note_unreferenced([b])
        elif op < 0.55:  # a lookup of an existing path takes references on what it matches
            block = rng.choice(cached)
            matched = cache.match("t", paths[block], len(paths[block]) // BS)
            for b in matched:
                refs[b] += 1
        elif op < 0.75:  # release a referenced block
            held = [b for b in cached if refs[b] > 1]
            if held:
                b = rng.choice(held)
                refs[b] -= 1
                if refs[b] == 1:
                    cache.note_unreferenced([b])
        elif op < 0.85:
            cache.touch(rng.sample(cached, min(3, len(cached))))
        elif op < 0.88:  # evict a few, one at a time, against the scan
            for _ in range(rng.randint(1, 4)):
                expected = _reference_victim(cache, refs)
                got = cache.evict(1, refs)  # type: ignore[arg-type]
                assert got == ([] if expected is None else [expected])
                for b in got:
                    del refs[b], paths[b]
        elif op < 0.93:  # a cache directive drops a block and what hangs below it (as far as unheld)
            for b in cache.drop([rng.choice(cached)], refs):  # type: ignore[arg-type]
                del refs[b], paths[b]
        else:  # evict many in one call: the same blocks, in the same order, as one at a time
            count = rng.randint(2, 12)
            one_by_one = copy.deepcopy(cache)
            expected_all = [b for _ in range(count) for b in one_by_one.evict(1, refs)]  # type: ignore[arg-type]
            assert cache.evict(count, refs) == expected_all  # type: ignore[arg-type]
            for b in expected_all:
                del refs[b], paths[b]
        cache.check_integrity()
