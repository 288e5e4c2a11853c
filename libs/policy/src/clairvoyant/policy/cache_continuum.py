"""``continuum``: Continuum's KV time-to-live across tool calls (arXiv 2511.02230), as Pythia's
evaluation ran it: only agents that can potentially have cache hits pin.

When a call ends in a tool call, its KV is pinned (retained in device memory) for a TTL ``tau``
that maximises the expected utility of holding it:

    U(tau) = F(tau) * B  -  tau * m

``F`` is the tool's duration CDF (the chance the tool is back within ``tau``), ``B`` the benefit of a
hit when it is (the reload cost of the call's tokens plus the queueing a re-admitted turn would
wait) and ``m`` the cost of pinning per second (the share of the worker's device memory the pin
holds, in seconds of the worker per second).  With at least ``min_samples`` durations ``F`` is their
empirical CDF over the last ``max_samples`` and ``tau`` is the best of 0 and the samples (U only
steps up at a sample); before that an exponential prior with the samples' mean (``prior_mean_s``
with none) gives ``tau = mu ln(B / (mu m))`` when ``B > mu m``, else 0.  ``tau`` is capped at
``max_ttl_s``; 0 pins nothing.  When the TTL expires the worker unpins and LRU resumes.

Choices of ours where the paper's constants are the engine's: ``reload_s_per_token`` = 1e-4 (a
10,000 tokens/s prefill), ``queueing_s`` = 0, ``prior_mean_s`` = 2 s, ``min_samples`` = 5,
``max_samples`` = 256, ``max_ttl_s`` = 300.  A call *ends in a tool call* when its agent's calls
are usually followed by one (``cache_tools.ToolCalls``).  Its agent *can potentially have cache
hits* when the annotation's next template copies from it or the predicted path names it again;
without an annotation nothing says so, and nothing is pinned.  ``eviction_rank``: pinned blocks
(while their TTL runs) last, the rest LRU.
"""

from __future__ import annotations

import math
from collections import deque

from clairvoyant.core.annotations import SysAnnotations
from clairvoyant.policy.cache import (
    CACHE_POLICIES,
    BlockUse,
    CacheDirective,
    CacheView,
    CompletedCall,
    lineage_key,
)
from clairvoyant.policy.cache_paths import BoundedMap, agents_in_path, by_worker, template_sources, worker_of
from clairvoyant.policy.cache_tools import ToolCalls

BAND = 1e12


def best_ttl(durations: list[float], benefit_s: float, cost_per_s: float) -> float:
    """argmax over tau in {0} + ``durations`` of F(tau) B - tau m (F their empirical CDF); the
    smallest tau on a tie."""
    ordered = sorted(durations)
    best_tau, best_utility = 0.0, 0.0
    for index, tau in enumerate(ordered):
        if index + 1 < len(ordered) and ordered[index + 1] == tau:
            continue  # F steps at the last of equal samples
        utility = (index + 1) / len(ordered) * benefit_s - tau * cost_per_s
        if utility > best_utility:
            best_tau, best_utility = tau, utility
    return best_tau


def prior_ttl(mean_s: float, benefit_s: float, cost_per_s: float) -> float:
    """The exponential prior's optimum: dU/dtau = B/mu e^(-tau/mu) - m = 0."""
    if cost_per_s <= 0:
        return math.inf
    if benefit_s <= mean_s * cost_per_s:
        return 0.0
    return mean_s * math.log(benefit_s / (mean_s * cost_per_s))


@CACHE_POLICIES.register("continuum")
class ContinuumCache:
    """Tool-aware TTL pinning of the calls whose context a later call continues."""

    def __init__(
        self,
        *,
        reload_s_per_token: float = 1e-4,
        queueing_s: float = 0.0,
        prior_mean_s: float = 2.0,
        min_samples: int = 5,
        max_samples: int = 256,
        max_ttl_s: float = 300.0,
        max_workflows: int = 4096,
        max_tools: int = 1024,
        max_pins: int = 1 << 16,
    ) -> None:
        self.reload_s_per_token = reload_s_per_token
        self.queueing_s = queueing_s
        self.prior_mean_s = prior_mean_s
        self.min_samples = min_samples
        self.max_samples = max_samples
        self.max_ttl_s = max_ttl_s
        self.tools = ToolCalls(max_workflows=max_workflows)
        self.durations: BoundedMap[tuple[str, str], deque[float]] = BoundedMap(max_tools)
        self.pinned: BoundedMap[tuple[str, int], tuple[str, float]] = BoundedMap(
            max_pins
        )  # -> (workflow, until)

    def ttl(self, tenant: str, tool: str, tokens: int, pinned_share: float) -> float:
        """The pin's TTL for a call of ``tokens`` tokens holding ``pinned_share`` of its worker."""
        benefit = tokens * self.reload_s_per_token + self.queueing_s
        samples = list(self.durations.get((tenant, tool), ()))
        if len(samples) >= self.min_samples:
            tau = best_ttl(samples, benefit, pinned_share)
        else:
            mean = sum(samples) / len(samples) if samples else self.prior_mean_s
            tau = prior_ttl(max(mean, 1e-3), benefit, pinned_share)
        return min(self.max_ttl_s, tau)

    def may_hit(self, agent_id: str, ann: SysAnnotations | None) -> bool:
        """Whether a later call is predicted to continue ``agent_id``'s context."""
        if ann is None:
            return False
        return agent_id in template_sources(ann.prompt_composition) or agent_id in agents_in_path(
            ann.predicted_path_regex
        )

    # ---- the protocol ------------------------------------------------------------------------
    def on_completion(self, call: CompletedCall, view: CacheView, now: float) -> list[CacheDirective]:
        gap = self.tools.observe(call)
        if gap is not None:
            samples = self.durations.get((call.tenant, gap.tool)) or deque(maxlen=self.max_samples)
            samples.append(gap.latency_s)
            self.durations[(call.tenant, gap.tool)] = samples
        key, meta = lineage_key(call), call.app_metadata
        if key is None or meta is None:
            return []
        if meta.workflow_end:
            self.forget(*key)
            return []
        tool = self.tools.tool_after(call.tenant, meta.workflow_type_id, meta.agent_id)
        hashes = call.prompt_block_hashes + call.response_block_hashes
        if not tool or not hashes or not self.may_hit(meta.agent_id, call.annotations):
            return []
        worker = worker_of(view, call.model, call.worker_id)
        share = len(hashes) / worker.l1_total if worker is not None and worker.l1_total else 1.0
        ttl = self.ttl(call.tenant, tool, call.prompt_tokens + call.output_tokens, share)
        if ttl <= 0:
            return []
        for block_hash in hashes:
            self.pinned[(call.tenant, block_hash)] = (key[1], now + ttl)
        return by_worker(
            "retain",
            [(call.worker_id, h) for h in hashes],
            tenant=call.tenant,
            workflow_id=key[1],
            ttl_s=ttl,
            target_tier=1,
            reason=f"continuum: pinned across tool {tool}",
        )

    def on_tick(self, view: CacheView, now: float) -> list[CacheDirective]:
        for key in [k for k, (_, until) in self.pinned.items() if until <= now]:
            del self.pinned[key]
        return []

    def eviction_rank(self, block: BlockUse, now: float) -> float:
        pin = self.pinned.get((block.tenant, block.block_hash))
        return block.last_access + BAND if pin is not None and pin[1] > now else block.last_access

    def forget(self, tenant: str, workflow_id: str) -> None:
        self.tools.forget(tenant, workflow_id)
        for key in [
            k for k, (workflow, _) in self.pinned.items() if k[0] == tenant and workflow == workflow_id
        ]:
            del self.pinned[key]


__all__ = ["ContinuumCache", "best_ttl", "prior_ttl"]
