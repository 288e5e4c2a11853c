"""The cluster index: which (tenant, block hash) lives on which worker in which tier, and who made it.

Holdings, sequence gaps and speculative entries are the shared ``KvIndex``'s
(``clairvoyant.policy.kv_index``, the scheduler's too): a gap drops the worker's entries until its
next CLEARED; a placement (``speculate``) marks a prompt's blocks as held in L1 on a worker for
``speculative_ttl_s`` until its STORED confirms them, as llm-d's indexer does.  On top of that this
index keeps each held block's lineage (``BlockUse``: workflow, agent, request, prompt or response,
last access, hits), from the STORED that first reported it, so a policy can ask for a workflow's
blocks.

Bounds: at most ``max_entries`` (worker, tier, block) entries.  At the cap a STORED is cut to the
blocks that still fit (a chain's head is kept, its tail not indexed: the index then under-reports,
never over-reports, what a worker holds) and the cut blocks are counted in ``refused``.  Lineage
records are capped at ``max_entries`` too; past that the least recently accessed record goes
(its block stays indexed with an unknown lineage).
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, replace

from clairvoyant.cachemgr.core.values import MAX_HASH
from clairvoyant.core.kv_events import KvBatch, KvBlockEvent, KvEventKind, KvTier
from clairvoyant.policy.cache import BlockUse, Residency, Tier
from clairvoyant.policy.kv_index import BlockKey, KvApplied, KvIndex


@dataclass(slots=True)
class _Lineage:
    workflow_id: str
    agent_id: str
    request_id: str
    response: bool
    last_access: float
    hits: int = 0


def batch_problem(batch: KvBatch) -> str:
    """Why ``batch`` breaks its contract ("" when it does not): ids set, numbers in range, a
    CLEARED without hashes, hashes unsigned 64-bit."""
    if not batch.worker_id or not batch.model:
        return "a KV batch needs worker_id and model"
    if batch.sequence < 0 or batch.block_size < 0:
        return "a KV batch's sequence and block_size are unsigned"
    for event in batch.events:
        if event.kind is KvEventKind.CLEARED and event.block_hashes:
            return "a CLEARED names no blocks"
        if any(not 0 <= h <= MAX_HASH for h in event.block_hashes):
            return "block hashes are unsigned 64-bit"
    return ""


class ClusterIndex:
    """The index described in the module docstring.  Pure: every call that needs the time takes ``now``."""

    def __init__(self, *, speculative_ttl_s: float = 2.0, max_entries: int = 2_000_000) -> None:
        if max_entries < 1:
            raise ValueError("max_entries must be >= 1")
        self.kv = KvIndex(speculative_ttl_s=speculative_ttl_s)
        self.max_entries = max_entries
        self.refused = 0  # blocks a STORED named that the cap kept out
        self._entries = 0  # (worker, tier, block) entries, kept in step with ``kv``
        self._lineage: OrderedDict[BlockKey, _Lineage] = OrderedDict()  # least recently accessed first
        self._by_workflow: dict[tuple[str, str], dict[int, None]] = {}  # -> hashes, first stored first
        self._unswept = False  # entries went without naming their blocks (CLEARED, gap)

    # ---- events ---------------------------------------------------------------------------------

    def apply(self, batch: KvBatch, now: float) -> KvApplied:
        """Apply one batch that passed ``batch_problem``."""
        known_as = self.kv.model_of(batch.worker_id)
        if known_as is not None and known_as != batch.model:
            self._unswept = True  # the worker restarted as another model: ``kv`` drops its entries
        events = tuple(self._fit(batch, event) for event in batch.events)
        applied = self.kv.apply(replace(batch, events=events), now)
        self._entries = self.kv.entries
        if applied.gap or any(e.kind is KvEventKind.CLEARED for e in events):
            self._unswept = True
        if applied.stale:
            return applied
        for event in events:
            if event.kind is KvEventKind.STORED:
                self._note_stored(event, now)
            elif event.kind is KvEventKind.REMOVED:
                self._forget_unheld(event.tenant, event.block_hashes)
        return applied

    def speculate(self, worker_id: str, tenant: str, block_hashes: Sequence[int], now: float) -> int:
        return self.kv.speculate_blocks(worker_id, tenant, block_hashes, now)

    def remove_worker(self, worker_id: str) -> bool:
        gone = self.kv.remove_worker(worker_id)
        self._entries = self.kv.entries
        self._unswept = self._unswept or gone
        return gone

    def expire(self, now: float) -> None:
        """Speculative entries past their TTL go; lineage of blocks no worker holds any more goes."""
        self.kv.expire(now)
        if self._unswept:
            unheld = [key for key in self._lineage if self.kv.holders(*key) == 0]
            for tenant, block_hash in unheld:
                self._forget_unheld(tenant, (block_hash,))
            self._unswept = False

    def touch(self, tenant: str, block_hashes: Iterable[int], now: float, hits: int = 0) -> None:
        """A sequence used these blocks at ``now``; the first ``hits`` of them were cache hits."""
        for i, block_hash in enumerate(block_hashes):
            lineage = self._lineage.get((tenant, block_hash))
            if lineage is not None:
                lineage.last_access = max(lineage.last_access, now)
                lineage.hits += 1 if i < hits else 0
                self._lineage.move_to_end((tenant, block_hash))

    # ---- queries --------------------------------------------------------------------------------

    @property
    def entries(self) -> int:
        return self._entries

    def residency(
        self, tenant: str, worker_ids: Iterable[str], block_hashes: Sequence[int], now: float
    ) -> list[Residency]:
        return [
            Residency(worker_id, *self.kv.leading_runs(worker_id, tenant, block_hashes, now))
            for worker_id in worker_ids
        ]

    def tier_of(self, worker_id: str, tenant: str, block_hash: int) -> Tier | None:
        """The fastest tier of ``worker_id`` holding the block (speculation aside), None if none."""
        tiers = self.kv.tiers_holding(worker_id, tenant, block_hash)
        return _tier(tiers[0]) if tiers else None

    def lineage_of(self, tenant: str, block_hash: int) -> BlockUse:
        """The block's lineage as a ``BlockUse`` (empty lineage when unknown)."""
        found = self._lineage.get((tenant, block_hash))
        if found is None:
            return BlockUse(block_hash, 0.0, tenant=tenant)
        return BlockUse(
            block_hash=block_hash,
            last_access=found.last_access,
            hits=found.hits,
            tenant=tenant,
            workflow_id=found.workflow_id,
            agent_id=found.agent_id,
            request_id=found.request_id,
            response=found.response,
        )

    def workflow_blocks(self, tenant: str, workflow_id: str) -> list[tuple[str, Tier, BlockUse]]:
        """(worker, tier, block) for each held block ``workflow_id``'s lineage stored first, oldest
        first, then by worker id and tier."""
        hashes = self._by_workflow.get((tenant, workflow_id), {})
        workers = self.kv.workers()
        out: list[tuple[str, Tier, BlockUse]] = []
        for block_hash in hashes:
            use = self.lineage_of(tenant, block_hash)
            for worker_id in workers:
                for tier in self.kv.tiers_holding(worker_id, tenant, block_hash):
                    out.append((worker_id, _tier(tier), use))
        return out

    def check_integrity(self) -> None:
        self.kv.check_integrity()
        assert self._entries == self.kv.entries, "entry count drifted"
        indexed = {(t, h) for (t, _), hashes in self._by_workflow.items() for h in hashes}
        assert indexed == {k for k, v in self._lineage.items() if v.workflow_id}, "workflow map drifted"

    # ---- internals ------------------------------------------------------------------------------

    def _fit(self, batch: KvBatch, event: KvBlockEvent) -> KvBlockEvent:
        """``event`` cut to the blocks the entry cap leaves room for (a STORED keeps its head)."""
        if event.kind is not KvEventKind.STORED:
            return event
        room = self.max_entries - self._entries
        for i, block_hash in enumerate(event.block_hashes):
            if self.kv.holds(batch.worker_id, event.tier, event.tenant, block_hash):
                continue
            if room == 0:
                self.refused += len(event.block_hashes) - i
                self._entries = self.max_entries
                return replace(event, block_hashes=event.block_hashes[:i])
            room -= 1
        self._entries = self.max_entries - room
        return event

    def _note_stored(self, event: KvBlockEvent, now: float) -> None:
        for block_hash in event.block_hashes:
            key = (event.tenant, block_hash)
            found = self._lineage.get(key)
            if found is not None:
                found.last_access = max(found.last_access, now)
                self._lineage.move_to_end(key)
                continue
            if self.kv.holders(*key) == 0:
                continue  # cut at the cap
            self._lineage[key] = _Lineage(
                event.workflow_id, event.agent_id, event.request_id, event.response, now
            )
            if event.workflow_id:
                self._by_workflow.setdefault((event.tenant, event.workflow_id), {})[block_hash] = None
            while len(self._lineage) > self.max_entries:
                old_key, old = self._lineage.popitem(last=False)
                self._unlink(old_key, old)

    def _forget_unheld(self, tenant: str, block_hashes: Iterable[int]) -> None:
        for block_hash in block_hashes:
            key = (tenant, block_hash)
            if self.kv.holders(*key) == 0:
                found = self._lineage.pop(key, None)
                if found is not None:
                    self._unlink(key, found)

    def _unlink(self, key: BlockKey, lineage: _Lineage) -> None:
        if not lineage.workflow_id:
            return
        workflow = (key[0], lineage.workflow_id)
        hashes = self._by_workflow.get(workflow)
        if hashes is not None:
            hashes.pop(key[1], None)
            if not hashes:
                del self._by_workflow[workflow]


def _tier(tier: KvTier) -> Tier:
    return 1 if tier is KvTier.L1 else 2 if tier is KvTier.L2 else 3
