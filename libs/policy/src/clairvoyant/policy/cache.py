"""The cache family: which KV blocks an engine evicts first, and what the cache manager directs.

A cache policy orders eviction (``eviction_rank``: the lowest rank goes first) and issues
directives to the workers (drop, keep, write back, promote, pre-compute).  ``lru`` is what every
engine does today: least recently used first, no directives; the engine's radix cache implements
that order natively (``worker/core/radix_cache.py``), and a test checks the two agree.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Literal, NamedTuple, Protocol

from clairvoyant.policy.capabilities import PolicyRegistry

DirectiveKind = Literal["drop", "keep", "write_back", "promote", "precompute"]


class BlockUse(NamedTuple):
    """What a cache policy may know of one cached block."""

    block_hash: int
    last_access: float  # when a sequence last matched or wrote it
    hits: int = 0  # prefix matches since it was cached
    tenant: str = ""
    workflow_id: str = ""


class CacheDirective(NamedTuple):
    kind: DirectiveKind
    worker_id: str
    block_hashes: tuple[int, ...]


class CachePolicy(Protocol):
    def eviction_rank(self, block: BlockUse, now: float) -> float:
        """The block's rank at ``now``: among evictable blocks the lowest goes first.  Must be
        cheap and deterministic; ties go to the block cached first."""
        ...

    def directives(self, blocks: Sequence[BlockUse], now: float) -> list[CacheDirective]:
        """Directives to issue now, given the blocks the cluster caches; [] for a policy that
        only orders eviction."""
        ...


CACHE_POLICIES: PolicyRegistry[CachePolicy] = PolicyRegistry("cache policy")


@CACHE_POLICIES.register("lru")
class LruCache:
    """Least recently used first; no directives (every engine's behaviour today)."""

    def eviction_rank(self, block: BlockUse, now: float) -> float:
        return block.last_access

    def directives(self, blocks: Sequence[BlockUse], now: float) -> list[CacheDirective]:
        return []
