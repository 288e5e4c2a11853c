"""The cache manager in virtual time: one ``CacheManagerCore`` for the run's replicas, told what a
live one hears on the bus, each after a delay, and its directives applied on the replicas' engines.

    replica step ──KV events, load──(+kv_events_s)──> core.on_kv_batch, core.on_worker_load
    call ends   ──CompletedCall────(+completion_s)──> core.on_completion ──┐
    every tick_s                                      core.tick ──────────┤ directives
    engine.check_directive, apply_directive <──(+directive_s)─────────────┘ (between steps)

It is a ``Ticker`` (simulator.py): a delivery happens after every event due at or before its time,
and a run ends at its last event, so deliveries and ticks past it never prolong it.  A policy that
issues no directive (``lru``) leaves every record as without a cache manager.
"""

from __future__ import annotations

import heapq
import itertools
from collections import Counter
from collections.abc import Callable, Mapping, Sequence
from functools import partial
from typing import TYPE_CHECKING, NamedTuple

from clairvoyant.bench.records import CacheManagerTotals, CallResult
from clairvoyant.bench.sim.cache_results import SpeculationLedger
from clairvoyant.bench.sim.events import EventQueue
from clairvoyant.bench.sim.replicas import Replica, ReplicaStepper
from clairvoyant.core.annotations import SysAnnotations
from clairvoyant.core.app_metadata import AppMetadata
from clairvoyant.core.blockhash import chain_hashes, sequence_hashes
from clairvoyant.core.kv_events import KvBatch, KvBlockEvent, KvEventKind, KvTier
from clairvoyant.policy.cache import CACHE_POLICIES, CacheDirective, CachePolicy, CompletedCall, WorkerLoad
from clairvoyant.worker.core.radix_cache import BlockTag
from clairvoyant.worker.core.tiers import Directive, DirectiveError
from clairvoyant.worker.core.types import KvEvent
from clairvoyant.workloads.program import WorkflowProgram

if TYPE_CHECKING:
    from clairvoyant.cachemgr.core import CoreConfig

# A message on its way to the core or a worker: (due, order of sending, is it a directive?, delivery(due)).
Delivery = tuple[float, int, bool, Callable[[float], object]]
SPECULATIVE_KINDS = ("promote", "pre_prefill")


class CacheManagerDelays(NamedTuple):
    """How late the cache manager hears and acts, in virtual seconds (a NATS hop and a decode
    each, on one cluster network)."""

    kv_events_s: float = 0.005  # a step's KV events and load, after the step ends
    completion_s: float = 0.010  # a call's completion record, after it ends (gateway, then NATS)
    directive_s: float = 0.005  # a directive, from its issue to the worker's engine loop
    tick_s: float = 1.0  # between two ``core.tick`` calls


DEFAULT_DELAYS = CacheManagerDelays()


def block_event(event: KvEvent) -> KvBlockEvent:
    """An engine's KV event as the cache manager's index takes it (as the worker's publisher and
    ``core.wire`` would carry it)."""
    tag = event.tag if isinstance(event.tag, BlockTag) else None
    lineage = tag.lineage if tag is not None else None
    return KvBlockEvent(
        kind=KvEventKind(event.kind), tier=KvTier(event.tier), tenant=event.namespace or "",
        block_hashes=event.block_hashes,
        workflow_id=(lineage.workflow_id or "") if lineage is not None else "",
        agent_id=(lineage.agent_id or "") if lineage is not None else "",
        request_id=(lineage.request_id or "") if lineage is not None else "",
        response=tag is not None and tag.source == "response", parent_hash=event.parent_hash,
    )  # fmt: skip


def engine_directive(directive: CacheDirective) -> Directive:
    """The engine's ``Directive`` for a cache manager's one (the mapping ``worker/directives.py``
    makes from the wire): tenant "" is "default", empty lineage fields match anything."""
    return Directive(
        kind=directive.kind, namespace=directive.tenant or "default",
        workflow_id=directive.workflow_id or None, agent_id=directive.agent_id or None,
        request_id=directive.request_id or None, block_hashes=directive.block_hashes,
        ttl_s=directive.ttl_s, target_tier=directive.target_tier, token_ids=directive.token_ids,
    )  # fmt: skip


def worker_load(replica: Replica) -> WorkerLoad:
    """``replica`` as its stats heartbeat describes it."""
    stats = replica.engine.stats()
    return WorkerLoad(
        worker_id=replica.worker_id, model=replica.model, running=stats.running, queued=stats.waiting,
        max_batch=stats.max_num_seqs, l1_used=stats.kv_blocks_used, l1_total=stats.kv_blocks_total,
        l2_used=stats.l2_blocks_used, l2_total=stats.l2_blocks_total, has_l3=bool(stats.l3_backend),
        hit_tokens=stats.hit_tokens,
    )  # fmt: skip


def completed_call(
    record: CallResult,
    program: WorkflowProgram,
    *,
    prompt_ids: Sequence[int],
    output_ids: Sequence[int],
    annotations: SysAnnotations | None,
    block_size: int,
    tenant: str,
    last: bool,
) -> CompletedCall:
    """The completion record of a finished (or refused: not ``ok``) call, as the gateway
    publishes it: its app metadata (upstream agent and the tool before it from its first parent),
    the annotations it was served with, its token ids and their block hash chains."""
    assert record.end_time is not None
    call = program.call(record.call_id)
    parent = program.call(call.dependencies[0]) if call.dependencies else None
    meta = AppMetadata(
        program.workflow_type, program.workflow_id, call.agent_id,
        upstream_agent_id=parent.agent_id if parent is not None else None, parent_request_ids=call.dependencies,
        tool=parent.tool if parent is not None else None, workflow_end=True if last else None,
    )  # fmt: skip
    prompt_hashes, response_hashes = sequence_hashes(prompt_ids, output_ids, block_size)
    return CompletedCall(
        request_id=record.call_id, tenant=tenant, model=record.model, worker_id=record.worker_id,
        start=record.ready_time, end=record.end_time, prompt_tokens=len(prompt_ids),
        output_tokens=len(output_ids), cached_tokens=record.cached_tokens, ok=not record.rejected,
        app_metadata=meta, annotations=annotations, prompt_block_hashes=tuple(prompt_hashes),
        response_block_hashes=tuple(response_hashes), prompt_token_ids=tuple(prompt_ids),
        output_token_ids=tuple(output_ids),
    )  # fmt: skip


class SimCacheManager:
    """The run's cache manager: a ``Ticker`` that delivers what the core hears and what it directs.

    ``policy``: a registered cache policy's name, or a policy object (named by its class).

    The simulator calls ``joined``/``left`` as replicas come and go, ``stepped`` after each step
    (and decode run) a replica delivers, and ``completed`` when a call ends.  A directive whose
    worker has left, or that the engine refuses (``DirectiveError``), is counted, not fatal."""

    def __init__(
        self,
        policy: str | CachePolicy,
        replicas: Mapping[str, Replica],
        events: EventQueue,
        stepper: ReplicaStepper,
        *,
        delays: CacheManagerDelays = DEFAULT_DELAYS,
        config: CoreConfig | None = None,
    ) -> None:
        if delays.tick_s <= 0 or min(delays) < 0:
            raise ValueError(f"cache manager delays must be >= 0 and the tick > 0, got {delays}")
        from clairvoyant.cachemgr.core import CacheManagerCore  # only runs with a cache policy need it

        if isinstance(policy, str):
            self.policy, policy = policy, CACHE_POLICIES.create(policy)
        else:
            self.policy = type(policy).__name__
        self.core = CacheManagerCore(policy, config, policy_name=self.policy)
        self.delays = delays
        self.replicas = replicas
        self.events = events
        self.stepper = stepper
        self.ledger = SpeculationLedger()
        self.issued: Counter[str] = Counter()
        self.applied: Counter[str] = Counter()
        self.refused: Counter[str] = Counter()
        self.applied_at: list[tuple[float, CacheDirective]] = []  # in order of application
        self._pending: list[Delivery] = []
        self._order = itertools.count()
        self._batches: dict[str, int] = {}  # worker -> sequence of its latest KV event batch
        self._next_core_tick = delays.tick_s

    # ---- what the simulator tells it -----------------------------------------------------------

    def joined(self, replica: Replica) -> None:
        """A replica starts: its first batch says its L1 and L2 are empty (the publisher's CLEARED)."""
        cleared = [KvEvent("cleared", 1, None, ()), KvEvent("cleared", 2, None, ())]
        self._batches[replica.worker_id] = 0
        self._publish(replica, cleared)

    def left(self, worker_id: str) -> None:
        self._batches.pop(worker_id, None)
        self._after(self.delays.kv_events_s, lambda now: self.core.on_worker_gone(worker_id))

    def stepped(self, replica: Replica) -> None:
        """A step (or a decode run) of ``replica`` was delivered: its KV events and load go out."""
        self._publish(replica, replica.engine.drain_kv_events())

    def completed(self, call: CompletedCall) -> None:
        """A call ended now: the engine-side speculation accounting, then its record goes out."""
        replica = self.replicas.get(call.worker_id)
        if replica is not None and call.ok:
            self.ledger.served(call, replica.engine.config.block_size)
        self._after(self.delays.completion_s, lambda now: self._issue(self.core.on_completion(call, now)))

    # ---- the Ticker ----------------------------------------------------------------------------

    @property
    def next_tick(self) -> float:
        due = self._pending[0][0] if self._pending else float("inf")
        return min(due, self._next_core_tick)

    def tick(self) -> None:
        now = self.events.now
        while self._pending and self._pending[0][0] <= now:
            due, _, _, delivery = heapq.heappop(self._pending)
            delivery(due)
        if self._next_core_tick <= now:
            self._next_core_tick += self.delays.tick_s
            self._issue(self.core.tick(now))

    def finish(self) -> None:
        """The run ended: the messages still on their way reach the core (at their due times), so
        it has seen every completion; directives still on their way act on nothing."""
        while self._pending:
            due, _, directive, delivery = heapq.heappop(self._pending)
            if not directive:
                delivery(due)

    def totals(self) -> CacheManagerTotals:
        stats = self.core.stats()
        return CacheManagerTotals(
            policy=self.policy, directives_issued=dict(sorted(self.issued.items())),
            directives_applied=dict(sorted(self.applied.items())),
            directives_refused=dict(sorted(self.refused.items())), speculative_tokens=self.ledger.tokens,
            speculative_tokens_used=self.ledger.used, completions_seen=stats.completions_seen,
            events_seen=stats.events_seen, indexed_blocks=stats.indexed_blocks,
            core_speculative_tokens=stats.speculative_tokens,
            core_wasted_speculative_tokens=stats.speculative_wasted_tokens,
        )  # fmt: skip

    # ---- deliveries ----------------------------------------------------------------------------

    def _after(self, delay: float, delivery: Callable[[float], object], *, directive: bool = False) -> None:
        """``delivery(due)`` at ``due`` = now + ``delay``."""
        heapq.heappush(self._pending, (self.events.now + delay, next(self._order), directive, delivery))

    def _publish(self, replica: Replica, events: list[KvEvent]) -> None:
        worker_id = replica.worker_id
        if worker_id not in self._batches:
            return  # it left the run
        load = worker_load(replica)
        if events:
            self._batches[worker_id] += 1
            batch = KvBatch(
                worker_id=worker_id, model=replica.model, block_size=replica.engine.config.block_size,
                sequence=self._batches[worker_id], events=tuple(block_event(e) for e in events),
            )  # fmt: skip
            self._after(self.delays.kv_events_s, lambda now: self.core.on_kv_batch(batch, now))
        self._after(self.delays.kv_events_s, lambda now: self.core.on_worker_load(load, now))

    def _issue(self, directives: list[CacheDirective]) -> None:
        for directive in directives:
            self.issued[directive.kind] += 1
            self._after(self.delays.directive_s, partial(self._deliver, directive), directive=True)

    def _deliver(self, directive: CacheDirective, now: float) -> None:
        """The directive reaches its worker: checked now, applied between two of its steps."""
        replica = self.replicas.get(directive.worker_id)
        if replica is None:
            self.refused[directive.kind] += 1
            return
        engine_form = engine_directive(directive)
        try:
            replica.engine.check_directive(engine_form)
        except DirectiveError:
            self.refused[directive.kind] += 1
            return
        self.stepper.between_steps(replica, partial(self._apply, replica, directive, engine_form))

    def _apply(self, replica: Replica, directive: CacheDirective, engine_form: Directive) -> None:
        try:
            replica.engine.apply_directive(engine_form)
        except DirectiveError:
            self.refused[directive.kind] += 1
            return
        self.applied[directive.kind] += 1
        self.applied_at.append((self.events.now, directive))
        if directive.speculative and directive.kind in SPECULATIVE_KINDS:
            block_size = replica.engine.config.block_size
            hashes = directive.block_hashes or tuple(chain_hashes(directive.token_ids, 0, block_size))
            self.ledger.placed(replica.worker_id, engine_form.namespace or "", hashes, block_size)
        self.stepped(replica)  # what the directive changed goes out now, as after a step
