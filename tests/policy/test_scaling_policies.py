"""The scaling family's cores, driven directly: Pythia's Algorithm 4, the reactive and predictive
baselines, and ``plan_actions`` (the budget, drains first, release once idle)."""

from __future__ import annotations

import math

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from clairvoyant.core.annotations import ProjectedCalls, SysAnnotations
from clairvoyant.policy.pythia_scaling import PythiaScaling
from clairvoyant.policy.scaling import (
    SCALING_POLICIES,
    ActiveCall,
    ModelProfile,
    ModelTraffic,
    ReplicaPhase,
    ReplicaState,
    ScalingDecision,
    ScalingInput,
    fit_budget,
    plan_actions,
)
from clairvoyant.policy.scaling_baselines import LocalLinearTrend, PredictiveScaling, ReactiveScaling

pytestmark = pytest.mark.unit

PLANNER, EXPLORER, VERIFIER = "llama-8b", "qwen-14b", "qwen-32b"
PROFILES = {
    PLANNER: ModelProfile(PLANNER, gpus_per_replica=1, calls_per_replica=32, startup_s=20.0),
    EXPLORER: ModelProfile(EXPLORER, gpus_per_replica=1, calls_per_replica=64, startup_s=30.0),
    VERIFIER: ModelProfile(VERIFIER, gpus_per_replica=2, calls_per_replica=32, startup_s=60.0),
}
AGENT_MODELS = {
    ("research", "planner"): PLANNER,
    ("research", "explorer"): EXPLORER,
    ("research", "verifier"): VERIFIER,
}


def planner_call(i: int, projection: tuple[ProjectedCalls, ...], queued: bool = False) -> ActiveCall:
    return ActiveCall(
        request_id=f"wf{i}-planner",
        model=PLANNER,
        queued=queued,
        workflow_type_id="research",
        workflow_id=f"wf{i}",
        agent_id="planner",
        tenant="acme",
        annotations=SysAnnotations(projection=projection),
    )


def replicas(*specs: tuple[str, str, ReplicaPhase, int]) -> tuple[ReplicaState, ...]:
    return tuple(
        ReplicaState(rid, model, PROFILES[model].gpus_per_replica, running=running, phase=phase)
        for rid, model, phase, running in specs
    )


# planner -> <explorer>{10} -> planner -> ... -> verifier, seen from a running planner call.
FAN_OUT = (
    ProjectedCalls(1, "explorer", 10.0),
    ProjectedCalls(2, "planner", 1.0),
    ProjectedCalls(3, "explorer", 10.0),
    ProjectedCalls(4, "verifier", 1.0),
)


def fifty_planners(budget: int = 8) -> ScalingInput:
    return ScalingInput(
        replicas=replicas(("p0", PLANNER, ReplicaPhase.READY, 32), ("p1", PLANNER, ReplicaPhase.READY, 18)),
        queued={},
        gpu_budget=budget,
        models=PROFILES,
        active=tuple(planner_call(i, FAN_OUT) for i in range(50)),
        agent_models=AGENT_MODELS,
    )


def test_pythia_provisions_the_fan_out_before_the_planners_finish() -> None:
    """Pythia §4.2.3's example: 50 planners, each followed by 10 explorers: 500 explorer calls are
    imminent, so explorer replicas start while every planner call is still running."""
    state = fifty_planners()
    decision = PythiaScaling(horizon_steps=2).tick(state, now=0.0)
    assert decision.diagnostics[f"demand_calls.{EXPLORER}"] == pytest.approx(500.0)
    assert decision.diagnostics[f"demand_calls.{PLANNER}"] == pytest.approx(50.0)
    # Wanted: 500 / 64 -> 8 explorer and 50 / 32 -> 2 planner replicas; 8 GPUs.  The 50 planner
    # calls running now keep their 2 replicas first; the other 6 GPUs go to the explorers.
    assert decision.targets == {PLANNER: 2, EXPLORER: 6, VERIFIER: 0}
    actions = plan_actions(decision, state)
    assert actions.drain == ()
    assert actions.start == {EXPLORER: 6}
    assert "8 wanted, 6 fit the GPU budget" in decision.reasons[EXPLORER]


def test_the_reactive_baseline_fed_the_same_state_does_not_scale_until_the_queue_builds() -> None:
    state = fifty_planners()
    reactive = ReactiveScaling()
    decision = reactive.tick(state, now=0.0)
    assert decision.targets.get(EXPLORER, 0) == 0  # nothing waits for the explorer model yet
    # The fan-out lands: 500 explorer calls queue with no replica to serve them.
    burst = state._replace(queued={EXPLORER: 500})
    assert reactive.tick(burst, now=5.0).targets.get(EXPLORER, 0) == 0  # within the polling interval
    later = reactive.tick(burst, now=15.0)
    assert later.targets[EXPLORER] == 1  # from zero: one replica first (max scale-up rate)


def test_a_model_whose_agents_lie_behind_the_frontier_is_drained() -> None:
    """Every workflow has moved on to its explorers: the planner model's replicas drain."""
    explorers = tuple(
        ActiveCall(f"wf{i}-e{j}", EXPLORER, False, "research", f"wf{i}", "explorer", "acme",
                   annotations=SysAnnotations(projection=(ProjectedCalls(1, "verifier", 1.0),)))
        for i in range(4) for j in range(10)
    )  # fmt: skip
    state = ScalingInput(
        replicas=replicas(
            ("p0", PLANNER, ReplicaPhase.READY, 0),
            ("p1", PLANNER, ReplicaPhase.READY, 1),
            ("e0", EXPLORER, ReplicaPhase.READY, 40),
        ),
        queued={},
        gpu_budget=8,
        models=PROFILES,
        active=explorers,
        agent_models=AGENT_MODELS,
    )
    decision = PythiaScaling().tick(state, now=0.0)
    assert decision.targets[PLANNER] == 0
    actions = plan_actions(decision, state)
    assert set(actions.drain) == {"p0", "p1"}
    assert actions.release == ("p0",)  # idle: released at once, no keep-alive; p1 finishes first
    assert decision.targets[VERIFIER] == 1  # one step ahead: warmed


def test_a_model_needed_only_beyond_the_horizon_is_not_warmed() -> None:
    state = fifty_planners(budget=16)
    near = PythiaScaling(horizon_steps=2).tick(state, now=0.0)
    assert near.targets[VERIFIER] == 0  # the verifier is 4 steps away
    far = PythiaScaling(horizon_steps=4).tick(state, now=0.0)
    assert far.targets[VERIFIER] == 2  # 50 verifier calls / 32 per replica


def test_a_workflow_counts_once_and_is_remembered_between_calls() -> None:
    """Ten explorers of one fan-out each predict the one verifier that joins them; once they are
    done and the workflow waits on a tool, its projection still counts until it expires."""
    explorers = tuple(
        ActiveCall(f"e{j}", EXPLORER, False, "research", "wf0", "explorer", "acme",
                   annotations=SysAnnotations(projection=(ProjectedCalls(1, "verifier", 1.0),)))
        for j in range(10)
    )  # fmt: skip
    state = ScalingInput(replicas=(), queued={}, gpu_budget=8, models=PROFILES, active=explorers,
                         agent_models=AGENT_MODELS)  # fmt: skip
    pythia = PythiaScaling(workflow_memory_s=60.0)
    first = pythia.tick(state, now=0.0)
    assert first.diagnostics[f"demand_calls.{VERIFIER}"] == pytest.approx(1.0)
    assert first.diagnostics[f"demand_calls.{EXPLORER}"] == pytest.approx(10.0)
    between = pythia.tick(state._replace(active=()), now=30.0)
    assert between.diagnostics[f"demand_calls.{VERIFIER}"] == pytest.approx(1.0)
    assert between.targets[VERIFIER] == 1
    expired = pythia.tick(state._replace(active=()), now=91.0)
    assert expired.targets[VERIFIER] == 0


def test_unmapped_agents_are_reported_not_guessed() -> None:
    call = planner_call(0, (ProjectedCalls(1, "stranger", 3.0),))
    state = ScalingInput(replicas=(), queued={}, gpu_budget=8, models=PROFILES, active=(call,),
                         agent_models=AGENT_MODELS)  # fmt: skip
    decision = PythiaScaling().tick(state, now=0.0)
    assert decision.diagnostics["unmapped_calls"] == pytest.approx(3.0)
    assert decision.targets == {PLANNER: 1, EXPLORER: 0, VERIFIER: 0}


def test_fit_budget_water_fills_by_demand_and_gives_every_model_with_demand_one_first() -> None:
    wanted = {PLANNER: 4, EXPLORER: 10, VERIFIER: 1}
    demand = {PLANNER: 100.0, EXPLORER: 600.0, VERIFIER: 1.0}
    assert fit_budget(wanted, demand, PROFILES, budget=6) == {PLANNER: 1, EXPLORER: 3, VERIFIER: 1}
    assert fit_budget(wanted, demand, PROFILES, budget=100) == wanted
    # The load now comes first: 100 planner calls waiting need 4 replicas before the explorers'
    # projected 600 get more than their first.
    now = fit_budget(wanted, demand, PROFILES, budget=6, first={PLANNER: 4}, first_demand={PLANNER: 100.0})
    assert now == {PLANNER: 3, EXPLORER: 1, VERIFIER: 1}


def test_plan_actions_cancels_starting_replicas_first_and_waits_for_draining_gpus() -> None:
    state = ScalingInput(
        replicas=replicas(
            ("p0", PLANNER, ReplicaPhase.READY, 3),
            ("p1", PLANNER, ReplicaPhase.STARTING, 0),
            ("v0", VERIFIER, ReplicaPhase.DRAINING, 2),
        ),
        queued={},
        gpu_budget=4,
        models=PROFILES,
    )
    actions = plan_actions(ScalingDecision(targets={PLANNER: 1, EXPLORER: 3}), state)
    assert actions.drain == ("p1",)  # the starting one goes before the one with work
    assert actions.release == ("p1",)  # nothing to finish: released now
    # 4 GPUs - p0 (1) - v0 still draining (2) = 1 free: one explorer now, two wait.
    assert actions.start == {EXPLORER: 1}
    assert actions.clamped == {EXPLORER: 2}


def test_reactive_keeps_a_model_warm_through_its_cooldown_then_scales_to_zero() -> None:
    reactive = ReactiveScaling()
    busy = ScalingInput(replicas=replicas(("p0", PLANNER, ReplicaPhase.READY, 4)), queued={PLANNER: 20},
                        gpu_budget=8, models={PLANNER: PROFILES[PLANNER]})  # fmt: skip
    assert reactive.tick(busy, now=0.0).targets[PLANNER] == 2  # 20 waiting / 5 per replica, capped at 2x
    idle = busy._replace(replicas=replicas(("p0", PLANNER, ReplicaPhase.READY, 0)), queued={})
    assert reactive.tick(idle, now=200.0).targets[PLANNER] >= 1  # stabilization + keep-alive
    # Past the 360 s cooldown, HPA's 300 s scale-down stabilization still remembers t=200.
    assert reactive.tick(idle, now=361.0).targets[PLANNER] == 1
    assert reactive.tick(idle, now=502.0).targets[PLANNER] == 0


def test_reactive_panics_on_a_doubling_within_the_panic_window() -> None:
    reactive = ReactiveScaling()
    one = replicas(("p0", PLANNER, ReplicaPhase.READY, 8))
    calm = ScalingInput(replicas=one, queued={PLANNER: 0}, gpu_budget=8, models={PLANNER: PROFILES[PLANNER]})
    for t in range(0, 181, 15):
        reactive.tick(calm, now=float(t))
    surge = calm._replace(queued={PLANNER: 40})
    decision = reactive.tick(surge, now=195.0)
    # Stable window: 40 waiting in 1 of 14 samples -> ~3 -> 1 replica; panic window (5 samples): 8 / 5 -> 2.
    assert decision.targets[PLANNER] == 2
    assert "panicking" in decision.reasons[PLANNER]


def test_the_kalman_predictor_is_constant_until_five_points_then_follows_a_trend() -> None:
    trend = LocalLinearTrend()
    trend.observe(0.0)  # leading idle zeros are skipped
    for value in (10.0, 12.0, 14.0):
        trend.observe(value)
    assert trend.predict() == 14.0
    for value in (16.0, 18.0, 20.0, 22.0, 24.0, 26.0):
        trend.observe(value)
    assert 26.0 < trend.predict() < 30.0


def test_predictive_sizes_replicas_by_littles_law_over_the_profile() -> None:
    profile = ModelProfile(EXPLORER, 1, calls_per_replica=10, startup_s=30.0,
                           prefill_tokens_per_s=1000.0, decode_step_s=0.05)  # fmt: skip
    predictive = PredictiveScaling(adjustment_interval_s=60.0)
    traffic = ModelTraffic()
    decisions = []
    for i in range(1, 7):  # 2 requests/s, 1000 input and 200 output tokens each
        traffic = ModelTraffic(120 * i, 120_000 * i, 120 * i, 24_000 * i)
        state = ScalingInput(replicas=(), queued={}, gpu_budget=16, models={EXPLORER: profile},
                             traffic={EXPLORER: traffic})  # fmt: skip
        decisions.append(predictive.tick(state, now=60.0 * i))
        assert predictive.tick(state, now=60.0 * i + 30).diagnostics["adjusted"] == 0.0
    # 2 req/s x (1 s prefill + 200 x 0.05 s decode) = 22 concurrent calls -> 3 replicas of 10.
    assert decisions[-1].targets[EXPLORER] == math.ceil(2.0 * 11.0 / 10)


replica_phases = st.sampled_from(list(ReplicaPhase))
replica_specs = st.lists(
    st.tuples(st.sampled_from([PLANNER, EXPLORER, VERIFIER]), replica_phases, st.integers(0, 40)), max_size=8
)


@settings(max_examples=150, deadline=None)
@given(
    specs=replica_specs,
    queued=st.dictionaries(st.sampled_from([PLANNER, EXPLORER, VERIFIER]), st.integers(0, 400)),
    fan_out=st.floats(0, 50),
    planners=st.integers(0, 60),
    budget=st.integers(2, 12),
)
def test_no_policy_plans_beyond_the_gpu_budget(
    specs: list[tuple[str, ReplicaPhase, int]],
    queued: dict[str, int],
    fan_out: float,
    planners: int,
    budget: int,
) -> None:
    """Whatever the state, what stays plus what starts fits the budget (draining GPUs count)."""
    reps = tuple(
        ReplicaState(f"r{i}", model, PROFILES[model].gpus_per_replica, running=running, phase=phase)
        for i, (model, phase, running) in enumerate(specs)
    )
    held = sum(r.gpus for r in reps)
    projection = (ProjectedCalls(1, "explorer", fan_out), ProjectedCalls(2, "verifier", 1.0))
    state = ScalingInput(reps, queued, budget, PROFILES, tuple(planner_call(i, projection) for i in range(planners)),
                         AGENT_MODELS, {m: ModelTraffic(n, 100 * n) for m, n in queued.items()})  # fmt: skip
    for name in SCALING_POLICIES:
        decision = SCALING_POLICIES.create(name).tick(state, now=0.0)
        actions = plan_actions(decision, state)
        released = sum(r.gpus for r in reps if r.replica_id in actions.release)
        started = sum(PROFILES[m].gpus_per_replica * n for m, n in actions.start.items())
        assert held - released + started <= max(budget, held - released), name
        assert all(n > 0 for n in actions.start.values())
        assert set(actions.release) <= {r.replica_id for r in reps}


def test_a_workflow_that_said_it_ends_is_not_remembered() -> None:
    last = ActiveCall("e9", EXPLORER, False, "research", "wf0", "explorer", "acme",
                      annotations=SysAnnotations(projection=(ProjectedCalls(1, "verifier", 1.0),)), workflow_end=True)  # fmt: skip
    state = ScalingInput(replicas=(), queued={}, gpu_budget=8, models=PROFILES, active=(last,),
                         agent_models=AGENT_MODELS)  # fmt: skip
    pythia = PythiaScaling()
    assert pythia.tick(state, now=0.0).targets[EXPLORER] == 1  # its own call still counts
    after = pythia.tick(state._replace(active=()), now=1.0)
    assert after.targets == {PLANNER: 0, EXPLORER: 0, VERIFIER: 0}


def test_in_a_full_cluster_scaling_one_model_up_drains_another() -> None:
    """Four GPUs all on the planner model, which has two calls left; 200 explorer calls wait.
    The planner keeps one replica, the others drain to make room, and explorers start as the
    drained GPUs free up (one is idle: released now, its GPU used at once)."""
    explorers = tuple(
        ActiveCall(f"e{i}", EXPLORER, True, "research", f"wf{i}", "explorer", "acme") for i in range(200)
    )
    planners = (planner_call(900, ()), planner_call(901, ()))
    state = ScalingInput(
        replicas=replicas(
            ("p0", PLANNER, ReplicaPhase.READY, 2),
            ("p1", PLANNER, ReplicaPhase.READY, 0),
            ("p2", PLANNER, ReplicaPhase.READY, 0),
            ("p3", PLANNER, ReplicaPhase.READY, 0),
        ),
        queued={EXPLORER: 200},
        gpu_budget=4,
        models=PROFILES,
        active=explorers + planners,
        agent_models=AGENT_MODELS,
    )
    decision = PythiaScaling().tick(state, now=0.0)
    assert decision.targets[PLANNER] == 1 and decision.targets[EXPLORER] == 3
    actions = plan_actions(decision, state)
    assert set(actions.drain) == {"p1", "p2", "p3"}  # the idle ones; p0 still serves its 2 calls
    assert set(actions.release) == {"p1", "p2", "p3"}
    assert actions.start == {EXPLORER: 3}
