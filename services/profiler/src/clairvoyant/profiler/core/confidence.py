"""Confidence tiers of a workflow type: a pure state machine.

Pythia (seed 000, §5 "Cold starts and workflow drift") serves a new or changed workflow version in
a reactive fallback while profiling it in the background ("shadow profiling") and promotes it once
safe confidence intervals are established.  SAGA (seed 003, §3.3) serves a new agent type as a
plain request-level workload until 30 tasks complete.  Here:

    SHADOW --(>= min_instances since entering shadow, distributions converged)--> LOW
    LOW    --(>= high_instances and recent acceptance >= high_acceptance)------> HIGH
    HIGH   --(recent acceptance < high_acceptance)------------------------------> LOW
    LOW/HIGH --(recent acceptance < baseline - max_acceptance_drop)-------------> SHADOW
    any    --(a new workflow_version)------------------------------------------> SHADOW (reset)

"Recent acceptance" is the share of the last ``acceptance_window`` closed instances the current
path expression accepts (judged once at least ``min_window`` are in); the baseline is the
expression's acceptance on the traces it was synthesised from.  A re-synthesis restarts the window.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from enum import StrEnum
from typing import Any


class Tier(StrEnum):
    NONE = "none"  # unknown workflow type: nothing is predicted
    SHADOW = "shadow"  # being learned: only output-length predictions are served
    LOW = "low"
    HIGH = "high"


@dataclass(frozen=True, slots=True)
class ConfidenceConfig:
    min_instances: int = 30
    high_instances: int = 100
    acceptance_window: int = 20
    min_window: int = 10
    max_acceptance_drop: float = 0.15
    high_acceptance: float = 0.95
    # False: leave SHADOW on min_instances alone (an operator who trusts the structure before every
    # distribution has converged; the offline evaluation's --ungated)
    require_convergence: bool = True


@dataclass(frozen=True, slots=True)
class ConfidenceState:
    tier: Tier = Tier.SHADOW
    version: str | None = None
    instances: int = 0  # closed instances since entering shadow (or since the last reset)
    total_instances: int = 0  # since the current version began
    recent: tuple[bool, ...] = field(default_factory=tuple)
    baseline: float | None = None
    reason: str = "cold start"

    @property
    def recent_acceptance(self) -> float | None:
        return sum(self.recent) / len(self.recent) if self.recent else None

    def to_state(self) -> dict[str, Any]:
        return {
            "tier": self.tier.value,
            "version": self.version,
            "instances": self.instances,
            "total_instances": self.total_instances,
            "recent": list(self.recent),
            "baseline": self.baseline,
            "reason": self.reason,
        }

    @classmethod
    def from_state(cls, state: dict[str, Any]) -> ConfidenceState:
        return cls(
            Tier(state["tier"]),
            state["version"],
            int(state["instances"]),
            int(state["total_instances"]),
            tuple(bool(v) for v in state["recent"]),
            state["baseline"],
            state["reason"],
        )


def on_version(state: ConfidenceState, version: str | None) -> tuple[ConfidenceState, bool]:
    """A record carried ``version``; returns (new state, whether the profile must reset)."""
    if version is None or version == state.version:
        return state, False
    if state.version is None and state.total_instances == 0:
        return replace(state, version=version), False
    return ConfidenceState(Tier.SHADOW, version, reason=f"new workflow_version {version!r}"), True


def on_synthesized(state: ConfidenceState, acceptance: float) -> ConfidenceState:
    return replace(state, baseline=acceptance, recent=())


def on_instance(
    state: ConfidenceState,
    accepted: bool | None,
    converged: bool,
    config: ConfidenceConfig = ConfidenceConfig(),
) -> ConfidenceState:
    """One workflow instance closed; ``accepted`` is None when no expression existed yet."""
    recent = state.recent if accepted is None else (*state.recent, accepted)[-config.acceptance_window :]
    state = replace(
        state, instances=state.instances + 1, total_instances=state.total_instances + 1, recent=recent
    )
    rate = state.recent_acceptance if len(state.recent) >= config.min_window else None
    if state.tier in (Tier.LOW, Tier.HIGH) and rate is not None:
        if state.baseline is not None and rate < state.baseline - config.max_acceptance_drop:
            return replace(
                state, tier=Tier.SHADOW, instances=0, recent=(), reason=f"acceptance dropped to {rate:.2f}"
            )
        if state.tier is Tier.HIGH and rate < config.high_acceptance:
            return replace(state, tier=Tier.LOW, reason=f"acceptance {rate:.2f}")
        if (
            state.tier is Tier.LOW
            and rate >= config.high_acceptance
            and state.total_instances >= config.high_instances
        ):
            return replace(state, tier=Tier.HIGH, reason="stable")
    converged = converged or not config.require_convergence
    if state.tier is Tier.SHADOW and state.instances >= config.min_instances and converged:
        return replace(state, tier=Tier.LOW, reason=f"{state.instances} instances, converged")
    return state
