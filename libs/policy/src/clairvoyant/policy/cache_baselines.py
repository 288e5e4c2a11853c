"""The engines' own hierarchical caches, as baselines: ``lmcache`` and ``hicache``.

* ``lmcache``: LMCache under vLLM, what Pythia's vLLM baselines ran with: LRU (its default
  ``cache_policy``) over device and host memory, and every computed chunk written to each backend,
  so the shared tier too (write-through).  Here: on each completion the call's prompt and response
  blocks are written back to L3 on its worker, when that worker has one.
* ``hicache``: SGLang HiCache's radix cache over L1/L2/L3 with ``write_through_selective``: a node
  is written to L3 once its hit count reaches the write-through threshold, 2.  Here a block's hits
  are the completed prompts that matched it after the call that first computed it (a prompt or a
  response chain introduces a block with 0 hits; each later prompt containing it is a hit); at the
  second hit it is written back to L3 on the worker that served that prompt, once.

Both keep LRU order and issue nothing else.  State: the hit counts and written marks of at most
``max_blocks`` hashes (the oldest forgotten: a forgotten block starts over at 0 hits).
"""

from __future__ import annotations

from clairvoyant.policy.cache import CACHE_POLICIES, BlockUse, CacheDirective, CacheView, CompletedCall
from clairvoyant.policy.cache_paths import BoundedMap, by_worker, worker_of

WRITE_THROUGH_THRESHOLD = 2  # HiCache's hit count for write_through_selective


def _has_l3(view: CacheView, call: CompletedCall) -> bool:
    worker = worker_of(view, call.model, call.worker_id)
    return worker is not None and worker.has_l3


def _workflow_of(call: CompletedCall) -> str:
    return call.app_metadata.workflow_id if call.app_metadata is not None else ""


@CACHE_POLICIES.register("lmcache")
class LmCacheWriteThrough:
    """LRU over L1/L2 with write-through of every completed call's blocks to L3."""

    def on_completion(self, call: CompletedCall, view: CacheView, now: float) -> list[CacheDirective]:
        hashes = call.prompt_block_hashes + call.response_block_hashes
        if not hashes or not _has_l3(view, call):
            return []
        return by_worker(
            "write_back",
            [(call.worker_id, h) for h in hashes],
            tenant=call.tenant,
            workflow_id=_workflow_of(call),
            reason="lmcache: write-through",
        )

    def on_tick(self, view: CacheView, now: float) -> list[CacheDirective]:
        return []

    def eviction_rank(self, block: BlockUse, now: float) -> float:
        return block.last_access

    def forget(self, tenant: str, workflow_id: str) -> None:
        return None


@CACHE_POLICIES.register("hicache")
class HiCacheSelective:
    """LRU radix over L1/L2/L3; blocks written to L3 at their second hit."""

    def __init__(self, *, threshold: int = WRITE_THROUGH_THRESHOLD, max_blocks: int = 1 << 18) -> None:
        self.threshold = threshold
        self.hits: BoundedMap[tuple[str, int], int] = BoundedMap(max_blocks)  # -1: written to L3

    def on_completion(self, call: CompletedCall, view: CacheView, now: float) -> list[CacheDirective]:
        due: list[int] = []
        for block_hash in call.prompt_block_hashes:
            key = (call.tenant, block_hash)
            hits = self.hits.get(key)
            if hits is None:
                self.hits[key] = 0
            elif hits >= 0:
                self.hits[key] = hits + 1
                if hits + 1 >= self.threshold:
                    due.append(block_hash)
        for block_hash in call.response_block_hashes:
            if (call.tenant, block_hash) not in self.hits:
                self.hits[(call.tenant, block_hash)] = 0
        if not due or not _has_l3(view, call):
            return []
        for block_hash in due:
            self.hits[(call.tenant, block_hash)] = -1
        return by_worker(
            "write_back",
            [(call.worker_id, h) for h in due],
            tenant=call.tenant,
            workflow_id=_workflow_of(call),
            reason="hicache: write_through_selective",
        )

    def on_tick(self, view: CacheView, now: float) -> list[CacheDirective]:
        return []

    def eviction_rank(self, block: BlockUse, now: float) -> float:
        return block.last_access

    def forget(self, tenant: str, workflow_id: str) -> None:
        return None  # hit counts belong to blocks, which outlive workflows


__all__ = ["HiCacheSelective", "LmCacheWriteThrough", "WRITE_THROUGH_THRESHOLD"]
