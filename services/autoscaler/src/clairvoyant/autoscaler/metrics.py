"""The autoscaler's Prometheus metrics."""

from __future__ import annotations

from prometheus_client import Counter, Gauge

from clairvoyant.policy.scaling import ReplicaPhase, ScalingDecision, ScalingInput

TICKS = Counter("cv_autoscaler_ticks_total", "Scaling loop ticks", ["outcome"])
ACTIONS = Counter("cv_autoscaler_actions_total", "Replicas started and released", ["action"])
FAILED_STARTS = Counter(
    "cv_autoscaler_failed_starts_total", "Replicas torn down for missing their start-up allowance"
)
ACTUATOR_RETRIES = Counter("cv_autoscaler_actuator_retries_total", "Actuator calls retried after a failure")
REPLICAS = Gauge("cv_autoscaler_replicas", "Replicas per model and phase", ["model", "phase"])
TARGET = Gauge("cv_autoscaler_target_replicas", "The policy's target per model", ["model"])
GPUS_IN_USE = Gauge("cv_autoscaler_gpus_in_use", "GPUs held by starting, ready and draining replicas")


def observe_tick(state: ScalingInput, decision: ScalingDecision) -> None:
    TICKS.labels(outcome="ok").inc()
    for model in state.models:
        for phase in ReplicaPhase:
            count = sum(1 for r in state.replicas if r.model == model and r.phase is phase)
            REPLICAS.labels(model=model, phase=phase.value).set(count)
    for model, target in decision.targets.items():
        TARGET.labels(model=model).set(target)
    GPUS_IN_USE.set(sum(r.gpus for r in state.replicas))
