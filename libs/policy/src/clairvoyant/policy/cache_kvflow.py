"""``kvflow``: KVFlow's workflow-aware eviction and prefetch (arXiv 2507.07400; its code's
``AgentManager``), over the agent step graph the profiler projects.

* **Steps-to-execution**: the annotation's ``projection`` gives the expected calls per agent in each
  coming step (1 = the next); an agent's steps-to-execution is the first step where it is expected
  (expected calls > 0).  Each completion of a workflow replaces its table (KVFlow's update version).
* **Hold priority** of an agent: ``min(evict_pri_level + 1, steps_to_execution)``; an agent outside
  the table gets ``evict_pri_level + 1`` and a block without a lineage agent
  ``evict_pri_level + 2`` (the code's unknown and invalid agents).  A block's priority is the
  minimum over the agents that used it (shared prefixes keep the nearest agent's priority), so
  its level is in 1 .. ``evict_pri_level + 2``; the highest level is evicted first, then LRU.
* **Prefetch**: each agent whose steps-to-execution is at most ``load_ahead_step`` has its last
  call's prefix (the code's ``agent_to_last_nodes``) loaded back toward the GPU: a promote to L1 on
  the worker holding the most of it below L1, speculative.  Loading to L1 is KVFlow's own choice
  (its prefetch is CPU -> GPU, overlapped).

Defaults are the example config's: ``load_ahead_step = 2``, ``evict_pri_level = 4`` (the code passes
``evict_pri_level`` as ``hold_step`` and ``load_ahead_step`` as ``prefetch_step``).  Choices of ours:
the agents that used a block are remembered for the prompt and response chains of completed calls
(at most ``max_blocks`` hashes, oldest forgotten, and the latest ``max_users_per_block`` = 16
(workflow, agent) pairs per hash); an agent's last prompt is kept for prefetch only
up to ``max_prefix_tokens``; nothing is prefetched for the agent of the call that just finished
(its blocks are where that call left them).
"""

from __future__ import annotations

from clairvoyant.policy.cache import (
    CACHE_POLICIES,
    BlockUse,
    CacheDirective,
    CacheView,
    CompletedCall,
    lineage_key,
)
from clairvoyant.policy.cache_paths import BoundedMap, prompt_hashes

BAND = 1e12  # rank distance between priority levels: beyond any clock value


@CACHE_POLICIES.register("kvflow")
class KvFlowCache:
    """Steps-to-execution eviction priority and load-ahead prefetch."""

    def __init__(
        self,
        *,
        load_ahead_step: int = 2,
        evict_pri_level: int = 4,
        max_workflows: int = 4096,
        max_blocks: int = 1 << 16,
        max_prefix_tokens: int = 1 << 17,
        max_users_per_block: int = 16,
    ) -> None:
        self.load_ahead_step = load_ahead_step
        self.evict_pri_level = evict_pri_level
        self.max_prefix_tokens = max_prefix_tokens
        self.max_users_per_block = max_users_per_block
        self.steps: BoundedMap[tuple[str, str], dict[str, int]] = BoundedMap(max_workflows)
        # (tenant, workflow, agent) -> its last call's prompt (model, token ids)
        self.last_prompt: BoundedMap[tuple[str, str, str], tuple[str, tuple[int, ...]]] = BoundedMap(
            max_workflows
        )
        # (tenant, hash) -> the latest (workflow, agent) pairs whose calls used it, oldest first
        self.users: BoundedMap[tuple[str, int], tuple[tuple[str, str], ...]] = BoundedMap(max_blocks)

    def hold_priority(self, tenant: str, workflow_id: str, agent_id: str) -> int:
        """The code's ``get_agent_hold_priority``: 1 = due next step .. ``evict_pri_level + 2``."""
        if not agent_id:
            return self.evict_pri_level + 2
        steps = self.steps.get((tenant, workflow_id), {}).get(agent_id)
        return self.evict_pri_level + 1 if steps is None else min(self.evict_pri_level + 1, steps)

    def block_priority(self, block: BlockUse) -> int:
        users = (*self.users.get((block.tenant, block.block_hash), ()), (block.workflow_id, block.agent_id))
        return min(self.hold_priority(block.tenant, workflow, agent) for workflow, agent in users)

    # ---- the protocol ------------------------------------------------------------------------
    def on_completion(self, call: CompletedCall, view: CacheView, now: float) -> list[CacheDirective]:
        key, meta, ann = lineage_key(call), call.app_metadata, call.annotations
        if key is None or meta is None:
            return []
        tenant, workflow_id = key
        for block_hash in call.prompt_block_hashes + call.response_block_hashes:
            user = (workflow_id, meta.agent_id)
            used = tuple(u for u in self.users.get((tenant, block_hash), ()) if u != user)
            self.users[(tenant, block_hash)] = (*used, user)[-self.max_users_per_block :]
        if call.prompt_token_ids and len(call.prompt_token_ids) <= self.max_prefix_tokens:
            self.last_prompt[(tenant, workflow_id, meta.agent_id)] = (call.model, call.prompt_token_ids)
        if meta.workflow_end:
            self.forget(tenant, workflow_id)
            return []
        if ann is None or not ann.projection:
            return []
        steps: dict[str, int] = {}
        for term in sorted(ann.projection, key=lambda t: (t.step, t.agent_id)):
            if term.expected_calls > 0 and term.step >= 1:
                steps.setdefault(term.agent_id, term.step)
        self.steps[key] = steps
        due = sorted(a for a, s in steps.items() if s <= self.load_ahead_step and a != meta.agent_id)
        return [d for agent in due for d in self._prefetch(tenant, workflow_id, agent, view)]

    def on_tick(self, view: CacheView, now: float) -> list[CacheDirective]:
        return []

    def eviction_rank(self, block: BlockUse, now: float) -> float:
        return block.last_access - BAND * self.block_priority(block)

    def forget(self, tenant: str, workflow_id: str) -> None:
        self.steps.pop((tenant, workflow_id), None)
        for key in [k for k in self.last_prompt if k[0] == tenant and k[1] == workflow_id]:
            del self.last_prompt[key]

    def _prefetch(self, tenant: str, workflow_id: str, agent: str, view: CacheView) -> list[CacheDirective]:
        last = self.last_prompt.get((tenant, workflow_id, agent))
        if last is None:
            return []
        model, tokens = last
        hashes = prompt_hashes(tokens)
        if not hashes:
            return []
        residency = view.residency(tenant, model, hashes)
        # the worker with the most of it below L1 (L2, else shared L3), then the lowest id
        best = min(
            residency,
            key=lambda r: (-(r.l2_blocks - r.l1_blocks), -(r.l3_blocks - r.l1_blocks), r.worker_id),
            default=None,
        )
        if (
            best is None
            or best.l1_blocks >= len(hashes)
            or max(best.l2_blocks, best.l3_blocks) <= best.l1_blocks
        ):
            return []
        return [
            CacheDirective(
                "promote",
                best.worker_id,
                tenant,
                workflow_id=workflow_id,
                agent_id=agent,
                token_ids=tokens,
                target_tier=1,
                speculative=True,
                reason="kvflow: agent due within load_ahead_step",
            )
        ]


__all__ = ["KvFlowCache"]
