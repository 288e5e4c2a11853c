"""The Triton kernels behind ``paged_attention.paged_decode_attention`` (imported only when used).

Stage 1, one program per (sequence b, q head h, split s), over positions [start, end) of b::

    split_len = cdiv(seq_len, NUM_KV_SPLITS)     start = s * split_len     end = min(start + split_len, seq_len)
    | split 0 | split 1 | split 2 | ... |        (a short sequence leaves the last splits empty)
    for BLOCK_N positions at a time:  slot = block_tables[b, pos // PAGE_SIZE] * PAGE_SIZE + pos % PAGE_SIZE
        running max m, running sum l, running acc (online softmax, float32)
    partial_out[b, h, s] = acc / l        partial_lse[b, h, s] = m + log(l)   (-inf when empty)

Stage 2, one program per (b, h): out = sum_s exp(lse_s - M) * partial_out_s / sum_s exp(lse_s - M).
"""

from __future__ import annotations

import contextlib

import torch
import triton
import triton.language as tl

from clairvoyant.kernels._triton import check_launchable, is_interpreted

# Keys per loop step of stage 1 (SGLang uses 64 on CUDA).
_BLOCK_N = 64


@triton.jit
def _decode_split_kernel(
    q_ptr,
    k_ptr,
    v_ptr,
    block_tables_ptr,
    seq_lens_ptr,
    partial_out_ptr,
    partial_lse_ptr,
    scale,
    stride_q_batch,
    stride_q_head,
    stride_k_slot,
    stride_k_head,
    stride_v_slot,
    stride_v_head,
    stride_table,
    GROUP: tl.constexpr,
    HEAD_DIM: tl.constexpr,
    BLOCK_D: tl.constexpr,
    BLOCK_N: tl.constexpr,
    PAGE_SIZE: tl.constexpr,
    NUM_KV_SPLITS: tl.constexpr,
):
    batch = tl.program_id(0)
    head = tl.program_id(1)
    split = tl.program_id(2)
    num_heads = tl.num_programs(1)
    kv_head = head // GROUP

    seq_len = tl.load(seq_lens_ptr + batch).to(tl.int32)
    split_len = tl.cdiv(seq_len, NUM_KV_SPLITS)
    start = split * split_len
    end = tl.minimum(start + split_len, seq_len)

    dims = tl.arange(0, BLOCK_D)
    dim_ok = dims < HEAD_DIM
    q = tl.load(q_ptr + batch * stride_q_batch + head * stride_q_head + dims, mask=dim_ok, other=0.0)
    q = q.to(tl.float32)

    running_max = -float("inf")
    running_sum = 0.0
    acc = tl.zeros([BLOCK_D], dtype=tl.float32)
    table = block_tables_ptr + batch.to(tl.int64) * stride_table
    for tile in range(start, end, BLOCK_N):
        positions = tile + tl.arange(0, BLOCK_N)
        valid = positions < end
        block = tl.load(table + positions // PAGE_SIZE, mask=valid, other=0).to(tl.int64)
        slots = block * PAGE_SIZE + positions % PAGE_SIZE
        load_ok = valid[:, None] & dim_ok[None, :]
        keys = tl.load(
            k_ptr + slots[:, None] * stride_k_slot + kv_head * stride_k_head + dims[None, :],
            mask=load_ok,
            other=0.0,
        ).to(tl.float32)
        scores = tl.sum(q[None, :] * keys, 1) * scale
        scores = tl.where(valid, scores, -float("inf"))
        new_max = tl.maximum(running_max, tl.max(scores, 0))
        rescale = tl.exp(running_max - new_max)
        weights = tl.exp(scores - new_max)
        values = tl.load(
            v_ptr + slots[:, None] * stride_v_slot + kv_head * stride_v_head + dims[None, :],
            mask=load_ok,
            other=0.0,
        ).to(tl.float32)
        acc = acc * rescale + tl.sum(weights[:, None] * values, 0)
        running_sum = running_sum * rescale + tl.sum(weights, 0)
        running_max = new_max

    # [B, heads, splits, HEAD_DIM] and [B, heads, splits], contiguous.
    row = (batch * num_heads + head) * NUM_KV_SPLITS + split
    nonempty = running_sum > 0.0
    partial = acc / tl.where(nonempty, running_sum, 1.0)
    tl.store(partial_out_ptr + row.to(tl.int64) * HEAD_DIM + dims, partial, mask=dim_ok)
    lse = tl.where(nonempty, running_max + tl.log(tl.where(nonempty, running_sum, 1.0)), -float("inf"))
    tl.store(partial_lse_ptr + row, lse)


@triton.jit
def _merge_splits_kernel(
    partial_out_ptr,
    partial_lse_ptr,
    out_ptr,
    stride_out_batch,
    stride_out_head,
    HEAD_DIM: tl.constexpr,
    BLOCK_D: tl.constexpr,
    NUM_KV_SPLITS: tl.constexpr,
):
    batch = tl.program_id(0)
    head = tl.program_id(1)
    num_heads = tl.num_programs(1)
    dims = tl.arange(0, BLOCK_D)
    dim_ok = dims < HEAD_DIM
    first_row = (batch * num_heads + head) * NUM_KV_SPLITS

    running_max = -float("inf")
    running_sum = 0.0
    acc = tl.zeros([BLOCK_D], dtype=tl.float32)
    for split in range(NUM_KV_SPLITS):
        lse = tl.load(partial_lse_ptr + first_row + split)
        partial = tl.load(
            partial_out_ptr + (first_row + split).to(tl.int64) * HEAD_DIM + dims, mask=dim_ok, other=0.0
        )
        new_max = tl.maximum(running_max, lse)
        # While every split so far is empty new_max is -inf: shift by 0 so exp(-inf - 0) = 0, not NaN.
        shift = tl.where(new_max == -float("inf"), 0.0, new_max)
        rescale = tl.exp(running_max - shift)
        weight = tl.exp(lse - shift)
        acc = acc * rescale + weight * partial
        running_sum = running_sum * rescale + weight
        running_max = new_max

    out = acc / tl.where(running_sum > 0.0, running_sum, 1.0)
    target = out_ptr + batch.to(tl.int64) * stride_out_batch + head * stride_out_head + dims
    tl.store(target, out.to(out_ptr.dtype.element_ty), mask=dim_ok)


def interpreted() -> bool:
    """The kernels run in Triton's interpreter (``TRITON_INTERPRET=1`` was set when they were defined)."""
    return is_interpreted(_decode_split_kernel)


def decode(
    q: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    block_tables: torch.Tensor,
    seq_lens: torch.Tensor,
    block_size: int,
    scale: float,
    num_kv_splits: int,
) -> torch.Tensor:
    """Both stages; arguments validated by ``paged_attention.paged_decode_attention``."""
    check_launchable(_decode_split_kernel, q, k_cache, v_cache, block_tables, seq_lens)
    if (
        q.stride(-1) != 1
        or k_cache.stride(-1) != 1
        or v_cache.stride(-1) != 1
        or block_tables.stride(-1) != 1
    ):
        raise ValueError("q, k_cache, v_cache and block_tables must be contiguous in their last dimension")
    batch, q_heads, head_dim = q.shape
    out = torch.empty_like(q)
    if batch == 0:
        return out
    partial_out = torch.empty(batch, q_heads, num_kv_splits, head_dim, dtype=torch.float32, device=q.device)
    partial_lse = torch.empty(batch, q_heads, num_kv_splits, dtype=torch.float32, device=q.device)
    block_d = triton.next_power_of_2(head_dim)
    with torch.cuda.device(q.device) if q.is_cuda else contextlib.nullcontext():
        _decode_split_kernel[(batch, q_heads, num_kv_splits)](
            q,
            k_cache,
            v_cache,
            block_tables,
            seq_lens,
            partial_out,
            partial_lse,
            scale,
            q.stride(0),
            q.stride(1),
            k_cache.stride(0),
            k_cache.stride(1),
            v_cache.stride(0),
            v_cache.stride(1),
            block_tables.stride(0),
            GROUP=q_heads // k_cache.shape[1],
            HEAD_DIM=head_dim,
            BLOCK_D=block_d,
            BLOCK_N=_BLOCK_N,
            PAGE_SIZE=block_size,
            NUM_KV_SPLITS=num_kv_splits,
        )
        _merge_splits_kernel[(batch, q_heads)](
            partial_out,
            partial_lse,
            out,
            out.stride(0),
            out.stride(1),
            HEAD_DIM=head_dim,
            BLOCK_D=block_d,
            NUM_KV_SPLITS=num_kv_splits,
        )
    return out
