"""Pythia's lookahead request scheduling (seeds/000, §4.2.2): the ``pythia`` preset.

    submit ──> PythiaPriority (Alg. 3)                 ──> PythiaCapacityRouting (Alg. 2)
               ω1 / E[D_remain] + ω2 × idle risk            capable: Σ u_i ≤ C and Σ α_i ≤ ε
               (idle risk from live per-model queues)       target: max headroom C − Σ u_i,
                                                            ties: the program's last engine
    engine ──> PythiaAgingRule: base priority + aging_rate × seconds on the engine

The worker side of §4.2.2 ("periodical local batch creation", "priority-aware preemption
recovery") is what the worker's local scheduler (worker ``core/scheduler.py``) already does: it
sorts every live sequence by effective priority at *every* step (a window of one iteration), admits
the most urgent ones while their first chunk fits in memory and stops at the first that does not,
and on memory exhaustion preempts the least urgent running sequence and puts it back in the waiting
list (which the next step sorts again).  The only part the preset adds is the aging term, through
an engine rule (``ENGINE_RULE``), because the engines' own ``aging_rate`` defaults to 0.

Unannotated requests: only annotations of confidence LOW or HIGH are trusted.  A request without
annotations, or of confidence NONE or SHADOW (the reactive tier of §5 "Cold starts"), gets
priority 0 (so FCFS among them, plus aging) and is routed with a hard bound: prompt + max_tokens
(the engine never generates more), or the worker's context window when max_tokens is 0, with
α = 0.  In the simulator max_tokens equals the realised output length, so this bound is exact there.

Defaults: the paper names none for ε, ω1, ω2, IDLE_THRESHOLD or the aging rate; it gives only the
99th percentile as the bound's example (α_i = 0.01).  The other values below are ours.
"""

from __future__ import annotations

import math
import weakref
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import NamedTuple

from clairvoyant.core.annotations import Confidence, SysAnnotations
from clairvoyant.policy.admission import KneeAdmission
from clairvoyant.policy.capabilities import Capability
from clairvoyant.policy.presets import PRESETS, Preset
from clairvoyant.policy.process_table import ProcessTable
from clairvoyant.policy.pythia_scaling import (
    PythiaScaling as PythiaScaling,  # registers the pythia scaling policy
)
from clairvoyant.policy.scheduling import (
    PRIORITY_POLICIES,
    ROUTING_POLICIES,
    EngineSequence,
    KvIndexView,
    LocalRule,
    PriorityChanges,
    SchedulerView,
    eligible_workers,
)
from clairvoyant.policy.types import QueuedRequest, WorkerView

TRUSTED = (Confidence.LOW, Confidence.HIGH)
_SLACK = 1e-9  # Σ α_i is a float sum: 50 × 0.01 must pass ε = 0.5


def trusted_annotations(request: QueuedRequest) -> SysAnnotations | None:
    """The request's annotations when the profiler trusts them (LOW or HIGH); None otherwise."""
    annotations = request.annotations
    return annotations if annotations is not None and annotations.confidence in TRUSTED else None


# ---- routing: Alg. 2 --------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class PythiaRoutingConfig:
    epsilon: float = 0.5  # ε: the bound on a node's P_oom (ours; the paper gives no value)
    alpha: float = 0.01  # α_i of a p99 bound: P(L_i > u_i) ≤ 0.01 (the paper's example)
    # Tokens per KV block: C = kv_blocks_total × block_size, with the worker's reported block size;
    # this one only for a worker that reports none (16 is the engines' default).
    block_size: int = 16


class LengthBound(NamedTuple):
    tokens: int  # u_i: prompt + output upper bound, in tokens
    alpha: float  # P(actual length > u_i) ≤ alpha; 0 for a hard bound


class NodeLoad(NamedTuple):
    capacity_tokens: float  # C; inf when the worker reports no KV pool
    reserved_tokens: int  # Σ u_i over the node's active requests
    failure_bound: float  # Σ α_i over the node's active requests
    active: int


def length_bound(request: QueuedRequest, max_model_len: int, alpha: float) -> LengthBound:
    """u_i and α_i.  Trusted: prompt + ceil(p99), α.  Otherwise the hard bound prompt + max_tokens
    (or the context window when max_tokens is unset), α = 0."""
    annotations = trusted_annotations(request)
    if annotations is not None and annotations.predicted_output_len is not None:
        return LengthBound(request.prompt_tokens + math.ceil(annotations.predicted_output_len.p99), alpha)
    if request.max_tokens > 0:
        return LengthBound(request.prompt_tokens + request.max_tokens, 0.0)
    return LengthBound(max(request.prompt_tokens, max_model_len), 0.0)


def capable(load: NodeLoad, bound: LengthBound, epsilon: float) -> bool:
    """Alg. 2 line 6 with the text's reservation: Σ u_i ≤ C and Σ α_i ≤ ε over A ∪ {R}.

    An empty node is always capable: otherwise a request whose bound alone exceeds C (or whose
    α exceeds ε) would wait for ever; the engine then deals with it as it would without Pythia."""
    if load.active == 0:
        return True
    fits = load.reserved_tokens + bound.tokens <= load.capacity_tokens
    return fits and load.failure_bound + bound.alpha <= epsilon + _SLACK


@ROUTING_POLICIES.register("pythia-capacity")
class PythiaCapacityRouting:
    """Statistical capacity routing (§4.2.2, Alg. 2).

    Among the eligible workers, the capable ones (``capable``) are candidates; the request goes to
    the one with the largest headroom C − Σ_{A ∪ {R}} u_i; ties (§4.2.2's cache-affinity
    tie-breaker) to the worker holding the most of the request's context by the scheduler's KV index
    (the workers' KV events: what the cache manager staged in L2 shows there), then to the worker
    the request's program was last routed to, then the smallest worker id.  None (wait) when no
    eligible worker is capable; the scheduler then keeps the queue's order (head-of-line).

    Readings: A is the node's placements that have not completed (``placed_requests``); headroom
    is the text's C − Σ u_i rather than Alg. 2 line 8's ExpectedSize (the paper uses both words for
    it); a node with headroom exactly 0 is a candidate (line 9's strict ">" from 0 would refuse it).
    """

    capabilities = frozenset({Capability.PROGRAM_AWARE, Capability.SCHEDULER_AWARE, Capability.KV_AWARE})

    def __init__(self, config: PythiaRoutingConfig | None = None) -> None:
        self.config = config or PythiaRoutingConfig()
        self._scheduler: SchedulerView | None = None
        self._programs: ProcessTable | None = None
        self._kv: KvIndexView | None = None

    def bind_kv_index(self, index: KvIndexView) -> None:
        self._kv = index

    def bind_scheduler(self, scheduler: SchedulerView) -> None:
        self._scheduler = scheduler

    def bind_programs(self, table: ProcessTable) -> None:
        self._programs = table

    def load(self, worker: WorkerView) -> NodeLoad:
        capacity = (
            worker.kv_blocks_total * (worker.block_size or self.config.block_size)
            if worker.kv_blocks_total
            else math.inf
        )
        active = self._scheduler.placed_requests(worker.worker_id) if self._scheduler is not None else []
        bounds = [length_bound(r, worker.max_model_len, self.config.alpha) for r in active]
        return NodeLoad(
            capacity, sum(b.tokens for b in bounds), math.fsum(b.alpha for b in bounds), len(bounds)
        )

    def route(self, request: QueuedRequest, workers: Sequence[WorkerView], now: float) -> str | None:
        program = self._programs.of(request) if self._programs is not None else None
        affine = program.engine_id if program is not None else None
        cached = (self._kv.cached_tokens(request, now) if self._kv is not None else None) or {}
        best: tuple[float, float, bool, str] | None = (
            None  # (-headroom, -cached, not affine, id): smallest wins
        )
        for worker in eligible_workers(request, workers):
            bound = length_bound(request, worker.max_model_len, self.config.alpha)
            load = self.load(worker)
            if not capable(load, bound, self.config.epsilon):
                continue
            key = (-(load.capacity_tokens - load.reserved_tokens - bound.tokens),
                   -cached.get(worker.worker_id, 0.0), worker.worker_id != affine, worker.worker_id)  # fmt: skip
            if best is None or key < best:
                best = key
        if best is None:
            return None
        if program is not None:
            program.engine_id = best[3]  # the column a routing policy may write: the affinity
        return best[3]


# ---- priority: Alg. 3 -------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class PythiaPriorityConfig:
    completion_weight: float = 1.0  # ω1 (ours)
    unblock_weight: float = 1.0  # ω2 (ours)
    # IDLE_THRESHOLD: a model whose waiting requests (global queue + engine queues) number fewer is
    # at risk of idling (ours: 1, i.e. nothing waits for it).
    idle_threshold: int = 1
    aging_rate: float = 0.01  # priority per second on the engine (ours: +1 after 100 s)
    # The throttle (§7.2, Fig. 9: Pythia "throttle[s] upstream injection when bottlenecks emerge";
    # the paper gives no formula, so ours): a next agent's model is a bottleneck when the calls
    # waiting for it (global queue + engine queues) exceed bottleneck_factor × the placements its
    # workers admit (Σ admission limit, or max_batch); each such successor lowers the call's
    # priority by throttle_weight × P(a) / E[D_a].  0 turns the throttle off.
    throttle_weight: float = 0.0
    bottleneck_factor: float = 1.0


def completion_score(annotations: SysAnnotations | None) -> float:
    """S_completion = 1 / E[D_remain], with D_remain counting the request's own step:
    expected_remaining_steps (steps after it) + 1.  So a final step scores 1.  0 without it."""
    if annotations is None or annotations.expected_remaining_steps is None:
        return 0.0
    return 1.0 / (1.0 + max(0.0, annotations.expected_remaining_steps))


@PRIORITY_POLICIES.register("pythia")
class PythiaPriority:
    """Graph-driven global priority (§4.2.2, Alg. 3): ω1 × S_completion + ω2 × S_unblock.

    S_unblock (DownstreamIdleRisk): for each predicted next agent a whose model's live queue depth
    is below IDLE_THRESHOLD, add P(a) / E[D_a].  Readings: the future agents are the annotation's
    ``next_agents`` (the wire carries no farther ones), so E[D_a] = 1 step, and each adds its
    probability (the expectation of 1/D when a does not follow is taken as 0), so a sure successor
    adds exactly 1; an agent's model is the one its latest submitted call used
    (``GlobalScheduler.agent_model``; unseen agents add nothing); a model's queue depth is its
    global queue plus the queues its workers report.

    The throttle (§7.2, "throttle upstream injection when bottlenecks emerge"; off unless
    ``throttle_weight`` > 0, on in the ``pythia-knee`` preset): a next agent whose model is a
    bottleneck (more calls wait for it than its workers admit) subtracts throttle_weight × P(a) /
    E[D_a].  With admission at the knee the lowered calls then wait in the global queue while the
    bottleneck drains, instead of feeding it more.

    The value when placed is the base priority the engine ages (``PythiaAgingRule``).  Untrusted
    annotations: 0 (see module doc).

    Incremental ranking (``IncrementalPriority``), exact: S_completion is fixed per call, and the
    other terms depend only on one state per (workflow type, next agent): the agent's model is
    known and below IDLE_THRESHOLD (+1), a bottleneck (-1), or neither (0).  Each evaluation
    records the call under its pairs; at each ranking ``priority_changes`` recomputes every
    recorded pair's state (one pass over the workers for the depths) and names the calls of the
    pairs whose state changed, e.g. when a model's queue empties or fills, or an agent's calls
    move to another model.  So the queue is re-ranked only where the full re-rank would give
    another value.
    """

    capabilities = frozenset(
        {Capability.SCHEDULER_AWARE, Capability.INCREMENTAL_PRIORITY, Capability.ENGINE_RULE}
    )

    def __init__(self, config: PythiaPriorityConfig | None = None) -> None:
        self.config = config or PythiaPriorityConfig()
        self._scheduler: SchedulerView | None = None
        # (workflow type, agent) -> its model's state (``_state``) as of the last ranking, and the
        # calls whose value read it (ids of calls no longer queued are pruned now and then).
        self._at_risk: dict[tuple[str, str], int] | None = None
        self._readers: dict[tuple[str, str], dict[str, None]] = {}
        self._reads = 0

    def bind_scheduler(self, scheduler: SchedulerView) -> None:
        self._scheduler = scheduler

    def model_queue_depth(self, model: str) -> int:
        scheduler = self._scheduler
        if scheduler is None:
            return 0
        return scheduler.queue_depth(model) + sum(w.queued for w in scheduler.workers() if w.model == model)

    def _loads(self) -> dict[str, tuple[int, int]]:
        """Model -> (calls its workers hold in their queues, placements they admit)."""
        loads: dict[str, tuple[int, int]] = {}
        for worker in self._scheduler.workers() if self._scheduler is not None else ():
            queued, admitted = loads.get(worker.model, (0, 0))
            loads[worker.model] = (
                queued + worker.queued,
                admitted + (worker.admission_limit or worker.max_batch),
            )
        return loads

    def _state(self, model: str | None, loads: dict[str, tuple[int, int]]) -> int:
        """+1: the model is at risk of idling; -1: it is a bottleneck (the throttle); 0: neither."""
        if model is None or self._scheduler is None:
            return 0
        engine_queued, admitted = loads.get(model, (0, 0))
        depth = self._scheduler.queue_depth(model) + engine_queued
        if depth < self.config.idle_threshold:
            return 1
        if self.config.throttle_weight and depth > self.config.bottleneck_factor * admitted:
            return -1
        return 0

    def idle_risk(self, request: QueuedRequest, annotations: SysAnnotations | None) -> float:
        """ω2 × S_unblock − throttle_weight × (the next agents' bottleneck share), unweighted by ω2."""
        if annotations is None or request.app_metadata is None or self._scheduler is None:
            return 0.0
        risk = 0.0
        workflow_type = request.app_metadata.workflow_type_id
        loads = self._loads()
        for nxt in annotations.next_agents:
            pair = (workflow_type, nxt.agent_id)
            state = self._state(self._scheduler.agent_model(*pair), loads)
            self._record(pair, request.request_id, state)
            if state > 0:
                risk += self.config.unblock_weight * nxt.probability / 1.0  # E[D_a] = 1: one step away
            elif state < 0:
                risk -= self.config.throttle_weight * nxt.probability / 1.0
        return risk

    def priority_changes(self, now: float) -> PriorityChanges:
        """The calls whose idle-risk pairs flipped since the previous ranking (class docstring)."""
        scheduler = self._scheduler
        if self._at_risk is None or scheduler is None:
            self._at_risk = {}
            return PriorityChanges(everything=True)
        loads = self._loads()
        changed: list[str] = []
        for pair, was in self._at_risk.items():
            state = self._state(scheduler.agent_model(*pair), loads)
            if state != was:
                self._at_risk[pair] = state
                changed += self._readers.get(pair, ())
        if self._reads > 2 * sum(scheduler.queue_depths().values()) + 64:
            self._prune(scheduler)
        return PriorityChanges(requests=changed)

    def _record(self, pair: tuple[str, str], request_id: str, state: int) -> None:
        if self._at_risk is None:
            return  # not ranked incrementally
        self._at_risk.setdefault(pair, state)
        readers = self._readers.setdefault(pair, {})
        if request_id not in readers:
            readers[request_id] = None
            self._reads += 1

    def _prune(self, scheduler: SchedulerView) -> None:
        queued = {r.request_id for r in scheduler.queued_requests()}
        for pair, readers in self._readers.items():
            self._readers[pair] = {rid: None for rid in readers if rid in queued}
        self._reads = sum(len(r) for r in self._readers.values())

    def priority(self, request: QueuedRequest, now: float) -> float:
        annotations = trusted_annotations(request)
        if annotations is None:
            return 0.0
        return self.config.completion_weight * completion_score(annotations) + self.idle_risk(
            request, annotations
        )

    def engine_rule(self) -> LocalRule:
        return PythiaAgingRule(self.config.aging_rate)


@dataclass
class PythiaAgingRule:
    """§4.2.2 "periodical local batch creation": effective priority = base priority +
    aging_rate × seconds since the engine first ranked the call (within one step of its arrival
    there; the engine ranks every live call at every step)."""

    aging_rate: float
    _first_seen: weakref.WeakKeyDictionary[EngineSequence, float] = field(
        default_factory=weakref.WeakKeyDictionary, init=False, repr=False
    )

    def effective_priority(self, seq: EngineSequence, now: float) -> float:
        first = self._first_seen.setdefault(seq, now)
        return seq.priority + self.aging_rate * (now - first)


PRESETS.register_preset("pythia", Preset("pythia", "pythia-capacity", cache="pythia", scaling="pythia"))


@ROUTING_POLICIES.register("pythia-knee")
class PythiaKneeRouting(KneeAdmission, PythiaCapacityRouting):
    """Alg. 2 routing that holds each worker at its knee (``admission.py``): what Pythia's
    iteration-level dispatcher keeps from the batch, placed late so that the priority order decides
    who runs (§4.2.2, §7.2)."""

    capabilities = PythiaCapacityRouting.capabilities | {Capability.ADMITS}


@PRIORITY_POLICIES.register("pythia-throttle")
def throttled_priority() -> PythiaPriority:
    """Alg. 3 with the throttle on (``PythiaPriorityConfig.throttle_weight`` = ω2 = 1)."""
    return PythiaPriority(PythiaPriorityConfig(throttle_weight=1.0))


PRESETS.register_preset(
    "pythia-knee", Preset("pythia-throttle", "pythia-knee", cache="pythia", scaling="pythia")
)
