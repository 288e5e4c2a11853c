"""The cache manager's pure core: index + workflow history + worker loads, and the policy over them.

    KV event batch   -> on_kv_batch      -> cluster index (ClusterIndex)
    worker heartbeat -> on_worker_load   -> loads
    completed call   -> on_completion    -> history, policy.on_completion -> directives
    clock tick       -> tick             -> expiry, policy.on_tick -> directives
    placement        -> speculate        -> speculative index entries

``CacheManagerCore`` is the ``CacheView`` its policy reads.  It does no I/O, reads no clock (every
call that needs the time takes ``now``) and never raises on bad input: a batch or record that breaks
its contract is counted (``note_malformed``) and dropped.  The directives it returns are the
adapter's to deliver; the most recent ``recent_directives`` stay readable through ``plan``.
"""

from __future__ import annotations

import math
from collections import Counter, deque
from collections.abc import Sequence

from clairvoyant.cachemgr.core.assembly import assemble as fill_template
from clairvoyant.cachemgr.core.history import WorkflowHistory, WorkflowKey, call_chains
from clairvoyant.cachemgr.core.index import ClusterIndex, batch_problem
from clairvoyant.cachemgr.core.speculation import SpeculationBook
from clairvoyant.cachemgr.core.values import (
    MAX_HASH,
    MAX_TOKEN,
    CoreConfig,
    CoreStats,
    TierCount,
    call_problem,
    out_of_range,
)
from clairvoyant.core.blockhash import BLOCK_TOKENS, chain_hashes
from clairvoyant.core.kv_events import KvBatch
from clairvoyant.core.templates import parse
from clairvoyant.policy.cache import (
    BlockUse,
    CacheDirective,
    CachePolicy,
    CacheView,
    CompletedCall,
    Residency,
    Tier,
    WorkerLoad,
)


class CacheManagerCore:
    """See the module docstring.  Implements ``CacheView``."""

    def __init__(self, policy: CachePolicy, config: CoreConfig | None = None, policy_name: str = "") -> None:
        self.policy = policy
        self.config = config or CoreConfig()
        self.policy_name = policy_name
        self.index = ClusterIndex(
            speculative_ttl_s=self.config.speculative_ttl_s, max_entries=self.config.max_index_entries
        )
        self.history = WorkflowHistory(
            max_bytes=self.config.history_max_bytes, idle_ttl_s=self.config.workflow_idle_ttl_s
        )
        self.speculation = SpeculationBook(max_age_s=self.config.workflow_idle_ttl_s)
        self._loads: dict[str, WorkerLoad] = {}
        self._recent: deque[CacheDirective] = deque(maxlen=max(self.config.recent_directives, 0))
        self._by_kind: Counter[str] = Counter()
        self._malformed: Counter[str] = Counter()
        self._completions = 0
        self._events = 0
        self._prompt_tokens = 0  # of completed calls, for the tiers' misses
        self._clock = 0.0  # the latest ``now`` an input carried (CacheView queries take no time)

    # ---- inputs ---------------------------------------------------------------------------------

    def on_kv_batch(self, batch: KvBatch, now: float) -> bool:
        """Apply a worker's batch; True when that worker's entries are stale after it (a gap in
        its sequence: the caller should ask it for a snapshot of its tiers)."""
        self._saw(now)
        if batch_problem(batch):
            self.note_malformed("kv_batch")
            return False
        applied = self.index.apply(batch, now)
        self._events += len(batch.events)
        return applied.stale

    def on_worker_load(self, load: WorkerLoad, now: float) -> None:
        self._saw(now)
        if not load.worker_id or not load.model:
            self.note_malformed("worker_load")
            return
        self._loads[load.worker_id] = load

    def on_worker_gone(self, worker_id: str) -> None:
        self._loads.pop(worker_id, None)
        self.index.remove_worker(worker_id)

    def on_completion(self, call: CompletedCall, now: float) -> list[CacheDirective]:
        """Record ``call`` in its workflow's history, ask the policy, and on ``workflow_end`` let
        the workflow go (after the policy saw the call)."""
        self._saw(now)
        if call_problem(call):
            self.note_malformed("completion")
            return []
        self._completions += 1
        self._prompt_tokens += call.prompt_tokens or len(call.prompt_token_ids)
        prompt_hashes, response_hashes = call_chains(call)
        self.speculation.observe(call.tenant, prompt_hashes, call.prompt_tokens)
        self.index.touch(call.tenant, prompt_hashes, now, hits=call.cached_tokens // BLOCK_TOKENS)
        self.index.touch(call.tenant, response_hashes, now)
        evicted = self.history.record(call, now).evicted
        directives = self._issue(self.policy.on_completion(call, self, now), now)
        self._gone(evicted)  # after the policy ran: it may have kept state for the call's own workflow
        meta = call.app_metadata
        if meta is not None and meta.workflow_end and meta.workflow_id:
            self.history.end(call.tenant, meta.workflow_id)
            self._gone(((call.tenant, meta.workflow_id),))
        return directives

    def tick(self, now: float) -> list[CacheDirective]:
        """Expire speculative index entries, idle workflows and old speculations; then the policy's turn."""
        self._saw(now)
        self.index.expire(now)
        self._gone(tuple(self.history.expire(now)))
        self.speculation.expire(now)
        return self._issue(self.policy.on_tick(self, now), now)

    def speculate(self, worker_id: str, tenant: str, block_hashes: Sequence[int], now: float) -> None:
        """A request with this prompt chain was placed on ``worker_id``: count its blocks as held
        there (L1) until the worker's STORED confirms them or ``speculative_ttl_s`` passes."""
        self._saw(now)
        if out_of_range(block_hashes, MAX_HASH):
            self.note_malformed("speculate")
            return
        self.index.speculate(worker_id, tenant, block_hashes, now)

    def note_malformed(self, what: str) -> None:
        """Count one input that could not be decoded or broke its contract (``what``: its kind)."""
        self._malformed[what] += 1

    # ---- outputs --------------------------------------------------------------------------------

    def plan(self, worker_id: str = "") -> list[CacheDirective]:
        """The most recent directives issued (at most ``recent_directives``), oldest first, for
        ``worker_id`` or ("") every worker."""
        return [d for d in self._recent if not worker_id or d.worker_id == worker_id]

    def stats(self) -> CoreStats:
        totals = self.speculation.totals()
        return CoreStats(
            policy=self.policy_name,
            indexed_blocks=self.index.kv.distinct_blocks,
            directives_issued=sum(self._by_kind.values()),
            completions_seen=self._completions,
            events_seen=self._events,
            malformed_dropped=sum(self._malformed.values()),
            live_workflows=len(self.history),
            history_bytes=self.history.nbytes + self.history.static_nbytes,
            workers=len(set(self._loads) | set(self.index.kv.workers())),
            tiers=self._tier_counts(),
            speculative_tokens=totals.issued_tokens,
            speculative_used_tokens=totals.used_tokens,
            speculative_wasted_tokens=totals.wasted_tokens,
            directives_by_kind=tuple(sorted(self._by_kind.items())),
        )

    @property
    def malformed(self) -> dict[str, int]:
        """Malformed inputs dropped, by kind (kv_batch, completion, template, directive, ...)."""
        return dict(self._malformed)

    @property
    def view(self) -> CacheView:
        """The ``CacheView`` the policy reads: this core (mypy checks that it is one)."""
        return self

    # ---- CacheView ------------------------------------------------------------------------------

    def workers(self, model: str) -> Sequence[WorkerLoad]:
        """Workers heard from by heartbeat or by KV events (a bare ``WorkerLoad`` for the latter),
        by worker id."""
        found = {wid: load for wid, load in self._loads.items() if not model or load.model == model}
        for worker_id in self.index.kv.workers():
            worker_model = self.index.kv.model_of(worker_id) or ""
            if worker_id not in self._loads and (not model or worker_model == model):
                found[worker_id] = WorkerLoad(worker_id, worker_model)
        return [found[wid] for wid in sorted(found)]

    def residency(self, tenant: str, model: str, block_hashes: Sequence[int]) -> Sequence[Residency]:
        worker_ids = [load.worker_id for load in self.workers(model)]
        return self.index.residency(tenant, worker_ids, block_hashes, self._now())

    def blocks(self, tenant: str, workflow_id: str) -> Sequence[tuple[str, Tier, BlockUse]]:
        """``CacheView.blocks``; ``BlockUse.tokens`` is the prompt + output length of the request
        that computed the block when the history holds it (else 0)."""
        sizes = {c.request_id: len(c.prompt) + len(c.output) for c in self.history.calls(tenant, workflow_id)}
        return [
            (worker_id, tier, use._replace(tokens=sizes.get(use.request_id, 0)))
            for worker_id, tier, use in self.index.workflow_blocks(tenant, workflow_id)
        ]

    def references(self, tenant: str, block_hash: int) -> int:
        """Live workflows other than the block's own (its lineage's) holding the block: of
        ``tenant``, or of every tenant when ``cross_tenant_sharing`` is set."""
        sharing = self.config.cross_tenant_sharing
        count = self.history.references(tenant, block_hash, all_tenants=sharing)
        own = self.index.lineage_of(tenant, block_hash).workflow_id
        if own and self.history.holds(tenant, own, block_hash):
            count -= 1
        return max(count, 0)

    def assemble(
        self, tenant: str, workflow_id: str, template: str, agent_id: str = ""
    ) -> tuple[int, ...] | None:
        """``CacheView.assemble``.  ``agent_id`` names the agent whose prompt the template is (its
        ``${static:...}`` source); without it a static source is missing.  A template that does not
        parse is counted as malformed and answers None."""
        try:
            parsed = parse(template)
        except ValueError:
            self.note_malformed("template")
            return None
        calls = self.history.calls(tenant, workflow_id)
        workflow_type = self.history.workflow_type(tenant, workflow_id)

        def static() -> tuple[int, ...] | None:
            if workflow_type is None or not agent_id:
                return None
            return self.history.static_prefix(tenant, workflow_type, agent_id)

        if workflow_type is None and parsed.segments:
            return None
        return fill_template(parsed, calls, static)

    def history_agents(self, tenant: str, workflow_id: str) -> Sequence[str]:
        return [call.agent_id for call in self.history.calls(tenant, workflow_id)]

    def chains(self, tenant: str, workflow_id: str, agent_id: str) -> Sequence[tuple[int, ...]]:
        return [
            (*call.prompt_hashes, *call.response_hashes)
            for call in reversed(self.history.calls(tenant, workflow_id))
            if call.agent_id == agent_id
        ]

    def check_integrity(self) -> None:
        self.index.check_integrity()
        self.history.check_integrity()
        self.speculation.check_integrity()

    # ---- internals ------------------------------------------------------------------------------

    def _now(self) -> float:
        """The latest time the core was told (speculative entries are judged against it)."""
        return self._clock

    def _saw(self, now: float) -> None:
        if math.isfinite(now):
            self._clock = max(self._clock, now)

    def _issue(self, directives: list[CacheDirective], now: float) -> list[CacheDirective]:
        """Keep and count the policy's directives; one naming impossible token ids or hashes is
        dropped and counted as malformed (no worker could apply it)."""
        issued = []
        for directive in directives:
            if out_of_range(directive.token_ids, MAX_TOKEN) or out_of_range(directive.block_hashes, MAX_HASH):
                self.note_malformed("directive")
                continue
            issued.append(directive)
            self._recent.append(directive)
            self._by_kind[directive.kind] += 1
            self.speculation.issue(directive, now)
            if directive.kind == "pre_prefill":  # its blocks will be on that worker's device shortly
                self.index.speculate(directive.worker_id, directive.tenant, chain_hashes(directive.token_ids), now)
        return issued

    def _gone(self, workflows: Sequence[WorkflowKey]) -> None:
        for tenant, workflow_id in workflows:
            self.policy.forget(tenant, workflow_id)
            self.speculation.close_workflow(tenant, workflow_id)

    def _tier_counts(self) -> tuple[TierCount, ...]:
        loads = self._loads.values()
        hits = [sum(load.hit_tokens[i] for load in loads) for i in range(3)]
        l3_used = self.index.kv.shared_blocks
        misses, served = [], 0
        for tier_hits in hits:
            served += tier_hits
            misses.append(max(self._prompt_tokens - served, 0))
        return (
            TierCount(
                1,
                sum(load.l1_used for load in loads),
                sum(load.l1_total for load in loads),
                hits[0],
                misses[0],
            ),
            TierCount(
                2,
                sum(load.l2_used for load in loads),
                sum(load.l2_total for load in loads),
                hits[1],
                misses[1],
            ),
            TierCount(3, l3_used, 0, hits[2], misses[2]),
        )


__all__ = ["CacheManagerCore", "call_problem"]  # call_problem: its home is values.py
