"""The cache manager core's configuration, its statistics, and the contracts its inputs must meet."""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import NamedTuple

from clairvoyant.policy.cache import CompletedCall, Tier

MAX_TOKEN = (1 << 32) - 1
MAX_HASH = (1 << 64) - 1


@dataclass(frozen=True, slots=True)
class CoreConfig:
    speculative_ttl_s: float = 2.0  # a placement's blocks count as held until the worker's STORED, this long
    history_max_bytes: int = 256 << 20  # workflow history (token ids and hashes) before eviction
    workflow_idle_ttl_s: float = 600.0  # a workflow with no completion this long expires
    # references may count other tenants' workflows; residency, blocks and assembly stay per tenant
    cross_tenant_sharing: bool = False
    recent_directives: int = 1024  # directives ``plan`` can show
    max_index_entries: int = 2_000_000  # (worker, tier, block) entries the index holds at most


class TierCount(NamedTuple):
    """One tier, summed over the workers.  L1/L2 ``blocks_*`` from the heartbeats; L3 ``blocks_used``
    is the distinct blocks the index knows in shared storage (no total).  ``hits``: prompt tokens
    the workers served from the tier; ``misses``: prompt tokens of completed calls that no tier up
    to and including this one served (completed prompt tokens minus the hits so far, at least 0)."""

    tier: Tier
    blocks_used: int
    blocks_total: int
    hits: int
    misses: int


class CoreStats(NamedTuple):
    policy: str
    indexed_blocks: int  # distinct (tenant, block hash) held somewhere
    directives_issued: int
    completions_seen: int
    events_seen: int  # KV events applied (not batches)
    malformed_dropped: int
    live_workflows: int
    history_bytes: int
    workers: int  # workers heard from (events or heartbeats)
    tiers: tuple[TierCount, ...]
    speculative_tokens: int = 0  # named by speculative directives
    speculative_used_tokens: int = 0  # of those, used by a later call of the tenant
    speculative_wasted_tokens: int = 0  # of those, unused when their speculation closed
    directives_by_kind: tuple[tuple[str, int], ...] = ()  # (kind, issued), by kind name


def call_problem(call: CompletedCall) -> str:
    """Why ``call`` breaks its contract ("" when it does not)."""
    if not call.request_id:
        return "a completion needs request_id"
    if not (math.isfinite(call.start) and math.isfinite(call.end)) or call.end < call.start:
        return "a completion's start and end must be finite, start <= end"
    if min(call.prompt_tokens, call.output_tokens, call.cached_tokens) < 0:
        return "token counts are unsigned"
    if out_of_range(call.prompt_token_ids, MAX_TOKEN) or out_of_range(call.output_token_ids, MAX_TOKEN):
        return "token ids are unsigned 32-bit"
    if out_of_range(call.prompt_block_hashes, MAX_HASH) or out_of_range(call.response_block_hashes, MAX_HASH):
        return "block hashes are unsigned 64-bit"
    return ""


def out_of_range(values: Sequence[int], largest: int) -> bool:
    return bool(values) and (min(values) < 0 or max(values) > largest)
