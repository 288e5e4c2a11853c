"""Per-agent statistics, convergence, Kairos ranking and the confidence state machine."""

from __future__ import annotations

import numpy as np
import pytest

from clairvoyant.profiler.core import confidence as conf
from clairvoyant.profiler.core.confidence import ConfidenceConfig, ConfidenceState, Tier
from clairvoyant.profiler.core.ranking import classical_mds_1d, kairos_ranking
from clairvoyant.profiler.core.stats import ConvergenceTracker, LearnedAgentStats, Summary, wasserstein

pytestmark = pytest.mark.unit


def test_p99_bound_covers_held_out_lognormal_lengths() -> None:
    rng = np.random.default_rng(0)
    train, held_out = rng.lognormal(np.log(800), 0.6, 2000), rng.lognormal(np.log(800), 0.6, 5000)
    summary = Summary.of(list(train))
    assert summary is not None
    assert np.mean(held_out <= summary.p99) >= 0.97
    assert np.mean(held_out <= summary.p50) == pytest.approx(0.5, abs=0.03)
    assert summary.cv == pytest.approx(np.sqrt(np.exp(0.36) - 1), rel=0.1)


def test_high_cv_agent_uses_the_previous_call_of_the_same_agent() -> None:
    """Pythia Opportunity #2: consecutive calls of a high-CV agent are correlated."""
    rng = np.random.default_rng(1)
    stats = LearnedAgentStats("explorer")
    held: list[tuple[float, float]] = []
    for w in range(400):
        level = rng.lognormal(np.log(400), 1.3)  # per-workflow scale: high CV across workflows
        previous = None
        for _ in range(3):
            length = float(level * rng.lognormal(0, 0.15))
            if w >= 300 and previous is not None:
                held.append((previous, length))
            elif w < 300:
                stats.add_call(length, 1.0, 5.0, 0.2, previous, w + 1)
            previous = length
    summary = stats.summary()
    assert summary.output_len is not None and summary.output_len.cv > 1.0
    assert summary.length_model is not None and summary.length_model.correlation > 0.9
    conditional = [summary.length_interval(prev) for prev, _ in held]
    coverage = np.mean([y <= hi for (_, y), (_, hi) in zip(held, conditional, strict=True)])
    assert coverage >= 0.97
    width_conditional = np.median([hi for _, hi in conditional])
    assert width_conditional < summary.output_len.p99 / 3  # far tighter than the marginal bound
    assert summary.length_interval(None) == (summary.output_len.p50, summary.output_len.p99)


def test_low_cv_agent_has_no_conditional_model() -> None:
    rng = np.random.default_rng(2)
    stats = LearnedAgentStats("planner")
    previous = None
    for w in range(100):
        length = float(rng.normal(60, 9))
        stats.add_call(length, 0.5, 3.0, None, previous, w + 1)
        previous = length
    assert stats.summary().length_model is None


def test_wasserstein_distance() -> None:
    rng = np.random.default_rng(3)
    x = rng.normal(0, 1, 500)
    assert wasserstein(x, x + 3.0) == pytest.approx(3.0)
    assert wasserstein([0, 1], [0, 1]) == 0.0
    assert wasserstein([0.0], [2.0, 4.0]) == pytest.approx(3.0)


def test_convergence_is_checked_at_doublings_of_workflows_and_records_them() -> None:
    rng = np.random.default_rng(4)
    tracker = ConvergenceTracker(threshold=0.1)
    checks: list[tuple[int, float | None]] = []
    for workflow in range(1, 300):
        for _ in range(3):
            tracker.add(float(rng.lognormal(5, 0.5)), workflow)
        before = tracker.next_check
        tracker.check(workflow)
        if tracker.next_check != before:
            checks.append((workflow, tracker.distance))
    assert [n for n, _ in checks] == [8, 16, 32, 64, 128, 256]
    assert checks[0][1] is None  # nothing to compare with at the first checkpoint
    assert tracker.converged and tracker.converged_at_workflows in (16, 32, 64, 128, 256)
    assert tracker.converged_at_samples == 3 * tracker.converged_at_workflows
    assert tracker.upper is not None and tracker.distance is not None and tracker.upper >= tracker.distance
    drifting = ConvergenceTracker(threshold=0.1)
    for workflow in range(1, 300):
        drifting.add(float(workflow), workflow)  # keeps growing: never converges
        drifting.check(workflow)
    assert not drifting.converged and drifting.distance is not None and drifting.distance > 0.1


def test_kairos_rank_orders_agents_by_remaining_latency() -> None:
    rng = np.random.default_rng(5)
    remaining = {
        "verifier": rng.exponential(1.0, 400),
        "reviewer": rng.lognormal(np.log(8), 0.3, 400),
        "engineer": rng.lognormal(np.log(25), 0.4, 400),
        "explorer": rng.normal(60, 5, 400).clip(0),
        "planner": rng.normal(75, 8, 400).clip(0),
    }
    ranking = kairos_ranking(remaining)
    assert sorted(ranking.rank, key=ranking.rank.get) == [
        "verifier",
        "reviewer",
        "engineer",
        "explorer",
        "planner",
    ]
    assert all(ranking.coordinate[a] > 0 for a in remaining)
    assert kairos_ranking({}).rank == {}


def test_classical_mds_recovers_points_on_a_line() -> None:
    points = np.array([0.0, 1.0, 3.0, 7.0])
    axis = classical_mds_1d(np.abs(points[:, None] - points[None, :]))
    assert np.abs(axis - axis[0]) == pytest.approx(points)


CONFIG = ConfidenceConfig(min_instances=30, high_instances=60, acceptance_window=20, min_window=10)


def run(state: ConfidenceState, n: int, accepted: bool | None, converged: bool = True) -> ConfidenceState:
    for _ in range(n):
        state = conf.on_instance(state, accepted, converged, CONFIG)
    return state


def test_shadow_until_thirty_converged_instances_then_active() -> None:
    state = run(ConfidenceState(), 29, None)
    assert state.tier is Tier.SHADOW
    state = conf.on_synthesized(state, 1.0)
    assert run(state, 5, True, converged=False).tier is Tier.SHADOW  # enough instances, not converged
    state = run(state, 1, True)
    assert state.tier is Tier.LOW and state.instances == 30
    state = run(state, 30, True)
    assert state.tier is Tier.HIGH  # 60 instances, recent acceptance 100%


def test_acceptance_drop_sends_an_active_workflow_back_to_shadow() -> None:
    state = run(conf.on_synthesized(run(ConfidenceState(), 30, None), 0.97), 40, True)
    assert state.tier is Tier.HIGH
    state = run(state, 2, False)
    assert state.tier is Tier.LOW  # 18/20 = 0.9 < 0.95
    state = run(state, 1, False)
    assert state.tier is Tier.LOW  # 17/20 = 0.85, not below 0.97 - 0.15
    state = run(state, 1, False)
    assert state.tier is Tier.SHADOW and "acceptance dropped" in state.reason
    assert state.instances == 0
    state = run(state, 29, True)
    assert state.tier is Tier.SHADOW
    assert run(state, 1, True).tier is Tier.LOW


def test_a_new_workflow_version_resets_to_shadow() -> None:
    state, reset = conf.on_version(ConfidenceState(), "v1")
    assert not reset and state.version == "v1"
    state = run(conf.on_synthesized(state, 1.0), 70, True)
    assert state.tier is Tier.HIGH
    same, reset = conf.on_version(state, "v1")
    assert same is state and not reset
    state, reset = conf.on_version(state, "v2")
    assert reset and state.tier is Tier.SHADOW and state.version == "v2" and state.total_instances == 0
    assert ConfidenceState.from_state(state.to_state()) == state
