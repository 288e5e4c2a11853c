"""Loops over alternatives learn their transitions: next agents and remaining steps inside a
generic loop depend on the last agent, and a generic loop never admits an empty run."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from clairvoyant.profiler.core.expr import Repeat, Seq, parse, to_text
from clairvoyant.profiler.core.path_automaton import transition_key
from clairvoyant.profiler.core.path_fitting import fit_weights
from clairvoyant.profiler.core.paths import PathModel
from clairvoyant.profiler.core.synthesis import SynthesisConfig, synthesize
from clairvoyant.profiler.core.trace import Step
from tests.profiler.generators import S, sample_word
from tests.profiler.strategies import expressions

pytestmark = pytest.mark.unit


def cycles(n: int, seed: int) -> list[list[Step]]:
    """a -> b -> c, repeated 1..5 times (uniformly): only c can end a run."""
    rng = np.random.default_rng(seed)
    return [[S("a"), S("b"), S("c")] * int(rng.integers(1, 6)) for _ in range(n)]


def test_next_agent_inside_a_generic_loop_follows_the_last_agent() -> None:
    data = cycles(300, seed=1)
    result = synthesize(data, config=SynthesisConfig(min_acceptance=1.01))  # force the fallback
    assert not result.structured and to_text(result.expr) == "(a | b | c){3,15} -> $"
    model, flat = PathModel(result.expr, result.weights), PathModel(result.expr)
    for prefix, expected in ((["a"], "b"), (["a", "b"], "c"), (["a", "b", "c"], "a")):
        assert flat.future_agents(flat.position(prefix)).agents[0][1] < 0.34  # a uniform choice
        nxt = model.future_agents(model.position(prefix))
        assert nxt.agents[0][0] == expected
        assert nxt.agents[0][1] > 0.75
    assert model.future_agents(model.position(["a"])).end_probability == 0.0  # below the bound
    # Only c ends a run: after one cycle P(end) is about P(1 cycle | >= 1) = 1/5, after two 1/4.
    after_one = model.future_agents(model.position(["a", "b", "c"])).end_probability
    after_two = model.future_agents(model.position(["a", "b", "c"] * 2)).end_probability
    assert after_one == pytest.approx(0.2, abs=0.04)
    assert after_two == pytest.approx(0.25, abs=0.05)


def test_expected_remaining_inside_a_generic_loop_matches_the_traces() -> None:
    data = cycles(400, seed=2)
    result = synthesize(data, config=SynthesisConfig(min_acceptance=1.01))
    model = PathModel(result.expr, result.weights)
    assert model.expected_remaining(model.start_position()).steps == pytest.approx(
        np.mean([len(t) for t in data]), rel=0.03
    )
    # Inside a cycle the rest is known to the step: after a -> b, c and then E[more cycles].
    after_ab = model.expected_remaining(model.position(["a", "b"])).steps
    after_abc = model.expected_remaining(model.position(["a", "b", "c"])).steps
    assert after_ab == pytest.approx(1.0 + after_abc, abs=0.05)
    remaining_after_first = [len(t) - 3 for t in data]
    assert after_abc == pytest.approx(np.mean(remaining_after_first), rel=0.1)


def test_transition_rows_are_fitted_frequencies() -> None:
    expr = parse("(a | b | c){3,15} -> $")
    weights = fit_weights(expr, cycles(200, seed=3))
    loop = (0,)
    assert weights[transition_key(loop, None)] == pytest.approx([1.0, 0.0, 0.0, 0.0])  # starts with a
    assert weights[transition_key(loop, 0)] == pytest.approx([0.0, 1.0, 0.0, 0.0])  # a -> b
    assert weights[transition_key(loop, 1)] == pytest.approx([0.0, 0.0, 1.0, 0.0])  # b -> c
    after_c = weights[transition_key(loop, 2)]  # c -> a or the end
    assert after_c[0] + after_c[3] == pytest.approx(1.0) and 0.2 < after_c[3] < 0.5
    assert all(0.99 < t < 1.0 for t in weights["0:trust"])
    assert fit_weights(expr, []).get(transition_key(loop, 0)) is None  # nothing seen: no rows


@settings(max_examples=60, deadline=None)
@given(expressions, st.integers(0, 2**32 - 1))
def test_fitted_transitions_never_change_the_language(expr: object, seed: int) -> None:
    rng = np.random.default_rng(seed)
    words = [sample_word(expr, rng) for _ in range(20)]
    model = PathModel(expr, fit_weights(expr, words))  # type: ignore[arg-type]
    flat = PathModel(expr)  # type: ignore[arg-type]
    for word in words:
        assert model.accepts(word)
        for cut in range(len(word)):
            assert model.accepts(word[:cut]) == flat.accepts(word[:cut])
    start = model.future_agents(model.start_position())
    assert sum(p for _, p in start.agents) + start.end_probability >= 1.0 - 1e-9


def test_a_generic_loop_never_admits_an_empty_run() -> None:
    """One session of 1 step among 40 of 6..20: the dominant-percentile widening of a singleton
    extreme (one mean spacing) would put the lower bound at 0."""
    rng = np.random.default_rng(5)
    agents = ["x", "y", "z"]
    data = [[S(str(rng.choice(agents))) for _ in range(int(rng.integers(6, 21)))] for _ in range(40)]
    data.append([S("x")])
    result = synthesize(data, config=SynthesisConfig(min_acceptance=1.01))
    loop = result.expr.items[0] if isinstance(result.expr, Seq) else result.expr
    assert isinstance(loop, Repeat) and loop.lo == 1
    model = PathModel(result.expr, result.weights)
    assert not model.accepts([])
    assert model.accepts([S("x")])
    assert model.future_agents(model.start_position()).end_probability == 0.0
