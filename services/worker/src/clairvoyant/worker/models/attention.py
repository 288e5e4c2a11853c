"""Paged attention in plain torch over the KV layout of ``runners/base.py``.

One engine step flattens every item's new tokens into one batch of ``T`` rows; the projections run on
all rows at once, and attention runs per item over that item's context read back from the blocks::

    rows:      | item 0: 5 prefill tokens | item 1: 1 decode token | item 2: 3 chunk tokens |
    K/V write: slot_mapping[row] = block_table[pos // block_size] * block_size + pos % block_size
    K/V read:  context_slots of item i = slots of positions 0 .. start_pos + len - 1

The metadata is built once per step and shared by every layer.
"""

from __future__ import annotations

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
class PagedContext:
    """Everything a layer needs to write and read paged K/V during one step."""

    kv_cache: torch.Tensor  # [num_layers, 2, num_slots, num_kv_heads, head_dim]
    slot_mapping: torch.Tensor  # [T] int64: where each new token's K/V is written
    items: list[ItemSlice]


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
    return PagedContext(kv_cache, slot_mapping, slices), all_positions


def paged_attention(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, layer: int, context: PagedContext, scale: float
) -> torch.Tensor:
    """Write ``k``/``v`` ([T, kv_heads, d]) into the cache, then attend ``q`` ([T, heads, d]) per item."""
    layer_cache = context.kv_cache[layer]
    layer_cache[0].index_copy_(0, context.slot_mapping, k.to(layer_cache.dtype))
    layer_cache[1].index_copy_(0, context.slot_mapping, v.to(layer_cache.dtype))
    out = torch.empty_like(q)
    for item in context.items:
        # [context_len, kv_heads, d] -> [kv_heads, context_len, d], the layout SDPA expects.
        keys = layer_cache[0].index_select(0, item.context_slots).transpose(0, 1)
        values = layer_cache[1].index_select(0, item.context_slots).transpose(0, 1)
        queries = q[item.query_start : item.query_end].transpose(0, 1)
        attended = F.scaled_dot_product_attention(
            queries, keys, values, attn_mask=item.mask, is_causal=item.is_causal, scale=scale, enable_gqa=True
        )
        out[item.query_start : item.query_end] = attended.transpose(0, 1)
    return out


def causal_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, scale: float) -> torch.Tensor:
    """Reference: one whole sequence attending to itself causally, no cache ([T, heads, d] layout)."""
    attended = F.scaled_dot_product_attention(
        q.transpose(0, 1), k.transpose(0, 1), v.transpose(0, 1), is_causal=True, scale=scale, enable_gqa=True
    )
    return attended.transpose(0, 1)
