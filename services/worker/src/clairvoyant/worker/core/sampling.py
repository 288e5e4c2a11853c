"""Sampling parameters and the sampler over last-position logits.

Each request that samples (temperature > 0) owns a ``torch.Generator`` seeded once, so its tokens
depend only on its own logits and seed: not on batch composition, preemption or prefix-cache hits.

Before a token is picked (greedy or sampled), a constrained row's logits are masked (tokens its
grammar disallows at -inf, ``core/grammar.py``, applied by the engine before ``sample``), then
adjusted in this order, as vLLM does (``vllm/v1/sample/ops/penalties.py``; OpenAI's API reference
for the first two):

1. ``repetition_penalty`` r (vLLM's and SGLang's extension, 1 = off) on every token of the prompt
   and the output so far: a positive logit is divided by r, a negative one multiplied by r;
2. ``frequency_penalty`` f and ``presence_penalty`` p (OpenAI's, 0 = off) on the output so far:
   ``logit -= f * count(token) + p * (count(token) > 0)``;
3. ``logit_bias`` (OpenAI's): the given value added to each named token's logit (-100 bans it in
   practice, 100 forces it).

Log probabilities (``logprobs``) are those of the model's own distribution, before any of that and
before temperature and top_p, as vLLM reports them by default (its ``raw_logprobs`` mode): they
say what the model thought, whatever the sampling settings did with it.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import NamedTuple

import torch

from clairvoyant.core.structured import OutputConstraint

MAX_TOP_LOGPROBS = 20  # OpenAI's limit for top_logprobs


class TokenLogprob(NamedTuple):
    """One sampled token's log probability and the ``k`` most likely tokens at its position."""

    token_id: int
    logprob: float
    top: tuple[tuple[int, float], ...]  # (token id, log probability), most likely first
    # The texts, from an engine that reports them (vLLM); None: decode the ids
    text: str | None = None
    top_texts: tuple[str, ...] = ()


def token_logprobs(logits: torch.Tensor, token_id: int, k: int) -> TokenLogprob:
    """``token_id``'s log probability under ``logits`` (one row, the model's raw output) and the
    top ``k`` (ties: the lower id first, as argmax)."""
    logprobs = torch.log_softmax(logits.detach().to(device="cpu", dtype=torch.float32), dim=-1)
    top: tuple[tuple[int, float], ...] = ()
    if k:
        values, ids = torch.sort(logprobs, descending=True, stable=True)
        top = tuple(zip(ids[:k].tolist(), values[:k].tolist(), strict=True))
    return TokenLogprob(token_id, float(logprobs[token_id]), top)


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
    frequency_penalty: float = 0.0  # [-2, 2]: subtracted once per earlier occurrence in the output
    presence_penalty: float = 0.0  # [-2, 2]: subtracted once if the token occurs in the output
    repetition_penalty: float = 1.0  # > 0: scales the logits of tokens in the prompt or the output
    logit_bias: tuple[tuple[int, float], ...] = ()  # (token id, bias in [-100, 100])
    logprobs: int | None = None  # None: none; k: each token's log probability and the top k (0-20)
    constraint: OutputConstraint | None = None  # grammar-constrained decoding (core/grammar.py)
    n: int = 1  # choices of the same prompt

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
        for name in ("frequency_penalty", "presence_penalty"):
            if not -2.0 <= getattr(self, name) <= 2.0:
                raise ValueError(f"{name} must be in [-2, 2], got {getattr(self, name)}")
        if self.repetition_penalty <= 0:
            raise ValueError(f"repetition_penalty must be > 0, got {self.repetition_penalty}")
        if self.n < 1:
            raise ValueError(f"n must be >= 1, got {self.n}")
        if self.logprobs is not None and not 0 <= self.logprobs <= MAX_TOP_LOGPROBS:
            raise ValueError(f"logprobs must be in [0, {MAX_TOP_LOGPROBS}], got {self.logprobs}")
        for token, bias in self.logit_bias:
            if token < 0 or not -100.0 <= bias <= 100.0:
                raise ValueError(f"logit_bias maps token ids >= 0 to values in [-100, 100], got {token}: {bias}")

    @property
    def adjusts_logits(self) -> bool:
        """Whether any penalty or bias applies (the common case, none, skips the work)."""
        return bool(
            self.frequency_penalty or self.presence_penalty or self.repetition_penalty != 1.0 or self.logit_bias
        )

    @property
    def greedy(self) -> bool:
        return self.temperature == 0.0


class SampleRow(NamedTuple):
    """One logits row's sampling inputs."""

    params: SamplingParams
    generator: torch.Generator | None  # required unless params.greedy
    suppressed_ids: tuple[int, ...]  # token ids that must not be sampled (EOS before min_tokens)
    prompt_ids: Sequence[int] = ()  # what the penalties look at (only when params.adjusts_logits)
    output_ids: Sequence[int] = ()


def make_generator(seed: int) -> torch.Generator:
    generator = torch.Generator(device="cpu")
    generator.manual_seed(seed)
    return generator


def sample(logits: torch.Tensor, rows: Sequence[SampleRow]) -> list[int]:
    """One token id per row of ``logits`` (``[len(rows), vocab]``, any device; sampled on the CPU)."""
    assert logits.shape[0] == len(rows), (logits.shape, len(rows))
    logits = logits.detach().to(device="cpu", dtype=torch.float32)
    # Greedy rows with nothing suppressed (the common case) share one argmax over the batch.
    plain = [not row.suppressed_ids and row.params.greedy and not row.params.adjusts_logits for row in rows]
    argmax = logits.argmax(dim=-1).tolist() if any(plain) else []
    return [argmax[i] if plain[i] else _sample_row(logits[i], row) for i, row in enumerate(rows)]


def adjust_logits(logits: torch.Tensor, row: SampleRow) -> torch.Tensor:
    """The row's logits after its penalties and bias (module docstring), as a new tensor."""
    params = row.params
    logits = logits.clone()
    vocab = logits.shape[-1]
    if params.repetition_penalty != 1.0:
        seen = torch.tensor(sorted({*row.prompt_ids, *row.output_ids}), dtype=torch.long)
        if len(seen):
            values = logits[seen]
            penalty = params.repetition_penalty
            logits[seen] = torch.where(values > 0, values / penalty, values * penalty)
    if (params.frequency_penalty or params.presence_penalty) and len(row.output_ids):
        counts = torch.bincount(torch.tensor(list(row.output_ids), dtype=torch.long), minlength=vocab)[:vocab]
        logits -= params.frequency_penalty * counts + params.presence_penalty * (counts > 0)
    if params.logit_bias:
        ids = torch.tensor([token for token, _ in params.logit_bias], dtype=torch.long)
        logits[ids] += torch.tensor([bias for _, bias in params.logit_bias], dtype=logits.dtype)
    return logits


def _sample_row(logits: torch.Tensor, row: SampleRow) -> int:
    if row.params.adjusts_logits:
        logits = adjust_logits(logits, row)
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
