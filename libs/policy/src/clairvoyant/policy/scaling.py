"""The scaling family: replicas per model over time, and which replicas to drain.

``tick(state, now)`` is pure: it takes what the autoscaler sees (replicas with their phase and
load, the calls in flight with their annotations, per-model traffic counters, each model's
profile, the GPU budget) and returns target replicas per model, the replicas to drain, and
diagnostics.  A policy may keep state between ticks (a smoothing window, a forecaster); it reads
no clock but ``now``.  ``plan_actions`` turns a decision into what an executor does (start,
drain, release), the same way for the live service and the simulator.

Members: ``static`` (the replicas it has), ``pythia`` (pythia_scaling.py), ``reactive`` and
``predictive`` (scaling_baselines.py).
"""

from __future__ import annotations

import enum
import math
from collections.abc import Iterable, Mapping
from typing import NamedTuple, Protocol

from clairvoyant.core.annotations import SysAnnotations
from clairvoyant.policy.capabilities import PolicyRegistry


class ReplicaPhase(enum.Enum):
    STARTING = "starting"  # provisioned: loading weights, not yet routable
    READY = "ready"  # serving
    DRAINING = "draining"  # excluded from routing; released once idle


class ReplicaState(NamedTuple):
    replica_id: str
    model: str
    gpus: int
    running: int = 0  # calls placed on it (running or in its engine queue)
    waiting: int = 0  # of those, waiting in its engine queue (num_requests_waiting)
    kv_utilization: float = 0.0  # KV blocks used / total, 0..1
    phase: ReplicaPhase = ReplicaPhase.READY
    since: float = 0.0  # when it entered its phase (STARTING: when it was provisioned)

    @property
    def draining(self) -> bool:
        return self.phase is ReplicaPhase.DRAINING

    @property
    def idle(self) -> bool:
        return self.running == 0 and self.waiting == 0


class ModelProfile(NamedTuple):
    """What the autoscaler knows of serving one model (from the cost model or an offline profile)."""

    model: str
    gpus_per_replica: int
    calls_per_replica: float  # concurrent calls one replica serves before decode slows (its knee)
    startup_s: float  # cold start: weights load + engine warm-up
    prefill_tokens_per_s: float = 10_000.0  # one replica's prefill throughput
    decode_step_s: float = 0.03  # one decode step at ``calls_per_replica`` running calls
    min_replicas: int = 0
    max_replicas: int | None = None


class ActiveCall(NamedTuple):
    """A call the scheduler holds: queued, or placed on a replica."""

    request_id: str
    model: str
    queued: bool
    workflow_type_id: str | None = None
    workflow_id: str | None = None
    agent_id: str | None = None
    tenant: str = ""
    wait_s: float = 0.0
    annotations: SysAnnotations | None = None
    workflow_end: bool = False  # the application said this is its workflow's last call


class ModelTraffic(NamedTuple):
    """Cumulative counters for one model; a policy differences two readings."""

    requests_total: int = 0
    input_tokens_total: int = 0
    completed_total: int = 0
    output_tokens_total: int = 0


class ScalingInput(NamedTuple):
    replicas: tuple[ReplicaState, ...]
    queued: Mapping[str, int]  # requests waiting in the global queue, per model
    gpu_budget: int  # GPUs the cluster may use in all (starting, ready and draining replicas)
    models: Mapping[str, ModelProfile] = {}  # the models the autoscaler manages
    active: tuple[ActiveCall, ...] = ()
    agent_models: Mapping[tuple[str, str], str] = {}  # (workflow type, agent) -> model
    traffic: Mapping[str, ModelTraffic] = {}


class ScalingDecision(NamedTuple):
    targets: dict[str, int]  # replicas per model to have, not counting draining ones
    drain: tuple[str, ...] = ()  # replica ids to stop routing to, then release once idle
    diagnostics: Mapping[str, float] = {}
    reasons: Mapping[str, str] = {}  # per model: why its target is what it is, one line


class ScalingPolicy(Protocol):
    def tick(self, state: ScalingInput, now: float) -> ScalingDecision:
        """The replicas each model should have from ``now`` on, and which to drain.  May update
        the policy's own history (a smoothing window, a forecaster); never raises on a state
        whose models lack a profile (they keep their replicas)."""
        ...


SCALING_POLICIES: PolicyRegistry[ScalingPolicy] = PolicyRegistry("scaling policy")


@SCALING_POLICIES.register("static")
class StaticScaling:
    """Keeps every model at the replicas it has (counting draining ones out); drains none."""

    def tick(self, state: ScalingInput, now: float) -> ScalingDecision:
        return ScalingDecision(targets=serving_counts(state.replicas))


# ---- shared by the policies and the executors ------------------------------------------------


def serving_counts(replicas: Iterable[ReplicaState]) -> dict[str, int]:
    """Replicas per model that are starting or ready (not draining)."""
    counts: dict[str, int] = {}
    for replica in replicas:
        counts[replica.model] = counts.get(replica.model, 0) + (0 if replica.draining else 1)
    return counts


def drain_order(replicas: Iterable[ReplicaState]) -> list[ReplicaState]:
    """Which of one model's serving replicas to drain first: starting ones (nothing to lose but
    the load so far, newest first), then ready ones with the least work, newest first."""
    serving = [r for r in replicas if not r.draining]
    return sorted(
        serving,
        key=lambda r: (r.phase is not ReplicaPhase.STARTING, r.running + r.waiting, -r.since, r.replica_id),
    )


def fit_budget(
    wanted: Mapping[str, int],
    demand: Mapping[str, float],
    profiles: Mapping[str, ModelProfile],
    budget: int,
    *,
    first: Mapping[str, int] | None = None,
    first_demand: Mapping[str, float] | None = None,
) -> dict[str, int]:
    """Clamp ``wanted`` replicas per model to ``budget`` GPUs.

    In order: models keep their ``min_replicas``; every model with demand gets one replica (most
    ``first_demand``, then demand, first); replicas go one at a time toward ``first`` (the
    replicas the load *now* needs, when given) to the model whose ``first_demand`` per unit of
    capacity would stay highest; then the same toward ``wanted`` by ``demand`` (water-filling).
    What fits is returned; a model never gets more than it wants.
    """
    now_demand = first_demand or {}

    def gpus(model: str) -> int:
        return profiles[model].gpus_per_replica if model in profiles else 1

    def pressure(load: Mapping[str, float], model: str, replicas: int) -> float:
        capacity = profiles[model].calls_per_replica if model in profiles else 1.0
        return load.get(model, 0.0) / (replicas * max(capacity, 1e-9))

    targets = {model: 0 for model in wanted}
    left = budget

    def fill(goal: Mapping[str, int], load: Mapping[str, float]) -> None:
        nonlocal left
        while True:
            open_models = [m for m in wanted if targets[m] < min(goal.get(m, 0), wanted[m]) and left >= gpus(m)]
            if not open_models:
                return
            best = max(open_models, key=lambda m: (pressure(load, m, targets[m] + 1), m))
            targets[best] += 1
            left -= gpus(best)

    fill({m: profiles[m].min_replicas if m in profiles else 0 for m in wanted}, demand)
    for model in sorted(wanted, key=lambda m: (-now_demand.get(m, 0.0), -demand.get(m, 0.0), m)):
        if targets[model] == 0 and wanted[model] > 0 and left >= gpus(model):
            targets[model] = 1
            left -= gpus(model)
    if first is not None:
        fill(first, now_demand)
    fill(wanted, demand)
    return targets


class ScalingActions(NamedTuple):
    """What an executor does for one decision."""

    start: dict[str, int]  # new replicas to provision per model (they fit the budget)
    drain: tuple[str, ...]  # replica ids to exclude from routing now
    release: tuple[str, ...]  # draining replicas that are idle: stop them now
    clamped: dict[str, int]  # per model: replicas wanted beyond the budget (not started this tick)


def plan_actions(decision: ScalingDecision, state: ScalingInput) -> ScalingActions:
    """Turn a decision into actions, keeping to the GPU budget.

    Drains come first: the decision's own, then the surplus of any model whose serving replicas
    exceed its target (``drain_order``).  Draining replicas hold their GPUs until they are idle,
    so a scale-up that does not fit waits for a later tick (``clamped``).  No keep-alive: an idle
    draining replica is released at once (Pythia §4.2.3).
    """
    by_id = {r.replica_id: r for r in state.replicas}
    draining = {r.replica_id for r in state.replicas if r.draining}
    newly = [rid for rid in decision.drain if rid in by_id and rid not in draining]
    serving = serving_counts(r for r in state.replicas if r.replica_id not in newly)
    for model, target in sorted(decision.targets.items()):
        surplus = serving.get(model, 0) - max(target, 0)
        if surplus > 0:
            mine = [r for r in state.replicas if r.model == model and r.replica_id not in newly]
            newly += [r.replica_id for r in drain_order(mine)[:surplus]]
            serving[model] -= surplus
    gone = draining | set(newly)
    release = tuple(
        sorted(rid for rid in gone if by_id[rid].idle or by_id[rid].phase is ReplicaPhase.STARTING)
    )
    used = sum(r.gpus for r in state.replicas if r.replica_id not in release)
    left = state.gpu_budget - used
    start: dict[str, int] = {}
    clamped: dict[str, int] = {}
    for model, target in sorted(decision.targets.items()):
        missing = target - serving.get(model, 0)
        if missing <= 0:
            continue
        per = state.models[model].gpus_per_replica if model in state.models else 1
        fits = max(0, min(missing, left // per)) if per > 0 else missing
        if fits:
            start[model] = fits
            left -= fits * per
        if fits < missing:
            clamped[model] = missing - fits
    return ScalingActions(start, tuple(newly), release, clamped)


def replicas_for(load: float, calls_per_replica: float) -> int:
    """EstimateReplicas: the replicas that serve ``load`` concurrent calls at speed."""
    if load <= 1e-9:
        return 0
    return max(1, math.ceil(load / max(calls_per_replica, 1e-9) - 1e-9))
