"""Unit-time mode: every engine step costs 1 time unit, whatever it computes (prefill is free).

With prompts that fit one step, a call of ``n`` output tokens occupies its batch slot for exactly
``n`` steps, which makes small schedules checkable by hand (Autellix Fig. 2 is one).
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from clairvoyant.worker.runners.base import ForwardItem, ModelInfo
from clairvoyant.worker.runners.tiny_random import TINY_SPECIAL_TOKENS
from clairvoyant.worker.runners.tokenizer import ByteTokenizer


class UnitTimeRunner:
    """A ModelRunner without a model: placeholder tokens, and ``last_step_seconds = 1``."""

    def __init__(self, name: str = "unit", max_model_len: int = 1 << 20) -> None:
        self.tokenizer = ByteTokenizer(TINY_SPECIAL_TOKENS)
        eos = self.tokenizer.special_ids[TINY_SPECIAL_TOKENS[1]]
        self.info = ModelInfo(name, self.tokenizer.vocab_size, max_model_len, (eos,), 1, 1, 1)
        self.last_step_seconds = 0.0
        self.steps = 0

    def kv_bytes_per_token(self) -> int:
        return 1

    def allocate_kv(self, num_blocks: int, block_size: int) -> None:
        del num_blocks, block_size  # nothing to store: no attention is computed

    def forward(self, items: Sequence[ForwardItem]) -> torch.Tensor:
        self.last_step_seconds = 1.0 if items else 0.0
        self.steps += 1
        wanted = [item for item in items if item.want_logits]
        logits = torch.zeros(len(wanted), self.info.vocab_size)
        for row, item in enumerate(wanted):
            # Distinct per sequence and position, never a special token: no accidental prefix sharing.
            position = item.start_pos + len(item.token_ids)
            logits[row, (item.seq_id * 131 + position * 7) % 256] = 1.0
        return logits
