"""KV tiers of one engine: L1 device, L2 host, L3 shared storage, and what moves between them.

::

    L1  device pool  (BlockManager + RadixCache, tier 1)   what forward reads
     |  evicted leaf --demote (its path's missing blocks)--> L2      promote at admission <--+
    L2  host pool    (a second BlockManager + RadixCache, tier 2: no sequences, only paths)  |
     |  write_through / write_through_selective / write_back --put--> L3                     |
    L3  shared store (core/l3.py: pages keyed by the block hash chain, per model and tenant) |
        prefetch at arrival --exists, get--> staged into L2 -------------------------------+

Residency is per tier and per node: the L1 and L2 trees index the same token paths, so a prefix
can sit in L1, L2 or both, and ``peek`` in each says how far it goes there.  L3 is not mirrored (as
in SGLang HiCache): it is asked (``exists``) when a request arrives.  A prefix match reports its hit
length per tier: L1 from the device tree, L2 what admission promoted, L3 what a prefetch staged.

The operations, each counted and each reported as ``KvEvent``s by the trees that change:

- **demote** (L1 -> L2): when L1 evicts a leaf and the policy keeps it (the default with an L2;
  not for blocks dropped or marked for recompute), the evicted node's path is made resident in L2:
  the blocks of it L2 lacks are copied (the ancestors are still in L1, so the copy is whole).
  It happens before the freed device blocks are handed out, so their data is intact.
- **promote** (L2 -> L1): at admission, when L2 holds more of the prompt than L1, the rest of the
  path is loaded into fresh device blocks, before the request's prefill.
- **write to L3**: ``write_through`` puts every block cached in L1 (after each step),
  ``write_through_selective`` a block at its second use (when a prefix match hits it; HiCache's hit
  threshold, here 2), ``write_back`` a block when L2 evicts it.  Puts run on the transfer executor.
- **prefetch** (L3 -> L2): when a request arrives and L3 holds at least ``prefetch_threshold_tokens``
  more of its prompt than L1 and L2 do, the pages are fetched on the executor; the request waits in
  the queue as the stop policy says (``best_effort``: not at all; ``wait_complete``: until done;
  ``timeout``: ``base + per_ki_token * tokens / 1024`` seconds, capped), SGLang's three policies
  and defaults.  Fetched pages are staged into L2; admission promotes them.
- **drop**, **retain** (a pin with a TTL), **write back**, **promote** and **pre-prefill**: the
  directives (``Directive``), addressed by lineage or by block hashes within one tenant.

Copies between L1 and L2 are the runner's (``HoldsHostKv``: a side stream on CUDA; on CPU a copy
done when the call returns, microseconds per block).  L3 calls block, so they only ever run on the
executor: the engine thread submits them and applies their results at the start of a later step.
The simulator passes ``InlineExecutor`` (done at once, deterministic) and a runner that charges the
modelled transfer time to its next step.
"""

from __future__ import annotations

import logging
import math
from collections import OrderedDict
from collections.abc import Callable, Iterable, Sequence
from concurrent.futures import Future
from dataclasses import dataclass, field
from typing import Any, Literal, Protocol, TypeVar

from clairvoyant.core.blockhash import chain_hashes
from clairvoyant.worker.core.block_manager import BlockManager, PrefixReservation
from clairvoyant.worker.core.l3 import L3Store, decode_page, encode_page, page_key
from clairvoyant.worker.core.radix_cache import BlockTag, Namespace, RadixCache, RadixNode
from clairvoyant.worker.core.sequence import Sequence as Seq
from clairvoyant.worker.core.types import KvEvent, Lineage, Tier
from clairvoyant.worker.runners.base import ChargesTransfers, HoldsHostKv, ModelRunner

logger = logging.getLogger(__name__)

WritePolicy = Literal["write_through", "write_through_selective", "write_back"]
PrefetchPolicy = Literal["best_effort", "wait_complete", "timeout"]
DirectiveKind = Literal["drop", "retain", "write_back", "promote", "pre_prefill"]
WRITE_POLICIES: tuple[WritePolicy, ...] = ("write_through", "write_through_selective", "write_back")
PREFETCH_POLICIES: tuple[PrefetchPolicy, ...] = ("best_effort", "wait_complete", "timeout")
_KNOWN_L3_PAGES = 1 << 20  # hashes remembered as written to L3 (to skip re-puts), LRU
T = TypeVar("T")


@dataclass(frozen=True)
class TierConfig:
    """The tiers below L1.  Defaults follow SGLang HiCache where it has one."""

    num_host_blocks: int = 0  # L2 size in blocks; 0: no L2 (and so no L3)
    write_policy: WritePolicy = "write_through"
    prefetch_policy: PrefetchPolicy = "timeout"
    prefetch_threshold_tokens: int = 256  # HiCache's prefetch_threshold
    prefetch_timeout_base_s: float = 2.0
    prefetch_timeout_per_ki_token_s: float = 0.1
    prefetch_timeout_max_s: float = 30.0
    max_retained_fraction: float = 0.5  # of a pool: RETAIN pins beyond it are refused

    def __post_init__(self) -> None:
        if self.num_host_blocks < 0:
            raise ValueError("TierConfig.num_host_blocks must be >= 0")
        if self.write_policy not in WRITE_POLICIES:
            raise ValueError(f"write policy must be one of {', '.join(WRITE_POLICIES)}, got {self.write_policy!r}")
        if self.prefetch_policy not in PREFETCH_POLICIES:
            raise ValueError(
                f"prefetch policy must be one of {', '.join(PREFETCH_POLICIES)}, got {self.prefetch_policy!r}"
            )
        if self.prefetch_threshold_tokens < 0 or not 0 <= self.max_retained_fraction <= 1:
            raise ValueError("prefetch_threshold_tokens must be >= 0 and max_retained_fraction in [0, 1]")

    def prefetch_timeout_s(self, num_tokens: int) -> float:
        wait = self.prefetch_timeout_base_s + self.prefetch_timeout_per_ki_token_s * num_tokens / 1024
        return min(self.prefetch_timeout_max_s, wait)


@dataclass(frozen=True)
class Directive:
    """A cache directive as the engine takes it (``proto``'s ``CacheDirective``, decoded).

    ``namespace`` is the tenant: the directive only ever sees that tenant's blocks.  Blocks are
    chosen by ``block_hashes`` when given, else by the lineage fields that are set (none set: every
    block of the tenant).  ``target_tier`` None means every tier (drop) or the natural one (retain:
    L1, promote: L1).  ``token_ids``: the sequence to pre-prefill, or to promote from L3.
    """

    kind: DirectiveKind
    namespace: Namespace
    workflow_id: str | None = None
    agent_id: str | None = None
    request_id: str | None = None
    block_hashes: tuple[int, ...] = ()
    ttl_s: float | None = None
    target_tier: Tier | None = None
    token_ids: tuple[int, ...] = ()


class DirectiveError(ValueError):
    """A directive this engine cannot take as given; nothing changed.  ``missing_tier``: refused
    for want of a tier (no tiers, or no L3), not for how it was written."""

    def __init__(self, message: str, *, missing_tier: bool = False) -> None:
        super().__init__(message)
        self.missing_tier = missing_tier


class Executor(Protocol):
    def submit(self, fn: Callable[..., T], /, *args: Any) -> Future[T]: ...


class InlineExecutor:
    """Runs each job when submitted (the simulator, tests): the future is done on return."""

    def submit(self, fn: Callable[..., T], /, *args: Any) -> Future[T]:
        future: Future[T] = Future()
        try:
            future.set_result(fn(*args))
        except Exception as exc:  # delivered through the future, as a thread pool would
            future.set_exception(exc)
        return future


@dataclass
class TierCounters:
    """Monotonic counters of the tier operations (tokens and blocks)."""

    hit_tokens: dict[int, int] = field(default_factory=lambda: {1: 0, 2: 0, 3: 0})
    demoted_blocks: int = 0
    promoted_blocks: int = 0
    l3_written_blocks: int = 0
    l3_fetched_blocks: int = 0
    l3_errors: int = 0
    prefetch_timeouts: int = 0
    retain_refused_blocks: int = 0
    swapped_preemptions: int = 0
    recomputed_preemptions: int = 0


@dataclass
class _Prefetch:
    """An L3 fetch in flight: pages for blocks ``first ..`` of ``token_ids``' whole blocks."""

    namespace: Namespace
    token_ids: tuple[int, ...]
    first: int
    future: Future[list[bytes]]
    deadline: float
    lineage: Lineage | None
    promote: bool = False  # a PROMOTE directive to L1: load into L1 once staged


@dataclass
class _Write:
    namespace: Namespace
    hashes: tuple[int, ...]
    future: Future[int]


@dataclass
class _Remove:
    namespace: Namespace
    hashes: tuple[int, ...]
    future: Future[int]


def _fetch(store: L3Store, keys: list[str], min_pages: int) -> list[bytes]:
    """The leading run of ``keys``' pages (empty when it is shorter than ``min_pages``)."""
    present = store.exists(keys)
    if present < max(1, min_pages):
        return []
    pages: list[bytes] = []
    for page in store.get(keys[:present]):
        if page is None:
            break
        pages.append(page)
    return pages


def _with_ancestors(nodes: Iterable[RadixNode]) -> list[RadixNode]:
    """``nodes`` and every cached node above them, each chain root-most first (a pinned block is
    only evictable-safe, and only useful, with its whole prefix).  Linear in the nodes returned."""
    seen: set[int] = set()
    ordered: list[RadixNode] = []
    for node in nodes:
        chain: list[RadixNode] = []
        current: RadixNode | None = node
        while current is not None and current.block_id >= 0 and current.block_id not in seen:
            seen.add(current.block_id)
            chain.append(current)
            current = current.parent
        ordered.extend(reversed(chain))
    return ordered


def _subtree_blocks(nodes: Iterable[RadixNode]) -> list[int]:
    """The blocks of ``nodes`` and of every node below them, each once."""
    seen: set[int] = set()
    stack = list(nodes)
    while stack:
        node = stack.pop()
        if node.block_id in seen:
            continue
        seen.add(node.block_id)
        stack.extend(node.children.values())
    return list(seen)


class KvTiers:
    """The L2 pool and the L3 store of one engine, and the operations between the tiers.

    Engine-thread only, like the engine (the executor's jobs touch the store alone).
    """

    def __init__(
        self,
        l1: BlockManager,
        runner: ModelRunner,
        config: TierConfig,
        *,
        model: str,
        l3: L3Store | None = None,
        executor: Executor | None = None,
        events: list[KvEvent] | None = None,
    ) -> None:
        if l1.cache is None:
            raise ValueError("KV tiers need the prefix cache")
        if not isinstance(runner, HoldsHostKv):
            raise ValueError(f"runner {type(runner).__name__} has no host KV pool (HoldsHostKv)")
        if config.num_host_blocks < 1:
            raise ValueError("KV tiers need an L2 host pool (num_host_blocks >= 1)")
        self.l1 = l1
        self.runner: HoldsHostKv = runner
        self.config = config
        self.model = model
        self.l3 = l3
        self.executor: Executor = executor if executor is not None else InlineExecutor()
        self.events = events
        self.block_size = l1.block_size
        runner.allocate_host_kv(config.num_host_blocks)
        self.l2 = BlockManager(config.num_host_blocks, l1.block_size, hashing=l1.cache.hashing, events=events, tier=2)
        l1.evict_hook, l1.flush_hook = self._on_l1_evict, self._flush_demotions
        self.l2.evict_hook, self.l2.flush_hook = self._on_l2_evict, self._flush_l2_evictions
        self.counters = TierCounters()
        self._charges = runner if isinstance(runner, ChargesTransfers) else None
        self._demotions: list[tuple[Namespace, list[int], list[int], list[BlockTag | None]]] = []
        self._skip_parent: RadixNode | None = None  # the parent of the node just captured (same path)
        self._no_keep: set[int] = set()  # L1 blocks not to demote (dropped, or a victim to recompute)
        self._l2_evicted: list[tuple[Namespace, int, tuple[int, ...], int]] = []
        self._retained: tuple[dict[int, float], dict[int, float]] = ({}, {})  # L1, L2: block -> expiry
        self._prefetches: dict[int, _Prefetch] = {}  # seq id (or a negative id for a directive) -> fetch
        self._next_job = -1
        self._writes: list[_Write | _Remove] = []
        self._in_l3: OrderedDict[tuple[Namespace, int], None] = OrderedDict()
        self._admission_hits: dict[int, tuple[int, int]] = {}  # seq id -> (promoted, of which from L3)
        self._staged: dict[int, int] = {}  # seq id -> blocks its fetch staged into L2
        self._written_upto: dict[int, int] = {}  # seq id -> its leading cached blocks written through

    # ---- L1 eviction -> L2 ---------------------------------------------------------------------
    def _on_l1_evict(self, node: RadixNode) -> None:
        block = node.block_id
        if block in self._no_keep:
            self._no_keep.discard(block)
            self._skip_parent = None
            return
        if node is self._skip_parent:  # the parent of the node captured before: already on that path
            self._skip_parent = node.parent
            return
        cache = self.l1.cache
        assert cache is not None
        path = node.path()
        tokens = [token for n in path for token in n.key]
        self._demotions.append((cache.namespace_of(node), tokens, [n.block_id for n in path], [n.tag for n in path]))
        self._skip_parent = node.parent

    def _flush_demotions(self) -> None:
        demotions, self._demotions, self._skip_parent = self._demotions, [], None
        for namespace, tokens, device_blocks, tags in demotions:
            self._stage_path(namespace, tokens, device_blocks, tags)

    def _reserve_head(self, namespace: Namespace, tokens: Sequence[int]) -> PrefixReservation | None:
        """``l2.reserve_prefix`` of the longest head of ``tokens`` (whole blocks) that L2 has room
        for: all of it when it fits, else halving until it does (a path longer than L2 still
        leaves its head there); None when not even one block fits."""
        bs = self.block_size
        blocks = len(tokens) // bs
        while blocks > 0:
            reservation = self.l2.reserve_prefix(namespace, tokens[: blocks * bs])
            if reservation is not None:
                return reservation
            blocks //= 2
        return None

    def _stage_path(
        self, namespace: Namespace, tokens: list[int], device_blocks: Sequence[int], tags: Sequence[BlockTag | None]
    ) -> int:
        """Make an L1 path resident in L2 (copy the blocks L2 lacks; only its head when the whole
        path does not fit); blocks copied."""
        reservation = self._reserve_head(namespace, tokens)
        if reservation is None:
            return 0  # every host block is pinned: the path is recomputed when needed
        device_blocks = device_blocks[: len(reservation.block_table)]
        first = len(reservation.cached)
        if reservation.new:
            self.runner.offload(device_blocks[first:], reservation.new)
            self.counters.demoted_blocks += len(reservation.new)
        tags = tags[first : len(reservation.block_table)]
        self.l2.commit_prefix(reservation, [tag or BlockTag(None, "prompt") for tag in tags])
        return len(reservation.new)

    def keep_on_evict(self, blocks: Iterable[int], keep: bool) -> None:
        """Whether these L1 blocks go to L2 when evicted (the default) or are let go."""
        if keep:
            self._no_keep.difference_update(blocks)
        else:
            self._no_keep.update(blocks)

    def on_preempt(self, seq: Seq) -> None:
        """The cost model's choice for a victim's own cached blocks: swap (demote them when evicted)
        or recompute (let them go).  Without a cost model, swapping wins: a copy of a block costs
        less than recomputing its tokens on any hardware this runs on."""
        own = [b for b in seq.block_table[: seq.num_cached_blocks] if self.l1.ref_count(b) == 2]
        if not own:
            return
        swap = True
        if self._charges is not None:
            swap = 2 * self._charges.host_transfer_seconds(len(own)) < self._charges.recompute_seconds(
                len(own) * self.block_size
            )
        self.keep_on_evict(own, swap)
        if swap:
            self.counters.swapped_preemptions += 1
        else:
            self.counters.recomputed_preemptions += 1

    # ---- L2 eviction -> L3 (write_back) --------------------------------------------------------
    def _on_l2_evict(self, node: RadixNode) -> None:
        if self.l3 is None or self.config.write_policy != "write_back":
            return
        cache = self.l2.cache
        assert cache is not None
        namespace = cache.namespace_of(node)
        if (namespace, node.block_hash) not in self._in_l3:
            self._l2_evicted.append((namespace, node.block_hash, node.key, node.block_id))

    def _flush_l2_evictions(self) -> None:
        evicted, self._l2_evicted = self._l2_evicted, []
        if not evicted:
            return
        pages = self.runner.host_pages([host for *_, host in evicted])
        by_namespace: dict[Namespace, list[tuple[int, bytes]]] = {}
        for (namespace, block_hash, key, _), kv in zip(evicted, pages, strict=True):
            by_namespace.setdefault(namespace, []).append((block_hash, encode_page(key, kv)))
        for namespace, items in by_namespace.items():
            self._put(namespace, [h for h, _ in items], [p for _, p in items])

    # ---- L2 -> L1 at admission -----------------------------------------------------------------
    def before_admit(self, seq: Seq) -> None:
        """Load the part of ``seq``'s prompt that L2 holds beyond L1 into L1 (before its prefix
        match), and note how much came from where."""
        namespace, tokens = seq.namespace, seq.token_ids
        max_blocks = (len(tokens) - 1) // self.block_size
        l1_cache, l2_cache = self.l1.cache, self.l2.cache
        assert l1_cache is not None and l2_cache is not None
        in_l1 = len(l1_cache.peek(namespace, tokens, max_blocks))
        in_l2 = len(l2_cache.peek(namespace, tokens, max_blocks))
        promoted = self._promote(namespace, tokens[: in_l2 * self.block_size]) if in_l2 > in_l1 else 0
        fetch = self._prefetches.pop(seq.seq_id, None)
        if fetch is not None and not fetch.future.done():
            fetch.future.cancel()  # best effort, or out of time: it still lands in L2 if it ran
            self._prefetches[self._job_id()] = fetch
            if self.config.prefetch_policy == "timeout":
                self.counters.prefetch_timeouts += 1
        from_l3 = min(promoted, self._staged.pop(seq.seq_id, 0))
        self._admission_hits[seq.seq_id] = (promoted, from_l3)

    def admitted(self, seq: Seq, cached_tokens: int, counted: bool) -> None:
        """Count the admitted ``seq``'s hit by tier when ``counted`` (a request's first admission),
        and write its hit blocks to L3 when the policy is ``write_through_selective`` (a hit is a
        block's second use)."""
        promoted, from_l3 = self._admission_hits.pop(seq.seq_id, (0, 0))
        bs, hits = self.block_size, self.counters.hit_tokens
        cached_blocks = cached_tokens // bs
        promoted = min(promoted, cached_blocks)
        from_l3 = min(from_l3, promoted)
        if counted:
            hits[1] += (cached_blocks - promoted) * bs
            hits[2] += (promoted - from_l3) * bs
            hits[3] += from_l3 * bs
        if self.config.write_policy == "write_through_selective" and cached_blocks:
            self._write_l1_blocks(seq.namespace, seq.block_table[:cached_blocks])

    def not_admitted(self, seq: Seq) -> None:
        self._admission_hits.pop(seq.seq_id, None)

    def _promote(self, namespace: Namespace, tokens: Sequence[int]) -> int:
        """Load the whole-block path ``tokens`` (all of it in L2) into L1; blocks loaded."""
        held = self.l2.reserve_prefix(namespace, tokens)  # pins the L2 path while L1 makes room
        assert held is not None and not held.new
        device = self.l1.reserve_prefix(namespace, tokens)
        if device is None:
            self.l2.release_prefix(held)
            return 0
        first = len(device.cached)
        if device.new:
            self.runner.load(held.cached[first:], device.new)
            l2_cache = self.l2.cache
            assert l2_cache is not None
            tags = [l2_cache.tag_of(b) or BlockTag(None, "prompt") for b in held.cached[first:]]
            self.l1.commit_prefix(device, tags)
            self.counters.promoted_blocks += len(device.new)
        else:
            self.l1.release_prefix(device)
        self.l2.release_prefix(held)
        return len(device.new)

    # ---- L3 -> L2 at arrival -------------------------------------------------------------------
    def on_arrival(self, seq: Seq, now: float) -> None:
        """Ask L3 for the part of ``seq``'s prompt that neither L1 nor L2 holds, when it is long
        enough to be worth it; the request waits for it as the prefetch policy says."""
        if self.l3 is None or seq.background:
            return
        fetch = self._start_fetch(seq.namespace, seq.token_ids, (len(seq.token_ids) - 1) // self.block_size,
                                  now, seq.lineage)  # fmt: skip
        if fetch is not None:
            self._prefetches[seq.seq_id] = fetch

    def _start_fetch(
        self, namespace: Namespace, token_ids: Sequence[int], max_blocks: int, now: float, lineage: Lineage | None
    ) -> _Prefetch | None:
        assert self.l3 is not None
        bs = self.block_size
        l1_cache, l2_cache = self.l1.cache, self.l2.cache
        assert l1_cache is not None and l2_cache is not None
        local = max(len(l1_cache.peek(namespace, token_ids, max_blocks)), len(l2_cache.peek(namespace, token_ids, max_blocks)))
        min_pages = -(-self.config.prefetch_threshold_tokens // bs)
        if max_blocks - local < max(1, min_pages):
            return None
        tokens = tuple(token_ids[: max_blocks * bs])
        hashes = chain_hashes(tokens, 0, bs)
        keys = [page_key(self.model, namespace, h) for h in hashes[local:]]
        policy = self.config.prefetch_policy
        if policy == "best_effort":
            deadline = now
        elif policy == "wait_complete":
            deadline = math.inf
        else:
            deadline = now + self.config.prefetch_timeout_s((max_blocks - local) * bs)
        future = self.executor.submit(_fetch, self.l3, keys, min_pages)
        return _Prefetch(namespace, tokens, local, future, deadline, lineage)

    def holds_back(self, seq: Seq, now: float) -> bool:
        """Whether ``seq`` waits for its prefetch before admission."""
        fetch = self._prefetches.get(seq.seq_id)
        return fetch is not None and not fetch.future.done() and now < fetch.deadline

    def _stage_pages(self, fetch: _Prefetch, pages: list[bytes]) -> int:
        """Put fetched pages (blocks ``fetch.first ..``) into L2 behind the head that L1 or L2
        holds; blocks staged (0 when the head is gone meanwhile or a page does not belong)."""
        bs, first = self.block_size, fetch.first
        tokens = fetch.token_ids[: (first + len(pages)) * bs]
        kvs: list[bytes] = []
        for i, page in enumerate(pages):
            try:
                page_tokens, kv = decode_page(page)
            except ValueError:
                page_tokens, kv = [], b""
            if tuple(page_tokens) != tokens[(first + i) * bs : (first + i + 1) * bs]:
                self.counters.l3_errors += 1
                pages = pages[:i]
                break
            kvs.append(kv)
        if not kvs:
            return 0
        tokens = tokens[: (first + len(kvs)) * bs]
        l1_cache = self.l1.cache
        assert l1_cache is not None
        device_head = l1_cache.peek(fetch.namespace, tokens, first)
        reservation = self._reserve_head(fetch.namespace, tokens)
        if reservation is None or len(reservation.block_table) <= first:
            if reservation is not None:
                self.l2.release_prefix(reservation)
            return 0
        kvs = kvs[: len(reservation.block_table) - first]
        have = len(reservation.cached)
        if have < first and len(device_head) < first:  # the head is in neither tier any more
            self.l2.release_prefix(reservation)
            return 0
        new = reservation.new
        staged = 0
        try:
            if have < first:
                self.runner.offload(device_head[have:first], new[: first - have])
            from_l3 = new[max(0, first - have) :]
            self.runner.set_host_pages(from_l3, kvs[len(kvs) - len(from_l3) :])
            staged = len(from_l3)
        except ValueError:
            self.counters.l3_errors += 1
            self.l2.release_prefix(reservation)
            return 0
        self.l2.commit_prefix(reservation, BlockTag(fetch.lineage, "prompt"))
        self.counters.l3_fetched_blocks += staged
        if self._charges is not None:
            self._charges.charge_l3(staged)
        return staged

    # ---- writes to L3 --------------------------------------------------------------------------
    def after_step(self, seqs: Iterable[Seq]) -> None:
        """``write_through``: put the blocks the step's sequences cached in L1."""
        if self.l3 is None or self.config.write_policy != "write_through":
            return
        written = self._written_upto
        for seq in seqs:
            if seq.is_finished:
                written.pop(seq.seq_id, None)
                continue
            done, cached = written.get(seq.seq_id, 0), seq.num_cached_blocks
            if cached > done:  # blocks before ``done`` are in L3 (or on their way) already
                self._write_l1_blocks(seq.namespace, seq.block_table[done:cached])
                written[seq.seq_id] = cached

    def before_free(self, seq: Seq) -> None:
        """A finishing sequence is about to let go of its blocks: ``write_through`` puts what it
        cached since its last write (a request that ends in its prefill step included)."""
        done = self._written_upto.pop(seq.seq_id, 0)
        if self.l3 is not None and self.config.write_policy == "write_through" and seq.num_cached_blocks > done:
            self._write_l1_blocks(seq.namespace, seq.block_table[done : seq.num_cached_blocks])

    def _write_l1_blocks(self, namespace: Namespace, blocks: Sequence[int]) -> None:
        """Put the cached L1 ``blocks`` (a path from the root) that L3 does not have yet."""
        if self.l3 is None:
            return
        cache = self.l1.cache
        assert cache is not None
        todo = []
        for b in blocks:
            node = cache.node_of(b)
            if node is not None and (namespace, node.block_hash) not in self._in_l3:
                todo.append(node)
        if todo:
            kvs = self.runner.device_pages([n.block_id for n in todo])
            self._put(namespace, [n.block_hash for n in todo], [encode_page(n.key, kv) for n, kv in zip(todo, kvs, strict=True)])

    def _write_nodes(self, tier: Tier, nodes: Iterable[RadixNode], namespace: Namespace) -> int:
        """Put ``nodes``' whole paths (a page is only usable behind its ancestors) to L3."""
        todo = [n for n in _with_ancestors(nodes) if (namespace, n.block_hash) not in self._in_l3]
        if not todo:
            return 0
        ids = [n.block_id for n in todo]
        kvs = self.runner.device_pages(ids) if tier == 1 else self.runner.host_pages(ids)
        self._put(namespace, [n.block_hash for n in todo], [encode_page(n.key, kv) for n, kv in zip(todo, kvs, strict=True)])
        return len(todo)

    def _put(self, namespace: Namespace, hashes: list[int], pages: list[bytes]) -> None:
        assert self.l3 is not None
        for h in hashes:
            self._remember_l3(namespace, h)
        keys = [page_key(self.model, namespace, h) for h in hashes]
        self._writes.append(_Write(namespace, tuple(hashes), self.executor.submit(self.l3.put, keys, pages)))

    def _remember_l3(self, namespace: Namespace, block_hash: int) -> None:
        known = self._in_l3
        known[(namespace, block_hash)] = None
        known.move_to_end((namespace, block_hash))
        if len(known) > _KNOWN_L3_PAGES:
            known.popitem(last=False)

    # ---- completions ---------------------------------------------------------------------------
    def poll(self, now: float) -> None:
        """Apply what the executor finished, and let expired retentions go.  Start of every step."""
        for job_id, fetch in list(self._prefetches.items()):
            if not fetch.future.done():
                continue
            del self._prefetches[job_id]
            pages = self._result(fetch.future, [])
            if pages:
                staged = self._stage_pages(fetch, pages)
                self._note_staged(job_id, staged)
                if fetch.promote and staged:
                    l2_cache = self.l2.cache
                    assert l2_cache is not None
                    depth = len(l2_cache.peek(fetch.namespace, fetch.token_ids, len(fetch.token_ids) // self.block_size))
                    self._promote(fetch.namespace, fetch.token_ids[: depth * self.block_size])
        pending: list[_Write | _Remove] = []
        for job in self._writes:
            if not job.future.done():
                pending.append(job)
                continue
            done = self._result(job.future, -1)
            if isinstance(job, _Write):
                if done < 0:
                    for h in job.hashes:
                        self._in_l3.pop((job.namespace, h), None)
                else:
                    self.counters.l3_written_blocks += done
                    self._event(KvEvent("stored", 3, job.namespace, job.hashes))
            elif done >= 0:
                self._event(KvEvent("removed", 3, job.namespace, job.hashes))
        self._writes = pending
        for tier, retained in enumerate(self._retained, start=1):
            expired = [b for b, until in retained.items() if until <= now]
            for b in expired:
                del retained[b]
            if expired:
                (self.l1 if tier == 1 else self.l2).unpin(expired)

    def _note_staged(self, job_id: int, staged: int) -> None:
        if job_id >= 0:  # a sequence's own fetch
            self._staged[job_id] = self._staged.get(job_id, 0) + staged

    def forget(self, seq: Seq) -> None:
        """``seq`` left the engine: its fetch (if any) still lands in L2, for whoever comes next."""
        fetch = self._prefetches.pop(seq.seq_id, None)
        if fetch is not None:
            self._prefetches[self._job_id()] = fetch
        self._staged.pop(seq.seq_id, None)
        self._admission_hits.pop(seq.seq_id, None)
        self._written_upto.pop(seq.seq_id, None)

    def _result(self, future: Future[Any], failed: Any) -> Any:
        if future.cancelled():
            return failed
        error = future.exception()
        if error is not None:
            self.counters.l3_errors += 1
            logger.warning("L3 %s: %s", self.l3.name if self.l3 else "-", error)
            return failed
        return future.result()

    def _event(self, event: KvEvent) -> None:
        if self.events is not None:
            self.events.append(event)

    def has_pending(self) -> bool:
        return bool(self._prefetches or self._writes)

    def _job_id(self) -> int:
        self._next_job -= 1
        return self._next_job

    # ---- directives ----------------------------------------------------------------------------
    def check(self, directive: Directive) -> None:
        """Raise ``DirectiveError`` for a directive other than pre-prefill that ``apply`` would
        refuse; changes nothing (a batch is checked whole before any of it applies)."""
        kind, tier = directive.kind, directive.target_tier
        if kind == "retain":
            if directive.ttl_s is None or not directive.ttl_s > 0:
                raise DirectiveError("retain needs ttl_s > 0")
            if tier == 3:
                raise DirectiveError("retain applies to L1 or L2 (L3 keeps pages by its own policy)")
        elif kind == "write_back" and self.l3 is None:
            raise DirectiveError("write_back needs an L3 store; this worker has none", missing_tier=True)
        elif kind == "promote":
            if tier == 3:
                raise DirectiveError("promote targets L1 or L2")
            if tier == 2 and not directive.token_ids:
                raise DirectiveError("promote to L2 needs token_ids (L3 pages are found by the prompt's hash chain)")
        elif kind not in ("drop", "write_back"):
            raise DirectiveError(f"directive kind {kind!r} is the engine's")

    def apply(self, directive: Directive, now: float) -> int:
        """Apply a directive other than pre-prefill (the engine's); blocks it touched (or pages
        asked for).  Raises ``DirectiveError`` (nothing changed) for one that cannot apply."""
        self.check(directive)
        kind, tier = directive.kind, directive.target_tier
        if kind == "drop":
            return self._drop(directive, tier)
        if kind == "retain":
            assert directive.ttl_s is not None
            return self._retain(2 if tier == 2 else 1, directive, now + directive.ttl_s)
        if kind == "write_back":
            return sum(self._write_nodes(t, self._select(t, directive), directive.namespace) for t in (1, 2))
        return self._promote_directive(directive, 2 if tier == 2 else 1, now)

    def _cache(self, tier: int) -> RadixCache:
        cache = (self.l1 if tier == 1 else self.l2).cache
        assert cache is not None
        return cache

    def _select(self, tier: int, d: Directive) -> list[RadixNode]:
        """The nodes of ``tier`` the directive names, in its tenant only."""
        cache = self._cache(tier)
        if d.block_hashes:
            found = (cache.node_of_hash(d.namespace, h) for h in d.block_hashes)
            return [n for n in found if n is not None]
        wanted = [(name, value) for name, value in
                  (("workflow_id", d.workflow_id), ("agent_id", d.agent_id), ("request_id", d.request_id)) if value]  # fmt: skip
        nodes = []
        for node in cache.nodes(d.namespace):
            lineage = node.tag.lineage if node.tag is not None else None
            if all(lineage is not None and getattr(lineage, name) == value for name, value in wanted):
                nodes.append(node)
        return nodes

    def _drop(self, d: Directive, tier: Tier | None) -> int:
        dropped = 0
        hashes: set[int] = set(d.block_hashes)
        for t, pool in ((1, self.l1), (2, self.l2)):
            if tier not in (None, t) and tier != 3:
                continue
            nodes = self._select(t, d)
            hashes.update(n.block_hash for n in nodes)
            if tier == 3:
                continue
            blocks = [n.block_id for n in nodes]
            retained = self._retained[t - 1]
            # Dropping a block drops what hangs below it: unpin retained blocks there too, or an
            # unpinned head would stay cached-only under a pinned tail (unevictable).
            pins = [b for b in _subtree_blocks(nodes) if retained.pop(b, None) is not None]
            pool.unpin(pins)
            if t == 1:
                self._no_keep.update(blocks)
            removed = pool.drop(blocks)
            if t == 1:
                self._no_keep.difference_update(removed)
            dropped += len(removed)
        if tier in (None, 3) and self.l3 is not None and hashes:
            ordered = tuple(sorted(hashes))
            for h in ordered:
                self._in_l3.pop((d.namespace, h), None)
            keys = [page_key(self.model, d.namespace, h) for h in ordered]
            self._writes.append(_Remove(d.namespace, ordered, self.executor.submit(self.l3.remove, keys)))
            dropped += len(ordered)
        return dropped

    def _retain(self, tier: int, d: Directive, until: float) -> int:
        pool = self.l1 if tier == 1 else self.l2
        retained = self._retained[tier - 1]
        budget = int(pool.num_blocks * self.config.max_retained_fraction) - len(retained)
        fresh: list[int] = []
        for node in _with_ancestors(self._select(tier, d)):
            b = node.block_id
            if b in retained:
                retained[b] = max(retained[b], until)
            elif len(fresh) < budget:
                fresh.append(b)
                retained[b] = until
            else:
                self.counters.retain_refused_blocks += 1
        pool.pin(fresh)
        return len(fresh)

    def _promote_directive(self, d: Directive, tier: int, now: float) -> int:
        if d.token_ids:
            bs = self.block_size
            whole = len(d.token_ids) // bs
            l2_cache = self.l2.cache
            assert l2_cache is not None
            count = 0
            if self.l3 is not None:
                fetch = self._start_fetch(d.namespace, d.token_ids, whole, now, Lineage(d.namespace or "", d.workflow_id))
                if fetch is not None:
                    fetch.promote = tier == 1
                    self._prefetches[self._job_id()] = fetch
                    count = whole - fetch.first
            if tier == 1:
                in_l2 = len(l2_cache.peek(d.namespace, d.token_ids, whole))
                count += self._promote(d.namespace, d.token_ids[: in_l2 * bs])
            return count
        promoted = 0
        selected = self._select(2, d)
        leaves = {id(n) for n in selected} - {id(n.parent) for n in selected}
        l2_cache = self.l2.cache
        assert l2_cache is not None
        for node in selected:
            if id(node) in leaves and self.l2.ref_count(node.block_id) > 0:
                tokens = [t for n in node.path() for t in n.key]
                # An earlier path's promotion may have evicted L1 blocks into L2 and so pushed part
                # of this path out of L2: load only the head that is still there.
                in_l2 = len(l2_cache.peek(d.namespace, tokens, len(tokens) // self.block_size))
                promoted += self._promote(d.namespace, tokens[: in_l2 * self.block_size])
        return promoted

    # ---- introspection -------------------------------------------------------------------------
    def retained_blocks(self, tier: int) -> list[int]:
        return list(self._retained[tier - 1])

    def resident(self, tier: int) -> set[tuple[Namespace, int]]:
        """(namespace, block hash) of every block ``tier`` holds (L3: what this engine wrote)."""
        if tier == 3:
            return set(self._in_l3)
        cache = self._cache(tier)
        return {(ns, n.block_hash) for ns in cache.namespaces() for n in cache.nodes(ns)}

    def check_integrity(self) -> None:
        self.l2.check_integrity([], self.retained_blocks(2))
