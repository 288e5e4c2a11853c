"""``saga``: SAGA's workflow-aware cache management (seed 003, §4.1-4.3, Table 9 defaults).

* **WA-LRU** (§4.1, Eq. 1-5): a block's score is ``0.3 R + 0.5 U + 0.2 S`` and the lowest score is
  evicted first.  ``R = 1 - idle / max_idle`` (normalised recency, floored at 0), ``U`` the
  predicted probability that the workflow's next step reuses it, ``S = tokens / max_tokens``
  (normalised size).
* **Tool-call-aware TTL** (§4.2, Alg. 1, Eq. 6): when a call ends in a tool call, its blocks are
  retained for ``min(p95(tool), 300 s) * (1 - pressure)`` where ``pressure = clip((u - 0.7) /
  (0.9 - 0.7), 0, 1)`` and ``u`` is the worker's device-memory use: soft pressure from 0.7 scales
  the TTL down, from 0.9 nothing is retained (hard eviction).
* **Speculative prefetch** (§4.3): at the same moment the most likely successor's prompt is
  assembled and, when the worker lacks it but the hierarchy holds some of it, promoted to L2 on the
  call's worker (session affinity routes the successor there).

The text lost SAGA's formulas; the choices written down here:

* p95 of a tool's latency: an exponentially weighted mean and variance (weight ``ema_alpha`` = 0.1
  per sample; the first sample sets the mean, variance 0) and ``mean + 1.645 std`` (the normal
  quantile).  A tool without samples gets no TTL (SAGA serves unknown agents request-level).
* Tool latency and the tool call starting: ``cache_tools.ToolCalls`` (the gap from a call's end to
  the workflow's next call naming the tool; an agent starts a tool when at least half of the calls
  that followed it named that tool).
* Eq. 4's reuse probability: over the annotation's ``next_agents`` (successor ``s`` with
  probability ``p``), a block of agent ``a`` gets ``p`` when ``s == a`` (a ReAct chain continues its
  own context: overlap 1) or when ``s``'s template (``prompt_composition``, known for the first
  successor) copies from ``a``; capped at 1.  Unknown or ended workflows: 0.
* ``max_idle``: the longest tool gap observed (at least 1 s; 300 s, the TTL cap, before any);
  ``max_tokens``: the largest call (prompt + output tokens) seen.  Larger entries score higher
  (regenerating them costs more, §9.1.1).
* Hard eviction (``on_tick``): on a worker at or above 0.9, the blocks of tracked workflows whose
  reuse probability is 0 are dropped.
"""

from __future__ import annotations

import math
from typing import NamedTuple

from clairvoyant.policy.cache import (
    CACHE_POLICIES,
    BlockUse,
    CacheDirective,
    CacheView,
    CompletedCall,
    lineage_key,
)
from clairvoyant.policy.cache_paths import (
    BoundedMap,
    by_worker,
    most_resident,
    prompt_hashes,
    template_sources,
    worker_of,
)
from clairvoyant.policy.cache_tools import ToolCalls

Z95 = 1.6449  # standard normal 95th percentile


class LatencyEma(NamedTuple):
    mean: float
    variance: float
    samples: int

    def add(self, latency_s: float, alpha: float) -> LatencyEma:
        diff = latency_s - self.mean
        return LatencyEma(
            self.mean + alpha * diff, (1 - alpha) * (self.variance + alpha * diff * diff), self.samples + 1
        )

    def p95(self) -> float:
        return self.mean + Z95 * math.sqrt(self.variance)


def memory_pressure(used_fraction: float, soft: float = 0.7, hard: float = 0.9) -> float:
    """Eq. 6: 0 below ``soft``, 1 from ``hard``, linear between."""
    return min(1.0, max(0.0, (used_fraction - soft) / (hard - soft)))


@CACHE_POLICIES.register("saga")
class SagaCache:
    """WA-LRU eviction order, tool-call-aware TTL retention and speculative prefetch."""

    def __init__(
        self,
        *,
        recency_weight: float = 0.3,
        reuse_weight: float = 0.5,
        size_weight: float = 0.2,
        soft_pressure: float = 0.7,
        hard_pressure: float = 0.9,
        ttl_cap_s: float = 300.0,
        ema_alpha: float = 0.1,
        max_workflows: int = 4096,
        max_tools: int = 1024,
    ) -> None:
        self.weights = (recency_weight, reuse_weight, size_weight)
        self.soft_pressure, self.hard_pressure = soft_pressure, hard_pressure
        self.ttl_cap_s = ttl_cap_s
        self.ema_alpha = ema_alpha
        self.tools = ToolCalls(max_workflows=max_workflows)
        self.latency: BoundedMap[tuple[str, str], LatencyEma] = BoundedMap(max_tools)
        self.reuse: BoundedMap[tuple[str, str], dict[str, float]] = BoundedMap(max_workflows)
        self.max_idle_s = 0.0
        self.max_tokens = 1

    # ---- numbers -----------------------------------------------------------------------------
    def tool_ttl(self, tenant: str, tool: str, used_fraction: float) -> float:
        """Alg. 1: the tool's p95 latency, capped, scaled down by memory pressure (0: do not retain)."""
        stats = self.latency.get((tenant, tool))
        if stats is None:
            return 0.0
        pressure = memory_pressure(used_fraction, self.soft_pressure, self.hard_pressure)
        return min(self.ttl_cap_s, stats.p95()) * (1.0 - pressure)

    def score(self, block: BlockUse, now: float) -> float:
        """Eq. 1: the WA-LRU score (lowest evicted first)."""
        recency_weight, reuse_weight, size_weight = self.weights
        max_idle = max(1.0, self.max_idle_s) if self.max_idle_s > 0 else self.ttl_cap_s
        recency = max(0.0, 1.0 - (now - block.last_access) / max_idle)
        reuse = self.reuse.get((block.tenant, block.workflow_id), {}).get(block.agent_id, 0.0)
        size = min(1.0, block.tokens / self.max_tokens)
        return recency_weight * recency + reuse_weight * reuse + size_weight * size

    # ---- the protocol ------------------------------------------------------------------------
    def on_completion(self, call: CompletedCall, view: CacheView, now: float) -> list[CacheDirective]:
        gap = self.tools.observe(call)
        if gap is not None:
            stats = self.latency.get((call.tenant, gap.tool))
            first = LatencyEma(gap.latency_s, 0.0, 1)
            self.latency[(call.tenant, gap.tool)] = (
                first if stats is None else stats.add(gap.latency_s, self.ema_alpha)
            )
            self.max_idle_s = max(self.max_idle_s, gap.latency_s)
        self.max_tokens = max(self.max_tokens, call.prompt_tokens + call.output_tokens)
        key, meta, ann = lineage_key(call), call.app_metadata, call.annotations
        if key is None or meta is None:
            return []
        if meta.workflow_end:
            self.forget(*key)
            return []
        if ann is not None and ann.next_agents:
            reuse: dict[str, float] = {}
            sources = template_sources(ann.prompt_composition)
            for rank, successor in enumerate(ann.next_agents):
                for agent in {successor.agent_id} | (sources if rank == 0 else frozenset()):
                    reuse[agent] = min(1.0, reuse.get(agent, 0.0) + successor.probability)
            self.reuse[key] = reuse
        tool = self.tools.tool_after(call.tenant, meta.workflow_type_id, meta.agent_id)
        if not tool:
            return []
        worker = worker_of(view, call.model, call.worker_id)
        ttl = self.tool_ttl(call.tenant, tool, worker.pressure(1) if worker is not None else 0.0)
        hashes = call.prompt_block_hashes + call.response_block_hashes
        directives: list[CacheDirective] = []
        if ttl > 0 and hashes:
            directives += by_worker(
                "retain",
                [(call.worker_id, h) for h in hashes],
                tenant=call.tenant,
                workflow_id=key[1],
                ttl_s=ttl,
                target_tier=1,
                reason=f"saga: tool {tool} running",
            )
        return directives + self._prefetch(call, view)

    def on_tick(self, view: CacheView, now: float) -> list[CacheDirective]:
        hot = {w.worker_id for w in view.workers("") if w.pressure(1) >= self.hard_pressure}
        directives: list[CacheDirective] = []
        for (tenant, workflow_id), reuse in sorted(self.reuse.items()) if hot else ():
            doomed = [
                (w, b.block_hash)
                for w, tier, b in view.blocks(tenant, workflow_id)
                if w in hot and tier != 3 and reuse.get(b.agent_id, 0.0) == 0.0
            ]
            directives += by_worker(
                "drop", doomed, tenant=tenant, workflow_id=workflow_id, reason="saga: hard memory pressure"
            )
        return directives

    def eviction_rank(self, block: BlockUse, now: float) -> float:
        return self.score(block, now)

    def forget(self, tenant: str, workflow_id: str) -> None:
        self.reuse.pop((tenant, workflow_id), None)
        self.tools.forget(tenant, workflow_id)

    # ---- §4.3 --------------------------------------------------------------------------------
    def _prefetch(self, call: CompletedCall, view: CacheView) -> list[CacheDirective]:
        meta, ann = call.app_metadata, call.annotations
        if meta is None or ann is None or not ann.prompt_composition:
            return []
        successor = ann.next_agents[0].agent_id if ann.next_agents else ""
        tokens = view.assemble(call.tenant, meta.workflow_id, ann.prompt_composition, successor)
        hashes = prompt_hashes(tokens or ())
        if not tokens or not hashes:
            return []
        residency = view.residency(call.tenant, call.model, hashes)
        here = next((r for r in residency if r.worker_id == call.worker_id), None)
        if here is not None and here.l2_blocks >= len(hashes):
            return []  # already cached
        if most_resident(residency, 3) == 0:
            return []  # nothing to load: the successor's own prefill computes it
        return [
            CacheDirective(
                "promote",
                call.worker_id,
                call.tenant,
                workflow_id=meta.workflow_id,
                agent_id=successor,
                token_ids=tuple(tokens),
                target_tier=2,
                speculative=True,
                reason="saga: prefetch the likely successor",
            )
        ]


__all__ = ["LatencyEma", "SagaCache", "memory_pressure"]
