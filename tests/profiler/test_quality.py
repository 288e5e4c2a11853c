"""Prediction-quality fixes: the incremental trace of open instances, latched Kairos convergence on
output lengths and paths, dominant bounds widened only at singleton extremes, and the priority-ordering
metric's pair rules."""

from __future__ import annotations

import numpy as np
import pytest

from clairvoyant.profiler.core.paths import PathModel
from clairvoyant.profiler.core.profile import WorkflowProfile
from clairvoyant.profiler.core.profile_types import CallRecord
from clairvoyant.profiler.core.stats import ConvergenceTracker
from clairvoyant.profiler.core.synthesis import dominant_bounds
from clairvoyant.profiler.core.trace import IncrementalTrace, TraceCall, build_trace
from clairvoyant.profiler.evaluation.replay import _pair_accuracy, _Prediction
from tests.profiler.generators import listing1, timed_calls

pytestmark = pytest.mark.unit


def random_calls(rng: np.random.Generator, n: int) -> list[TraceCall]:
    """Overlapping calls with parents and upstream agents, so components merge and split."""
    calls: list[TraceCall] = []
    t = 0.0
    for i in range(n):
        t += float(rng.choice([0.0, 0.5, 1.0, 2.0]))
        parents = (calls[int(rng.integers(len(calls)))].request_id,) if calls and rng.random() < 0.4 else ()
        upstream = [None, "a", "b"][int(rng.integers(3))]
        duration = float(rng.choice([0.5, 1.0, 3.0, 6.0]))
        agent = "abc"[int(rng.integers(3))]
        calls.append(TraceCall(f"r{i}", agent, t, t + duration, 10, 10, upstream, parents))
    return calls


@pytest.mark.parametrize("order", ["end", "shuffled"])
def test_the_incremental_trace_equals_a_rebuilt_one_after_every_call(order: str) -> None:
    rng = np.random.default_rng(7)
    for trial in range(60):
        calls = random_calls(rng, int(rng.integers(1, 40)))
        arrival = sorted(calls, key=lambda c: c.end) if order == "end" else list(rng.permutation(calls))
        incremental = IncrementalTrace()
        for k, call in enumerate(arrival):
            before = list(incremental.steps)
            first_changed = incremental.add(call)
            rebuilt = build_trace("w", arrival[: k + 1])
            assert incremental.trace("w") == rebuilt, trial
            assert before[:first_changed] == list(rebuilt.steps[:first_changed])


def record(c: TraceCall, workflow_id: str, end: bool = False) -> CallRecord:
    return CallRecord(
        c.request_id,
        workflow_id,
        c.agent_id,
        c.start,
        c.end,
        c.prompt_tokens,
        c.output_tokens,
        workflow_end=end,
    )


def test_incremental_positions_equal_positions_from_a_rebuilt_trace() -> None:
    """Annotating an open instance after each record gives the annotation that a profile which
    rebuilds the trace and re-advances the model from the start would give."""
    rng = np.random.default_rng(3)
    profile = WorkflowProfile("t", "listing1")
    for i in range(40):
        calls = timed_calls(f"w{i}", listing1(rng), rng, start=i * 1000.0)
        for j, c in enumerate(calls):
            profile.ingest(record(c, f"w{i}", end=j == len(calls) - 1))
    assert profile.model is not None
    for i in range(40, 46):
        calls = timed_calls(f"w{i}", listing1(rng), rng, start=i * 1000.0)
        for c in sorted(calls, key=lambda c: c.end)[:-1]:
            profile.ingest(record(c, f"w{i}"))
            for agent in ("engineer", "reviewer", "explorer"):
                live = profile.predict(agent, f"w{i}")
                history = build_trace("x", profile._open[f"w{i}"].calls.values()).steps
                fresh = profile.predict(agent, None, history)
                assert live is not None and fresh is not None
                assert live.position == fresh.position
                assert live.remaining == fresh.remaining


def test_convergence_latches_once_a_doubling_check_passes() -> None:
    tracker = ConvergenceTracker()
    for workflow in range(1, 33):
        value = 10.0 if workflow <= 16 else 1000.0  # a heavy tail arrives after the 16 check
        for _ in range(4):
            tracker.add(value, workflow)
        tracker.check(workflow)
        if workflow == 16:
            assert tracker.converged and tracker.converged_at_workflows == 16 and tracker.converged_at_samples == 64
    assert tracker.distance is not None and tracker.distance > 0.1
    assert tracker.converged and tracker.converged_at_workflows == 16


def test_convergence_gates_on_lengths_and_paths_of_agents_with_5_percent_of_calls() -> None:
    """Workflow length grows run after run (3 to 48 steps) and so do service times (as a queue
    builds): neither gates.  Output lengths and the step after each agent are steady, so the
    profile converges; the rare agent "z" (1 call in 100+) is left out."""
    profile = WorkflowProfile("t", "varied")
    rng = np.random.default_rng(0)
    for i in range(16):
        n = 3 + 3 * i  # keeps growing: the workflow length never converges
        t = i * 1000.0
        for j in range(n):
            agent = "z" if (i, j) == (0, 0) else "ab"[j % 2]
            end = j == n - 1
            service = (1.0 + i) * (1.0 + 0.01 * float(rng.random()))  # slower in every later run
            c = TraceCall(f"w{i}-{j}", agent, t, t + service, 10, 10)
            profile.ingest(record(c, f"w{i}", end))
            t += service + 1.0
    assert not profile.steps_convergence.converged
    assert profile.agents["z"].calls == 1 and not profile.agents["z"].output_convergence.converged
    for agent in "ab":
        stats = profile.agents[agent]
        assert not stats.service_convergence.converged
        assert stats.output_convergence.converged and stats.path_convergence.converged
    assert profile.converged()


def test_lengths_or_a_path_that_keep_changing_keep_a_profile_unconverged() -> None:
    """32 runs of a -> (b or c) -> d.  Drifting output lengths of one agent, or the agent after "a"
    changing from b to c at run 13, fail every check (16 and 32) and hold the profile back."""

    def run(drifting_lengths: bool, switch_at: int) -> WorkflowProfile:
        profile = WorkflowProfile("t", "drift")
        for i in range(1, 33):
            middle = "b" if i < switch_at else "c"
            for j, agent in enumerate(("a", middle, "d")):
                tokens = 10 * i if drifting_lengths and agent == "d" else 10
                start = i * 1000.0 + 2.0 * j
                c = TraceCall(f"w{i}-{j}", agent, start, start + 1.0, 10, tokens)
                profile.ingest(record(c, f"w{i}", j == 2))
        return profile

    steady = run(drifting_lengths=False, switch_at=100)
    assert steady.converged()
    lengths = run(drifting_lengths=True, switch_at=100)
    d = lengths.agents["d"]
    assert not d.output_convergence.converged and d.path_convergence.converged
    assert not lengths.converged()
    path = run(drifting_lengths=False, switch_at=13)
    a = path.agents["a"]
    assert a.output_convergence.converged and not a.path_convergence.converged
    assert a.path_convergence.distance == pytest.approx(0.375)  # b in 12 of 16 runs, then in 12 of 32
    assert not path.converged()


def test_singleton_extremes_are_widened_by_one_mean_spacing() -> None:
    # 41 lengths 12..50, each extreme seen once: widened by ceil(38 / 40) = 1 on each side
    values = [12, *range(13, 50), 50, 20, 30]
    assert len(values) == 41
    assert dominant_bounds(values, 0.01) == (11, 51)
    # an extreme seen twice looks like a hard limit and stays
    assert dominant_bounds([*values, 50, 12], 0.01) == (12, 50)
    # 60 retries over {2, 3, 4}: unchanged (Pythia Listing 1's (engineer){2,4})
    assert dominant_bounds([2, 3, 4] * 20, 0.01) == (2, 4)
    # 100 samples or more: percentiles read off directly, the lone extremes dropped
    many = [5] + [10] * 199 + [40]
    assert dominant_bounds(many, 0.01) == (10, 10)
    assert dominant_bounds([1, 0, 7], 0.01) == (0, 11)  # spacing ceil(7 / 2) = 4, floored at 0


def test_widened_bounds_accept_one_more_count() -> None:
    from clairvoyant.profiler.core.synthesis import synthesize
    from clairvoyant.profiler.core.trace import Step

    data = [[Step.of("a")] * n for n in (2, 3, 3, 4, 4, 5, 5, 6, 6, 7)]  # 2 seen once, 7 once
    model: PathModel = PathModel(synthesize(data).expr)
    assert model.accepts([Step.of("a")] * 8) and model.accepts([Step.of("a")])
    assert not model.accepts([Step.of("a")] * 9)


def prediction(workflow: int, agent: str, key: float | None) -> _Prediction:
    return _Prediction(workflow, agent, key, {"k": key})


def test_pair_accuracy_counts_ties_and_missing_as_half_and_skips_equal_ends() -> None:
    ends = [10.0, 20.0, 30.0, 30.0]
    me = prediction(0, "a", 5.0)  # workflow 0 ends first: smaller key is right
    others = [prediction(1, "b", 9.0), prediction(2, "a", 5.0), prediction(3, "b", None)]
    assert _pair_accuracy(me, others, ends, lambda p: p.served) == pytest.approx((1.0 + 0.5 + 0.5) / 3)
    # only pairs with other agents: 1 right, 1 missing
    assert _pair_accuracy(me, others, ends, lambda p: p.served, cross_agent=True) == pytest.approx(0.75)
    # workflows 2 and 3 end together: no right order, the pair is skipped
    assert (
        _pair_accuracy(prediction(2, "a", 1.0), [prediction(3, "b", 2.0)], ends, lambda p: p.served) is None
    )
