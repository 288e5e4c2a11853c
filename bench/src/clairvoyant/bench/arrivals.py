"""Arrival processes: when workflows start.

Every process answers ``times(rng, count=..., horizon_s=...)``: non-decreasing arrival times in
seconds from 0, either the first ``count`` or all before ``horizon_s`` (with both, whichever ends
first).  Randomness comes only from the injected ``numpy.random.Generator``.

- ``poisson(rate)``: exponential inter-arrivals (CV 1).
- ``bursty(rate, cv)``: gamma inter-arrivals with the given CV (Pythia §7.3 sweeps 0, 1, >1).
- ``cron(period_s, batch)``: ``batch`` workflows at once every ``period_s`` (Pythia §2.2 Challenge #3:
  batched cron jobs spike a model's requests by up to 50.3% within a minute), optionally spread over
  ``jitter_s``.
- ``closed_loop(concurrency)``: a marker: ``concurrency`` workflows start at 0 and the driver starts
  a new one whenever one completes (``next_arrival``).
- ``azure_replay(kind, scale)``: the timestamps of the Azure LLM inference trace 2023 (``code``:
  bursty, inter-arrival CV ~13; ``conv``: CV ~1.1), sped up ``scale`` times (or to a mean ``rate``).
- ``merge(*processes)``: their union, e.g. a Poisson background plus cron spikes.

``parse_arrivals`` reads one from text (the CLI's ``--arrivals``): a registered name and its
parameters by name, processes joined by ``+`` for their union::

    bursty:rate=0.5,cv=4
    azure_replay:kind=code,scale=20
    poisson:rate=0.2+cron:period_s=300,batch=40,jitter_s=10
"""

from __future__ import annotations

import csv
import inspect
import math
import typing
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import date
from functools import lru_cache
from typing import Any, Literal, Protocol, runtime_checkable

import numpy as np

from clairvoyant.core.registry import Registry
from clairvoyant.workloads.data import require


@runtime_checkable
class ArrivalProcess(Protocol):
    @property
    def name(self) -> str: ...

    def times(
        self, rng: np.random.Generator, *, count: int | None = None, horizon_s: float | None = None
    ) -> np.ndarray:
        """Arrival times (seconds, non-decreasing, from 0): the first ``count`` and/or those before
        ``horizon_s``; at least one of the two must be given."""
        ...


def _check_limits(count: int | None, horizon_s: float | None) -> None:
    if count is None and horizon_s is None:
        raise ValueError("give count or horizon_s (or both)")
    if count is not None and count < 0:
        raise ValueError("count must be >= 0")
    if horizon_s is not None and horizon_s < 0:
        raise ValueError("horizon_s must be >= 0")


def _renewal(
    draw: Callable[[int], np.ndarray], mean_gap: float, count: int | None, horizon_s: float | None
) -> np.ndarray:
    """Cumulative sums of i.i.d. gaps, drawn in chunks until count / horizon is covered."""
    _check_limits(count, horizon_s)
    chunks: list[np.ndarray] = []
    total, last = 0, 0.0
    while True:
        if count is not None and total >= count:
            break
        if horizon_s is not None and last >= horizon_s:
            break
        want = (count - total) if count is not None else int(horizon_s / mean_gap * 1.1) + 16  # type: ignore[operator]
        gaps = draw(max(want, 16))
        arrivals = last + np.cumsum(gaps)
        chunks.append(arrivals)
        total += len(arrivals)
        last = float(arrivals[-1])
    out = np.concatenate(chunks) if chunks else np.empty(0)
    return _limit(out, count, horizon_s)


def _limit(times: np.ndarray, count: int | None, horizon_s: float | None) -> np.ndarray:
    if horizon_s is not None:
        times = times[times < horizon_s]
    if count is not None:
        times = times[:count]
    return times


@dataclass(frozen=True)
class Poisson:
    rate: float  # arrivals per second
    name: str = field(default="poisson", init=False)

    def __post_init__(self) -> None:
        if not self.rate > 0:
            raise ValueError("rate must be > 0")

    def times(
        self, rng: np.random.Generator, *, count: int | None = None, horizon_s: float | None = None
    ) -> np.ndarray:
        return _renewal(lambda n: rng.exponential(1.0 / self.rate, n), 1.0 / self.rate, count, horizon_s)


@dataclass(frozen=True)
class Bursty:
    """Gamma inter-arrivals with mean 1/rate and coefficient of variation ``cv`` (0: evenly spaced,
    1: Poisson, > 1: bursts separated by lulls)."""

    rate: float
    cv: float
    name: str = field(default="bursty", init=False)

    def __post_init__(self) -> None:
        if not self.rate > 0 or self.cv < 0:
            raise ValueError("rate must be > 0 and cv >= 0")

    def times(
        self, rng: np.random.Generator, *, count: int | None = None, horizon_s: float | None = None
    ) -> np.ndarray:
        mean_gap = 1.0 / self.rate
        if self.cv == 0:
            return _renewal(lambda n: np.full(n, mean_gap), mean_gap, count, horizon_s)
        shape = 1.0 / (self.cv * self.cv)
        return _renewal(lambda n: rng.gamma(shape, mean_gap / shape, n), mean_gap, count, horizon_s)


@dataclass(frozen=True)
class Cron:
    """``batch`` arrivals every ``period_s`` starting at ``offset_s``, each batch spread uniformly over
    ``jitter_s`` (0: all at the same instant)."""

    period_s: float
    batch: int
    offset_s: float = 0.0
    jitter_s: float = 0.0
    name: str = field(default="cron", init=False)

    def __post_init__(self) -> None:
        if (
            not self.period_s > 0
            or self.batch < 1
            or self.offset_s < 0
            or not 0 <= self.jitter_s <= self.period_s
        ):
            raise ValueError("need period_s > 0, batch >= 1, offset_s >= 0 and 0 <= jitter_s <= period_s")

    def times(
        self, rng: np.random.Generator, *, count: int | None = None, horizon_s: float | None = None
    ) -> np.ndarray:
        _check_limits(count, horizon_s)
        batches = math.ceil(count / self.batch) if count is not None else 0
        if horizon_s is not None:
            within = max(0, math.ceil((horizon_s - self.offset_s) / self.period_s))
            batches = within if count is None else min(batches, within)
        starts = self.offset_s + self.period_s * np.repeat(np.arange(batches), self.batch)
        spread = rng.uniform(0.0, self.jitter_s, len(starts)) if self.jitter_s else np.zeros(len(starts))
        return _limit(np.sort(starts + spread), count, horizon_s)


@dataclass(frozen=True)
class ClosedLoop:
    """Marker for closed-loop load: ``concurrency`` workflows in flight at all times.  ``times``
    gives the initial ones (all at 0); the driver calls ``next_arrival`` when a workflow completes."""

    concurrency: int
    think_time_s: float = 0.0  # pause between a completion and the next start
    name: str = field(default="closed_loop", init=False)

    def __post_init__(self) -> None:
        if self.concurrency < 1 or self.think_time_s < 0:
            raise ValueError("concurrency must be >= 1 and think_time_s >= 0")

    def times(
        self, rng: np.random.Generator, *, count: int | None = None, horizon_s: float | None = None
    ) -> np.ndarray:
        _check_limits(count, horizon_s)
        initial = self.concurrency if count is None else min(count, self.concurrency)
        return np.zeros(0 if horizon_s == 0 else initial)

    def next_arrival(self, completed_at_s: float) -> float:
        return completed_at_s + self.think_time_s


@dataclass(frozen=True)
class Replay:
    """Recorded arrival times (seconds from the first), sped up ``scale`` times.  Past the end of the
    recording it starts over, one mean gap after the last arrival."""

    offsets_s: np.ndarray = field(repr=False, compare=False)
    scale: float = 1.0
    name: str = "replay"

    def __post_init__(self) -> None:
        if not self.scale > 0 or len(self.offsets_s) == 0:
            raise ValueError("scale must be > 0 and the recording non-empty")

    @property
    def duration_s(self) -> float:
        """Length of one pass of the recording, after scaling (the wrap-around period)."""
        raw = self.offsets_s
        mean_gap = float(raw[-1] - raw[0]) / max(len(raw) - 1, 1)
        return (float(raw[-1] - raw[0]) + mean_gap) / self.scale

    @property
    def mean_rate(self) -> float:
        """Arrivals per second over one pass, after scaling."""
        return len(self.offsets_s) / self.duration_s

    def times(
        self, rng: np.random.Generator, *, count: int | None = None, horizon_s: float | None = None
    ) -> np.ndarray:
        _check_limits(count, horizon_s)
        one = (self.offsets_s - self.offsets_s[0]) / self.scale
        needed = []  # passes over the recording each limit needs; the tighter one suffices
        if count is not None:
            needed.append(max(1, math.ceil(count / len(one))))
        if horizon_s is not None:
            needed.append(max(1, math.ceil(horizon_s / self.duration_s)))
        out = np.concatenate([one + k * self.duration_s for k in range(min(needed))])
        return _limit(out, count, horizon_s)


@dataclass(frozen=True)
class Merged:
    processes: tuple[ArrivalProcess, ...]
    name: str = field(default="merge", init=False)

    def times(
        self, rng: np.random.Generator, *, count: int | None = None, horizon_s: float | None = None
    ) -> np.ndarray:
        _check_limits(count, horizon_s)
        # Each stream's first `count` include every one of its arrivals among the union's first `count`.
        parts = [p.times(rng, count=count, horizon_s=horizon_s) for p in self.processes]
        return _limit(np.sort(np.concatenate(parts)), count, horizon_s)


# ---------------------------------------------------------------------------------------------------
# Factories and the registry

ARRIVALS: Registry[ArrivalProcess] = Registry("arrival process")


@ARRIVALS.register("poisson")
def poisson(rate: float) -> Poisson:
    return Poisson(rate)


@ARRIVALS.register("bursty")
def bursty(rate: float, cv: float) -> Bursty:
    return Bursty(rate, cv)


@ARRIVALS.register("cron")
def cron(period_s: float, batch: int, offset_s: float = 0.0, jitter_s: float = 0.0) -> Cron:
    return Cron(period_s, batch, offset_s, jitter_s)


@ARRIVALS.register("closed_loop")
def closed_loop(concurrency: int, think_time_s: float = 0.0) -> ClosedLoop:
    return ClosedLoop(concurrency, think_time_s)


AZURE_TRACES = {
    "code": "azure_llm_2023/AzureLLMInferenceTrace_code.csv",
    "conv": "azure_llm_2023/AzureLLMInferenceTrace_conv.csv",
}


@ARRIVALS.register("azure_replay")
def azure_replay(kind: Literal["code", "conv"] = "code", scale: float = 1.0, rate: float = 0.0) -> Replay:
    """The Azure LLM inference trace 2023 (code: 8,819 requests in ~57 min; conv: 19,366), its time
    axis divided by ``scale`` (scale 2 = twice the rate, same burstiness).  ``rate`` > 0 instead
    picks the scale whose mean rate is ``rate`` arrivals per second."""
    if kind not in AZURE_TRACES:
        raise ValueError(f"kind must be one of {sorted(AZURE_TRACES)}")
    if rate < 0 or (rate > 0 and scale != 1.0):
        raise ValueError(f"give scale or a positive rate, not both (scale {scale:g}, rate {rate:g})")
    path = require(AZURE_TRACES[kind], f"azure_replay({kind!r})")
    offsets = _azure_offsets(str(path))
    if rate > 0:
        scale = rate / Replay(offsets).mean_rate
    return Replay(offsets, scale, name=f"azure_{kind}")


def merge(*processes: ArrivalProcess) -> Merged:
    return Merged(tuple(processes))


@lru_cache(maxsize=4)
def _azure_offsets(path: str) -> np.ndarray:
    """Seconds since the first request; TIMESTAMP is 'YYYY-MM-DD HH:MM:SS.fffffff' (7 digits)."""
    seconds: list[float] = []
    with open(path, newline="") as f:
        for row in csv.DictReader(f):
            day, clock = row["TIMESTAMP"].split(" ")
            hours, minutes, secs = clock.split(":")
            days = date.fromisoformat(day).toordinal()
            seconds.append(days * 86400.0 + int(hours) * 3600.0 + int(minutes) * 60.0 + float(secs))
    offsets = np.sort(np.asarray(seconds))
    offsets -= offsets[0]
    offsets.flags.writeable = False  # shared by every Replay built from the cache
    return offsets


def parse_arrivals(spec: str) -> ArrivalProcess:
    """An arrival process from text: ``name[:param=value,...]``, several joined by ``+`` (``merge``).
    Raises ValueError saying what is wrong: an unknown process or parameter, a missing or
    ill-typed value, or a value the process refuses."""
    parts = [_parse_one(part.strip()) for part in spec.split("+")]
    return parts[0] if len(parts) == 1 else merge(*parts)


def _parse_one(spec: str) -> ArrivalProcess:
    name, _, params = spec.partition(":")
    if not name:
        raise ValueError(f"empty arrival process in {spec!r}; write name[:param=value,...]")
    if name == "closed_loop":
        raise ValueError("closed_loop is not a timestamp process: give --concurrency instead")
    factory = ARRIVALS.factory(name)
    signature = inspect.signature(factory)
    hints = typing.get_type_hints(factory)
    takes = ", ".join(signature.parameters)
    kwargs: dict[str, Any] = {}
    for item in filter(None, (p.strip() for p in params.split(","))):
        key, equals, text = item.partition("=")
        key = key.strip()
        if not equals:
            raise ValueError(f"{name}: expected param=value, got {item!r}; it takes {takes}")
        if key not in signature.parameters:
            raise ValueError(f"{name}: unknown parameter {key!r}; it takes {takes}")
        if key in kwargs:
            raise ValueError(f"{name}: {key} given twice")
        kwargs[key] = _value(name, key, text.strip(), hints[key])
    missing = [p.name for p in signature.parameters.values() if p.default is p.empty and p.name not in kwargs]
    if missing:
        raise ValueError(f"{name}: missing {', '.join(missing)}; it takes {takes}")
    try:
        return factory(**kwargs)
    except ValueError as exc:
        raise ValueError(f"{name}: {exc}") from None


def _value(name: str, key: str, text: str, kind: Any) -> Any:
    choices = typing.get_args(kind) if typing.get_origin(kind) is Literal else None
    if choices is not None:
        if text not in choices:
            raise ValueError(f"{name}: {key} must be one of {', '.join(choices)}, got {text!r}")
        return text
    try:
        value = int(text) if kind is int else float(text)
    except ValueError:
        raise ValueError(f"{name}: {key} must be {'an integer' if kind is int else 'a number'}, got {text!r}") from None
    if not math.isfinite(value):
        raise ValueError(f"{name}: {key} must be finite, got {text!r}")
    return value
