"""Path models: acceptance, positions, look-ahead, fitted weights."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from clairvoyant.profiler.core.expr import parse
from clairvoyant.profiler.core.path_fitting import fit_weights
from clairvoyant.profiler.core.paths import (
    MAX_BELIEF_STATES,
    PathModel,
    accepts,
    expected_remaining,
    future_agents,
    project,
)
from clairvoyant.profiler.core.trace import Step
from tests.profiler.generators import S, listing1, sample_word, traces
from tests.profiler.strategies import expressions

pytestmark = pytest.mark.unit


@settings(max_examples=150, deadline=None)
@given(expressions, st.integers(0, 2**32 - 1))
def test_sampled_words_are_accepted_and_foreign_steps_are_not(expr: object, seed: int) -> None:
    rng = np.random.default_rng(seed)
    for _ in range(5):
        word = sample_word(expr, rng)
        assert accepts(expr, word)  # type: ignore[arg-type]
        assert not accepts(expr, [*word, S("zz-unknown")])  # type: ignore[arg-type]
        assert not accepts(expr, [S("zz-unknown"), *word])  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("text", "word", "ok"),
    [
        ("a -> (b){2,3} -> c", ["a", "b", "b", "c"], True),
        ("a -> (b){2,3} -> c", ["a", "b", "c"], False),
        ("a -> (b){2,3} -> c", ["a", "b", "b", "b", "b", "c"], False),
        ("a -> <b>{2,3} -> c", ["a", ("b", "b"), "c"], True),
        ("a -> <b>{2,3} -> c", ["a", "b", "b", "c"], False),  # sequential, not parallel
        ("a -> <b>{1,3} -> c", ["a", "b", "c"], True),  # a width-1 fan-out is a plain step
        ("a -> <b | d>{2,2} -> c", ["a", ("d", "b"), "c"], True),
        ("a -> (b -> c)? -> d", ["a", "d"], True),
        ("a -> (b -> c)? -> d", ["a", "b", "d"], False),
        ("(a -> $ | b) -> c", ["a"], True),
        ("(a -> $ | b) -> c", ["a", "c"], False),
        ("(a -> $ | b) -> c", ["b", "c"], True),
        ("a -> $", [], False),
        ("((a)?){0,2}", [], True),
    ],
)
def test_acceptance_examples(text: str, word: list, ok: bool) -> None:
    assert accepts(parse(text), word) is ok


def test_expected_remaining_matches_the_fundamental_matrix() -> None:
    """a -> (b){1,3} -> (c)? -> d with P(count = 1, 2, 3) = .5, .3, .2 and P(c) = .6, against the
    absorbing Markov chain over a, b1, b2, b3, c, d: t = (I - Q)^-1 1."""
    expr = parse("a -> (b){1,3} -> (c)? -> d")
    model = PathModel(expr, {"1:rep": [0.5, 0.3, 0.2], "2:opt": [0.4, 0.6]})
    states = ["a", "b1", "b2", "b3", "c", "d"]
    q = np.zeros((6, 6))
    ix = {s: i for i, s in enumerate(states)}

    def edge(u: str, v: str, p: float) -> None:
        q[ix[u], ix[v]] += p

    edge("a", "b1", 1.0)
    edge("b1", "b2", 0.5)
    for u, p_stop in (("b1", 0.5), ("b2", 0.6), ("b3", 1.0)):
        edge(u, "c", p_stop * 0.6)
        edge(u, "d", p_stop * 0.4)
    edge("b2", "b3", 0.4)
    edge("c", "d", 1.0)
    visits = np.linalg.solve(np.eye(6) - q, np.ones(6))
    remaining = visits - 1.0  # steps after the current one
    assert model.expected_remaining(model.position([])).steps == pytest.approx(visits[0])
    for prefix, state in (
        (["a"], "a"),
        (["a", "b"], "b1"),
        (["a", "b", "b"], "b2"),
        (["a", "b", "b", "b"], "b3"),
        (["a", "b", "c"], "c"),
    ):
        assert model.expected_remaining(model.position(prefix)).steps == pytest.approx(remaining[ix[state]])


def test_expected_remaining_time_uses_service_and_gap() -> None:
    expr = parse("a -> <b>{2,4} -> c")
    service = {"a": 1.0, "b": 4.0, "c": 2.0}
    gaps = {"a": 0.5, "b": 0.25, "c": 0.0}
    at_a = expected_remaining(expr, ["a"], service, gaps)
    assert at_a.steps == pytest.approx(2.0)
    assert at_a.time_s == pytest.approx((4.0 + 0.25) + (2.0 + 0.0))  # a parallel step costs its slowest call
    assert expected_remaining(expr, []).time_s is None


@pytest.mark.parametrize(
    "text",
    ["a -> (b){1,4} -> (c | d -> e) -> f", "(a -> (b)?){2,3} -> <c | d>{1,3} -> $", "(a | b -> $){1,3} -> c"],
)
def test_expected_steps_match_monte_carlo(text: str) -> None:
    expr = parse(text)
    rng = np.random.default_rng(7)
    lengths = [len(sample_word(expr, rng)) for _ in range(20_000)]
    assert expected_remaining(expr, []).steps == pytest.approx(np.mean(lengths), rel=0.02)


def test_future_agents_and_projection() -> None:
    expr = parse("planner -> <explorer>{2,4} -> (engineer){1,2} -> (reviewer | verifier)")
    nxt = future_agents(expr, ["planner"])
    assert nxt.agents == (("explorer", 1.0),)
    assert nxt.end_probability == 0.0
    nxt = future_agents(expr, ["planner", ("explorer",) * 3, "engineer"])
    assert dict(nxt.agents) == pytest.approx({"engineer": 0.5, "reviewer": 0.25, "verifier": 0.25})
    assert future_agents(expr, ["planner", ("explorer",) * 3, "engineer", "verifier"]).end_probability == 1.0
    # Alg. 4: within 2 steps of the planner, 3 explorers (uniform width 2..4) and one engineer
    assert project(expr, ["planner"], 2) == pytest.approx({"explorer": 3.0, "engineer": 1.0})
    assert project(expr, ["planner"], 1) == pytest.approx({"explorer": 3.0})
    assert project(expr, ["planner"], 10) == pytest.approx(
        {"explorer": 3.0, "engineer": 1.5, "reviewer": 0.5, "verifier": 0.5}
    )


def test_residual_expression_is_the_rest_of_the_path() -> None:
    model = PathModel(parse("a -> (b){2,4} -> c -> $"))
    assert model.residual(model.position([])) == "a -> (b){2,4} -> c -> $"
    assert model.residual(model.position(["a", "b"])) == "(b){1,3} -> c -> $"
    assert model.residual(model.position(["a", "b", "b", "b"])) == "(b)? -> c -> $"
    assert model.residual(model.position(["a", "b", "b", "b", "b", "c"])) == "$"


def test_a_position_off_the_path_is_re_anchored_on_the_last_step() -> None:
    model = PathModel(parse("a -> b -> c -> d"))
    position = model.position(["a", "c"])  # b skipped
    assert not position.on_path
    assert model.future_agents(position).agents == (("d", 1.0),)
    assert model.position(["a", "b"]).on_path


def test_fitted_weights_follow_the_traces() -> None:
    expr = parse(
        "planner -> <explorer>{3,4} -> (engineer){3,6} -> reviewer -> ((engineer){2,4} -> reviewer)? -> verifier -> $"
    )
    data = traces(listing1, 400, seed=3)
    weights = fit_weights(expr, data)
    p_skip, p_take = weights["4:opt"]
    reworked = np.mean([sum(s == S("reviewer") for s in t) == 2 for t in data])
    assert p_take == pytest.approx(reworked, abs=0.01)
    assert weights["2:rep"] == pytest.approx([0.25] * 4, abs=0.06)
    model = PathModel(expr, weights)
    empirical = np.mean([len(t) for t in data])
    assert model.expected_remaining(model.position([])).steps == pytest.approx(empirical, rel=0.02)


def test_step_helpers() -> None:
    assert Step.of("b", "a").agents == ("a", "b")
    assert str(Step.of("b", "a")) == "{a, b}"
    with pytest.raises(ValueError):
        Step.of()


def test_a_re_anchored_position_keeps_its_most_likely_states_only() -> None:
    """Off the path, every count of (a){1,200} can emit the step: the belief keeps the
    MAX_BELIEF_STATES likeliest, renormalised, so queries cost a bounded amount per step."""
    model = PathModel(parse("b -> (a){1,200} -> c"))
    position = model.position(["a"])  # b skipped: re-anchored
    assert not position.on_path
    assert len(position.belief) == MAX_BELIEF_STATES
    assert sum(w for _, w in position.belief) == pytest.approx(1.0)
    weights = [w for _, w in position.belief]
    assert weights == sorted(weights, reverse=True)
    nxt = model.future_agents(position)
    assert [a for a, _ in nxt.agents] == ["a", "c"]
