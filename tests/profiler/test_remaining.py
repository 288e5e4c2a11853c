"""The remaining-work model (core/remaining.py): progress features, exact fitting, Gittins ranks."""

from __future__ import annotations

import json

import numpy as np
import pytest

from clairvoyant.profiler.core.profile import CallRecord, WorkflowProfile
from clairvoyant.profiler.core.remaining import (
    RemainingConfig,
    RemainingModel,
    fit,
    gittins_index,
    samples,
)
from clairvoyant.profiler.core.trace import TraceCall, WorkflowTrace, build_trace


def call(rid: str, agent: str, start: float, end: float, prompt: int = 100, output: int = 10) -> TraceCall:
    return TraceCall(rid, agent, start, end, prompt, output)


def test_samples_see_only_the_calls_that_had_ended() -> None:
    trace = build_trace(
        "w",
        [
            call("a", "plan", 0.0, 2.0, output=5),
            call("b", "work", 3.0, 6.0, output=7),
            call("c", "work", 3.5, 5.0, output=9),  # parallel with b: one step
            call("d", "check", 8.0, 9.0, prompt=400),
        ],
    )
    rows = {p.agent + str(p.calls): (p, seconds, steps) for p, seconds, steps in samples(trace)}
    first, seconds, steps = rows["plan0"]
    assert (first.previous, first.steps, first.elapsed_s, first.idle_s) == (None, 0, 0.0, 0.0)
    assert seconds == 7.0 and steps == 2.0  # ends at 9; the work step and the check follow
    # b and c start after a ended and before each other ended: both see a only
    works = [r for r in samples(trace) if r[0].agent == "work"]
    assert [(p.counts, p.previous, p.elapsed_s, p.idle_s, p.steps) for p, _, _ in works] == [
        ({"plan": 1}, "plan", 3.0, 1.0, 1),
        ({"plan": 1}, "plan", 3.5, 1.5, 1),
    ]
    check, seconds, steps = rows["check3"]
    assert check.counts == {"plan": 1, "work": 2}
    assert check.previous == "work"  # b ended last (at 6)
    assert check.service_s == pytest.approx(2.0 + 3.0 + 1.5)
    assert check.output_tokens == 5 + 7 + 9 and check.prompt_tokens == 400
    assert (check.elapsed_s, check.idle_s, check.steps) == (8.0, 2.0, 2)
    assert (seconds, steps) == (0.0, 0.0)


def _chain(wid: str, agents: list[str], durations: list[float], gap: float = 1.0) -> WorkflowTrace:
    calls, t = [], 0.0
    for i, (agent, d) in enumerate(zip(agents, durations, strict=True)):
        calls.append(call(f"{wid}-{i}", agent, t, t + d))
        t += d + gap
    return build_trace(wid, calls)


def test_agents_added_later_give_the_same_fit_as_knowing_them_all() -> None:
    """Growing the statistics by a column block is exact: the fit equals a direct least squares on
    the final feature matrix."""
    rng = np.random.default_rng(0)
    traces = []
    for i in range(30):
        agents = ["plan"] + ["work"] * int(rng.integers(1, 6)) + (["fix"] if i >= 10 else []) + ["end"]
        traces.append(_chain(f"w{i}", agents, list(rng.uniform(0.5, 3.0, len(agents)))))
    config = RemainingConfig(forgetting=1.0, ridge=1e-9, min_instances=1)
    model = fit(traces, config)
    assert model.agents == ["plan", "work", "end", "fix"]
    rows = [row for trace in traces for row in samples(trace)]
    x = np.stack([model.features(p) for p, _, _ in rows])
    y = np.log1p(np.array([[s, k] for _, s, k in rows]))
    np.testing.assert_allclose(model.xtx, x.T @ x, rtol=1e-9, atol=1e-9)
    np.testing.assert_allclose(model.xty, x.T @ y, rtol=1e-9, atol=1e-9)
    used = np.abs(x).sum(axis=0) > 0  # columns no sample uses are left at 0 by the ridge
    direct = np.linalg.lstsq(x[:, used], y, rcond=None)[0]
    assert model.beta is not None
    np.testing.assert_allclose(x[:, used] @ model.beta[used], x[:, used] @ direct, atol=1e-5)


def test_the_model_ranks_by_what_the_progress_shows() -> None:
    """The first agent says how long the run will be; the model must rank by it."""
    rng = np.random.default_rng(1)
    traces = []
    for i in range(60):
        short = i % 2 == 0
        n = int(rng.integers(2, 4)) if short else int(rng.integers(10, 14))
        agents = ["triage_quick" if short else "triage_deep"] + ["work"] * n
        traces.append(_chain(f"w{i}", agents, [1.0] * len(agents)))
    model = fit(traces, RemainingConfig())
    quick = _chain("q", ["triage_quick", "work", "work", "work"], [1.0] * 4)
    deep = _chain("d", ["triage_deep", "work", "work", "work"], [1.0] * 4)
    at_quick = [p for p, _, _ in samples(quick)][1]  # the first work call of each
    at_deep = [p for p, _, _ in samples(deep)][1]
    q, d = model.predict(at_quick), model.predict(at_deep)
    assert q is not None and d is not None
    assert q.mean_s < d.mean_s and q.steps < d.steps and q.gittins > d.gittins
    # the quick runs have ~1.5 more work calls after the first (2 s each), the deep ones ~10.5
    assert q.mean_s == pytest.approx(3.0, abs=1.5)
    assert d.mean_s == pytest.approx(21.0, rel=0.25)


def test_gittins_index_of_known_distributions() -> None:
    assert gittins_index([4.0, 4.0, 4.0]) == pytest.approx(0.25)  # deterministic: 1 / size
    # {1, 9} with equal chances: serve for 1 s, done half the time: 0.5 / 1 beats 1 / 5
    assert gittins_index([1.0, 9.0]) == pytest.approx(0.5)
    # brute force over every quantum on a random sample
    rng = np.random.default_rng(2)
    work = rng.lognormal(0.0, 1.0, 200)
    grid = np.linspace(0.01, work.max(), 20_000)
    brute = max(np.mean(work <= q) / np.mean(np.minimum(work, q)) for q in grid)
    assert gittins_index(work) == pytest.approx(brute, rel=1e-3)
    assert gittins_index(work) >= brute


def test_learning_is_bounded_in_history() -> None:
    """One instance costs O(d^2) whatever came before: the statistics and the windows stay the
    same size however many instances are learned."""
    rng = np.random.default_rng(3)
    config = RemainingConfig(residual_window=256, min_instances=1)
    model = RemainingModel(config)
    sizes = []
    for i in range(400):
        agents = ["plan"] + ["work"] * int(rng.integers(1, 8))
        model.observe(_chain(f"w{i}", agents, list(rng.uniform(0.5, 2.0, len(agents)))))
        model.refit()
        if i in (99, 399):
            state = model.to_state()
            stored = sum(len(v) for v in state["residuals"].values()) + len(state["steps_residuals"])
            sizes.append((model.xtx.shape, len(model.residuals[""].values), stored))
    assert sizes[0][0] == sizes[1][0] and sizes[0][1] == sizes[1][1] == 256
    assert sizes[1][2] <= 4 * 256  # the pools of everything, plan, work, and the steps


def test_more_agents_than_slots_share_the_other_slot() -> None:
    model = fit(
        [_chain(f"w{i}", [f"expert_{i}", "review"], [1.0, 1.0]) for i in range(12)],
        RemainingConfig(max_agents=4, min_instances=1),
    )
    assert len(model.agents) == 4 and model.dimension == 1 + 7 + 3 * 5
    unseen = [p for p, _, _ in samples(_chain("u", ["expert_99", "review"], [1.0, 1.0]))][0]
    assert model.predict(unseen) is not None


def _records(trace: WorkflowTrace, last: bool = True) -> list[CallRecord]:
    calls = sorted(trace.all_calls(), key=lambda c: c.end)
    return [
        CallRecord(c.request_id, trace.workflow_id, c.agent_id, c.start, c.end, c.prompt_tokens,
                   c.output_tokens, workflow_end=last and c is calls[-1])
        for c in calls
    ]


def test_profile_serves_the_model_and_survives_a_round_trip() -> None:
    rng = np.random.default_rng(4)
    profile = WorkflowProfile("t", "loop")
    t0 = 0.0
    for i in range(40):
        n = int(rng.integers(1, 12))
        trace = _chain(f"w{i}", ["plan"] + ["work"] * n, [1.0] * (n + 1))
        shifted = [call(c.request_id, c.agent_id, c.start + t0, c.end + t0) for c in trace.all_calls()]
        for r in _records(build_trace(trace.workflow_id, shifted)):
            profile.ingest(r)
        t0 += 100.0
    live = [call(f"live-{i}", a, t0 + 2.0 * i, t0 + 2.0 * i + 1.0) for i, a in enumerate(["plan", "work"])]
    for r in _records(build_trace("live", live), last=False):
        profile.ingest(r)
    work = profile.predict_remaining("work", "live", 100, now=t0 + 4.0)
    assert work is not None and work.mean_s > 0 and work.gittins > 0
    annotation = profile.annotate("work", "live", 100, now=t0 + 4.0)
    assert annotation.remaining_gittins_index == pytest.approx(work.gittins)
    assert profile.remaining_time_source in ("work", "path")
    restored = WorkflowProfile.from_state(json.loads(json.dumps(profile.to_state())))
    assert restored.predict_remaining("work", "live", 100, now=t0 + 4.0) == work
    assert restored.remaining_time_source == profile.remaining_time_source


def _feed(profile: WorkflowProfile, traces: list[WorkflowTrace]) -> None:
    t0 = 0.0
    for trace in traces:
        shifted = [call(c.request_id, c.agent_id, c.start + t0, c.end + t0) for c in trace.all_calls()]
        for r in _records(build_trace(trace.workflow_id, shifted)):
            profile.ingest(r)
        t0 += 1000.0


def test_the_path_model_is_served_where_the_structure_says_it_all() -> None:
    """A fixed chain at fixed speeds: the path model's remaining time is exact, so it is served."""
    profile = WorkflowProfile("t", "chain")
    _feed(profile, [_chain(f"w{i}", ["plan", "code", "test", "ship"], [2.0, 5.0, 3.0, 1.0]) for i in range(60)])
    assert profile.remaining_time_source == "path"
    assert profile.path_errors and max(profile.path_errors) < 1e-6


def test_the_progress_model_is_served_where_the_progress_tells_more() -> None:
    """Same chain, but each instance runs at its own speed (a slow or a fast model or tool): the
    elapsed time tells the speed, which the path model's mean times cannot."""
    rng = np.random.default_rng(5)
    traces = []
    for i in range(80):
        speed = float(rng.choice([0.5, 4.0]))
        traces.append(_chain(f"w{i}", ["plan", "code", "test", "ship"], [speed * d for d in (2.0, 5.0, 3.0, 1.0)], gap=speed))
    profile = WorkflowProfile("t", "chain")
    _feed(profile, traces)
    assert profile.remaining_time_source == "work"
    work = sum(profile.work_errors) / len(profile.work_errors)
    path = sum(profile.path_errors) / len(profile.path_errors)
    assert work < 0.75 * path
