"""``TorchRunner``: the reference ``ModelRunner``, a torch Llama-style model over paged KV."""

from __future__ import annotations

from collections.abc import Sequence

import torch

from clairvoyant.kernels.kv_pages import gather_pages, scatter_pages
from clairvoyant.worker.models.attention import build_paged_context, slots_of
from clairvoyant.worker.models.llama import LlamaForCausalLM
from clairvoyant.worker.runners.base import ForwardItem, ModelInfo, Tokenizer


class TorchRunner:
    """Implements ``runners.base.ModelRunner``, ``CopiesKv`` and ``HoldsHostKv``.

    KV storage is one tensor ``[num_layers, 2 (K, V), num_blocks * block_size, num_kv_heads, head_dim]``;
    a slot index is ``block * block_size + offset``, exactly the layout ``base.py`` draws.  The host
    pool (L2) is page-first, ``[num_host_blocks, num_layers, 2, block_size, num_kv_heads, head_dim]``
    (pinned on CUDA), so a page is contiguous: one object in L3, one copy per batch of blocks.
    Blocks move through ``clairvoyant.kernels.kv_pages`` (the Triton kernel on CUDA, the torch path
    on CPU): a batch is gathered into one page-first staging tensor and copied at once.
    """

    def __init__(self, model: LlamaForCausalLM, tokenizer: Tokenizer, info: ModelInfo) -> None:
        self.model = model.eval()
        self.tokenizer = tokenizer
        self.info = info
        weight = model.model.embed_tokens.weight
        self.device = weight.device
        self.dtype = weight.dtype
        self.kv_cache: torch.Tensor | None = None
        self.host_kv: torch.Tensor | None = None
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

    # ---- HoldsHostKv ----------------------------------------------------------------------------
    def allocate_host_kv(self, num_blocks: int) -> None:
        if self.kv_cache is None:
            raise RuntimeError("allocate_kv must be called before allocate_host_kv")
        if num_blocks <= 0:
            raise ValueError(f"num_blocks must be positive, got {num_blocks}")
        layers, _, _, heads, head_dim = self.kv_cache.shape
        shape = (num_blocks, layers, 2, self.block_size, heads, head_dim)
        self.host_kv = torch.zeros(shape, dtype=self.dtype, pin_memory=self.device.type == "cuda")

    def _pools(self) -> tuple[torch.Tensor, torch.Tensor]:
        if self.kv_cache is None or self.host_kv is None:
            raise RuntimeError("allocate_kv and allocate_host_kv must be called first")
        return self.kv_cache, self.host_kv

    @torch.inference_mode()
    def offload(self, device_blocks: Sequence[int], host_blocks: Sequence[int]) -> None:
        kv, host = self._pools()
        pages = gather_pages(kv, device_blocks, self.block_size)
        index = torch.tensor(list(host_blocks), dtype=torch.int64)
        host.index_copy_(0, index, pages.to("cpu"))

    @torch.inference_mode()
    def load(self, host_blocks: Sequence[int], device_blocks: Sequence[int]) -> None:
        kv, host = self._pools()
        pages = host.index_select(0, torch.tensor(list(host_blocks), dtype=torch.int64))
        scatter_pages(kv, device_blocks, pages.to(self.device, non_blocking=True), self.block_size)

    @torch.inference_mode()
    def device_pages(self, device_blocks: Sequence[int]) -> list[bytes]:
        kv, _ = self._pools()
        return _page_bytes(gather_pages(kv, device_blocks, self.block_size).to("cpu"))

    @torch.inference_mode()
    def host_pages(self, host_blocks: Sequence[int]) -> list[bytes]:
        _, host = self._pools()
        return _page_bytes(host.index_select(0, torch.tensor(list(host_blocks), dtype=torch.int64)))

    @torch.inference_mode()
    def set_host_pages(self, host_blocks: Sequence[int], pages: Sequence[bytes]) -> None:
        _, host = self._pools()
        size = self.page_nbytes()
        for block, page in zip(host_blocks, pages, strict=True):
            if len(page) != size:
                raise ValueError(f"a page of {len(page)} bytes; this worker's pages are {size} bytes")
            host[block].view(-1).view(torch.uint8).copy_(torch.frombuffer(bytearray(page), dtype=torch.uint8))

    def page_nbytes(self) -> int:
        return self.kv_bytes_per_token() * self.block_size

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


def _page_bytes(pages: torch.Tensor) -> list[bytes]:
    """The raw bytes of each page of a page-first CPU tensor."""
    flat = pages.contiguous().view(pages.shape[0], -1).view(torch.uint8)
    return [row.numpy().tobytes() for row in flat]


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
