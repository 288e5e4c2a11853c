"""``TorchRunner``: the reference ``ModelRunner``, a torch Llama-style model over paged KV."""

from __future__ import annotations

from collections.abc import Sequence

import torch

from clairvoyant.worker.models.attention import build_paged_context, slots_of
from clairvoyant.worker.models.llama import LlamaForCausalLM
from clairvoyant.worker.runners.base import ForwardItem, ModelInfo, Tokenizer


class TorchRunner:
    """Implements ``runners.base.ModelRunner`` and ``CopiesKv``.

    KV storage is one tensor ``[num_layers, 2 (K, V), num_blocks * block_size, num_kv_heads, head_dim]``;
    a slot index is ``block * block_size + offset``, exactly the layout ``base.py`` draws.
    """

    def __init__(self, model: LlamaForCausalLM, tokenizer: Tokenizer, info: ModelInfo) -> None:
        self.model = model.eval()
        self.tokenizer = tokenizer
        self.info = info
        weight = model.model.embed_tokens.weight
        self.device = weight.device
        self.dtype = weight.dtype
        self.kv_cache: torch.Tensor | None = None
        self.block_size = 0

    def kv_bytes_per_token(self) -> int:
        config = self.model.config
        element = torch.empty((), dtype=self.dtype).element_size()
        return config.num_layers * 2 * config.num_kv_heads * config.head_dim * element

    def allocate_kv(self, num_blocks: int, block_size: int) -> None:
        if num_blocks <= 0 or block_size <= 0:
            raise ValueError(f"num_blocks and block_size must be positive, got {num_blocks}, {block_size}")
        config = self.model.config
        shape = (config.num_layers, 2, num_blocks * block_size, config.num_kv_heads, config.head_dim)
        self.kv_cache = torch.zeros(shape, dtype=self.dtype, device=self.device)
        self.block_size = block_size

    @torch.inference_mode()
    def read_kv(self, block_table: Sequence[int], num_tokens: int) -> torch.Tensor:
        if self.kv_cache is None:
            raise RuntimeError("allocate_kv must be called before read_kv")
        slots = slots_of(block_table, self.block_size, num_tokens, self.device)
        return self.kv_cache.index_select(2, slots)  # [layers, 2, tokens, kv_heads, head_dim], a copy

    @torch.inference_mode()
    def write_kv(self, block_table: Sequence[int], first_position: int, kv: torch.Tensor) -> None:
        if self.kv_cache is None:
            raise RuntimeError("allocate_kv must be called before write_kv")
        if kv.shape[:2] + kv.shape[3:] != self.kv_cache.shape[:2] + self.kv_cache.shape[3:]:
            cache = tuple(self.kv_cache.shape)
            raise ValueError(f"KV of shape {tuple(kv.shape)} does not fit a cache of {cache}")
        end = first_position + kv.shape[2]
        slots = slots_of(block_table, self.block_size, end, self.device)[first_position:]
        self.kv_cache.index_copy_(2, slots, kv.to(device=self.device, dtype=self.dtype))

    @torch.inference_mode()
    def forward(self, items: Sequence[ForwardItem]) -> torch.Tensor:
        if self.kv_cache is None:
            raise RuntimeError("allocate_kv must be called before forward")
        if not items:
            return torch.empty(0, self.info.vocab_size, dtype=torch.float32, device=self.device)
        context, positions = build_paged_context(items, self.kv_cache, self.block_size)
        token_ids = [token for item in items for token in item.token_ids]
        input_ids = torch.tensor(token_ids, dtype=torch.int64, device=self.device)
        hidden = self.model(input_ids, positions, context)
        # Only the last row of an item that asked is projected: the vocab matmul dominates small models.
        rows = [s.query_end - 1 for s, item in zip(context.items, items, strict=True) if item.want_logits]
        if not rows:
            return torch.empty(0, self.info.vocab_size, dtype=torch.float32, device=self.device)
        return self.model.compute_logits(hidden[rows]).float()


def greedy_generate(
    runner: TorchRunner, prompt_ids: Sequence[int], max_new_tokens: int, prefill_chunk: int | None = None
) -> list[int]:
    """Greedy tokens after ``prompt_ids``, driving ``runner`` through the paged path with blocks 0, 1, ...

    For tests and smoke runs only (the engine core owns real block allocation): needs ``allocate_kv``
    done with enough blocks for ``len(prompt_ids) + max_new_tokens`` positions.
    """
    if max_new_tokens <= 0:
        return []
    total = len(prompt_ids) + max_new_tokens
    block_table = list(range(-(-total // runner.block_size)))
    chunk = prefill_chunk or len(prompt_ids)
    logits = torch.empty(0)
    for start in range(0, len(prompt_ids), chunk):
        piece = list(prompt_ids[start : start + chunk])
        last = start + len(piece) == len(prompt_ids)
        logits = runner.forward([ForwardItem(0, piece, start, block_table, want_logits=last)])
    generated: list[int] = []
    position = len(prompt_ids)
    while True:
        generated.append(int(logits[0].argmax()))
        if len(generated) == max_new_tokens:
            return generated
        logits = runner.forward([ForwardItem(0, [generated[-1]], position, block_table, want_logits=True)])
        position += 1
