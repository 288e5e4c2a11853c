"""Synthesis recovers known structures from generated traces, and falls back when it cannot."""

from __future__ import annotations

import numpy as np
import pytest

from clairvoyant.profiler.core.automaton import TransitionAutomaton
from clairvoyant.profiler.core.expr import to_text
from clairvoyant.profiler.core.paths import PathModel
from clairvoyant.profiler.core.synthesis import SynthesisConfig, dominant_bounds, synthesize
from clairvoyant.profiler.core.trace import Step
from tests.profiler.generators import EXPECTED, S, listing1, traces

pytestmark = pytest.mark.unit


@pytest.mark.parametrize("generator", list(EXPECTED), ids=lambda g: g.__name__)
def test_recovers_the_generating_structure(generator: object) -> None:
    data = traces(generator, 300, seed=11)  # type: ignore[arg-type]
    result = synthesize(data)
    assert to_text(result.expr) == EXPECTED[generator]  # type: ignore[index]
    assert result.structured
    assert result.acceptance == 1.0


@pytest.mark.parametrize("generator", list(EXPECTED), ids=lambda g: g.__name__)
def test_recovers_the_structure_through_rare_noise(generator: object) -> None:
    """3% of traces take an anomalous path (Pythia's chaotic error-recovery loops): they are pruned."""
    rng = np.random.default_rng(12)
    data = traces(generator, 400, seed=12)  # type: ignore[arg-type]
    for i in rng.choice(len(data), size=12, replace=False):
        noisy = list(data[i])
        noisy.insert(int(rng.integers(1, len(noisy))), S("error_handler"))
        data[i] = noisy
    result = synthesize(data)
    assert to_text(result.expr) == EXPECTED[generator]  # type: ignore[index]
    assert result.acceptance == pytest.approx(0.97)
    assert result.dominant_traces == 388


def test_alternatives_from_branching() -> None:
    rng = np.random.default_rng(2)
    data = [
        [S("router"), S(str(rng.choice(["math", "code", "search"], p=[0.5, 0.3, 0.2]))), S("answer")]
        for _ in range(300)
    ]
    assert to_text(synthesize(data).expr) == "router -> (math | code | search) -> answer -> $"


def test_bounds_are_dominant_percentiles_not_extremes() -> None:
    rng = np.random.default_rng(4)
    data = [[S("a"), *[S("b")] * int(min(rng.geometric(0.3), 60)), S("c")] for _ in range(1000)]
    runs = [len(t) - 2 for t in data]
    expr = to_text(synthesize(data).expr)
    lo, hi = dominant_bounds(runs, 0.01)
    assert expr == f"a -> (b){{{lo},{hi}}} -> c -> $"
    assert hi < max(runs)
    assert np.mean([r <= hi for r in runs]) >= 0.99


def test_dominant_bounds() -> None:
    assert dominant_bounds([1] * 50 + [2] * 50, 0.01) == (1, 2)
    assert dominant_bounds([1] + [2] * 98 + [9], 0.02) == (2, 2)  # each tail holds 1% < 2%
    assert dominant_bounds([1] + [2] * 98 + [9], 0.01) == (1, 9)  # 1% is not < 1%: kept
    assert dominant_bounds([5], 0.5) == (5, 5)


def test_irreducible_workflows_fall_back_to_a_generic_loop_accepting_95_percent() -> None:
    """A free-form group chat: a random, fully connected Markov chain over 6 agents."""
    rng = np.random.default_rng(9)
    agents = ["ceo", "cto", "coder", "tester", "reviewer", "writer"]
    matrix = rng.dirichlet(np.ones(len(agents)), size=len(agents))
    data: list[list[Step]] = []
    for _ in range(300):
        at = int(rng.integers(len(agents)))
        steps = [S(agents[at])]
        while rng.random() > 0.08:
            at = int(rng.choice(len(agents), p=matrix[at]))
            steps.append(S(agents[at]))
        data.append(steps)
    result = synthesize(data)
    # one strongly connected region with no single header: a generic loop over every agent
    assert result.acceptance >= 0.95
    held_out = PathModel(result.expr)
    rng2 = np.random.default_rng(10)
    assert np.mean([held_out.accepts(data[int(i)]) for i in rng2.integers(0, 300, 100)]) >= 0.95
    assert to_text(result.expr).startswith("(ceo | coder | cto | reviewer | tester | writer){")


def test_generic_loop_covers_fan_outs() -> None:
    rng = np.random.default_rng(3)
    data = [
        [
            S(*["w"] * int(rng.integers(1, 4))) if rng.random() < 0.3 else S(str(rng.choice(["x", "y", "z"])))
            for _ in range(int(rng.integers(3, 12)))
        ]
        for _ in range(200)
    ]
    result = synthesize(data, config=SynthesisConfig(min_acceptance=1.0))
    assert result.acceptance >= 0.95
    assert (
        to_text(result.expr) == "(<w>{2,3} | w | x | y | z){3,11} -> $"
    )  # a one-call "group" is a plain step


def test_whole_trace_fallback_when_the_structure_accepts_too_little() -> None:
    data = traces(listing1, 200, seed=1)
    result = synthesize(data, config=SynthesisConfig(min_acceptance=1.01))
    assert not result.structured
    assert result.acceptance >= 0.95
    text = to_text(result.expr)
    assert text.startswith("(<explorer>{3,4} | engineer | planner | reviewer | verifier){")


def test_a_structure_that_does_not_generalise_is_kept_as_the_candidate_only() -> None:
    data = traces(listing1, 200, seed=1)
    result = synthesize(data, generalizes=False)
    assert not result.structured and result.candidate is not None
    assert to_text(result.candidate) == EXPECTED[listing1]  # what would have been served
    assert to_text(result.expr).startswith("(<explorer>{3,4} | engineer | planner | reviewer | verifier){")
    assert result.acceptance >= 0.95
    assert synthesize(data).candidate is None


def test_synthesis_uses_the_given_automaton_for_pruning() -> None:
    data = traces(listing1, 200, seed=1)
    automaton = TransitionAutomaton.from_traces(data)
    assert to_text(synthesize(data, automaton).expr) == EXPECTED[listing1]
