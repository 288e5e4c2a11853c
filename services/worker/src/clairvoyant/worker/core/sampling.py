"""Sampling parameters and the sampler over last-position logits.

Each request that samples (temperature > 0) owns a ``torch.Generator`` seeded once, so its tokens
depend only on its own logits and seed: not on batch composition, preemption or prefix-cache hits.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import NamedTuple

import torch


@dataclass(frozen=True)
class SamplingParams:
    """How to pick tokens and when to stop.  Invalid values raise ``ValueError`` at construction."""

    max_tokens: int = 16
    temperature: float = 1.0  # 0 = greedy
    top_p: float = 1.0  # nucleus: keep the smallest set of top tokens whose probability reaches top_p
    seed: int | None = None  # None: the engine derives one from its own seed and the request id
    stop: tuple[str, ...] = ()  # stop strings; the matched stop string is not part of the output text
    ignore_eos: bool = False  # EOS tokens are sampled like any other and do not stop the request
    min_tokens: int = 0  # EOS and stop strings are suppressed until this many tokens were generated

    def __post_init__(self) -> None:
        if self.max_tokens < 1:
            raise ValueError(f"max_tokens must be >= 1, got {self.max_tokens}")
        if self.temperature < 0:
            raise ValueError(f"temperature must be >= 0, got {self.temperature}")
        if not 0.0 < self.top_p <= 1.0:
            raise ValueError(f"top_p must be in (0, 1], got {self.top_p}")
        if not 0 <= self.min_tokens <= self.max_tokens:
            raise ValueError(f"min_tokens must be in [0, max_tokens], got {self.min_tokens}")
        if any(not s for s in self.stop):
            raise ValueError("stop strings must be non-empty")

    @property
    def greedy(self) -> bool:
        return self.temperature == 0.0


class SampleRow(NamedTuple):
    """One logits row's sampling inputs."""

    params: SamplingParams
    generator: torch.Generator | None  # required unless params.greedy
    suppressed_ids: tuple[int, ...]  # token ids that must not be sampled (EOS before min_tokens)


def make_generator(seed: int) -> torch.Generator:
    generator = torch.Generator(device="cpu")
    generator.manual_seed(seed)
    return generator


def sample(logits: torch.Tensor, rows: Sequence[SampleRow]) -> list[int]:
    """One token id per row of ``logits`` (``[len(rows), vocab]``, any device; sampled on the CPU)."""
    assert logits.shape[0] == len(rows), (logits.shape, len(rows))
    logits = logits.detach().to(device="cpu", dtype=torch.float32)
    # Greedy rows with nothing suppressed (the common case) share one argmax over the batch.
    plain = [not row.suppressed_ids and row.params.greedy for row in rows]
    argmax = logits.argmax(dim=-1).tolist() if any(plain) else []
    return [argmax[i] if plain[i] else _sample_row(logits[i], row) for i, row in enumerate(rows)]


def _sample_row(logits: torch.Tensor, row: SampleRow) -> int:
    if row.suppressed_ids:
        logits = logits.clone()
        logits[list(row.suppressed_ids)] = float("-inf")
    params = row.params
    if params.greedy:
        return int(torch.argmax(logits))
    assert row.generator is not None, "a sampling row needs its generator"
    probs = torch.softmax(logits / params.temperature, dim=-1)
    if params.top_p >= 1.0:
        return int(torch.multinomial(probs, 1, generator=row.generator))
    # Stable sort: among equal probabilities the lowest id comes first, as with argmax.
    sorted_probs, sorted_ids = torch.sort(probs, descending=True, stable=True)
    mass_before = torch.cumsum(sorted_probs, dim=-1) - sorted_probs
    keep = mass_before < params.top_p
    keep[0] = True  # the top token always survives, so top_p -> 0 is greedy
    choice = torch.multinomial(sorted_probs * keep, 1, generator=row.generator)
    return int(sorted_ids[choice])
