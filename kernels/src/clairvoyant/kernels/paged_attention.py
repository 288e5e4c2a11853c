"""Decode attention (one query token per sequence) over a paged KV cache, addressed by block tables.

Layouts::

    q             [B, num_q_heads, D]
    k_cache       [num_blocks * block_size, num_kv_heads, D]     kv[layer, 0] of the runner's cache
    v_cache       [num_blocks * block_size, num_kv_heads, D]     kv[layer, 1]
    block_tables  [B, max_blocks] int32/int64                    entries past a sequence's end are ignored
    seq_lens      [B]                                             keys attended: positions 0 .. seq_len-1
    slot(b, pos)  = block_tables[b, pos // block_size] * block_size + pos % block_size
    q head h reads kv head h // (num_q_heads // num_kv_heads)    (GQA)

The Triton kernel follows the split-KV decode kernels of SGLang (``decode_attention.py``) and vLLM
(``triton_decode_attention.py``, which reads pages through a block table): stage 1 runs one program
per (sequence, q head, split) over its share of the keys with an online softmax and writes a
normalised partial output and its log-sum-exp; stage 2 merges the splits by their LSE.  Scores and
sums are float32; the output has q's dtype.  A sequence with ``seq_len == 0`` gets a zero output.
"""

from __future__ import annotations

import torch

from clairvoyant.kernels._triton import Impl, use_triton

DEFAULT_KV_SPLITS = 8


def _check(
    q: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    block_tables: torch.Tensor,
    seq_lens: torch.Tensor,
    block_size: int,
) -> None:
    if q.dim() != 3:
        raise ValueError(f"q must be [batch, num_q_heads, head_dim], got shape {tuple(q.shape)}")
    if k_cache.dim() != 3 or k_cache.shape != v_cache.shape:
        shapes = f"{tuple(k_cache.shape)} and {tuple(v_cache.shape)}"
        raise ValueError(f"k_cache and v_cache must both be [slots, num_kv_heads, head_dim], got {shapes}")
    if k_cache.dtype != v_cache.dtype:
        raise ValueError(f"k_cache is {k_cache.dtype} but v_cache is {v_cache.dtype}")
    if not q.is_floating_point() or not k_cache.is_floating_point():
        raise ValueError(f"q and the caches must be floating point, got {q.dtype} and {k_cache.dtype}")
    batch, q_heads, head_dim = q.shape
    slots, kv_heads, _ = k_cache.shape
    if k_cache.shape[2] != head_dim:
        raise ValueError(f"q has head_dim {head_dim}, the caches {k_cache.shape[2]}")
    if q_heads % kv_heads != 0:
        raise ValueError(f"num_q_heads {q_heads} is not a multiple of num_kv_heads {kv_heads}")
    if block_size <= 0 or slots % block_size != 0:
        raise ValueError(f"block_size {block_size} must be positive and divide the {slots} cache slots")
    if block_tables.dim() != 2 or block_tables.shape[0] != batch:
        raise ValueError(f"block_tables must be [{batch}, max_blocks], got shape {tuple(block_tables.shape)}")
    if block_tables.dtype not in (torch.int32, torch.int64):
        raise ValueError(f"block_tables must be int32 or int64, got {block_tables.dtype}")
    if seq_lens.shape != (batch,) or seq_lens.dtype not in (torch.int32, torch.int64):
        raise ValueError(
            f"seq_lens must be int32/int64 of shape ({batch},), got {seq_lens.dtype} {tuple(seq_lens.shape)}"
        )
    if not seq_lens.is_cuda and batch > 0:
        # Only on the CPU: checking device values would synchronise the stream.
        longest, capacity = int(seq_lens.max()), block_tables.shape[1] * block_size
        if int(seq_lens.min()) < 0 or longest > capacity:
            raise ValueError(
                f"seq_lens must lie in [0, {capacity}] (block_tables' capacity), got max {longest}"
            )


def paged_decode_attention(
    q: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    block_tables: torch.Tensor,
    seq_lens: torch.Tensor,
    block_size: int,
    scale: float,
    *,
    num_kv_splits: int = DEFAULT_KV_SPLITS,
    impl: Impl = "auto",
) -> torch.Tensor:
    """Attention output ``[B, num_q_heads, D]`` (q's dtype) of each sequence's one query over its keys.

    ``num_kv_splits`` is how many programs share one (sequence, head)'s keys in the Triton kernel;
    the torch reference ignores it.  Raises ``ValueError`` on inconsistent shapes or dtypes.
    """
    _check(q, k_cache, v_cache, block_tables, seq_lens, block_size)
    if num_kv_splits < 1:
        raise ValueError(f"num_kv_splits must be at least 1, got {num_kv_splits}")
    if use_triton(impl, q, k_cache, v_cache, block_tables, seq_lens):
        from clairvoyant.kernels import _paged_attention_triton

        return _paged_attention_triton.decode(
            q, k_cache, v_cache, block_tables, seq_lens, block_size, scale, num_kv_splits
        )
    return _reference(q, k_cache, v_cache, block_tables, seq_lens, block_size, scale)


def paged_decode_attention_torch(
    q: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    block_tables: torch.Tensor,
    seq_lens: torch.Tensor,
    block_size: int,
    scale: float,
) -> torch.Tensor:
    """Reference ``paged_decode_attention``: each sequence's keys gathered, then a float32 softmax."""
    return paged_decode_attention(
        q, k_cache, v_cache, block_tables, seq_lens, block_size, scale, impl="torch"
    )


def _reference(
    q: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    block_tables: torch.Tensor,
    seq_lens: torch.Tensor,
    block_size: int,
    scale: float,
) -> torch.Tensor:
    group = q.shape[1] // k_cache.shape[1]
    out = torch.zeros_like(q)
    for row, length in enumerate(seq_lens.tolist()):
        if length == 0:
            continue
        positions = torch.arange(length, device=q.device)
        slots = block_tables[row, positions // block_size].long() * block_size + positions % block_size
        keys = k_cache[slots].float().repeat_interleave(group, dim=1)  # [length, q_heads, D]
        values = v_cache[slots].float().repeat_interleave(group, dim=1)
        scores = torch.einsum("hd,nhd->hn", q[row].float(), keys) * scale
        out[row] = torch.einsum("hn,nhd->hd", scores.softmax(dim=-1), values).to(q.dtype)
    return out
