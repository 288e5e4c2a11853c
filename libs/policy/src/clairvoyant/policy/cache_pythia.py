"""``pythia``: Pythia's speculative cache manager (seed 000, §4.2.1, Algorithm 1).

On each completed call that carries a LOW or HIGH confidence annotation with a path expression:

* **Early eviction** (Alg. 1 l.5-10).  ``future`` = the agents the predicted path expression (the
  remaining workflow) names.  A block the workflow's lineage computed is *live* when its agent is in
  ``future``, when a known template of a future agent copies from its agent, or when another live
  workflow of the tenant references it (``view.references``: a shared system prompt); otherwise it
  is dead and dropped at once, in every tier, on the worker holding it.  Live blocks are retained
  in L2 (``RetainInHierarchy``) and written back to L3 on workers that have one.
* **Forward staging** (Alg. 1 l.12-19).  The next prompt is assembled from the annotation's
  ``prompt_composition`` and the workflow's history.  If any worker holds any of it (L3 counts),
  it is promoted to L2 (``PromoteToHost``) on the worker the scheduler will likely pick; otherwise,
  if that worker is idle, it is pre-prefilled there.  Both are speculative; nothing is ever
  promoted to L1 (the paper keeps speculative data off the GPU).
* ``workflow_end``: the workflow's blocks no other live workflow references are dropped.

Choices where the paper is silent:

* Without an annotation (or with confidence NONE/SHADOW, or an empty path) the call gets no
  directives: the engines' LRU stands.
* A block with an unknown lineage agent ("") is live (nothing says it is transient).
* Lineage is the call that first computed a block, so a continued conversation's later calls hold
  earlier agents' blocks: a block in the chain of any call of a live agent is live too.
* Dead means provably dead: while any future agent's template is still unknown (it may copy from
  any earlier call), every block of the workflow is live; the paper's cache manager always has the
  templates, ours learns them from the annotations it sees.
* ``RetainInHierarchy`` keeps live blocks below device memory: pinned in L2 where they are there,
  and written back to L3 in any case.  Device memory stays LRU: pinning it for a future step would
  displace live requests, which the paper rules out for speculative data (under load, pins in L1
  cost more JCT than the hits they kept).
* Retain TTL: the annotation's ``expected_remaining_time_s`` (every future use falls within it),
  clamped to [``min_retain_s``, ``max_retain_s``] = [30, 600] s (600 s is the cache manager's idle
  workflow expiry); 120 s when the profiler has no estimate.
* Templates are learned per (tenant, workflow type, agent): the annotation's ``prompt_composition``
  is the template of ``next_agents[0]``.  A future agent's model is the one its last call used
  (the current call's model until seen).
* The likely worker (Pythia's router, Alg. 2): the most free device blocks among the next agent's
  model's workers (the statistical capacity bound needs the scheduler's state, which the cache
  manager does not have), then the most of the prompt already in L2 (the paper's tie-break), then
  the worker id.  Nothing is staged when that worker already holds the whole prompt in L2 or L1.
* ``eviction_rank``: dead blocks (an ended or tracked workflow's blocks outside its live set)
  first, then LRU, live blocks last; each band in last-access order.
"""

from __future__ import annotations

from collections.abc import Sequence

from clairvoyant.core.annotations import Confidence, SysAnnotations
from clairvoyant.policy.cache import (
    CACHE_POLICIES,
    BlockUse,
    CacheDirective,
    CacheView,
    CompletedCall,
    DirectiveKind,
    Tier,
    WorkerLoad,
    lineage_key,
)
from clairvoyant.policy.cache_paths import (
    BoundedMap,
    agents_in_path,
    by_worker,
    most_resident,
    prompt_hashes,
    template_sources,
)

BAND = 1e12  # rank offset of the dead and live bands: beyond any clock value
PREDICTING = (Confidence.LOW, Confidence.HIGH)


class _AllAgents(frozenset[str]):
    """The live set when a future agent's template is unknown: every agent is in it."""

    def __contains__(self, agent: object) -> bool:
        return True


ALL_LIVE: frozenset[str] = _AllAgents()


def likely_worker(workers: Sequence[WorkerLoad], l2_blocks: dict[str, int]) -> WorkerLoad | None:
    """Pythia's router as the cache manager can run it: the most free device blocks, then the most
    of the prompt in L2 (Alg. 2's cache-affinity tie-break), then the lowest worker id."""
    if not workers:
        return None
    return min(
        workers, key=lambda w: (-(w.l1_total - w.l1_used), -l2_blocks.get(w.worker_id, 0), w.worker_id)
    )


@CACHE_POLICIES.register("pythia")
class PythiaCache:
    """Early eviction by lineage and forward staging of the next prompt (Alg. 1)."""

    def __init__(
        self,
        *,
        min_retain_s: float = 30.0,
        max_retain_s: float = 600.0,
        default_retain_s: float = 120.0,
        max_workflows: int = 4096,
        max_templates: int = 4096,
        max_shared_blocks: int = 1 << 16,
    ) -> None:
        self.min_retain_s = min_retain_s
        self.max_retain_s = max_retain_s
        self.default_retain_s = default_retain_s
        # (tenant, workflow type, agent) -> template / model its last call used
        self.templates: BoundedMap[tuple[str, str, str], str] = BoundedMap(max_templates)
        self.models: BoundedMap[tuple[str, str, str], str] = BoundedMap(max_templates)
        # (tenant, workflow) -> the agents whose blocks are live (future + template sources)
        self.live_agents: BoundedMap[tuple[str, str], frozenset[str]] = BoundedMap(max_workflows)
        self.shared: BoundedMap[tuple[str, int], None] = BoundedMap(max_shared_blocks)

    # ---- the protocol ------------------------------------------------------------------------
    def on_completion(self, call: CompletedCall, view: CacheView, now: float) -> list[CacheDirective]:
        key, meta, ann = lineage_key(call), call.app_metadata, call.annotations
        if key is None or meta is None:
            return []
        tenant, workflow_id = key
        self.models[(tenant, meta.workflow_type_id, meta.agent_id)] = call.model
        if meta.workflow_end:
            return self._end(call, view)
        if ann is None or ann.confidence not in PREDICTING or not ann.predicted_path_regex:
            return []
        if ann.next_agents and ann.prompt_composition:
            self.templates[(tenant, meta.workflow_type_id, ann.next_agents[0].agent_id)] = (
                ann.prompt_composition
            )
        future = agents_in_path(ann.predicted_path_regex)
        sources = frozenset().union(
            *(
                template_sources(self.templates.get((tenant, meta.workflow_type_id, agent), ""))
                for agent in future
            )
        )
        live_agents = future | sources
        # A future agent whose template is unknown may copy from any earlier call: nothing is dead.
        known = all((tenant, meta.workflow_type_id, agent) in self.templates for agent in future)
        self.live_agents[key] = live_agents if known else ALL_LIVE
        return self._evict_early(call, view, self.live_agents[key], ann) + self._stage(call, view, ann)

    def on_tick(self, view: CacheView, now: float) -> list[CacheDirective]:
        return []  # retained blocks expire at the workers; nothing else is due

    def eviction_rank(self, block: BlockUse, now: float) -> float:
        live = self.live_agents.get((block.tenant, block.workflow_id))
        if live is None:
            return block.last_access
        if not block.agent_id or block.agent_id in live or (block.tenant, block.block_hash) in self.shared:
            return block.last_access + BAND
        return block.last_access - BAND

    def forget(self, tenant: str, workflow_id: str) -> None:
        self.live_agents.pop((tenant, workflow_id), None)

    # ---- Alg. 1 ------------------------------------------------------------------------------
    def _evict_early(
        self, call: CompletedCall, view: CacheView, live_agents: frozenset[str], ann: SysAnnotations
    ) -> list[CacheDirective]:
        """Lines 5-10: free the dead blocks, retain the live ones and write them back to L3."""
        tenant, workflow_id = call.tenant, call.app_metadata.workflow_id if call.app_metadata else ""
        # Blocks a future agent's template copies: the chains of the source agents' calls.  A
        # block's lineage is the call that first computed it, so a later call's chain holds blocks
        # of earlier agents too (a continued conversation): they are live through it.
        copied: set[int] = set()
        if live_agents is not ALL_LIVE:
            for agent in live_agents:
                for chain in view.chains(tenant, workflow_id, agent):
                    copied.update(chain)
        dead: list[tuple[str, int]] = []
        live: dict[Tier, list[tuple[str, int]]] = {1: [], 2: []}  # (worker, hash) in L1, in L2
        in_l3: set[int] = set()
        for worker_id, tier, block in view.blocks(tenant, workflow_id):
            shared = view.references(tenant, block.block_hash) > 0
            if shared:
                self.shared[(tenant, block.block_hash)] = None
            if block.agent_id and block.agent_id not in live_agents and not shared and block.block_hash not in copied:
                dead.append((worker_id, block.block_hash))
            elif tier == 3:
                in_l3.add(block.block_hash)
            else:
                live[tier].append((worker_id, block.block_hash))
        with_l3 = {w.worker_id for w in view.workers("") if w.has_l3}
        ttl = self._retain_ttl(ann)
        return [
            *by_worker("drop", dead, tenant=tenant, workflow_id=workflow_id, reason="pythia: dead lineage"),
            *by_worker(
                "retain",
                live[2],
                tenant=tenant,
                workflow_id=workflow_id,
                ttl_s=ttl,
                target_tier=2,
                reason="pythia: in the future path",
            ),
            *by_worker(
                "write_back",
                [(w, h) for w, h in live[1] + live[2] if w in with_l3 and h not in in_l3],
                tenant=tenant,
                workflow_id=workflow_id,
                reason="pythia: persist the future path to L3",
            ),
        ]

    def _stage(self, call: CompletedCall, view: CacheView, ann: SysAnnotations) -> list[CacheDirective]:
        """Lines 12-19: assemble the next prompt; promote it to L2, or pre-prefill it on an idle worker."""
        meta = call.app_metadata
        if meta is None or not ann.prompt_composition:
            return []
        next_agent = ann.next_agents[0].agent_id if ann.next_agents else ""
        tokens = view.assemble(call.tenant, meta.workflow_id, ann.prompt_composition, next_agent)
        hashes = prompt_hashes(tokens or ())
        if not tokens or not hashes:
            return []
        model = self.models.get((call.tenant, meta.workflow_type_id, next_agent), call.model)
        residency = view.residency(call.tenant, model, hashes)
        l2_blocks = {r.worker_id: r.l2_blocks for r in residency}
        target = likely_worker(view.workers(model), l2_blocks)
        if target is None or l2_blocks.get(target.worker_id, 0) >= len(hashes):
            return []
        if most_resident(residency, 3) > 0:
            kind: DirectiveKind = "promote"
            reason = "pythia: stage the next prompt in L2"
        elif target.idle:
            kind, reason = "pre_prefill", "pythia: pre-prefill on an idle worker"
        else:
            return []  # a busy worker's GPU is left to live requests
        return [
            CacheDirective(
                kind,
                target.worker_id,
                call.tenant,
                workflow_id=meta.workflow_id,
                agent_id=next_agent,
                token_ids=tuple(tokens),
                target_tier=2 if kind == "promote" else None,
                speculative=True,
                reason=reason,
            )
        ]

    def _end(self, call: CompletedCall, view: CacheView) -> list[CacheDirective]:
        tenant, workflow_id = call.tenant, call.app_metadata.workflow_id if call.app_metadata else ""
        unshared = [
            (w, b.block_hash)
            for w, _, b in view.blocks(tenant, workflow_id)
            if view.references(tenant, b.block_hash) == 0
        ]
        self.forget(tenant, workflow_id)
        return by_worker(
            "drop", unshared, tenant=tenant, workflow_id=workflow_id, reason="pythia: workflow ended"
        )

    def _retain_ttl(self, ann: SysAnnotations) -> float:
        if ann.expected_remaining_time_s is None:
            return self.default_retain_s
        return min(self.max_retain_s, max(self.min_retain_s, ann.expected_remaining_time_s))


__all__ = ["PythiaCache", "likely_worker"]
