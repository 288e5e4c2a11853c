"""Pythia's phase-adaptive autoscaling (seeds/000, §4.2.3, Algorithm 4): the ``pythia`` scaling policy.

    EstimateImminentDemand(A, H): for each active workflow, the load its imminent agents put on
        each model within H steps (ProjectGraph = the profiler's ``SysAnnotations.projection``)
    AutoscaleCluster: R'[m] = EstimateReplicas(D[m]); scale-downs first (drain by routing
        exclusion, release once idle, no keep-alive), then scale-ups

The choices where the paper is silent (docs/autoscaling.md, "Pythia"):

* Load is in concurrent calls, and a workflow's load on a model is the *largest* expected number
  of its calls on that model in any one of the steps 0..H (step 0: its calls queued or running
  now).  Summing over steps would count a sequential loop's calls as concurrent.
* A workflow is counted once: its active calls each carry a projection from their own position;
  per (step, agent) the largest is taken (ten explorers of one fan-out all predict the one
  summarizer that joins them).
* A workflow between calls (waiting on a tool) has no active call but will call again: its last
  projection, shifted by the step it completed, is kept for ``workflow_memory_s``, unless one of
  its calls said ``workflow_end``.
* EstimateReplicas is ceil(D[m] / calls_per_replica) (``ModelProfile``).  Targets that do not fit
  the GPU budget are water-filled (``fit_budget``): every model with demand gets one replica, then
  the calls queued or running *now* are served first, then the projected ones.  Calls waiting now
  cost queueing for certain; a projected call may be several steps away, beyond a cold start.
  This is how scaling one model up drains another in a constrained cluster.
* H = 2 steps by default: one step of an agent plus its tool call is tens of seconds, about one
  replica's cold start, so two steps ahead is the nearest horizon that hides a cold start.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import NamedTuple

from clairvoyant.policy.scaling import (
    SCALING_POLICIES,
    ActiveCall,
    ScalingDecision,
    ScalingInput,
    fit_budget,
    replicas_for,
    serving_counts,
)

DEFAULT_HORIZON_STEPS = 2
DEFAULT_WORKFLOW_MEMORY_S = 120.0


class _Remembered(NamedTuple):
    workflow_type_id: str
    steps: dict[int, dict[str, float]]  # step after the last call -> agent -> expected calls
    seen_at: float


def _projection_by_step(calls: Iterable[ActiveCall], horizon: int) -> dict[int, dict[str, float]]:
    """One workflow's projection, steps 1..horizon, the largest per (step, agent) over its calls."""
    steps: dict[int, dict[str, float]] = {}
    for call in calls:
        if call.annotations is None:
            continue
        for term in call.annotations.projection:
            if 1 <= term.step <= horizon:
                agents = steps.setdefault(term.step, {})
                agents[term.agent_id] = max(agents.get(term.agent_id, 0.0), term.expected_calls)
    return steps


@SCALING_POLICIES.register("pythia")
class PythiaScaling:
    """Algorithm 4 with ``horizon_steps`` = H; see the module docstring for its reading."""

    def __init__(
        self,
        horizon_steps: int = DEFAULT_HORIZON_STEPS,
        workflow_memory_s: float = DEFAULT_WORKFLOW_MEMORY_S,
    ) -> None:
        if horizon_steps < 0 or workflow_memory_s < 0:
            raise ValueError("horizon_steps and workflow_memory_s must be non-negative")
        self.horizon_steps = horizon_steps
        self.workflow_memory_s = workflow_memory_s
        self._memory: dict[tuple[str, str], _Remembered] = {}  # (tenant, workflow id) -> last projection

    def tick(self, state: ScalingInput, now: float) -> ScalingDecision:
        demand, unmapped = self.estimate_imminent_demand(state, now)
        now_load: dict[str, float] = {}
        for call in state.active:
            now_load[call.model] = now_load.get(call.model, 0.0) + 1.0
        wanted: dict[str, int] = {}
        needed_now: dict[str, int] = {}
        reasons: dict[str, str] = {}
        for model, profile in sorted(state.models.items()):
            load = demand.get(model, 0.0)
            replicas = max(profile.min_replicas, replicas_for(load, profile.calls_per_replica))
            if profile.max_replicas is not None:
                replicas = min(replicas, profile.max_replicas)
            wanted[model] = replicas
            needed_now[model] = replicas_for(now_load.get(model, 0.0), profile.calls_per_replica)
            reasons[model] = f"imminent load {load:.1f} calls within {self.horizon_steps} steps"
        targets = fit_budget(
            wanted, demand, state.models, state.gpu_budget, first=needed_now, first_demand=now_load
        )
        for model, target in targets.items():
            if target < wanted[model]:
                reasons[model] += f"; {wanted[model]} wanted, {target} fit the GPU budget"
        for model, count in serving_counts(state.replicas).items():
            targets.setdefault(model, count)  # a model without a profile keeps what it has
        diagnostics = {f"demand_calls.{m}": d for m, d in sorted(demand.items())}
        diagnostics["unmapped_calls"] = unmapped
        diagnostics["remembered_workflows"] = float(len(self._memory))
        return ScalingDecision(targets=targets, diagnostics=diagnostics, reasons=reasons)

    def estimate_imminent_demand(self, state: ScalingInput, now: float) -> tuple[dict[str, float], float]:
        """EstimateImminentDemand: expected concurrent calls per model within H steps, and the
        expected calls whose agent maps to no known model."""
        by_workflow: dict[tuple[str, str], list[ActiveCall]] = {}
        demand: dict[str, float] = {}
        for call in state.active:
            if call.workflow_id is None or call.workflow_type_id is None:
                demand[call.model] = demand.get(call.model, 0.0) + 1.0  # untagged: itself only
            else:
                by_workflow.setdefault((call.tenant, call.workflow_id), []).append(call)
        unmapped = 0.0
        for key, calls in by_workflow.items():
            workflow_type = calls[0].workflow_type_id or ""
            steps = _projection_by_step(calls, self.horizon_steps)
            if any(call.workflow_end for call in calls):
                steps = {}  # its last call: nothing follows it, nor is it remembered once done
            self._memory[key] = _Remembered(workflow_type, steps, now)
            now_load: dict[str, float] = {}
            for call in calls:
                now_load[call.model] = now_load.get(call.model, 0.0) + 1.0
            unmapped += self._add_peak(demand, state, workflow_type, [now_load], steps.values())
        for key, remembered in list(self._memory.items()):
            if key in by_workflow:
                continue
            if now - remembered.seen_at > self.workflow_memory_s or not remembered.steps:
                del self._memory[key]
                continue
            # Between calls: its last call's step is done, so what was step k is now step k - 1.
            ahead = [
                agents for step, agents in sorted(remembered.steps.items()) if step <= self.horizon_steps
            ]
            unmapped += self._add_peak(demand, state, remembered.workflow_type_id, [], ahead)
        return demand, unmapped

    @staticmethod
    def _add_peak(
        demand: dict[str, float],
        state: ScalingInput,
        workflow_type: str,
        by_model_now: list[dict[str, float]],
        projected: Iterable[dict[str, float]],
    ) -> float:
        """Add one workflow's peak per-step load on each model to ``demand``; returns the
        expected calls of agents with no known model."""
        unmapped = 0.0
        per_step = list(by_model_now)
        for agents in projected:
            step_load: dict[str, float] = {}
            for agent, calls in agents.items():
                model = state.agent_models.get((workflow_type, agent))
                if model is None:
                    unmapped += calls
                else:
                    step_load[model] = step_load.get(model, 0.0) + calls
            per_step.append(step_load)
        peak: dict[str, float] = {}
        for step_load in per_step:
            for model, calls in step_load.items():
                peak[model] = max(peak.get(model, 0.0), calls)
        for model, calls in peak.items():
            demand[model] = demand.get(model, 0.0) + calls
        return unmapped
