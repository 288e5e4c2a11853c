"""How fast this engine decodes at a given batch size: a step costs ``base_s + per_seq_s × batch``.

The scheduler's admission control reads it (the knee of throughput against batch,
``clairvoyant.policy.admission``).  Decode is memory-bound: every step streams the weights once
(``base_s``, with the step's fixed overhead) and each sequence's KV cache (``per_seq_s``, which grows
with its context).  So throughput ``b / (base_s + per_seq_s × b)`` rises toward ``1 / per_seq_s`` and
the per-token latency grows linearly in ``b``.

Two sources, whichever the runner allows:

- ``ModelledSpeed``: a runner whose step times are known in advance (the emulated runner's roofline,
  ``FastForwardRunner.decode_run_seconds``) is asked for a step of one sequence and a step of
  ``max_batch`` sequences at the live sequences' mean context.  Exact for the cost model, which is
  linear in the batch for decode-only steps.
- ``MeasuredSpeed``: any other runner's decode-only steps are timed as they run, and a least-squares
  line of step seconds against batch size is fitted with exponential forgetting (recent context
  lengths count most).  Unknown (``None``) until it has seen two batch sizes at least
  ``MIN_SPREAD`` apart.
"""

from __future__ import annotations

from collections.abc import Iterable

from clairvoyant.worker.core.types import DecodeSpeed
from clairvoyant.worker.runners.base import FastForwardRunner

CONTEXT_BUCKET = 256  # tokens: the modelled speed is computed once per bucket of mean context


class ModelledSpeed:
    """The runner's own cost model, at the mean context of the sequences given."""

    def __init__(self, runner: FastForwardRunner, max_batch: int) -> None:
        self.runner = runner
        self.max_batch = max(2, max_batch)
        self._by_bucket: dict[int, DecodeSpeed] = {}
        self._last: DecodeSpeed | None = None

    def speed(self, contexts: Iterable[int]) -> DecodeSpeed | None:
        """At the mean of ``contexts`` (tokens per live sequence); with none, the last answer."""
        total = count = 0
        for context in contexts:
            total += context
            count += 1
        if count == 0:
            return self._last
        bucket = round(total / count / CONTEXT_BUCKET)
        speed = self._by_bucket.get(bucket)
        if speed is None:
            context = max(1, bucket * CONTEXT_BUCKET)
            one = float(self.runner.decode_run_seconds([context], 1)[0])
            full = float(self.runner.decode_run_seconds([context] * self.max_batch, 1)[0])
            per_seq = max(0.0, (full - one) / (self.max_batch - 1))
            speed = self._by_bucket[bucket] = DecodeSpeed(max(0.0, one - per_seq), per_seq)
        self._last = speed
        return speed


class MeasuredSpeed:
    """A line through the timed decode-only steps: seconds = base + per_seq × batch."""

    MIN_SPREAD = 2  # sequences between the smallest and largest batch seen before answering

    def __init__(self, forgetting: float = 0.99) -> None:
        if not 0.0 < forgetting <= 1.0:
            raise ValueError("forgetting must be in (0, 1]")
        self.forgetting = forgetting
        self._n = self._x = self._y = self._xx = self._xy = 0.0
        self._low: int | None = None
        self._high: int | None = None

    def observe(self, batch: int, seconds: float) -> None:
        """One decode-only step of ``batch`` sequences took ``seconds``."""
        if batch < 1 or seconds <= 0.0:
            return
        f = self.forgetting
        self._n = f * self._n + 1.0
        self._x = f * self._x + batch
        self._y = f * self._y + seconds
        self._xx = f * self._xx + batch * batch
        self._xy = f * self._xy + batch * seconds
        self._low = batch if self._low is None else min(self._low, batch)
        self._high = batch if self._high is None else max(self._high, batch)

    def speed(self) -> DecodeSpeed | None:
        if self._low is None or self._high is None or self._high - self._low < self.MIN_SPREAD:
            return None
        spread = self._n * self._xx - self._x * self._x
        if spread <= 0.0:
            return None
        slope = (self._n * self._xy - self._x * self._y) / spread
        intercept = (self._y - slope * self._x) / self._n
        if slope <= 0.0:  # no measurable cost per sequence: the batch is free at these sizes
            return DecodeSpeed(max(0.0, self._y / self._n), 0.0)
        return DecodeSpeed(max(0.0, intercept), slope)
