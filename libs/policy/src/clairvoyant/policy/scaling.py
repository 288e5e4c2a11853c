"""The scaling family: replicas per model over time, and which replicas to drain.

``tick`` takes what the autoscaler sees (replicas per model, their load, the GPU budget) and
returns target replica counts and the replicas to drain, with diagnostics.  ``static`` is what
every cluster does today: the replicas it has, none drained.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import NamedTuple, Protocol

from clairvoyant.policy.capabilities import PolicyRegistry


class ReplicaState(NamedTuple):
    replica_id: str
    model: str
    gpus: int
    running: int  # requests on it now
    draining: bool = False


class ScalingInput(NamedTuple):
    replicas: tuple[ReplicaState, ...]
    queued: Mapping[str, int]  # requests waiting per model
    gpu_budget: int  # GPUs the cluster may use in all


class ScalingDecision(NamedTuple):
    targets: dict[str, int]  # replicas per model to have
    drain: tuple[str, ...] = ()  # replica ids to stop routing to, then release once idle
    diagnostics: Mapping[str, float] = {}


class ScalingPolicy(Protocol):
    def tick(self, state: ScalingInput, now: float) -> ScalingDecision:
        """The replicas each model should have from ``now`` on, and which to drain.  Pure."""
        ...


SCALING_POLICIES: PolicyRegistry[ScalingPolicy] = PolicyRegistry("scaling policy")


@SCALING_POLICIES.register("static")
class StaticScaling:
    """Keeps every model at the replicas it has (counting draining ones out); drains none."""

    def tick(self, state: ScalingInput, now: float) -> ScalingDecision:
        targets: dict[str, int] = {}
        for replica in state.replicas:
            targets[replica.model] = targets.get(replica.model, 0) + (0 if replica.draining else 1)
        return ScalingDecision(targets=targets)
