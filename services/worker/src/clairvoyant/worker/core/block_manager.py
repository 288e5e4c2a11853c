"""Paged KV block accounting: reference counts, a free list and the radix prefix cache.

A block's reference count = number of sequence block tables holding it + 1 if a prefix-cache node
holds it.  Blocks with count 0 are on the free list; blocks held only by the cache are still free for
allocation purposes (evicted LRU on demand).  Shared blocks are never written: the prefix lookup stops
at least one token before the end of the sequence, so new K/V always lands in a block the sequence
owns alone; a block joins the cache only once full and computed.

The scheduler talks to this class through ``match_prefix`` / ``allocate`` / ``free`` /
``cache_computed_blocks`` and never reads block internals; "doesn't fit" is a ``False`` return.
Decode runs (core/decode_run.py) replay many steps' blocks at once through ``take`` and
``cache_in_order``, which give the same blocks in the same order as those calls step by step.
"""

from __future__ import annotations

from collections import Counter, deque
from collections.abc import Callable, Iterable
from collections.abc import Sequence as Tokens
from typing import NamedTuple

from clairvoyant.worker.core.radix_cache import BlockTag, HeldInsert, Namespace, RadixCache, RadixNode
from clairvoyant.worker.core.sequence import Sequence
from clairvoyant.worker.core.types import KvEvent, Tier


class PrefixReservation(NamedTuple):
    """Blocks held for a prefix on its way into the cache (``reserve_prefix``): one reference
    each, until ``commit_prefix`` or ``release_prefix``."""

    namespace: Namespace
    token_ids: tuple[int, ...]  # whole blocks
    cached: tuple[int, ...]  # blocks of the prefix's head already cached, in order
    new: tuple[int, ...]  # fresh blocks for the rest, in order: their K/V is to be written

    @property
    def block_table(self) -> list[int]:
        return [*self.cached, *self.new]


class BlockManager:
    """One tier's block pool: the device pool (L1) of an engine, or its host pool (L2,
    ``core/tiers.py``), which holds no sequences and is filled through ``reserve_prefix``.

    ``evict_hook`` sees each cached node just before eviction unlinks it, and ``flush_hook`` runs
    once eviction is done and before the freed blocks are handed out (the tiers demote the evicted
    blocks there, while their data is still intact).
    """

    def __init__(
        self,
        num_blocks: int,
        block_size: int,
        enable_prefix_cache: bool = True,
        *,
        hashing: bool = False,
        events: list[KvEvent] | None = None,
        tier: Tier = 1,
    ) -> None:
        assert num_blocks > 0 and block_size > 0
        self.num_blocks = num_blocks
        self.block_size = block_size
        self._ref_counts = [0] * num_blocks
        self._free: deque[int] = deque(range(num_blocks))
        self.cache: RadixCache | None = (
            RadixCache(block_size, hashing=hashing, events=events, tier=tier) if enable_prefix_cache else None
        )
        self._num_cached_only = 0  # blocks whose only reference is the cache's
        self.evict_hook: Callable[[RadixNode], None] | None = None
        self.flush_hook: Callable[[], None] | None = None

    # ---- queries -------------------------------------------------------------------------------
    @property
    def num_used_blocks(self) -> int:
        return self.num_blocks - len(self._free)

    @property
    def num_cached_only_blocks(self) -> int:
        return self._num_cached_only

    @property
    def num_allocatable_blocks(self) -> int:
        return len(self._free) + self._num_cached_only

    def blocks_needed(self, seq: Sequence, num_new_tokens: int) -> int:
        """Blocks to add so the table covers ``num_computed_tokens + num_new_tokens`` positions."""
        covered = seq.num_computed_tokens + num_new_tokens
        return max(0, -(-covered // self.block_size) - len(seq.block_table))

    def max_new_tokens(self, seq: Sequence) -> int:
        """How many new tokens ``seq`` could get slots for right now."""
        capacity = (len(seq.block_table) + self.num_allocatable_blocks) * self.block_size
        return max(0, capacity - seq.num_computed_tokens)

    def reclaimable_blocks(self, seq: Sequence) -> int:
        """Blocks that become allocatable if ``seq`` is freed (those no other sequence holds)."""
        cache = self.cache
        return sum(
            1
            for b in seq.block_table
            if self._ref_counts[b] - (1 if cache is not None and b in cache else 0) == 1
        )

    # ---- operations ----------------------------------------------------------------------------
    def match_prefix(self, seq: Sequence) -> int:
        """Give a block-less ``seq`` the cached blocks of its longest cached prefix; tokens matched.

        At most ``num_tokens - 1`` tokens are matched so at least one token is computed (for logits).
        """
        assert not seq.block_table and seq.num_computed_tokens == 0
        if self.cache is None:
            return 0
        max_blocks = (seq.num_tokens - 1) // self.block_size
        blocks = self.cache.match(seq.namespace, seq.token_ids, max_blocks)
        refs = self._ref_counts
        for b in blocks:  # ``_incref`` of blocks known to be cached
            if refs[b] == 1:
                self._num_cached_only -= 1
            refs[b] += 1
        seq.block_table = blocks
        seq.num_cached_blocks = len(blocks)
        seq.num_computed_tokens = len(blocks) * self.block_size
        return seq.num_computed_tokens

    def allocate(self, seq: Sequence, num_new_tokens: int) -> bool:
        """Extend ``seq``'s table to cover ``num_new_tokens`` more tokens; False (no change) if no room."""
        needed = self.blocks_needed(seq, num_new_tokens)
        if needed > self.num_allocatable_blocks:
            return False
        seq.block_table += self._take(needed)
        return True

    def _take(self, count: int) -> list[int]:
        """``count`` blocks with one reference each, evicting cached-only blocks as needed (the
        caller checked ``num_allocatable_blocks``): the free list's head first, then the evicted
        blocks in eviction order."""
        free, refs = self._free, self._ref_counts
        shortfall = count - len(free)
        if shortfall > 0:
            assert self.cache is not None
            evicted = self.cache.evict(shortfall, refs, self.evict_hook)
            assert len(evicted) == shortfall, "cached-only blocks must all be evictable"
            self._num_cached_only -= shortfall
            taken = [*free, *evicted]  # the whole free list, then what eviction freed
            free.clear()
            if self.flush_hook is not None:
                self.flush_hook()
        else:
            taken = [free.popleft() for _ in range(count)]
        for b in taken:  # free or just evicted, so not cached: one reference, the caller's
            refs[b] = 1
        return taken

    def take(self, count: int) -> list[int]:
        """``count`` fresh blocks with one reference each, for the caller to append to block tables
        in order (a decode run's allocations, core/decode_run.py); the caller checked
        ``num_allocatable_blocks``.  The same blocks, in the same order, as ``count`` one-block
        ``allocate`` calls with nothing freed in between."""
        assert count <= self.num_allocatable_blocks
        return self._take(count)

    def caches_as_new(self, seq: Sequence, index: int, claimed: set[tuple[object, ...]]) -> bool:
        """Whether caching ``seq``'s block ``index`` now would add a node, so ``cache_in_order`` may
        take it: no cached block below its parent has the same content, nor does one ``claimed``
        (which gets this block's (namespace, parent, content) when it is new)."""
        if self.cache is None:
            return False
        bs = self.block_size
        parent = seq.block_table[index - 1] if index else None
        if parent is not None and self._ref_counts[parent] == 2 and self.cache.is_leaf(parent):
            return True  # nothing below the parent, and no other sequence holds it to put anything there
        ident = (seq.namespace, parent, tuple(seq.token_ids[index * bs : (index + 1) * bs]))
        if ident in claimed or self.cache.has_child(*ident):
            return False
        claimed.add(ident)
        return True

    def cache_in_order(self, entries: Iterable[tuple[Sequence, int]]) -> None:
        """For each (sequence, block index), in order: cache that full, computed block, the one right
        after the sequence's cached blocks, as ``cache_computed_blocks`` would at the step it fills
        (one clock tick each).  Every block must be new content below its parent (``caches_as_new``,
        and no two entries alike), so no sequence switches blocks."""
        cache = self.cache
        assert cache is not None
        bs, refs = self.block_size, self._ref_counts
        inserts: list[HeldInsert] = []
        for seq, index in entries:
            assert index == seq.num_cached_blocks
            table, block = seq.block_table, seq.block_table[index]
            tag = seq.block_tags[0 if index < seq.prompt_len // bs else 1]
            key = tuple(seq.token_ids[index * bs : (index + 1) * bs])
            inserts.append((seq.namespace, table[index - 1] if index else None, key, block, tag))
            refs[block] += 1  # the cache's reference; the sequence holds one too
            seq.num_cached_blocks = index + 1
        cache.insert_held(inserts)

    def free(self, seq: Sequence) -> None:
        """Drop all of ``seq``'s references (its cached blocks stay in the cache, most recently used)."""
        table, cached, refs = seq.block_table, seq.num_cached_blocks, self._ref_counts
        # The uncached tail is the sequence's alone: back to the free list, deepest first (reused first).
        for b in reversed(table[cached:]):
            assert refs[b] == 1, f"block {b} is not the sequence's alone"
            refs[b] = 0
            self._free.append(b)
        if cached:
            assert self.cache is not None
            self._num_cached_only += self.cache.release(table[:cached], refs)
        seq.block_table = []
        seq.num_cached_blocks = 0
        seq.num_computed_tokens = 0

    def cache_computed_blocks(self, seq: Sequence) -> None:
        """Insert ``seq``'s newly full, computed blocks into the prefix cache.

        When another sequence cached the same content first, ``seq`` switches to that block and its
        own copy is released, so identical prefixes converge on one physical block.
        """
        cache = self.cache
        num_full = seq.num_computed_tokens // self.block_size
        if cache is None or num_full <= seq.num_cached_blocks:
            return
        first = seq.num_cached_blocks
        bs = self.block_size
        parent = seq.block_table[first - 1] if first > 0 else None
        prompt_blocks = seq.prompt_len // bs  # block i holds prompt tokens only if i < this
        prompt_tag, response_tag = seq.block_tags
        tags = [prompt_tag if i < prompt_blocks else response_tag for i in range(first, num_full)]
        own = seq.block_table[first:num_full]
        canonical = cache.insert(seq.namespace, parent, seq.token_ids[first * bs : num_full * bs], own, tags)
        for i, (mine, cached) in enumerate(zip(own, canonical, strict=True)):
            if mine == cached:
                self._ref_counts[mine] += 1  # the cache's reference; seq still holds one, so >= 2
            else:
                self._incref(cached)
                self._decref(mine)
                seq.block_table[first + i] = cached
        seq.num_cached_blocks = num_full

    # ---- prefixes from elsewhere (KV migration, core/kv_transfer.py) ---------------------------
    def reserve_prefix(self, namespace: Namespace, token_ids: Tokens[int]) -> PrefixReservation | None:
        """Hold blocks for the whole blocks of ``token_ids``: the cached head of the prefix, and
        fresh blocks for the rest.  None (no change) when the pool has no room for the rest.

        Holding the cached head keeps eviction from taking it while the fresh blocks are found.
        Requires the prefix cache.
        """
        cache = self.cache
        assert cache is not None, "importing a prefix needs the prefix cache"
        num_blocks = len(token_ids) // self.block_size
        cached = cache.match(namespace, token_ids, num_blocks)
        for b in cached:
            self._incref(b)
        missing = num_blocks - len(cached)
        if missing > self.num_allocatable_blocks:
            for b in cached:
                self._decref(b)
            return None
        whole = tuple(token_ids[: num_blocks * self.block_size])
        return PrefixReservation(namespace, whole, tuple(cached), tuple(self._take(missing)))

    def commit_prefix(self, reservation: PrefixReservation, tag: BlockTag | Tokens[BlockTag]) -> None:
        """Cache the reservation's fresh blocks (their K/V written by now) and let go of it.
        ``tag``: one for every fresh block, or one per fresh block."""
        cache = self.cache
        assert cache is not None
        if reservation.new:
            first = len(reservation.cached)
            bs = self.block_size
            parent = reservation.cached[-1] if reservation.cached else None
            tags = [tag] * len(reservation.new) if isinstance(tag, BlockTag) else list(tag)
            canonical = cache.insert(
                reservation.namespace, parent, reservation.token_ids[first * bs :], reservation.new, tags
            )
            assert canonical == list(reservation.new), "the prefix was cached meanwhile"
            for b in reservation.new:
                self._ref_counts[b] += 1  # the cache's reference
        self.release_prefix(reservation)

    def release_prefix(self, reservation: PrefixReservation) -> None:
        """Drop the reservation's references; fresh blocks nobody cached go back to the free list."""
        self._decref_all(reversed(reservation.block_table))

    # ---- holders other than sequences (core/tiers.py: retention, transfers in flight) ----------
    def pin(self, blocks: Iterable[int]) -> None:
        """Add a reference to each of ``blocks`` (cached or held): eviction skips them until ``unpin``."""
        for b in blocks:
            assert self._ref_counts[b] > 0, f"block {b} is free"
            self._incref(b)

    def unpin(self, blocks: Iterable[int]) -> None:
        self._decref_all(blocks)

    def drop(self, blocks: Iterable[int]) -> list[int]:
        """Remove cached ``blocks`` and what is cached below them from the cache, as far as only the
        cache holds them (``RadixCache.drop``); the removed blocks go back to the free list."""
        if self.cache is None:
            return []
        removed = self.cache.drop(blocks, self._ref_counts)
        for b in removed:
            self._ref_counts[b] = 0
            self._free.append(b)
        self._num_cached_only -= len(removed)
        return removed

    def ref_count(self, b: int) -> int:
        return self._ref_counts[b]

    # ---- reference counts ----------------------------------------------------------------------
    def _incref(self, b: int) -> None:
        if self._ref_counts[b] == 1 and self.cache is not None and b in self.cache:
            self._num_cached_only -= 1
        self._ref_counts[b] += 1

    def _decref_all(self, blocks: Iterable[int]) -> None:
        """``_decref`` of each of ``blocks``, in order, with one call to the cache for those left to it."""
        refs, free = self._ref_counts, self._free
        last_holder_left: list[int] = []  # down to one reference: the cache's, if it holds them
        for b in blocks:
            count = refs[b] = refs[b] - 1
            if count == 0:
                free.append(b)
            elif count == 1:
                last_holder_left.append(b)
            assert count >= 0, f"block {b} freed twice"
        if last_holder_left and self.cache is not None:
            self._num_cached_only += self.cache.note_unreferenced(last_holder_left)

    def _decref(self, b: int) -> None:
        self._decref_all((b,))

    def check_integrity(self, seqs: Iterable[Sequence], pins: Iterable[int] = ()) -> None:
        """Reference counts equal the references held by ``seqs``, ``pins`` (one per occurrence)
        and the cache; nothing leaks."""
        expected: Counter[int] = Counter(pins)
        for seq in seqs:
            assert len(set(seq.block_table)) == len(seq.block_table), f"duplicate block in {seq}"
            assert len(seq.block_table) * self.block_size >= seq.num_computed_tokens, seq
            assert seq.num_cached_blocks * self.block_size <= seq.num_computed_tokens, seq
            expected.update(seq.block_table)
        cached = set()
        if self.cache is not None:
            self.cache.check_integrity()
            cached = set(self.cache.cached_blocks())
            expected.update(cached)
            for seq in seqs:
                assert set(seq.block_table[: seq.num_cached_blocks]) <= cached, seq
        for b in range(self.num_blocks):
            assert self._ref_counts[b] == expected[b], (b, self._ref_counts[b], expected[b])
        free = set(self._free)
        assert len(free) == len(self._free), "free list has duplicates"
        assert free == {b for b in range(self.num_blocks) if expected[b] == 0}, "free list != unreferenced"
        cached_only = sum(1 for b in cached if expected[b] == 1)
        assert self._num_cached_only == cached_only, (self._num_cached_only, cached_only)
