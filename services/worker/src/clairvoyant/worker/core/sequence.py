"""A request's life inside the engine: its tokens, how many have K/V, and the blocks holding them::

    token_ids:  p0 p1 ... p(P-1) | o0 o1 ... o(k-1)        (prompt | generated output)
                |<---- num_computed_tokens ---->|           K/V written (or shared from the cache)

block_table covers at least num_computed_tokens positions; the last sampled token is never
computed until the next step, so a running sequence always has >= 1 uncomputed token.
"""

from __future__ import annotations

import enum

import torch
import xgrammar as xgr

from clairvoyant.worker.core.detokenize import Detokenizer
from clairvoyant.worker.core.radix_cache import BlockTag
from clairvoyant.worker.core.sampling import SampleRow, SamplingParams
from clairvoyant.worker.core.types import EngineRequest, FinishReason, Lineage

__all__ = ["EngineRequest", "Lineage", "Sequence", "SequenceStatus"]


class SequenceStatus(enum.Enum):
    WAITING = "waiting"  # holds no blocks (new, or preempted and to be recomputed)
    RUNNING = "running"  # holds blocks; mid-prefill or decoding
    FINISHED = "finished"


class Sequence:
    """Mutable per-request state.  Block fields are written by the block manager only."""

    def __init__(
        self,
        seq_id: int,
        request: EngineRequest,
        arrival_time: float,
        generator: torch.Generator | None,
        detokenizer: Detokenizer,
        eos_token_ids: tuple[int, ...],
        *,
        index: int = 0,
        matcher: xgr.GrammarMatcher | None = None,
    ) -> None:
        """``index``: the choice of its request (``SamplingParams.n``); ``matcher``: the grammar
        state of a constrained request, advanced once per appended token."""
        self.seq_id = seq_id
        self.request_id = request.request_id
        self.params: SamplingParams = request.sampling
        self.priority = request.priority
        self.program_wait_s = request.program_wait_s
        self.program_service_s = request.program_service_s
        self.lineage: Lineage | None = request.lineage
        # The tags of the blocks this sequence caches (prompt blocks, response blocks): one object
        # each, shared by every block (tags are immutable).
        self.block_tags = (BlockTag(self.lineage, "prompt"), BlockTag(self.lineage, "response"))
        self.arrival_time = arrival_time
        self.prompt_len = len(request.prompt_token_ids)
        self.token_ids: list[int] = list(request.prompt_token_ids)
        self.status = SequenceStatus.WAITING
        self.finish_reason: FinishReason | None = None
        self.num_computed_tokens = 0
        self.block_table: list[int] = []
        self.num_cached_blocks = 0  # leading blocks of block_table that are prefix-cache nodes
        self.cached_tokens: int | None = None  # prompt tokens served from the cache at first admission
        self.num_preemptions = 0
        self.first_token_time: float | None = None
        self.generator = generator
        self.detokenizer = detokenizer
        self.eos_token_ids = eos_token_ids
        self.background = False  # a pre-prefill: computes K/V only while nothing else can run
        self.index = index
        self.matcher = matcher
        # Choices 1..n-1, held back until this one (choice 0) has computed the prompt (engine.py)
        self.deferred_choices: list[Sequence] = []

    @property
    def namespace(self) -> str | None:
        """Prefix-cache namespace: the tenant."""
        return None if self.lineage is None else self.lineage.tenant

    @property
    def num_tokens(self) -> int:
        return len(self.token_ids)

    @property
    def num_output_tokens(self) -> int:
        return len(self.token_ids) - self.prompt_len

    @property
    def num_uncomputed_tokens(self) -> int:
        return len(self.token_ids) - self.num_computed_tokens

    @property
    def is_finished(self) -> bool:
        return self.status is SequenceStatus.FINISHED

    def sample_row(self, grammar_ends: bool = False) -> SampleRow:
        """Sampling inputs for the next token: EOS is banned until ``min_tokens`` were generated,
        unless the grammar allows nothing else (``grammar_ends``)."""
        suppress = (
            not self.params.ignore_eos and self.num_output_tokens < self.params.min_tokens and not grammar_ends
        )
        suppressed = self.eos_token_ids if suppress else ()
        if not self.params.adjusts_logits:
            return SampleRow(self.params, self.generator, suppressed)
        prompt, output = self.token_ids[: self.prompt_len], self.token_ids[self.prompt_len :]
        return SampleRow(self.params, self.generator, suppressed, prompt, output)

    def __repr__(self) -> str:
        return (
            f"Sequence({self.request_id!r}, {self.status.value}, tokens={self.num_tokens}, "
            f"computed={self.num_computed_tokens}, blocks={self.block_table})"
        )
