"""Per-agent statistics: output lengths, service and remaining latency, gaps, convergence.

``LearnedAgentStats`` keeps one agent's samples in sliding windows of the most recent ``MAX_SAMPLES``
(memory stays bounded and a drifting agent is followed) and summarises them (``AgentSummary``:
the p50/p99 output-length interval, conditional on the previous call's length for high-CV agents,
service time, remaining latency, gap after).  ``ConvergenceTracker`` is Kairos' doubling check
(relative W1 <= ``DEFAULT_CONVERGENCE_THRESHOLD``, first at ``FIRST_CHECK`` samples, latched once
passed).  ``wasserstein`` is the exact 1-D distance.  The summary of an empty window is None.
What is measured, from which paper, and why convergence latches: docs/profiler.md,
"Per-agent statistics and convergence".
"""

from __future__ import annotations

from collections import deque
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

MAX_SAMPLES = 4096
HIGH_CV = 1.0
MIN_CORRELATION = 0.5
MIN_PAIRS = 20
SKETCH_POINTS = 200
DEFAULT_CONVERGENCE_THRESHOLD = 0.1
FIRST_CHECK = 8


def wasserstein(a: Sequence[float] | np.ndarray, b: Sequence[float] | np.ndarray) -> float:
    """Exact Wasserstein-1 distance between two empirical distributions on the line:
    the integral of |F_a - F_b| over the merged support."""
    x = np.sort(np.asarray(a, dtype=float))
    y = np.sort(np.asarray(b, dtype=float))
    if x.size == 0 or y.size == 0:
        return 0.0 if x.size == y.size else float("inf")
    support = np.concatenate([x, y])
    support.sort()
    deltas = np.diff(support)
    cdf_x = np.searchsorted(x, support[:-1], side="right") / x.size
    cdf_y = np.searchsorted(y, support[:-1], side="right") / y.size
    return float(np.sum(np.abs(cdf_x - cdf_y) * deltas))


def sketch(values: Sequence[float] | np.ndarray, points: int = SKETCH_POINTS) -> np.ndarray:
    """Quantiles at the midpoints of ``points`` equal-mass cells: a fixed-size stand-in for the
    distribution (W1 between two sketches = mean |difference|)."""
    grid = (np.arange(points) + 0.5) / points
    return np.quantile(np.asarray(values, dtype=float), grid)


@dataclass
class ConvergenceTracker:
    """Kairos' doubling check on one distribution."""

    threshold: float = DEFAULT_CONVERGENCE_THRESHOLD
    next_check: int = FIRST_CHECK
    previous: list[float] | None = None  # sketch at the last checkpoint
    distance: float | None = None  # relative W1 at the last check
    converged: bool = False
    converged_at_samples: int | None = None
    converged_at_workflows: int | None = None

    def observe(self, window: Sequence[float], total_seen: int, workflows: int) -> None:
        """Call after adding samples; ``window`` holds the current samples, ``total_seen`` counts all."""
        while total_seen >= self.next_check and len(window) > 0:
            current = sketch(window)
            if self.previous is not None:
                scale = float(np.mean(np.abs(current)))
                w1 = float(np.mean(np.abs(current - np.asarray(self.previous))))
                self.distance = w1 / scale if scale > 0 else 0.0
                if self.distance <= self.threshold and not self.converged:
                    self.converged = True  # latches (module doc)
                    self.converged_at_samples = total_seen
                    self.converged_at_workflows = workflows
            self.previous = [float(v) for v in current]
            self.next_check *= 2

    def to_state(self) -> dict[str, Any]:
        return dict(self.__dict__)

    @classmethod
    def from_state(cls, state: dict[str, Any]) -> ConvergenceTracker:
        return cls(**state)


@dataclass(frozen=True, slots=True)
class Summary:
    """Quantiles of one distribution."""

    samples: int
    mean: float
    p50: float
    p95: float
    p99: float
    cv: float

    @staticmethod
    def of(values: Sequence[float]) -> Summary | None:
        if not values:
            return None
        arr = np.asarray(values, dtype=float)
        mean = float(arr.mean())
        p50, p95, p99 = (float(q) for q in np.quantile(arr, [0.5, 0.95, 0.99], method="higher"))
        cv = float(arr.std() / mean) if mean > 0 else 0.0
        return Summary(len(values), mean, p50, p95, p99, cv)


@dataclass(frozen=True, slots=True)
class LengthModel:
    """log(1+y) = intercept + slope * log(1+previous) + residual."""

    correlation: float
    slope: float
    intercept: float
    residual_p50: float
    residual_p99: float

    def interval(self, previous: float) -> tuple[float, float]:
        center = self.intercept + self.slope * float(np.log1p(max(previous, 0.0)))
        return float(np.expm1(center + self.residual_p50)), float(np.expm1(center + self.residual_p99))


def fit_length_model(pairs: Iterable[tuple[float, float]]) -> LengthModel | None:
    data = np.asarray(list(pairs), dtype=float)
    if len(data) < MIN_PAIRS:
        return None
    x, y = np.log1p(np.maximum(data[:, 0], 0)), np.log1p(np.maximum(data[:, 1], 0))
    if x.std() == 0 or y.std() == 0:
        return None
    correlation = float(np.corrcoef(x, y)[0, 1])
    slope, intercept = (float(v) for v in np.polyfit(x, y, 1))
    residuals = y - (intercept + slope * x)
    r50, r99 = (float(q) for q in np.quantile(residuals, [0.5, 0.99], method="higher"))
    return LengthModel(correlation, slope, intercept, r50, r99)


@dataclass(frozen=True, slots=True)
class AgentSummary:
    agent_id: str
    calls: int
    output_len: Summary | None
    service_s: Summary | None
    remaining_s: Summary | None
    gap_after_s: Summary | None
    length_model: LengthModel | None  # only for high-CV agents with a strong consecutive correlation
    output_len_converged: bool
    service_converged: bool

    def length_interval(self, previous_output_len: float | None = None) -> tuple[float, float] | None:
        """(p50, p99) of the next output length; conditional on the previous call when that helps."""
        if self.length_model is not None and previous_output_len is not None:
            return self.length_model.interval(previous_output_len)
        if self.output_len is None:
            return None
        return self.output_len.p50, self.output_len.p99


def _window() -> deque[float]:
    return deque(maxlen=MAX_SAMPLES)


@dataclass
class LearnedAgentStats:
    """The running samples of one agent (sliding windows) and their convergence trackers."""

    agent_id: str
    calls: int = 0
    output_len: deque[float] = field(default_factory=_window)
    service_s: deque[float] = field(default_factory=_window)
    remaining_s: deque[float] = field(default_factory=_window)
    gap_after_s: deque[float] = field(default_factory=_window)
    pairs: deque[tuple[float, float]] = field(default_factory=lambda: deque(maxlen=MAX_SAMPLES))
    output_convergence: ConvergenceTracker = field(default_factory=ConvergenceTracker)
    service_convergence: ConvergenceTracker = field(default_factory=ConvergenceTracker)

    def add_call(
        self,
        output_len: float,
        service_s: float,
        remaining_s: float,
        gap_after_s: float | None,
        previous_output_len: float | None,
        workflows: int,
    ) -> None:
        self.calls += 1
        self.output_len.append(float(output_len))
        self.service_s.append(max(float(service_s), 0.0))
        self.remaining_s.append(max(float(remaining_s), 0.0))
        if gap_after_s is not None:
            self.gap_after_s.append(max(float(gap_after_s), 0.0))
        if previous_output_len is not None:
            self.pairs.append((float(previous_output_len), float(output_len)))
        self.output_convergence.observe(self.output_len, self.calls, workflows)
        self.service_convergence.observe(self.service_s, self.calls, workflows)

    def summary(self) -> AgentSummary:
        lengths = Summary.of(list(self.output_len))
        model = None
        if lengths is not None and lengths.cv > HIGH_CV:
            fitted = fit_length_model(self.pairs)
            if fitted is not None and fitted.correlation >= MIN_CORRELATION:
                model = fitted
        return AgentSummary(
            self.agent_id,
            self.calls,
            lengths,
            Summary.of(list(self.service_s)),
            Summary.of(list(self.remaining_s)),
            Summary.of(list(self.gap_after_s)),
            model,
            self.output_convergence.converged,
            self.service_convergence.converged,
        )

    def consecutive_correlation(self) -> float | None:
        fitted = fit_length_model(self.pairs)
        return None if fitted is None else fitted.correlation

    def to_state(self) -> dict[str, Any]:
        return {
            "agent_id": self.agent_id,
            "calls": self.calls,
            "output_len": list(self.output_len),
            "service_s": list(self.service_s),
            "remaining_s": list(self.remaining_s),
            "gap_after_s": list(self.gap_after_s),
            "pairs": [list(p) for p in self.pairs],
            "output_convergence": self.output_convergence.to_state(),
            "service_convergence": self.service_convergence.to_state(),
        }

    @classmethod
    def from_state(cls, state: dict[str, Any]) -> LearnedAgentStats:
        stats = cls(state["agent_id"], int(state["calls"]))
        for name in ("output_len", "service_s", "remaining_s", "gap_after_s"):
            getattr(stats, name).extend(float(v) for v in state[name])
        stats.pairs.extend((float(a), float(b)) for a, b in state["pairs"])
        stats.output_convergence = ConvergenceTracker.from_state(state["output_convergence"])
        stats.service_convergence = ConvergenceTracker.from_state(state["service_convergence"])
        return stats
