"""Admission at the gateway: per-key rate limits, and refusals while a model's queue is full.

Both answer 429 (busy: retry later), never 503 (a dependency is down).  Neither knows about HTTP;
the edge turns ``RateLimited.headers`` into response headers.  ``GatewayFrontend.admit`` applies both.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import NamedTuple

from clairvoyant.core.errors import ClairvoyantError, QueueFull
from clairvoyant.gateway import metrics


class Limits(NamedTuple):
    """Per-minute budgets; 0 is unlimited."""

    requests_per_minute: int = 0
    tokens_per_minute: int = 0


class RateLimited(ClairvoyantError):
    """Over a requests- or tokens-per-minute budget.  ``error_type`` is the budget that ran out
    ("requests" or "tokens"), as OpenAI reports it; ``headers`` are the ``x-ratelimit-*`` ones."""

    http_status = 429
    error_type = "requests"
    default_code = "rate_limit_exceeded"

    def __init__(
        self, message: str, *, dimension: str, retry_after_s: float, headers: dict[str, str]
    ) -> None:
        super().__init__(message, retry_after_s=retry_after_s)
        self.error_type = dimension
        self.headers = headers


class ServiceBusy(QueueFull):
    """A service refused a call for load without saying why (gRPC's own shedding): busy, not down."""

    default_code = "overloaded"


@dataclass
class _Bucket:
    """A token bucket: ``level`` of ``capacity``, refilling at capacity per minute."""

    capacity: int
    level: float
    at: float

    def refill(self, now: float) -> None:
        self.level = min(self.capacity, self.level + (now - self.at) * self.capacity / 60.0)
        self.at = now

    def wait_for(self, amount: float) -> float:
        """Seconds until ``amount`` is available (0 if it is now; inf if it never fits)."""
        if amount > self.capacity:
            return math.inf
        return max(0.0, (amount - self.level) * 60.0 / self.capacity)

    def until_full(self) -> float:
        return (self.capacity - self.level) * 60.0 / self.capacity


def duration(seconds: float) -> str:
    """OpenAI's way of writing a reset time: ``20ms``, ``1s``, ``1.5s``, ``6m0s``."""
    if seconds < 1:
        return f"{max(1, math.ceil(seconds * 1000))}ms"
    if seconds < 60:
        return f"{math.ceil(seconds * 10) / 10:g}s"
    minutes, rest = divmod(math.ceil(seconds), 60)
    return f"{minutes}m{rest}s"


class RateLimiter:
    """Token buckets per subject (an API key), one for requests and one for tokens.

    A bucket holds a minute's budget and refills continuously, so a client may burst up to its
    per-minute limit and then goes on at the steady rate.  A request is charged one request and
    its token estimate at admission, both or neither; nothing is refunded when it ends.  A request
    whose estimate exceeds the whole per-minute token budget can never run and is refused too.
    """

    PRUNE_EVERY = 1024  # admissions between sweeps of idle (full) buckets

    def __init__(self, now: Callable[[], float] = time.monotonic) -> None:
        self._now = now
        self._buckets: dict[tuple[str, str], _Bucket] = {}
        self._admitted = 0

    def admit(self, subject: str, limits: Limits, tokens: int) -> dict[str, str]:
        """Charge ``subject`` for one request of ``tokens`` tokens and return its ``x-ratelimit-*``
        headers, or raise RateLimited (charging nothing)."""
        now = self._now()
        wanted = {"requests": (limits.requests_per_minute, 1), "tokens": (limits.tokens_per_minute, tokens)}
        buckets = {
            dimension: self._bucket(subject, dimension, limit, now)
            for dimension, (limit, _) in wanted.items()
            if limit > 0
        }
        waits = {dimension: bucket.wait_for(wanted[dimension][1]) for dimension, bucket in buckets.items()}
        blocked = [dimension for dimension, wait in waits.items() if wait > 0]
        if blocked:
            dimension = max(blocked, key=lambda d: waits[d])
            limit, amount = wanted[dimension]
            if math.isinf(waits[dimension]):
                message = (
                    f"this request may use {amount} tokens (prompt estimate plus max_tokens), more than "
                    f"the key's whole budget of {limit} tokens per minute; lower max_tokens"
                )
                retry_after = 60.0
            else:
                used = limit - math.floor(buckets[dimension].level)
                unit = "requests" if dimension == "requests" else "tokens"
                message = (
                    f"rate limit reached on {unit} per minute: limit {limit}, used {used}, requested "
                    f"{amount}; retry in {duration(waits[dimension])}"
                )
                retry_after = max(waits[d] for d in blocked)
            raise RateLimited(
                message, dimension=dimension, retry_after_s=retry_after, headers=self._headers(buckets)
            )
        for dimension, bucket in buckets.items():
            bucket.level -= wanted[dimension][1]
        self._admitted += 1
        if self._admitted % self.PRUNE_EVERY == 0:
            self.prune()
        return self._headers(buckets)

    def prune(self) -> None:
        """Forget buckets that have refilled: a full bucket is what a new one starts as."""
        now = self._now()
        for key, bucket in list(self._buckets.items()):
            bucket.refill(now)
            if bucket.level >= bucket.capacity:
                del self._buckets[key]

    def __len__(self) -> int:
        return len(self._buckets)

    def _bucket(self, subject: str, dimension: str, limit: int, now: float) -> _Bucket:
        bucket = self._buckets.get((subject, dimension))
        if bucket is None:
            bucket = self._buckets[(subject, dimension)] = _Bucket(limit, float(limit), now)
        elif bucket.capacity != limit:  # the key's limit changed: keep what was used of it
            used = bucket.capacity - bucket.level
            bucket.capacity, bucket.level = limit, max(0.0, limit - used)
        bucket.refill(now)
        return bucket

    @staticmethod
    def _headers(buckets: dict[str, _Bucket]) -> dict[str, str]:
        headers: dict[str, str] = {}
        for dimension, bucket in buckets.items():
            headers[f"x-ratelimit-limit-{dimension}"] = str(bucket.capacity)
            headers[f"x-ratelimit-remaining-{dimension}"] = str(max(0, math.floor(bucket.level)))
            headers[f"x-ratelimit-reset-{dimension}"] = duration(bucket.until_full())
        return headers


class FullQueues:
    """Models whose queue the scheduler recently said was full.

    For ``hold_s`` after a QueueFull (never longer than its retry hint) the gateway refuses that
    model's requests itself: a flood of clients is then answered without a scheduler round trip
    each, and costs the scheduler nothing.  The hold is short next to the time a full queue takes
    to drain, so no worker goes idle for it.
    """

    def __init__(self, hold_s: float, now: Callable[[], float] = time.monotonic) -> None:
        self.hold_s = hold_s
        self._now = now
        self._until: dict[str, tuple[float, QueueFull]] = {}

    def mark(self, model: str, refusal: QueueFull) -> None:
        hint = refusal.retry_after_s
        hold = self.hold_s if hint is None else min(self.hold_s, hint)
        if hold > 0:
            self._until[model] = (self._now() + hold, refusal)

    def refusal(self, model: str) -> QueueFull | None:
        """A copy of the scheduler's last refusal for ``model`` while the hold lasts, else None."""
        held = self._until.get(model)
        if held is None:
            return None
        until, refusal = held
        if self._now() >= until:
            del self._until[model]
            return None
        metrics.BUSY_REFUSALS.labels("queue_full_held").inc()
        return QueueFull(refusal.message, code=refusal.code, retry_after_s=refusal.retry_after_s)
