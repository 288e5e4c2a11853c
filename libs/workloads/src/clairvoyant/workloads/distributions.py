"""Distributions of token lengths, tool latencies and loop / fan-out counts in a workflow spec.

Each one offers ``quantile(u)`` (so a sample is ``quantile(rng.random())`` and consecutive draws can
be correlated through a Gaussian copula), ``support()`` and ``moments()``: the realised mean and
coefficient of variation.  For a bounded log-normal, ``mean`` and ``cv`` *are* the realised
moments: the underlying (mu, sigma) are solved for so that the distribution truncated to
[min, max] has exactly that mean and CV.  What a spec says is what the generator produces.

Integers (tokens, counts) are drawn by stochastic rounding, ``floor(x) + Bernoulli(frac(x))``, which
keeps the mean exact.

Spec forms: ``{mean: 300, cv: 0.4}`` (log-normal, the default), ``{dist: lognormal, mean, cv, min,
max}``, ``{dist: uniform, low, high}``, ``{dist: constant, value}`` or a bare number,
``{dist: empirical, values: [...]}`` (uniform over the list), ``{dist: geometric, p_continue, min,
max}`` (repeat-until-stop counts, capped at max).
"""

from __future__ import annotations

import math
from functools import cached_property
from statistics import NormalDist
from typing import Annotated, Any, Literal

import numpy as np
from pydantic import BaseModel, ConfigDict, Discriminator, Field, Tag, model_validator

_STD_NORMAL = NormalDist()
_U_EPS = 1e-15


def normal_cdf(z: float) -> float:
    return _STD_NORMAL.cdf(z)


def _upper_tail(z: float) -> float:
    """P(Z > z), accurate far into the upper tail where 1 - cdf(z) would cancel."""
    if z == math.inf:
        return 0.0
    if z == -math.inf:
        return 1.0
    return 0.5 * math.erfc(z / math.sqrt(2.0))


def _prob_between(a: float, b: float) -> float:
    """P(a < Z < b) for a standard normal Z, without cancellation in either tail."""
    if a > 0:
        return _upper_tail(a) - _upper_tail(b)
    return _upper_tail(-b) - _upper_tail(-a)


def stochastic_round(x: float, rng: np.random.Generator) -> int:
    base = math.floor(x)
    return int(base) + (1 if rng.random() < x - base else 0)


class _Dist(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    def quantile(self, u: float) -> float:
        raise NotImplementedError

    def support(self) -> tuple[float, float]:
        raise NotImplementedError

    def moments(self) -> tuple[float, float]:
        """(mean, cv) of the values this distribution produces."""
        raise NotImplementedError

    @property
    def mean_value(self) -> float:
        return self.moments()[0]

    def sample(self, rng: np.random.Generator) -> float:
        return self.quantile(rng.random())

    def sample_int(self, rng: np.random.Generator, u: float | None = None) -> int:
        """An integer draw with the same mean; ``u`` (in [0, 1)) replaces the uniform draw."""
        return stochastic_round(self.quantile(rng.random() if u is None else u), rng)


class LogNormal(_Dist):
    dist: Literal["lognormal"] = "lognormal"
    mean: float = Field(gt=0)
    cv: float = Field(ge=0)
    min: float | None = Field(default=None, ge=0)
    max: float | None = Field(default=None, gt=0)

    @model_validator(mode="after")
    def _fit(self) -> LogNormal:
        lo, hi = self.support()
        if not lo < hi:
            raise ValueError(f"min ({lo:g}) must be < max ({hi:g})")
        if not lo < self.mean < hi:
            raise ValueError(f"mean {self.mean:g} must lie strictly between min and max")
        _ = self.fitted  # solve now, so an unreachable (mean, cv) is a validation error
        return self

    @cached_property
    def fitted(self) -> tuple[float, float, float, float]:
        """(mu, sigma) of the underlying normal and (P(Z < a), P(Z < b)) at the truncation points."""
        if self.cv == 0:
            return math.log(self.mean), 0.0, 0.0, 1.0
        lo, hi = self.support()
        mu, sigma = _fit_truncated_lognormal(self.mean, self.cv, lo, hi)
        a = (math.log(lo) - mu) / sigma if lo > 0 else -math.inf
        b = (math.log(hi) - mu) / sigma if hi < math.inf else math.inf
        return mu, sigma, normal_cdf(a), normal_cdf(b)

    def support(self) -> tuple[float, float]:
        return (self.min or 0.0, math.inf if self.max is None else self.max)

    def quantile(self, u: float) -> float:
        mu, sigma, p_lo, p_hi = self.fitted
        if sigma == 0:
            return self.mean
        p = p_lo + u * (p_hi - p_lo)
        x = math.exp(mu + sigma * _STD_NORMAL.inv_cdf(min(max(p, _U_EPS), 1.0 - _U_EPS)))
        return min(max(x, self.min or 0.0), math.inf if self.max is None else self.max)

    def moments(self) -> tuple[float, float]:
        return self.mean, self.cv


def _truncated_lognormal_moments(mu: float, sigma: float, lo: float, hi: float) -> tuple[float, float]:
    a = (math.log(lo) - mu) / sigma if lo > 0 else -math.inf
    b = (math.log(hi) - mu) / sigma if hi < math.inf else math.inf
    mass = _prob_between(a, b)
    if mass < 1e-12:
        raise ValueError("no probability mass between min and max")
    m1 = math.exp(mu + sigma**2 / 2) * _prob_between(a - sigma, b - sigma) / mass
    m2 = math.exp(2 * mu + 2 * sigma**2) * _prob_between(a - 2 * sigma, b - 2 * sigma) / mass
    return m1, math.sqrt(max(m2 - m1 * m1, 0.0)) / m1


def _fit_truncated_lognormal(mean: float, cv: float, lo: float, hi: float) -> tuple[float, float]:
    """(mu, sigma) whose log-normal, truncated to [lo, hi], has this mean and CV."""
    sigma = math.sqrt(math.log1p(cv * cv))
    mu = math.log(mean) - sigma * sigma / 2
    if lo <= 0 and hi == math.inf:
        return mu, sigma
    for _ in range(500):
        try:
            m, c = _truncated_lognormal_moments(mu, sigma, lo, hi)
        except (ValueError, OverflowError):
            break
        if abs(m / mean - 1) < 1e-9 and abs(c / cv - 1) < 1e-9:
            return mu, sigma
        mu += math.log(mean / m)
        if c > 0:
            sigma *= (cv / c) ** 0.7  # damped: near the largest reachable CV the plain step overshoots
        if sigma > 50:
            break
    raise ValueError(f"mean {mean:g} with cv {cv:g} cannot be reached within [{lo:g}, {hi:g}]")


class Uniform(_Dist):
    dist: Literal["uniform"] = "uniform"
    low: float = Field(ge=0)
    high: float = Field(ge=0)

    @model_validator(mode="after")
    def _ordered(self) -> Uniform:
        if self.low > self.high:
            raise ValueError(f"low ({self.low:g}) must be <= high ({self.high:g})")
        return self

    def support(self) -> tuple[float, float]:
        return self.low, self.high

    def quantile(self, u: float) -> float:
        return self.low + u * (self.high - self.low)

    def moments(self) -> tuple[float, float]:
        mean = (self.low + self.high) / 2
        return mean, ((self.high - self.low) / math.sqrt(12) / mean if mean > 0 else 0.0)


class Constant(_Dist):
    dist: Literal["constant"] = "constant"
    value: float = Field(ge=0)

    @model_validator(mode="before")
    @classmethod
    def _scalar(cls, data: Any) -> Any:
        return {"value": data} if isinstance(data, int | float) and not isinstance(data, bool) else data

    def support(self) -> tuple[float, float]:
        return self.value, self.value

    def quantile(self, u: float) -> float:
        return self.value

    def moments(self) -> tuple[float, float]:
        return self.value, 0.0


class Empirical(_Dist):
    dist: Literal["empirical"] = "empirical"
    values: list[Annotated[float, Field(ge=0)]] = Field(min_length=1)

    @cached_property
    def sorted_values(self) -> tuple[float, ...]:
        return tuple(sorted(self.values))

    def support(self) -> tuple[float, float]:
        return self.sorted_values[0], self.sorted_values[-1]

    def quantile(self, u: float) -> float:
        return self.sorted_values[min(int(u * len(self.sorted_values)), len(self.sorted_values) - 1)]

    def moments(self) -> tuple[float, float]:
        values = np.asarray(self.sorted_values)
        mean = float(values.mean())
        return mean, (float(values.std()) / mean if mean > 0 else 0.0)


class Geometric(_Dist):
    """``min`` plus the number of extra repetitions, each taken with probability ``p_continue``,
    stopping at ``max`` (the loop bound) regardless."""

    dist: Literal["geometric"] = "geometric"
    p_continue: float = Field(ge=0, lt=1)
    min: int = Field(default=1, ge=0)
    max: int = Field(ge=0)

    @model_validator(mode="after")
    def _ordered(self) -> Geometric:
        if self.min > self.max:
            raise ValueError(f"min ({self.min}) must be <= max ({self.max})")
        return self

    def _pmf(self) -> list[float]:
        extra = self.max - self.min
        p = self.p_continue
        return [(1 - p) * p**j for j in range(extra)] + [p**extra]

    def support(self) -> tuple[float, float]:
        return float(self.min), float(self.max)

    def quantile(self, u: float) -> float:
        total = 0.0
        for j, mass in enumerate(self._pmf()):
            total += mass
            if u < total:
                return float(self.min + j)
        return float(self.max)

    def moments(self) -> tuple[float, float]:
        pmf = np.asarray(self._pmf())
        values = np.arange(self.min, self.max + 1, dtype=float)
        mean = float((pmf * values).sum())
        var = float((pmf * values**2).sum()) - mean * mean
        return mean, (math.sqrt(max(var, 0.0)) / mean if mean > 0 else 0.0)


DIST_TAG_PREFIX = "dist:"


def _dist_tag(value: Any) -> str:
    if isinstance(value, bool):
        return DIST_TAG_PREFIX + "?"
    if isinstance(value, int | float):
        return DIST_TAG_PREFIX + "constant"
    if isinstance(value, dict):
        return DIST_TAG_PREFIX + str(value.get("dist", "lognormal"))
    return DIST_TAG_PREFIX + str(getattr(value, "dist", "?"))


Distribution = Annotated[
    Annotated[LogNormal, Tag("dist:lognormal")]
    | Annotated[Uniform, Tag("dist:uniform")]
    | Annotated[Constant, Tag("dist:constant")]
    | Annotated[Empirical, Tag("dist:empirical")]
    | Annotated[Geometric, Tag("dist:geometric")],
    Discriminator(_dist_tag),
]
"""Any of the distributions above, chosen by the ``dist`` key (log-normal when absent)."""

DistributionModel = LogNormal | Uniform | Constant | Empirical | Geometric
