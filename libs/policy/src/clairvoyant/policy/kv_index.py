"""Which worker holds which KV blocks, from the workers' KV events: precise prefix matching.

Per worker and tier, the set of (tenant, block hash) it reported storing and not yet removing.
A query scores each worker of a model for one request (``KvIndexView.cached_tokens``):

    prompt hashes  h0 h1 h2 h3 h4          held on w1:  h0:L1 h1:L1 h2:L2 h3:-  -> 1 + 1 + 0.8 = 2.8 blocks
                                           held on w2:  h0:L1 h1:-              -> 1 block

the longest leading run of the prompt's blocks the worker holds in any tier, each block weighted by
the best tier holding it.  L3 is shared storage: a block one worker of the model reports there
counts for every worker of that model.  A request without hashes is scored by its session's blocks
(the lineage a STORED names), tier-weighted the same way.

Sequence numbers: a batch whose ``sequence`` is not the previous one + 1 means batches were lost, so
the worker's entries are dropped and the worker is *stale* (scored as holding nothing) until it
sends a CLEARED, from which it rebuilds.  Speculative entries: a placement of a request with hashes
marks its blocks as held (L1) on the chosen worker for ``speculative_ttl_s``, until a STORED
confirms them; otherwise they expire.  Pure: every call that needs the time takes ``now``.
Shared by the scheduler (routing) and the cache manager (its cluster index); the event values
live in ``clairvoyant.core.kv_events``.
"""

from __future__ import annotations

from collections import Counter, deque
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import NamedTuple

from clairvoyant.core.blockhash import BLOCK_TOKENS
from clairvoyant.core.kv_events import KvBatch, KvBlockEvent, KvEventKind, KvTier
from clairvoyant.policy.process_table import ProgramKey, program_key
from clairvoyant.policy.types import QueuedRequest

BlockKey = tuple[str, int]  # (tenant, chained block hash)


class KvApplied(NamedTuple):
    """What ``KvIndex.apply`` found."""

    gap: bool  # the sequence skipped (or restarted): the worker's entries were dropped
    stale: bool  # the worker is stale after the batch (waiting for a CLEARED)
    confirmed: int  # speculative entries a STORED confirmed


@dataclass(frozen=True, slots=True)
class TierWeights:
    """How much a block held in each tier counts.  L1 and L2 as llm-d's defaults (gpu 1.0, cpu
    0.8); L3 (ours) 0.5: a reload from shared storage still beats recomputing, but is slowest."""

    l1: float = 1.0
    l2: float = 0.8
    l3: float = 0.5

    def of(self, tier: KvTier) -> float:
        return {KvTier.L1: self.l1, KvTier.L2: self.l2, KvTier.L3: self.l3}[tier]


@dataclass(slots=True)
class _Worker:
    model: str
    block_size: int
    sequence: int
    stale: bool = False
    blocks: dict[KvTier, dict[BlockKey, ProgramKey | None]] = field(default_factory=dict)
    sessions: dict[KvTier, Counter[ProgramKey]] = field(default_factory=dict)
    speculative: dict[BlockKey, float] = field(default_factory=dict)  # -> expiry

    def tokens_per_block(self) -> int:
        return self.block_size or BLOCK_TOKENS


class KvIndex:
    """The scheduler's view of the workers' KV blocks (implements ``KvIndexView``)."""

    def __init__(self, weights: TierWeights | None = None, speculative_ttl_s: float = 2.0) -> None:
        if speculative_ttl_s < 0:
            raise ValueError("speculative_ttl_s must be >= 0")
        self.weights = weights or TierWeights()
        self.speculative_ttl_s = speculative_ttl_s
        self._workers: dict[str, _Worker] = {}
        self._shared: dict[str, Counter[BlockKey]] = {}  # model -> L3 block -> workers reporting it
        self._expiries: deque[tuple[float, str, BlockKey]] = deque()  # speculative, oldest first
        self._held: Counter[BlockKey] = Counter()  # block -> (worker, tier) entries holding it

    # ---- events ---------------------------------------------------------------------------------

    def apply(self, batch: KvBatch, now: float) -> KvApplied:
        """Apply one batch.  A batch from an unknown worker creates it (its first sequence is
        taken as is)."""
        self.expire(now)
        worker = self._workers.get(batch.worker_id)
        if worker is not None and (worker.model != batch.model or worker.block_size != batch.block_size):
            self.remove_worker(batch.worker_id)  # restarted as something else: start afresh
            worker = None
        gap = False
        if worker is None:
            worker = self._workers[batch.worker_id] = _Worker(batch.model, batch.block_size, batch.sequence)
        else:
            gap = batch.sequence != worker.sequence + 1
            worker.sequence = batch.sequence
            if gap:
                self._drop_entries(worker)
                worker.stale = True
        confirmed = 0
        for event in batch.events:
            if event.kind is KvEventKind.CLEARED:
                self._clear_tier(worker, event.tier)
                worker.stale = False
            elif worker.stale:
                continue  # rebuilt only from a CLEARED
            elif event.kind is KvEventKind.STORED:
                confirmed += self._store(worker, event)
            else:
                self._remove(worker, event)
        return KvApplied(gap, worker.stale, confirmed)

    def remove_worker(self, worker_id: str) -> bool:
        """Forget a worker (it left); False if unknown."""
        worker = self._workers.pop(worker_id, None)
        if worker is None:
            return False
        self._drop_entries(worker)
        return True

    def speculate(self, worker_id: str, request: QueuedRequest, now: float) -> int:
        """The request was placed on ``worker_id``: its prompt's blocks will be there shortly.
        Only for a known, fresh worker whose blocks the hashes can name; returns the entries added."""
        return self.speculate_blocks(worker_id, request.tenant, request.prompt_block_hashes, now)

    def speculate_blocks(self, worker_id: str, tenant: str, block_hashes: Sequence[int], now: float) -> int:
        """``speculate`` for a bare chain of ``tenant``'s block hashes."""
        self.expire(now)
        worker = self._workers.get(worker_id)
        if (
            worker is None
            or worker.stale
            or worker.tokens_per_block() != BLOCK_TOKENS
            or self.speculative_ttl_s <= 0
        ):
            return 0
        held = worker.blocks.get(KvTier.L1, {})
        expiry = now + self.speculative_ttl_s
        added = 0
        for block_hash in block_hashes:
            key = (tenant, block_hash)
            if key not in held:
                worker.speculative[key] = expiry
                self._expiries.append((expiry, worker_id, key))
                added += 1
        return added

    def expire(self, now: float) -> int:
        """Drop speculative entries whose time ran out at ``now``; returns how many."""
        dropped = 0
        while self._expiries and self._expiries[0][0] <= now:
            expiry, worker_id, key = self._expiries.popleft()
            worker = self._workers.get(worker_id)
            if worker is not None and worker.speculative.get(key) == expiry:
                del worker.speculative[key]
                dropped += 1
        return dropped

    # ---- queries --------------------------------------------------------------------------------

    def cached_tokens(self, request: QueuedRequest, now: float) -> dict[str, float] | None:
        """``KvIndexView.cached_tokens``: the fresh workers of the request's model, scored."""
        workers = [(wid, w) for wid, w in self._workers.items() if w.model == request.model and not w.stale]
        if not workers:
            return None
        if request.prompt_block_hashes:
            shared = self._shared.get(request.model, Counter())
            return {
                wid: self._prefix_blocks(w, request.tenant, request.prompt_block_hashes, shared, now)
                * BLOCK_TOKENS
                for wid, w in workers
                if w.tokens_per_block() == BLOCK_TOKENS
            }
        session = program_key(request)
        if session is None:
            return {}
        shared_blocks = max(w.sessions.get(KvTier.L3, Counter())[session] for _, w in workers)
        l3 = self.weights.l3 * shared_blocks
        return {
            wid: (
                self.weights.l1 * w.sessions.get(KvTier.L1, Counter())[session]
                + self.weights.l2 * w.sessions.get(KvTier.L2, Counter())[session]
                + l3
            )
            * w.tokens_per_block()
            for wid, w in workers
        }

    def holds(self, worker_id: str, tier: KvTier, tenant: str, block_hash: int) -> bool:
        worker = self._workers.get(worker_id)
        return worker is not None and (tenant, block_hash) in worker.blocks.get(tier, {})

    def is_stale(self, worker_id: str) -> bool:
        worker = self._workers.get(worker_id)
        return worker is not None and worker.stale

    def workers(self) -> list[str]:
        return sorted(self._workers)

    def model_of(self, worker_id: str) -> str | None:
        worker = self._workers.get(worker_id)
        return worker.model if worker is not None else None

    def tiers_holding(self, worker_id: str, tenant: str, block_hash: int) -> list[KvTier]:
        """The tiers of ``worker_id`` that reported the block, fastest first (speculation aside)."""
        worker = self._workers.get(worker_id)
        if worker is None:
            return []
        key = (tenant, block_hash)
        return [tier for tier in sorted(worker.blocks) if key in worker.blocks[tier]]

    def holders(self, tenant: str, block_hash: int) -> int:
        """How many (worker, tier) entries hold the block."""
        return self._held[(tenant, block_hash)]

    @property
    def distinct_blocks(self) -> int:
        """Distinct (tenant, block hash) held by some worker in some tier."""
        return len(self._held)

    @property
    def shared_blocks(self) -> int:
        """Distinct (model, tenant, block hash) some worker reported in shared storage (L3)."""
        return sum(len(blocks) for blocks in self._shared.values())

    @property
    def entries(self) -> int:
        """(worker, tier, tenant, block hash) entries held."""
        return sum(len(blocks) for w in self._workers.values() for blocks in w.blocks.values())

    def leading_runs(
        self, worker_id: str, tenant: str, hashes: Sequence[int], now: float
    ) -> tuple[int, int, int]:
        """The leading run of ``hashes`` the worker holds in L1 (speculative entries included), in
        L1 or L2, and anywhere (the model's shared L3 included); zeros for a stale or unknown one."""
        worker = self._workers.get(worker_id)
        if worker is None or worker.stale:
            return (0, 0, 0)
        l1, l2 = worker.blocks.get(KvTier.L1, {}), worker.blocks.get(KvTier.L2, {})
        shared = self._shared.get(worker.model, Counter())
        runs = [0, 0, 0]
        best = 1  # the slowest tier every block of the run so far is in (1: L1, 2: L2, 3: L3)
        for block_hash in hashes:
            key = (tenant, block_hash)
            if key in l1 or worker.speculative.get(key, 0.0) > now:
                tier = 1
            elif key in l2:
                tier = 2
            elif shared[key] > 0:
                tier = 3
            else:
                break
            best = max(best, tier)
            for t in range(best - 1, 3):
                runs[t] += 1
        return (runs[0], runs[1], runs[2])

    def check_integrity(self) -> None:
        """Assert that the session counts and the shared L3 counts match the blocks."""
        shared: dict[str, Counter[BlockKey]] = {}
        for worker_id, worker in self._workers.items():
            for tier, blocks in worker.blocks.items():
                sessions = Counter(s for s in blocks.values() if s is not None)
                assert +worker.sessions.get(tier, Counter()) == sessions, (
                    f"{worker_id} {tier.name}: sessions drifted"
                )
                if tier is KvTier.L3:
                    shared.setdefault(worker.model, Counter()).update(blocks.keys())
            assert not (worker.stale and any(worker.blocks.values())), f"{worker_id}: stale but holds blocks"
        assert {m: +c for m, c in self._shared.items() if +c} == {m: c for m, c in shared.items() if c}, (
            "shared L3 counts drifted"
        )
        held: Counter[BlockKey] = Counter()
        for worker in self._workers.values():
            for blocks in worker.blocks.values():
                held.update(blocks.keys())
        assert +self._held == held, "held counts drifted"

    # ---- internals ------------------------------------------------------------------------------

    def _prefix_blocks(
        self, worker: _Worker, tenant: str, hashes: Iterable[int], shared: Counter[BlockKey], now: float
    ) -> float:
        """The tier-weighted length of the leading run of ``hashes`` the worker holds."""
        l1, l2 = worker.blocks.get(KvTier.L1, {}), worker.blocks.get(KvTier.L2, {})
        total = 0.0
        for block_hash in hashes:
            key = (tenant, block_hash)
            if key in l1 or worker.speculative.get(key, 0.0) > now:
                total += self.weights.l1
            elif key in l2:
                total += self.weights.l2
            elif shared[key] > 0:
                total += self.weights.l3
            else:
                break
        return total

    def _store(self, worker: _Worker, event: KvBlockEvent) -> int:
        blocks = worker.blocks.setdefault(event.tier, {})
        sessions = worker.sessions.setdefault(event.tier, Counter())
        session = (event.tenant, event.workflow_id) if event.workflow_id else None
        confirmed = 0
        for block_hash in event.block_hashes:
            key = (event.tenant, block_hash)
            if key in blocks:
                old = blocks[key]
                if old is not None:
                    sessions[old] -= 1
            else:
                self._held[key] += 1
                if event.tier is KvTier.L3:
                    self._shared.setdefault(worker.model, Counter())[key] += 1
            blocks[key] = session
            if session is not None:
                sessions[session] += 1
            if worker.speculative.pop(key, None) is not None:
                confirmed += 1
        return confirmed

    def _remove(self, worker: _Worker, event: KvBlockEvent) -> None:
        blocks = worker.blocks.get(event.tier)
        if not blocks:
            return
        for block_hash in event.block_hashes:
            key = (event.tenant, block_hash)
            if key not in blocks:
                continue
            self._forget(worker, event.tier, key, blocks.pop(key))

    def _forget(self, worker: _Worker, tier: KvTier, key: BlockKey, session: ProgramKey | None) -> None:
        if session is not None:
            worker.sessions[tier][session] -= 1
        self._held[key] -= 1
        if self._held[key] <= 0:
            del self._held[key]
        if tier is KvTier.L3:
            shared = self._shared[worker.model]
            shared[key] -= 1
            if shared[key] <= 0:
                del shared[key]

    def _clear_tier(self, worker: _Worker, tier: KvTier) -> None:
        for key, session in worker.blocks.pop(tier, {}).items():
            self._forget(worker, tier, key, session)
        worker.sessions.pop(tier, None)
        if tier is KvTier.L1:
            worker.speculative.clear()

    def _drop_entries(self, worker: _Worker) -> None:
        for tier in list(worker.blocks):
            self._clear_tier(worker, tier)
        worker.speculative.clear()
