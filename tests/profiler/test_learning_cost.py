"""The work of one re-learning is bounded by the distinct traces it has not derived before, not by
the history: counted in derivations and Viterbi cells (``FitWork``), never in seconds."""

from __future__ import annotations

from collections import deque

import numpy as np
import pytest

from clairvoyant.profiler.core.expr import parse, to_text
from clairvoyant.profiler.core.path_fitting import DerivationCache, FitWork, fit, fit_weights, shapes_of
from clairvoyant.profiler.core.synthesis import synthesize
from clairvoyant.profiler.core.trace import Step
from tests.profiler.generators import EXPECTED, S, listing1, traces

pytestmark = pytest.mark.unit


def relearnings(data: list[list[Step]], every: int, window: int, cache: DerivationCache) -> list[FitWork]:
    """The work of each re-learning when ``data`` arrives one trace at a time and a profile
    re-learns over its window every ``every`` traces."""
    recent: deque[list[Step]] = deque(maxlen=window)
    work = []
    for i, trace in enumerate(data, 1):
        recent.append(trace)
        if i % every == 0:
            work.append(synthesize(list(recent), cache=cache).work)
    return work


def test_four_times_the_history_does_not_grow_one_relearning() -> None:
    """Listing 1 has 32 distinct traces; the window holds all the history (2,000 traces), so only
    the deduplication and the cache can keep a re-learning's work flat."""
    short = traces(listing1, 100, seed=21)
    long = traces(listing1, 400, seed=21)
    cold_short = synthesize(short, cache=DerivationCache()).work
    cold_long = synthesize(long, cache=DerivationCache()).work
    assert cold_long.traces == 4 * cold_short.traces
    distinct = len(shapes_of(long))
    assert distinct <= 32
    assert cold_long.derived <= 2 * distinct  # acceptance and fitting share one derivation per trace
    assert cold_long.cells <= 1.5 * cold_short.cells  # 4x the traces, not 4x the work
    # Derived again with the history kept: every trace is known, nothing is derived.
    cache = DerivationCache()
    synthesize(short, cache=cache)
    warm = synthesize(long, cache=cache).work
    assert to_text(synthesize(long, cache=cache).expr) == EXPECTED[listing1]
    assert warm.derived <= distinct - len(shapes_of(short))
    assert warm.cells <= cold_short.cells


def test_relearning_work_stays_bounded_as_a_profile_keeps_learning() -> None:
    data = traces(listing1, 800, seed=22)
    work = relearnings(data, every=20, window=2000, cache=DerivationCache())
    early = max(w.cells for w in work[:5])  # up to 100 traces
    late = max(w.cells for w in work[20:])  # from 400 on
    assert [w.traces for w in work[:3]] == [20, 40, 60]
    assert late <= early
    assert sum(w.derived for w in work[20:]) <= 32


def test_duplicate_traces_are_fitted_once_with_their_count() -> None:
    expr = parse("a -> (b){1,3} -> (c)? -> $")
    words = [[S("a"), S("b"), S("c")], [S("a"), S("b"), S("b")], [S("a"), S("b"), S("b"), S("b"), S("c")]]
    data = [words[0]] * 30 + [words[1]] * 20 + [words[2]] * 10
    result = fit(expr, shapes_of(data), cache=DerivationCache())
    assert result.work.traces == 60 and result.work.shapes == 3 and result.work.derived == 3
    assert result.accepted == 60
    assert result.weights == fit_weights(expr, data)
    assert result.weights["1:rep"] == pytest.approx(np.array([30.5, 20.5, 10.5]) / 61.5)
    assert result.weights["2:opt"] == pytest.approx([20.5 / 61, 40.5 / 61])


def test_only_ambiguous_traces_are_derived_again_under_the_fitted_choices() -> None:
    """(a){1,3} -> (a)? splits a run of two a's two ways; the unambiguous runs of one and four are
    final after the first round."""
    expr = parse("(a){1,3} -> (a)? -> $")
    data = [[S("a")] * 2] * 5 + [[S("a")] * 4] * 5 + [[S("a")]] * 5
    result = fit(expr, shapes_of(data), rounds=2, cache=DerivationCache())
    assert result.work.derived == 3 + 1


def test_the_cache_is_bounded() -> None:
    cache = DerivationCache(max_expressions=2, max_shapes=5)
    work = FitWork()
    data = traces(listing1, 60, seed=23)
    expressions = [parse(EXPECTED[listing1]), parse("(planner | explorer | engineer){1,40} -> $")]
    for expr in expressions:
        for trace in data:
            cache.derive(expr, tuple(trace), work)
    assert len(cache.entry(expressions[1])[1]) == 5
    cache.derive(parse("a -> $"), (S("a"),), work)
    cache.derive(expressions[1], tuple(data[-1]), work)
    derived = work.derived
    cache.derive(expressions[0], tuple(data[-1]), work)  # evicted with its expression: derived again
    assert work.derived == derived + 1
