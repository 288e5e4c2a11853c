"""The replay's cache state, and the ``CacheView`` a policy reads it through during a replay.

``ReplayState`` holds each cache's blocks (a ``BlockUse`` each: the lineage of the call that
cached it, its last access and hits) and what the trace has shown so far: which live workflows
referenced which blocks, and each workflow's agents.  ``ReplayView`` answers a policy's queries from
it, as the cache manager's index would from the workers' KV events, with these differences:

- one tier: every block is in L1, and a worker's L1 is the replay's capacity (no L2, no L3);
- in the cluster scope every worker shares the one cache: each reports its blocks, and ``blocks``
  names the cache (``CLUSTER``) as their worker; a directive may name either;
- ``assemble`` answers None (the replay keeps no token history and ignores pre-prefills anyway);
- a tenant "" is the tenant "default", as in the workers' namespaces.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field

from clairvoyant.bench.access_trace import CLUSTER, AccessTrace
from clairvoyant.cachemgr.core.history import WorkflowHistory
from clairvoyant.policy.cache import (
    BlockUse,
    CacheDirective,
    CompletedCall,
    Residency,
    Tier,
    WorkerLoad,
    lineage_key,
)


def tenant_of(name: str) -> str:
    return name or "default"


@dataclass
class ReplayCache:
    """One cache: block -> (its use, the order it was cached in)."""

    name: str
    blocks: dict[int, tuple[BlockUse, int]] = field(default_factory=dict)

    def touch(self, block: int, now: float, *, hit: bool) -> None:
        use, order = self.blocks[block]
        self.blocks[block] = (use._replace(last_access=now, hits=use.hits + hit), order)

    def leading(self, tenant: str, block_hashes: Sequence[int]) -> int:
        """How many of ``block_hashes``, from the first, the cache holds for ``tenant``."""
        run = 0
        for block in block_hashes:
            held = self.blocks.get(block)
            if held is None or tenant_of(held[0].tenant) != tenant_of(tenant):
                break
            run += 1
        return run


class ReplayState:
    """The caches of one replay and what the trace has shown so far (module docstring)."""

    def __init__(self, trace: AccessTrace, capacity: int) -> None:
        self.capacity = capacity
        self.caches: dict[str, ReplayCache] = {}
        self.cache_of: dict[str, str] = {}  # worker (or cache) id -> cache
        self.models: dict[str, str] = {}  # worker -> model
        for call in trace.calls:
            self.cache_of[call.worker_id] = call.worker_id if trace.scope == "worker" else CLUSTER
            self.models.setdefault(call.worker_id, call.model)
        self.cache_of.update({cache: cache for cache in set(self.cache_of.values())})
        self._cached = 0  # blocks cached so far: each one's order
        self._by_workflow: dict[tuple[str, str], dict[tuple[str, int], None]] = {}  # ordered sets
        # References as the live core counts them (``CacheManagerCore.references``): the live
        # workflows' chains and the agents' static prefixes, from the core's own history.
        self.history = WorkflowHistory(max_bytes=1 << 62, idle_ttl_s=math.inf)
        self.agents: dict[tuple[str, str], list[str]] = {}  # each workflow's finished calls' agents
        self.chains: dict[
            tuple[str, str, str], list[tuple[int, ...]]
        ] = {}  # (tenant, workflow, agent) -> oldest first

    def cache(self, name: str) -> ReplayCache:
        found = self.caches.get(name)
        if found is None:
            found = self.caches[name] = ReplayCache(name)
        return found

    def lineage(self, block: int, call: CompletedCall, now: float, *, response: bool) -> BlockUse:
        """``block`` as ``call`` caches it now."""
        meta = call.app_metadata
        return BlockUse(
            block, now, 0, tenant=call.tenant, workflow_id=meta.workflow_id if meta else "",
            agent_id=meta.agent_id if meta else "", request_id=call.request_id,
            tokens=call.prompt_tokens + call.output_tokens, response=response,
        )  # fmt: skip

    def insert(self, cache: ReplayCache, use: BlockUse) -> None:
        self._cached += 1
        cache.blocks[use.block_hash] = (use, self._cached)
        if use.workflow_id:
            key = (tenant_of(use.tenant), use.workflow_id)
            self._by_workflow.setdefault(key, {})[(cache.name, use.block_hash)] = None

    def evict(self, cache: ReplayCache, block: int) -> None:
        use, _ = cache.blocks.pop(block)
        if use.workflow_id:
            self._by_workflow.get((tenant_of(use.tenant), use.workflow_id), {}).pop((cache.name, block), None)

    def completed(self, call: CompletedCall) -> None:
        key = lineage_key(call)
        if key is not None and call.app_metadata is not None:
            tenant, agent = tenant_of(key[0]), call.app_metadata.agent_id
            self.agents.setdefault((tenant, key[1]), []).append(agent)
            chain = call.prompt_block_hashes + call.response_block_hashes
            self.chains.setdefault((tenant, key[1], agent), []).append(chain)
            self.history.record(call, call.end)

    def ended(self, key: tuple[str, str]) -> None:
        self.history.end(*key)

    def references(self, tenant: str, block: int, own: str) -> int:
        """Live workflows other than ``own`` holding the block, plus static prefixes holding it."""
        count = self.history.references(tenant, block)
        if own and self.history.holds(tenant, own, block):
            count -= 1
        return max(count, 0)

    def workflow_blocks(self, tenant: str, workflow_id: str) -> list[tuple[str, BlockUse]]:
        found = self._by_workflow.get((tenant_of(tenant), workflow_id), {})
        return [(cache, self.caches[cache].blocks[block][0]) for cache, block in found]

    def drop(self, directive: CacheDirective) -> int:
        """Remove the blocks ``directive`` names from its worker's cache; how many."""
        name = self.cache_of.get(directive.worker_id)
        if name is None:
            return 0
        cache = self.cache(name)
        tenant = tenant_of(directive.tenant)
        if directive.block_hashes:
            chosen = [b for b in directive.block_hashes
                      if b in cache.blocks and tenant_of(cache.blocks[b][0].tenant) == tenant]  # fmt: skip
        else:
            wanted = [(n, v) for n, v in (("workflow_id", directive.workflow_id), ("agent_id", directive.agent_id),
                                          ("request_id", directive.request_id)) if v]  # fmt: skip
            chosen = [b for b, (use, _) in cache.blocks.items()
                      if tenant_of(use.tenant) == tenant and all(getattr(use, n) == v for n, v in wanted)]  # fmt: skip
        for block in chosen:
            self.evict(cache, block)
        return len(chosen)


class ReplayView:
    """A ``CacheView`` over a ``ReplayState`` (the module docstring lists how it differs)."""

    def __init__(self, state: ReplayState) -> None:
        self.state = state

    def workers(self, model: str) -> Sequence[WorkerLoad]:
        state = self.state
        return [WorkerLoad(worker, state.models[worker], l1_used=len(state.cache(state.cache_of[worker]).blocks),
                           l1_total=state.capacity)
                for worker in sorted(state.models) if not model or state.models[worker] == model]  # fmt: skip

    def residency(self, tenant: str, model: str, block_hashes: Sequence[int]) -> Sequence[Residency]:
        out = []
        for load in self.workers(model):
            run = self.state.cache(self.state.cache_of[load.worker_id]).leading(tenant, block_hashes)
            out.append(Residency(load.worker_id, run, run, run))
        return out

    def blocks(self, tenant: str, workflow_id: str) -> Sequence[tuple[str, Tier, BlockUse]]:
        return [(cache, 1, use) for cache, use in self.state.workflow_blocks(tenant, workflow_id)]

    def references(self, tenant: str, block_hash: int) -> int:
        own = ""
        for cache in self.state.caches.values():
            held = cache.blocks.get(block_hash)
            if held is not None:
                own = held[0].workflow_id
                break
        return self.state.references(tenant, block_hash, own)

    def assemble(
        self, tenant: str, workflow_id: str, template: str, agent_id: str = ""
    ) -> tuple[int, ...] | None:
        return None  # no token history in a replay

    def history_agents(self, tenant: str, workflow_id: str) -> Sequence[str]:
        return list(self.state.agents.get((tenant_of(tenant), workflow_id), ()))

    def chains(self, tenant: str, workflow_id: str, agent_id: str) -> Sequence[tuple[int, ...]]:
        return self.state.chains.get((tenant_of(tenant), workflow_id, agent_id), [])[::-1]
