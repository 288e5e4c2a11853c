"""What one tick sees, as plain values: the scheduler's workers, queues and held calls, and the
profiles of the models under management; ``scaling_input`` assembles the policy's input.  Pure."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any, NamedTuple

from clairvoyant.autoscaler.core.replicas import ReplicaBook, WorkerSeen
from clairvoyant.policy.scaling import ActiveCall, ModelProfile, ModelTraffic, ScalingInput

DEFAULT_CALLS_PER_REPLICA = 16.0


class ClusterView(NamedTuple):
    """One reading of the scheduler (its Snapshot and Active RPCs)."""

    workers: tuple[WorkerSeen, ...]
    queued: Mapping[str, int]
    active: tuple[ActiveCall, ...] = ()
    agent_models: Mapping[tuple[str, str], str] = {}
    traffic: Mapping[str, ModelTraffic] = {}


class ProfileDefaults(NamedTuple):
    startup_s: float = 30.0
    calls_per_replica: float = DEFAULT_CALLS_PER_REPLICA


def managed_models(view: ClusterView, configured: Sequence[str]) -> list[str]:
    """The configured models, or (none configured) every model a worker or a queue shows."""
    if configured:
        return sorted(set(configured))
    return sorted({w.model for w in view.workers} | {m for m, depth in view.queued.items() if depth})


def model_profiles(
    models: Sequence[str],
    view: ClusterView,
    overrides: Mapping[str, Mapping[str, float | int | None]],
    defaults: ProfileDefaults,
) -> dict[str, ModelProfile]:
    """A profile per model: the operator's overrides, else its workers' batch size as the calls a
    replica serves, else the defaults."""
    profiles: dict[str, ModelProfile] = {}
    for model in models:
        batches = [w.max_batch for w in view.workers if w.model == model and w.max_batch > 0]
        base = ModelProfile(
            model,
            gpus_per_replica=1,
            calls_per_replica=float(max(batches)) if batches else defaults.calls_per_replica,
            startup_s=defaults.startup_s,
        )
        given: dict[str, Any] = {k: v for k, v in overrides.get(model, {}).items() if v is not None}
        profiles[model] = base._replace(**given)
    return profiles


def scaling_input(
    view: ClusterView, book: ReplicaBook, profiles: Mapping[str, ModelProfile], gpu_budget: int
) -> ScalingInput:
    gpus = {model: p.gpus_per_replica for model, p in profiles.items()}
    return ScalingInput(
        replicas=tuple(book.states(view.workers, gpus)),
        queued=dict(view.queued),
        gpu_budget=gpu_budget,
        models=dict(profiles),
        active=view.active,
        agent_models=dict(view.agent_models),
        traffic=dict(view.traffic),
    )
