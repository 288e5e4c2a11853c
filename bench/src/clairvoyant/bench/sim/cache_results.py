"""What a run's cache manager achieved: the speculation ledger kept as the run goes, and the
figures a results file gets (``cache_metrics``) when the run had a cache policy.

Speculation is judged on the engines: a speculative directive's blocks count once applied on a
worker, and count as used when a later call on that worker is served them from its cache (its
leading ``cached_tokens``); whatever is unused at the end was wasted.  The core keeps its own
count, from the directives it issued (``CoreStats.speculative_*``); both are reported.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Sequence
from typing import Any

import numpy as np

from clairvoyant.bench.records import RunRecords
from clairvoyant.policy.cache import CompletedCall


class SpeculationLedger:
    """Blocks placed on a worker on a prediction, and whether a call then used them.

    A block counts once per (worker, tenant, hash) while unused; a call served from its cache uses
    the placed blocks among its leading ``cached_tokens``."""

    def __init__(self) -> None:
        self._open: dict[tuple[str, str, int], int] = {}  # -> tokens
        self.tokens = 0
        self.used = 0

    def placed(self, worker_id: str, tenant: str, block_hashes: Sequence[int], block_size: int) -> None:
        for block_hash in block_hashes:
            key = (worker_id, tenant, block_hash)
            if key not in self._open:
                self._open[key] = block_size
                self.tokens += block_size

    def served(self, call: CompletedCall, block_size: int) -> None:
        if not self._open:
            return
        hits = call.prompt_block_hashes[: call.cached_tokens // block_size]
        for block_hash in hits:
            self.used += self._open.pop((call.worker_id, call.tenant, block_hash), 0)


def cache_metrics(records: RunRecords) -> dict[str, Any]:
    """The results file's ``cache_manager`` entry: the prompt cache hit ratio by tier (prompt
    tokens served from L1, L2, L3 over the prompt tokens the engines took), the prefill tokens
    saved, the directives, the speculative tokens and those wasted, and the mean TTFT by agent."""
    totals, tiers = records.cache_manager, records.kv_tiers
    assert totals is not None, "a run without a cache manager"
    prompt = tiers.prompt_tokens if tiers is not None else 0
    hits = tiers.hit_tokens if tiers is not None else (0, 0, 0)
    ttft: dict[str, list[float]] = defaultdict(list)
    for call in records.calls:
        if call.first_token_time is not None and not call.rejected:
            ttft[call.agent_id].append(call.first_token_time - call.ready_time)
    return {
        "policy": totals.policy,
        "hit_ratio": {f"l{tier}": count / prompt if prompt else 0.0 for tier, count in enumerate(hits, 1)},
        "hit_ratio_total": sum(hits) / prompt if prompt else 0.0,
        "prefill_tokens_saved": tiers.prefill_tokens_saved if tiers is not None else 0,
        "directives_issued": totals.directives_issued,
        "directives_applied": totals.directives_applied,
        "directives_refused": totals.directives_refused,
        "speculative_tokens": totals.speculative_tokens,
        "speculative_tokens_used": totals.speculative_tokens_used,
        "wasted_speculative_tokens": totals.wasted_speculative_tokens,
        "core_speculative_tokens": totals.core_speculative_tokens,
        "core_wasted_speculative_tokens": totals.core_wasted_speculative_tokens,
        "ttft_s_by_agent": {agent: float(np.mean(values)) for agent, values in sorted(ttft.items())},
        "completions_seen": totals.completions_seen,
        "events_seen": totals.events_seen,
        "indexed_blocks": totals.indexed_blocks,
    }
