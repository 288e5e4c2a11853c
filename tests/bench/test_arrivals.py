"""Arrival processes: rates, burstiness, cron batches, closed loop and the Azure replay."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from clairvoyant.bench.arrivals import (
    ARRIVALS,
    ArrivalProcess,
    ClosedLoop,
    Replay,
    azure_replay,
    bursty,
    closed_loop,
    cron,
    merge,
    parse_arrivals,
    poisson,
)
from clairvoyant.bench.workloads import WorkloadDataError
from clairvoyant.workloads.data import DATA_DIR_ENV

pytestmark = pytest.mark.unit


def gaps_cv(times: np.ndarray) -> float:
    gaps = np.diff(times)
    return float(gaps.std() / gaps.mean())


def azure(kind: str, scale: float = 1.0) -> Replay:
    try:
        return azure_replay(kind, scale)  # type: ignore[arg-type]
    except WorkloadDataError as exc:
        pytest.skip(str(exc))


def test_registry_and_protocol() -> None:
    assert ARRIVALS.names() == ["azure_replay", "bursty", "closed_loop", "cron", "poisson"]
    for process in (poisson(1.0), bursty(1.0, 2.0), cron(60, 5), closed_loop(4), merge(poisson(1.0))):
        assert isinstance(process, ArrivalProcess)
    assert ARRIVALS.create("bursty", rate=2.0, cv=3.0) == bursty(2.0, 3.0)


def test_poisson_rate_and_cv() -> None:
    times = poisson(5.0).times(np.random.default_rng(0), count=20_000)
    assert len(times) == 20_000 and np.all(np.diff(times) >= 0)
    assert 1 / np.diff(times).mean() == pytest.approx(5.0, rel=0.03)
    assert gaps_cv(times) == pytest.approx(1.0, abs=0.03)
    within = poisson(5.0).times(np.random.default_rng(1), horizon_s=1000.0)
    assert within.max() < 1000.0 and len(within) == pytest.approx(5000, rel=0.05)


@pytest.mark.parametrize("cv", [0.0, 0.5, 2.0, 4.0])
def test_bursty_hits_the_chosen_cv(cv: float) -> None:
    times = bursty(2.0, cv).times(np.random.default_rng(2), count=50_000)
    assert 1 / np.diff(times).mean() == pytest.approx(2.0, rel=0.05)
    assert gaps_cv(times) == pytest.approx(cv, rel=0.08, abs=0.01)


def test_cron_batches_arrive_together() -> None:
    times = cron(60.0, 25).times(np.random.default_rng(3), horizon_s=300.0)
    assert len(times) == 5 * 25
    assert np.array_equal(np.unique(times), [0.0, 60.0, 120.0, 180.0, 240.0])
    jittered = cron(60.0, 25, offset_s=10.0, jitter_s=5.0).times(np.random.default_rng(3), count=60)
    assert len(jittered) == 60 and jittered.min() >= 10.0
    batch_of = np.floor((jittered - 10.0) / 60.0)
    assert list(np.bincount(batch_of.astype(int))) == [25, 25, 10]
    assert np.all((jittered - 10.0) % 60.0 <= 5.0)


def test_closed_loop_is_a_marker_for_the_driver() -> None:
    process = closed_loop(8, think_time_s=2.0)
    assert isinstance(process, ClosedLoop)
    assert list(process.times(np.random.default_rng(0), count=100)) == [0.0] * 8
    assert len(process.times(np.random.default_rng(0), count=3)) == 3
    assert process.next_arrival(12.5) == 14.5


def test_merge_keeps_the_first_count_of_the_union() -> None:
    background, spikes = poisson(1.0), cron(30.0, 10)
    union = merge(background, spikes).times(np.random.default_rng(4), horizon_s=120.0)
    assert np.all(np.diff(union) >= 0)
    assert np.sum(union == 30.0) == 10 and np.sum(union == 90.0) == 10
    first = merge(background, spikes).times(np.random.default_rng(4), count=50)
    assert len(first) == 50


def test_same_seed_same_arrivals() -> None:
    for process in (poisson(3.0), bursty(3.0, 2.0), cron(10, 3, jitter_s=1.0)):
        a = process.times(np.random.default_rng(9), count=100)
        b = process.times(np.random.default_rng(9), count=100)
        assert np.array_equal(a, b)


def test_limits_are_required() -> None:
    with pytest.raises(ValueError, match="count or horizon_s"):
        poisson(1.0).times(np.random.default_rng(0))
    with pytest.raises(ValueError):
        bursty(0.0, 1.0)


def test_azure_replay_reproduces_the_trace_burstiness() -> None:
    code, conv = azure("code"), azure("conv")
    assert len(code.offsets_s) == 8819 and len(conv.offsets_s) == 19366  # data README
    assert code.duration_s / 60 == pytest.approx(57, abs=1)
    one_pass = code.times(np.random.default_rng(0), count=8819)
    assert gaps_cv(one_pass) == pytest.approx(13, rel=0.05)  # "very bursty, inter-arrival CV 13"
    assert gaps_cv(conv.times(np.random.default_rng(0), count=19366)) == pytest.approx(1.1, rel=0.05)


def test_azure_replay_is_scaled() -> None:
    base, fast = azure("conv"), azure("conv", scale=4.0)
    rng = np.random.default_rng(0)
    original = base.times(rng, count=1000)
    assert np.allclose(fast.times(rng, count=1000), original / 4.0)
    hour = base.times(rng, horizon_s=600.0)
    assert len(fast.times(rng, horizon_s=150.0)) == len(hour)  # 4x the rate, same shape
    # Past the end of the recording it starts over.
    twice = fast.times(rng, count=2 * 19366)
    assert len(twice) == 2 * 19366 and np.all(np.diff(twice) >= 0)
    assert twice[19366] == pytest.approx(fast.duration_s)


def test_azure_replay_without_data_names_the_path(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(DATA_DIR_ENV, str(tmp_path))
    with pytest.raises(WorkloadDataError, match="AzureLLMInferenceTrace_code.csv"):
        azure_replay("code")


@pytest.mark.parametrize(
    ("spec", "expected"),
    [
        ("poisson:rate=2", poisson(2.0)),
        ("bursty:rate=0.5,cv=4", bursty(0.5, 4.0)),
        (" cron:period_s=60, batch=32 ,jitter_s=5", cron(60.0, 32, jitter_s=5.0)),
        ("poisson:rate=0.2+cron:period_s=300,batch=40", merge(poisson(0.2), cron(300.0, 40))),
    ],
)
def test_parse_arrivals_builds_the_named_process(spec: str, expected: ArrivalProcess) -> None:
    parsed = parse_arrivals(spec)
    assert parsed == expected
    rng = np.random.default_rng(3)
    assert np.array_equal(parsed.times(rng, count=50), expected.times(np.random.default_rng(3), count=50))


@pytest.mark.parametrize(
    ("spec", "message"),
    [
        ("nope:rate=1", "unknown arrival process 'nope'; choose one of: azure_replay, bursty, closed_loop, cron, poisson"),
        ("bursty:rate=1", "bursty: missing cv; it takes rate, cv"),
        ("bursty:rate=1,cv=2,shape=3", "bursty: unknown parameter 'shape'; it takes rate, cv"),
        ("bursty:rate=fast,cv=2", "bursty: rate must be a number, got 'fast'"),
        ("bursty:rate=inf,cv=2", "bursty: rate must be finite"),
        ("bursty:rate=-1,cv=2", "bursty: rate must be > 0"),
        ("bursty:rate=1,rate=2,cv=1", "bursty: rate given twice"),
        ("bursty:rate", "bursty: expected param=value, got 'rate'"),
        ("cron:period_s=60,batch=2.5", "cron: batch must be an integer, got '2.5'"),
        ("azure_replay:kind=chat", "azure_replay: kind must be one of code, conv, got 'chat'"),
        ("closed_loop:concurrency=4", "give --concurrency instead"),
        ("poisson:rate=1+", "empty arrival process"),
    ],
)
def test_parse_arrivals_says_what_is_wrong(spec: str, message: str) -> None:
    with pytest.raises(ValueError) as caught:
        parse_arrivals(spec)
    assert message in str(caught.value)
