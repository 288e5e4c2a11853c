"""Per-agent statistics: output lengths, service and remaining latency, gaps, convergence.

``LearnedAgentStats`` keeps one agent's samples in sliding windows of the most recent ``MAX_SAMPLES``
(memory stays bounded and a drifting agent is followed) and summarises them (``AgentSummary``:
the p50/p99 output-length interval, conditional on the previous call's length for high-CV agents,
service time, remaining latency, gap after).  ``ConvergenceTracker`` is Kairos' doubling check,
counted in closed workflows (first at ``FIRST_CHECK``) and passed when the bootstrap upper bound of
the distance (relative W1 for numbers, total variation for categories) is <=
``DEFAULT_CONVERGENCE_THRESHOLD``; it latches once passed.  ``wasserstein`` is the exact 1-D
distance.  The summary of an empty window is None.
What is measured, from which paper, and why convergence latches: docs/profiler.md,
"Per-agent statistics and convergence".
"""

from __future__ import annotations

import heapq
import zlib
from collections import deque
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field, fields
from typing import Any, NamedTuple

import numpy as np

MAX_SAMPLES = 4096
HIGH_CV = 1.0
MIN_CORRELATION = 0.5
MIN_PAIRS = 20
SKETCH_POINTS = 200
DEFAULT_CONVERGENCE_THRESHOLD = 0.1
DEFAULT_CONVERGENCE_CONFIDENCE = 0.9
FIRST_CHECK = 8  # closed workflows
BOOTSTRAP_REPLICATES = 200
RESERVOIR = 4096  # samples a tracker holds
MIN_CLUSTERS = 2  # workflows on each side of a comparison


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
    # np.quantile's linear method, written out: it is called ~400 times per convergence check.
    x = np.sort(np.asarray(values, dtype=float))
    position = (np.arange(points) + 0.5) / points * (x.size - 1)
    low = np.floor(position).astype(np.int64)
    high = np.minimum(low + 1, x.size - 1)
    return x[low] + (x[high] - x[low]) * (position - low)


def relative_distance(before: np.ndarray, now: np.ndarray) -> float:
    """W1 between the sketches of ``before`` and ``now``, over the mean of ``now`` (0 if that is 0)."""
    current = sketch(now)
    scale = float(np.mean(np.abs(current)))
    return float(np.mean(np.abs(current - sketch(before)))) / scale if scale > 0 else 0.0


def category_distance(before: np.ndarray, now: np.ndarray) -> float:
    """Total variation distance between the category frequencies of ``before`` and ``now`` (dense
    category indices 0, 1, 2, ... as floats): half the summed |difference|, in [0, 1]."""
    size = int(max(before.max(initial=0), now.max(initial=0))) + 1
    old = np.bincount(before.astype(np.int64), minlength=size) / max(before.size, 1)
    new = np.bincount(now.astype(np.int64), minlength=size) / max(now.size, 1)
    return 0.5 * float(np.abs(old - new).sum())


def category_code(name: str) -> float:
    """A stable number for a category (CRC-32: exact as a float, the same in every process)."""
    return float(zlib.crc32(name.encode()))


Distance = Callable[[np.ndarray, np.ndarray], float]


class Comparison(NamedTuple):
    """One doubling check: the observed relative W1 and its bootstrap upper bound."""

    distance: float
    upper: float


def compare_halves(
    values: np.ndarray,
    workflow_of: np.ndarray,
    split: int,
    confidence: float,
    distance: Distance = relative_distance,
) -> Comparison | None:
    """``distance`` between the samples of workflows <= ``split`` ("before") and all of them, and the
    ``confidence`` quantile of the same distance under a stratified cluster bootstrap: workflows (not
    calls: the calls of one workflow move together) are redrawn with replacement on each side.
    None when either side has fewer than ``MIN_CLUSTERS`` workflows.  The generator is seeded from
    the samples, so the same data always gives the same answer.
    """
    ids = np.unique(workflow_of)
    old_ids, new_ids = ids[ids <= split], ids[ids > split]
    if old_ids.size < MIN_CLUSTERS or new_ids.size < MIN_CLUSTERS:
        return None
    order = np.argsort(workflow_of, kind="stable")
    bounds = np.searchsorted(workflow_of[order], ids)
    clusters = np.split(values[order], bounds[1:])
    old, new = clusters[: old_ids.size], clusters[old_ids.size :]
    observed = distance(np.concatenate(old), values)
    rng = np.random.default_rng([split, zlib.crc32(values.tobytes())])
    replicates = np.empty(BOOTSTRAP_REPLICATES)
    for r in range(BOOTSTRAP_REPLICATES):
        before = np.concatenate([old[i] for i in rng.integers(0, len(old), len(old))])
        after = np.concatenate([new[i] for i in rng.integers(0, len(new), len(new))])
        replicates[r] = distance(before, np.concatenate([before, after]))
    return Comparison(observed, float(np.quantile(replicates, confidence)))


def _priority(workflow: int, seen: int) -> int:
    """A fixed pseudo-random 53-bit rank for the ``seen``-th sample, from workflow ``workflow``
    (splitmix64's finaliser: well mixed, and exact as a float)."""
    mask = (1 << 64) - 1
    z = (workflow * 0x9E3779B97F4A7C15 + seen + 0x9E3779B97F4A7C15) & mask
    z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & mask
    z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & mask
    return (z ^ (z >> 31)) >> 11


@dataclass
class ConvergenceTracker:
    """Kairos' doubling check on one distribution, counted in closed workflows.

    ``add(value, workflow)`` records a sample of closed workflow number ``workflow`` (1-based);
    ``check(workflows)`` is called once per closed workflow, after its samples.  At ``FIRST_CHECK``
    workflows and every doubling after, the samples of the workflows up to the previous check are
    compared with all of them (``compare_halves``, Kairos' n against 2n); the check passes when the
    bootstrap upper bound of the relative W1 is at most ``threshold``, so a distance hovering
    around the threshold does not pass by luck.  A pass latches (docs/profiler.md, "Per-agent
    statistics and convergence").  The distribution is all samples since the start, held as a
    uniform sample of at most ``RESERVOIR`` of them: the ones of lowest ``_priority``, a hash of the
    workflow number and arrival position, so the same stream always keeps the same samples.
    ``categorical``: the samples are category codes (``category_code``) and the distance is total
    variation (``category_distance``) instead of the relative W1.
    """

    threshold: float = DEFAULT_CONVERGENCE_THRESHOLD
    confidence: float = DEFAULT_CONVERGENCE_CONFIDENCE
    next_check: int = FIRST_CHECK  # workflows
    last_check: int | None = None  # workflows at the previous check
    distance: float | None = None  # relative W1 at the last check
    upper: float | None = None  # its bootstrap upper bound
    converged: bool = False
    converged_at_samples: int | None = None  # samples seen then
    converged_at_workflows: int | None = None
    seen: int = 0  # samples added
    categorical: bool = False
    # max-heap on priority (stored negated): [-priority, value, workflow]
    reservoir: list[list[float]] = field(default_factory=list)

    def add(self, value: float, workflow: int) -> None:
        item = [-float(_priority(workflow, self.seen)), float(value), float(workflow)]
        self.seen += 1
        if len(self.reservoir) < RESERVOIR:
            heapq.heappush(self.reservoir, item)
        elif item[0] > self.reservoir[0][0]:
            heapq.heapreplace(self.reservoir, item)

    def check(self, workflows: int) -> None:
        """Run the check due once ``workflows`` instances have closed, if any."""
        if workflows < self.next_check:
            return
        while self.next_check <= workflows:  # catches up after a restore
            self.next_check *= 2
        if self.last_check is not None and self.reservoir:
            held = np.asarray(self.reservoir, dtype=float)
            values, distance = held[:, 1], relative_distance
            if self.categorical:  # codes -> dense indices, once: each replicate only counts them
                values = np.unique(values, return_inverse=True)[1].astype(float)
                distance = category_distance
            result = compare_halves(
                values, held[:, 2].astype(np.int64), self.last_check, self.confidence, distance
            )
            if result is not None:
                self.distance, self.upper = result
                if result.upper <= self.threshold and not self.converged:
                    self.converged = True  # latches (class doc)
                    self.converged_at_samples = self.seen
                    self.converged_at_workflows = workflows
        self.last_check = workflows

    def to_state(self) -> dict[str, Any]:
        return {**self.__dict__, "reservoir": [list(item) for item in self.reservoir]}

    @classmethod
    def from_state(cls, state: dict[str, Any]) -> ConvergenceTracker:
        """Also reads states saved when checks were counted in samples (no ``last_check``): their
        schedule restarts at ``FIRST_CHECK`` workflows and catches up; a pass stays latched."""
        known = {f.name for f in fields(cls)}
        tracker = cls(**{k: v for k, v in state.items() if k in known})
        tracker.reservoir = [list(item) for item in tracker.reservoir]
        heapq.heapify(tracker.reservoir)
        if "last_check" not in state:
            tracker.next_check = FIRST_CHECK
        return tracker


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
    service_converged: bool  # tracked, not gating: it depends on load (docs/profiler.md)
    path_converged: bool  # the distribution of the step after this agent's calls

    def length_interval(self, previous_output_len: float | None = None) -> tuple[float, float] | None:
        """(p50, p99) of the next output length; conditional on the previous call when that helps."""
        if self.length_model is not None and previous_output_len is not None:
            return self.length_model.interval(previous_output_len)
        if self.output_len is None:
            return None
        return self.output_len.p50, self.output_len.p99


def _window() -> deque[float]:
    return deque(maxlen=MAX_SAMPLES)


def _path_tracker() -> ConvergenceTracker:
    return ConvergenceTracker(categorical=True)


END_OF_WORKFLOW = ""  # the "next step" of a call in a workflow's last step


@dataclass
class LearnedAgentStats:
    """The running samples of one agent (sliding windows) and their convergence trackers: output
    length, service time, and the path after the agent (which step follows its calls)."""

    agent_id: str
    calls: int = 0
    output_len: deque[float] = field(default_factory=_window)
    service_s: deque[float] = field(default_factory=_window)
    remaining_s: deque[float] = field(default_factory=_window)
    gap_after_s: deque[float] = field(default_factory=_window)
    pairs: deque[tuple[float, float]] = field(default_factory=lambda: deque(maxlen=MAX_SAMPLES))
    output_convergence: ConvergenceTracker = field(default_factory=ConvergenceTracker)
    service_convergence: ConvergenceTracker = field(default_factory=ConvergenceTracker)
    path_convergence: ConvergenceTracker = field(default_factory=_path_tracker)

    def add_call(
        self,
        output_len: float,
        service_s: float,
        remaining_s: float,
        gap_after_s: float | None,
        previous_output_len: float | None,
        workflows: int,
        next_step: str = END_OF_WORKFLOW,
    ) -> None:
        """One call of closed workflow number ``workflows``; ``next_step``: the step that followed
        its step (``str(Step)``), ``END_OF_WORKFLOW`` when none did."""
        self.calls += 1
        self.output_len.append(float(output_len))
        self.service_s.append(max(float(service_s), 0.0))
        self.remaining_s.append(max(float(remaining_s), 0.0))
        if gap_after_s is not None:
            self.gap_after_s.append(max(float(gap_after_s), 0.0))
        if previous_output_len is not None:
            self.pairs.append((float(previous_output_len), float(output_len)))
        self.output_convergence.add(self.output_len[-1], workflows)
        self.service_convergence.add(self.service_s[-1], workflows)
        self.path_convergence.add(category_code(next_step), workflows)

    def check_convergence(self, workflows: int) -> None:
        """Run the convergence checks due once ``workflows`` instances have closed (every agent's,
        whether or not it took part in the last one)."""
        self.output_convergence.check(workflows)
        self.service_convergence.check(workflows)
        self.path_convergence.check(workflows)

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
            self.path_convergence.converged,
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
            "path_convergence": self.path_convergence.to_state(),
        }

    @classmethod
    def from_state(cls, state: dict[str, Any]) -> LearnedAgentStats:
        stats = cls(state["agent_id"], int(state["calls"]))
        for name in ("output_len", "service_s", "remaining_s", "gap_after_s"):
            getattr(stats, name).extend(float(v) for v in state[name])
        stats.pairs.extend((float(a), float(b)) for a, b in state["pairs"])
        stats.output_convergence = ConvergenceTracker.from_state(state["output_convergence"])
        stats.service_convergence = ConvergenceTracker.from_state(state["service_convergence"])
        if "path_convergence" in state:  # states saved before the path was tracked start it afresh
            stats.path_convergence = ConvergenceTracker.from_state(state["path_convergence"])
        return stats
