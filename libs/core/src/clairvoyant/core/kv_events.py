"""The workers' KV events as plain values: what one tier of one worker stored, removed or lost.

Workers publish them as ``KvEventBatch`` on ``cv.kv.events.<worker_id>``; ``clairvoyant.core.wire``
decodes a batch into a ``KvBatch``.  The scheduler's and the cache manager's KV index
(``clairvoyant.policy.kv_index``) apply them.  A ``STORED`` names consecutive blocks of one chain
(each the parent of the next, the first below ``parent_hash``) and the lineage that computed them.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass


class KvTier(enum.IntEnum):
    L1 = 1  # device memory
    L2 = 2  # host memory
    L3 = 3  # shared storage


class KvEventKind(enum.Enum):
    STORED = "stored"
    REMOVED = "removed"
    CLEARED = "cleared"


@dataclass(frozen=True, slots=True)
class KvBlockEvent:
    kind: KvEventKind
    tier: KvTier
    tenant: str = ""
    block_hashes: tuple[int, ...] = ()
    workflow_id: str = ""  # stored: the lineage's workflow (the session); "" for none
    agent_id: str = ""  # stored: the lineage's agent ("" unknown)
    request_id: str = ""  # stored: the request that computed the blocks ("" unknown)
    response: bool = False  # stored: the blocks hold response tokens
    parent_hash: int | None = None  # stored: the hash below the first block (None: the chain's root)


@dataclass(frozen=True, slots=True)
class KvBatch:
    """One engine step's events of one worker, in order."""

    worker_id: str
    model: str
    block_size: int  # tokens per block the hashes cover; 0 = not said
    sequence: int  # +1 per batch
    events: tuple[KvBlockEvent, ...] = ()


__all__ = ["KvBatch", "KvBlockEvent", "KvEventKind", "KvTier"]
