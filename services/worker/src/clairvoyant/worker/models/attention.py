"""Paged attention in plain torch over the KV layout of ``runners/base.py``.

One engine step flattens every item's new tokens into one batch of ``T`` rows; the projections run on
all rows at once, and attention runs per item over that item's context read back from the blocks::

    rows:      | item 0: 5 prefill tokens | item 1: 1 decode token | item 2: 3 chunk tokens |
    K/V write: slot_mapping[row] = block_table[pos // block_size] * block_size + pos % block_size
    K/V read:  context_slots of item i = slots of positions 0 .. start_pos + len - 1

The metadata is built once per step and shared by every layer.  Decode items (one query each) are
attended together in one padded, masked SDPA call per layer: a per-item Python loop over 32
sequences and 30 layers costs more than the attention arithmetic itself on a CPU.  On a CUDA device
with Triton installed they go instead to the split-KV paged decode kernel
(``clairvoyant.kernels.paged_attention``), which reads the blocks through the block tables directly.
"""

from __future__ import annotations

import functools
from collections.abc import Sequence
from dataclasses import dataclass

import torch
import torch.nn.functional as F

from clairvoyant.worker.runners.base import ForwardItem


@dataclass(frozen=True)
class ItemSlice:
    """Where one item's queries sit in the flattened batch, and which slots its context occupies."""

    query_start: int  # first row of this item in the flattened batch
    query_end: int  # one past its last row
    context_slots: torch.Tensor  # [context_len] int64: physical slot of each position 0 .. context_len-1
    mask: torch.Tensor | None  # [query_len, context_len] bool (True = attend); None when causal is trivial
    is_causal: bool  # a fresh prefill (start_pos 0): SDPA's own causal mask is exact


@dataclass(frozen=True)
class DecodeBatch:
    """All single-token items of a step, padded to the longest context::

        rows         = [3, 4, 7]              (their rows in the flattened batch)
        context_slots= [[s s s s s 0 0],      [num_decodes, max_context] (0 = padding)
                        [s s s s s s s],
                        [s s 0 0 0 0 0]]
        mask         = True where a real position is
    """

    rows: torch.Tensor  # [num_decodes] int64
    context_slots: torch.Tensor  # [num_decodes, max_context] int64
    mask: torch.Tensor  # [num_decodes, 1, 1, max_context] bool


@dataclass(frozen=True)
class KernelDecodeBatch:
    """All single-token items of a step, as the Triton paged decode kernel reads them::

        rows         = [3, 4, 7]              (their rows in the flattened batch)
        block_tables = [[7 2 9],              [num_decodes, max_blocks] int32 (0 = padding, never read)
                        [4 0 0],
                        [5 1 0]]
        seq_lens     = [10, 3, 6]             keys attended: positions 0 .. start_pos
    """

    rows: torch.Tensor  # [num_decodes] int64
    block_tables: torch.Tensor  # [num_decodes, max_blocks] int32
    seq_lens: torch.Tensor  # [num_decodes] int32
    block_size: int


@dataclass(frozen=True)
class PagedContext:
    """Everything a layer needs to write and read paged K/V during one step."""

    kv_cache: torch.Tensor  # [num_layers, 2, num_slots, num_kv_heads, head_dim]
    slot_mapping: torch.Tensor  # [T] int64: where each new token's K/V is written
    items: list[ItemSlice]  # every item, in step order
    decodes: DecodeBatch | None = None  # the single-query items, batched for SDPA (CPU)
    kernel_decodes: KernelDecodeBatch | None = None  # the same, for the Triton kernel (CUDA)


def slots_of(block_table: Sequence[int], block_size: int, length: int, device: torch.device) -> torch.Tensor:
    """Physical slots of positions ``0 .. length-1`` for a sequence with ``block_table``."""
    needed = -(-length // block_size)
    if len(block_table) < needed:
        raise ValueError(f"block table has {len(block_table)} blocks, {length} positions need {needed}")
    table = torch.tensor(list(block_table[:needed]), dtype=torch.int64, device=device)
    positions = torch.arange(length, dtype=torch.int64, device=device)
    return table[positions // block_size] * block_size + positions % block_size


def build_paged_context(
    items: Sequence[ForwardItem], kv_cache: torch.Tensor, block_size: int
) -> tuple[PagedContext, torch.Tensor]:
    """The step's attention metadata and the absolute position of every flattened row."""
    device = kv_cache.device
    slices: list[ItemSlice] = []
    write_slots: list[torch.Tensor] = []
    positions: list[torch.Tensor] = []
    row = 0
    for item in items:
        query_len = len(item.token_ids)
        if query_len == 0:
            raise ValueError(f"sequence {item.seq_id}: a forward item needs at least one token")
        context_len = item.start_pos + query_len
        context_slots = slots_of(item.block_table, block_size, context_len, device)
        mask = None
        if item.start_pos > 0 and query_len > 1:
            # Query i sits at absolute position start_pos + i and sees positions <= that.
            query_pos = torch.arange(item.start_pos, context_len, device=device)
            mask = torch.arange(context_len, device=device)[None, :] <= query_pos[:, None]
        slices.append(
            ItemSlice(row, row + query_len, context_slots, mask, item.start_pos == 0 and query_len > 1)
        )
        write_slots.append(context_slots[item.start_pos :])
        positions.append(torch.arange(item.start_pos, context_len, device=device))
        row += query_len
    slot_mapping = torch.cat(write_slots) if write_slots else torch.empty(0, dtype=torch.int64, device=device)
    all_positions = torch.cat(positions) if positions else torch.empty(0, dtype=torch.int64, device=device)
    single = [s for s in slices if s.query_end - s.query_start == 1]
    if single and triton_decode_available(device):
        pairs = [(s, item) for s, item in zip(slices, items, strict=True) if s.query_end - s.query_start == 1]
        kernel_decodes = _kernel_decode_batch(pairs, block_size, device)
        return PagedContext(kv_cache, slot_mapping, slices, kernel_decodes=kernel_decodes), all_positions
    return PagedContext(kv_cache, slot_mapping, slices, _decode_batch(single, device)), all_positions


@functools.cache
def _triton_importable() -> bool:
    try:
        from clairvoyant.kernels import triton_available
    except ImportError:
        return False
    return triton_available()


def triton_decode_available(device: torch.device) -> bool:
    """Decode items on ``device`` go to the Triton paged decode kernel: a CUDA device, and the
    kernels package with Triton installed.  The CPU always keeps the SDPA path."""
    return device.type == "cuda" and _triton_importable()


def _kernel_decode_batch(
    pairs: list[tuple[ItemSlice, ForwardItem]], block_size: int, device: torch.device
) -> KernelDecodeBatch:
    # Built on the host and moved in one copy each: per-row writes would each be a kernel launch.
    lengths = [item.start_pos + 1 for _, item in pairs]
    tables = [
        list(item.block_table[: -(-length // block_size)])
        for (_, item), length in zip(pairs, lengths, strict=True)
    ]
    widest = max(len(table) for table in tables)
    padded = [table + [0] * (widest - len(table)) for table in tables]
    return KernelDecodeBatch(
        rows=torch.tensor([s.query_start for s, _ in pairs], dtype=torch.int64, device=device),
        block_tables=torch.tensor(padded, dtype=torch.int32, device=device),
        seq_lens=torch.tensor(lengths, dtype=torch.int32, device=device),
        block_size=block_size,
    )


def _decode_batch(single: list[ItemSlice], device: torch.device) -> DecodeBatch | None:
    if not single:
        return None
    longest = max(len(s.context_slots) for s in single)
    slots = torch.zeros(len(single), longest, dtype=torch.int64, device=device)
    mask = torch.zeros(len(single), 1, 1, longest, dtype=torch.bool, device=device)
    for i, item in enumerate(single):
        slots[i, : len(item.context_slots)] = item.context_slots
        mask[i, 0, 0, : len(item.context_slots)] = True
    rows = torch.tensor([s.query_start for s in single], dtype=torch.int64, device=device)
    return DecodeBatch(rows, slots, mask)


def paged_attention(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, layer: int, context: PagedContext, scale: float
) -> torch.Tensor:
    """Write ``k``/``v`` ([T, kv_heads, d]) into the cache, then attend ``q`` ([T, heads, d]) per item."""
    layer_cache = context.kv_cache[layer]
    layer_cache[0].index_copy_(0, context.slot_mapping, k.to(layer_cache.dtype))
    layer_cache[1].index_copy_(0, context.slot_mapping, v.to(layer_cache.dtype))
    out = torch.empty_like(q)
    for item in context.items:
        if item.query_end - item.query_start == 1:
            continue  # attended below, with the other decodes
        # [context_len, kv_heads, d] -> [kv_heads, context_len, d], the layout SDPA expects.
        keys = layer_cache[0].index_select(0, item.context_slots).transpose(0, 1)
        values = layer_cache[1].index_select(0, item.context_slots).transpose(0, 1)
        queries = q[item.query_start : item.query_end].transpose(0, 1)
        attended = F.scaled_dot_product_attention(
            queries, keys, values, attn_mask=item.mask, is_causal=item.is_causal, scale=scale, enable_gqa=True
        )
        out[item.query_start : item.query_end] = attended.transpose(0, 1)
    if context.decodes is not None:
        batch = context.decodes
        # [D, max_context, kv_heads, d] -> [D, kv_heads, max_context, d]
        keys = layer_cache[0][batch.context_slots].transpose(1, 2)
        values = layer_cache[1][batch.context_slots].transpose(1, 2)
        queries = q[batch.rows].unsqueeze(2)  # [D, heads, 1, d]
        attended = F.scaled_dot_product_attention(
            queries, keys, values, attn_mask=batch.mask, scale=scale, enable_gqa=True
        )
        out[batch.rows] = attended.squeeze(2)
    if context.kernel_decodes is not None:
        from clairvoyant.kernels.paged_attention import paged_decode_attention

        kernel_batch = context.kernel_decodes
        out[kernel_batch.rows] = paged_decode_attention(
            q[kernel_batch.rows],
            layer_cache[0],
            layer_cache[1],
            kernel_batch.block_tables,
            kernel_batch.seq_lens,
            kernel_batch.block_size,
            scale,
            impl="triton",
        )
    return out


def causal_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, scale: float) -> torch.Tensor:
    """Reference: one whole sequence attending to itself causally, no cache ([T, heads, d] layout)."""
    attended = F.scaled_dot_product_attention(
        q.transpose(0, 1), k.transpose(0, 1), v.transpose(0, 1), is_causal=True, scale=scale, enable_gqa=True
    )
    return attended.transpose(0, 1)
