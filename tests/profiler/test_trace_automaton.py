"""Trace reconstruction (Kairos sweep line) and the transition automaton."""

from __future__ import annotations

import numpy as np
import pytest

from clairvoyant.profiler.core.automaton import END, START, TransitionAutomaton, step_label
from clairvoyant.profiler.core.trace import TraceCall, build_trace
from tests.profiler.generators import S, listing1, timed_calls, traces

pytestmark = pytest.mark.unit


def call(rid: str, agent: str, start: float, end: float, **extra: object) -> TraceCall:
    return TraceCall(rid, agent, start, end, **extra)  # type: ignore[arg-type]


def test_overlapping_spans_form_one_parallel_step() -> None:
    calls = [
        call("1", "planner", 0, 2),
        call("2", "explorer", 3, 6),
        call("4", "explorer", 3.5, 8),
        call("3", "explorer", 3.2, 5),
        call("5", "engineer", 8, 9),  # starts exactly when the last explorer ends: sequential
        call("6", "reviewer", 9.5, 10),
    ]
    trace = build_trace("w", reversed(calls))
    assert trace.steps == (S("planner"), S("explorer", "explorer", "explorer"), S("engineer"), S("reviewer"))
    assert [c.request_id for c in trace.calls[1]] == ["2", "3", "4"]
    assert (trace.start, trace.end) == (0, 10)


def test_transitive_overlap_chains_into_one_group() -> None:
    trace = build_trace("w", [call("1", "a", 0, 2), call("2", "a", 1.5, 4), call("3", "a", 3.5, 5)])
    assert trace.steps == (S("a", "a", "a"),)


def test_parent_ids_split_a_trigger_from_what_it_triggered() -> None:
    """A streaming caller that triggers its callee before finishing overlaps it in time; the parent
    id says they are sequential (Kairos: spans alone would call them parallel)."""
    calls = [
        call("1", "router", 0, 5),
        call("2", "math", 3, 6, parent_request_ids=("1",)),
        call("3", "code", 3.1, 6.5, parent_request_ids=("1",)),
    ]
    assert build_trace("w", calls).steps == (S("router"), S("code", "math"))
    assert build_trace("w", [call("1", "router", 0, 5), call("2", "math", 3, 6)]).steps == (
        S("math", "router"),
    )


def test_upstream_agent_splits_like_a_parent() -> None:
    calls = [call("1", "router", 0, 5), call("2", "math", 3, 6, upstream_agent_id="router")]
    assert build_trace("w", calls).steps == (S("router"), S("math"))


def test_generated_timed_calls_reconstruct_their_steps() -> None:
    rng = np.random.default_rng(5)
    for steps in traces(listing1, 50, seed=5):
        assert list(build_trace("w", timed_calls("w", steps, rng)).steps) == steps


def test_automaton_counts_and_probabilities() -> None:
    data = [[S("a"), S("b"), S("b"), S("c")]] * 3 + [[S("a"), S("c")]]
    automaton = TransitionAutomaton.from_traces(data)
    assert automaton.counts[START] == {"a": 4}
    assert automaton.counts["b"] == {"b": 3, "c": 3}
    assert automaton.successors("a") == {"b": 0.75, "c": 0.25}
    assert automaton.states == ["a", "b", "c"]
    assert automaton.counts["c"] == {END: 4}
    assert step_label(S("b", "a", "a")) == "<a|b>"


def test_pruning_drops_transitions_seen_in_under_five_percent_of_traces() -> None:
    data = [[S("a"), S("b"), S("c")]] * 96 + [[S("a"), S("x"), S("c")]] * 4
    pruned = TransitionAutomaton.from_traces(data).pruned(0.05)
    assert "x" not in pruned.counts["a"]
    assert pruned.allows([S("a"), S("b"), S("c")])
    assert not pruned.allows([S("a"), S("x"), S("c")])
    # a long loop's exit is taken once per trace, so per-trace support keeps it
    loop = [[S("a"), *[S("b")] * 40, S("c")]] * 10
    assert TransitionAutomaton.from_traces(loop).pruned(0.05).allows(loop[0])


def test_markov_remaining_steps_from_the_fundamental_matrix() -> None:
    """a -> b, b loops with probability 1/2 (geometric), then c: E[steps after b] = 1 + 1 = 2."""
    automaton = TransitionAutomaton(
        counts={START: {"a": 10}, "a": {"b": 10}, "b": {"b": 10, "c": 10}, "c": {END: 10}}
    )
    remaining = automaton.expected_remaining_steps()
    assert remaining["b"] == pytest.approx(2.0)
    assert remaining["a"] == pytest.approx(3.0)
    assert remaining[START] == pytest.approx(4.0)
    state = automaton.to_state()
    assert TransitionAutomaton.from_state(state).expected_remaining_steps() == remaining
