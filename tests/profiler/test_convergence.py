"""Convergence counted in closed workflows, decided on a bootstrap upper bound, latched, and
restorable from states saved when checks were counted in samples."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from clairvoyant.profiler.core.profile_types import ProfileConfig
from clairvoyant.profiler.core.stats import (
    DEFAULT_CONVERGENCE_THRESHOLD,
    FIRST_CHECK,
    ConvergenceTracker,
    LearnedAgentStats,
    compare_halves,
)
from clairvoyant.profiler.core.trace import TraceCall, build_trace
from clairvoyant.profiler.core.workload_stats import LearnedWorkloadStats
from clairvoyant.profiler.evaluation.cli import main, workflows_to_converge
from clairvoyant.profiler.evaluation.data import load_workflows
from clairvoyant.profiler.evaluation.replay import replay

pytestmark = pytest.mark.unit


def clustered_workflows(seed: int, workflows: int, calls: int = 4) -> list[list[float]]:
    """Service times whose workflows differ (a per-workflow factor): the distance between the first
    n and the first 2n workflows hovers around 0.1 for n up to ~100."""
    rng = np.random.default_rng(seed)
    return [list(np.exp(rng.normal(0, 0.6)) * rng.lognormal(0, 0.8, calls)) for _ in range(workflows)]


def feed(tracker: ConvergenceTracker, workflows: list[list[float]]) -> list[tuple[int, float, bool]]:
    """(workflows, observed distance, converged) at each comparison."""
    checks = []
    for number, values in enumerate(workflows, 1):
        for value in values:
            tracker.add(value, number)
        due = tracker.next_check
        tracker.check(number)
        if tracker.next_check != due and tracker.distance is not None:
            checks.append((number, tracker.distance, tracker.converged))
    return checks


def test_a_distance_hovering_around_the_threshold_does_not_flip_the_decision() -> None:
    """Four orders of the same 128 workflows: the observed distance falls below the threshold at
    some checks and rises above it at later ones (a point test would pass by luck and then fail),
    while the bootstrap bound keeps the decision at "not converged" at every check, in every order."""
    base = clustered_workflows(0, 128)
    point_flips = 0
    for order_seed in range(100, 104):
        order = np.random.default_rng(order_seed).permutation(len(base))
        checks = feed(ConvergenceTracker(), [base[i] for i in order])
        assert [n for n, _, _ in checks] == [16, 32, 64, 128]
        passes = [d <= DEFAULT_CONVERGENCE_THRESHOLD for _, d, _ in checks]
        point_flips += any(a and not b for a, b in zip(passes, passes[1:], strict=False))
        assert [converged for _, _, converged in checks] == [False] * 4
    assert point_flips >= 1  # the data really does hover


def test_the_bound_is_deterministic_and_order_free_within_a_side() -> None:
    rng = np.random.default_rng(1)
    values = rng.lognormal(0, 1, 400)
    labels = np.repeat(np.arange(1, 101), 4)
    first = compare_halves(values, labels, 50, 0.9)
    again = compare_halves(values.copy(), labels.copy(), 50, 0.9)
    assert first is not None and first == again
    assert first.upper >= first.distance
    # Too few workflows on one side: no decision.
    assert compare_halves(values[:8], labels[:8], 1, 0.9) is None


def test_convergence_happens_at_a_workflow_count_not_a_call_count() -> None:
    """40 calls per workflow from one tight distribution: a check counted in calls would pass at
    16 calls (inside the first workflow); counted in workflows it passes at the first comparison,
    16 workflows (640 calls), and not before."""
    stats = LearnedAgentStats("coder")
    rng = np.random.default_rng(2)
    for workflow in range(1, 40):
        for _ in range(40):
            stats.add_call(100.0, 1.0 + 0.01 * float(rng.random()), 5.0, 0.1, None, workflow)
        stats.check_convergence(workflow)
        assert stats.service_convergence.converged == (workflow >= 2 * FIRST_CHECK)
    assert stats.service_convergence.converged_at_workflows == 16
    assert stats.service_convergence.converged_at_samples == 640


def test_agents_absent_from_a_workflow_are_still_checked_on_its_count() -> None:
    """A profile-level test: agent "a" is not in the 16th workflow, yet its checks run then."""
    stats = LearnedWorkloadStats(max_traces=100)
    for number in range(1, 17):
        agents = "ab" if number < 16 else "b"
        calls = [
            TraceCall(f"{number}-{k}", agent, 2.0 * k, 2.0 * k + 1.0, 10, 10)
            for k, agent in enumerate(agents)
        ]
        stats.observe(build_trace(f"w{number}", calls), number)
    a = stats.agents["a"]
    for tracker in (a.output_convergence, a.path_convergence, a.service_convergence):
        assert tracker.converged_at_workflows == 16
    assert stats.converged()


def test_a_pass_latches() -> None:
    tracker = ConvergenceTracker()
    feed(tracker, [[10.0] * 4 for _ in range(16)])
    assert tracker.converged and tracker.converged_at_workflows == 16
    replay_from = [[10.0] * 4 for _ in range(16)] + [[1000.0] * 4 for _ in range(16)]
    for number, values in enumerate(replay_from[16:], 17):  # a heavy tail arrives: the 32 check fails
        for value in values:
            tracker.add(value, number)
        tracker.check(number)
    assert tracker.distance is not None and tracker.distance > DEFAULT_CONVERGENCE_THRESHOLD
    assert tracker.converged and tracker.converged_at_workflows == 16


def test_state_round_trips_and_old_states_load() -> None:
    tracker = ConvergenceTracker()
    feed(tracker, clustered_workflows(3, 40))
    again = ConvergenceTracker.from_state(tracker.to_state())
    assert again == tracker
    for number in range(41, 70):  # the restored tracker goes on exactly as the original
        for t in (tracker, again):
            t.add(float(number % 7), number)
            t.check(number)
    assert again == tracker
    # Saved when checks were counted in samples: no last_check, no reservoir; a pass stays.
    old = {
        "threshold": 0.1,
        "next_check": 4096,
        "previous": [1.0] * 200,
        "distance": 0.05,
        "converged": True,
        "converged_at_samples": 2048,
        "converged_at_workflows": 40,
    }
    restored = ConvergenceTracker.from_state(old)
    assert restored.converged and restored.converged_at_workflows == 40
    assert restored.next_check == FIRST_CHECK and restored.reservoir == [] and restored.last_check is None
    restored.check(100)  # catches up: records, compares at the next doubling
    assert (restored.last_check, restored.next_check) == (100, 128)
    unconverged = ConvergenceTracker.from_state({**old, "converged": False, "converged_at_workflows": None})
    feed(unconverged, [[10.0] * 4 for _ in range(32)])
    assert unconverged.converged and unconverged.converged_at_workflows == 16


def test_the_convergence_command_agrees_with_the_replay(tmp_path: Path) -> None:
    """``convergence`` folds workflows in the order ``replay`` closes them: same count."""
    workflows = load_workflows("workload:webarena", seed=1, limit=24, hash_tokens=0)
    assert replay(workflows, 0.3, ProfileConfig())["workflows_to_converge"] == 16
    assert workflows_to_converge(workflows, ProfileConfig().max_traces) == (16, 24)
    out = tmp_path / "table.json"
    args = [
        "convergence",
        "--data",
        "workload:webarena",
        "--seeds",
        "1,2",
        "--limit",
        "24",
        "--out",
        str(out),
    ]
    assert main(args) == 0
    table = json.loads(out.read_text())
    assert [row["seed"] for row in table["seeds"]] == [1, 2]
    assert table["seeds"][0] == {"seed": 1, "workflows": 24, "workflows_to_converge": 16}


def old_format(tracker_state: dict[str, object]) -> dict[str, object]:
    """A tracker state as saved when checks were counted in samples."""
    kept = (
        "threshold",
        "next_check",
        "distance",
        "converged",
        "converged_at_samples",
        "converged_at_workflows",
    )
    return {**{k: tracker_state[k] for k in kept}, "next_check": 4096, "previous": [1.0] * 200}


def test_workload_stats_saved_by_the_old_code_load_and_go_on_learning() -> None:
    stats = LearnedWorkloadStats(max_traces=100)
    traces = [
        build_trace(
            f"w{n}", [TraceCall(f"{n}-{k}", "ab"[k % 2], 2.0 * k, 2.0 * k + 1.0, 10, 10) for k in range(4)]
        )
        for n in range(1, 41)
    ]
    for number, trace in enumerate(traces[:10], 1):
        stats.observe(trace, number)
    state = stats.to_state()
    for name in ("steps_convergence", "duration_convergence"):
        state[name] = old_format(state[name])
    for agent in state["agents"].values():
        for name in ("output_convergence", "service_convergence"):
            agent[name] = old_format(agent[name])
    restored = LearnedWorkloadStats.from_state(state, max_traces=100)
    assert not restored.converged()
    for number, trace in enumerate(traces[10:], 11):
        restored.observe(trace, number)
    # The schedule restarts: 11 is recorded; at 16 only workflow 11 lies before the split (the old
    # state held no samples), so no decision; at 32 workflows 11-16 against 11-32 pass.
    assert restored.agents["a"].service_convergence.converged_at_workflows == 32
    assert restored.converged()
