"""The Triton paged decode attention equals its torch reference, which equals dense SDPA."""

from __future__ import annotations

from typing import NamedTuple

import pytest
import torch
import torch.nn.functional as F

from clairvoyant.kernels.paged_attention import paged_decode_attention, paged_decode_attention_torch

pytestmark = pytest.mark.unit

TOLERANCE = {torch.float32: 1e-5, torch.float16: 2e-3, torch.bfloat16: 2e-2}


class Case(NamedTuple):
    q_heads: int
    kv_heads: int
    head_dim: int
    block_size: int
    seq_lens: list[int]
    num_kv_splits: int
    dtype: torch.dtype = torch.float32
    table_dtype: torch.dtype = torch.int32


CASES = {
    "gqa-partial-last-block": Case(6, 2, 16, 4, [13, 5], 4),
    "mha-full-blocks": Case(2, 2, 8, 4, [8, 12], 2),
    "mqa-one-token": Case(4, 1, 8, 2, [1, 3], 3),
    "more-splits-than-keys": Case(2, 1, 8, 4, [3, 2], 8),  # empty splits must not count
    "one-split-past-a-tile": Case(2, 1, 8, 8, [70], 1),  # 70 keys: two 64-key tiles in one program
    "head-dim-not-pow2": Case(3, 3, 20, 3, [10, 7], 2, table_dtype=torch.int64),
    "empty-sequence": Case(2, 2, 8, 4, [0, 9], 2),  # seq_len 0: a zero output
    "bf16": Case(4, 2, 16, 4, [11, 6], 2, torch.bfloat16),
    "fp16": Case(4, 2, 16, 4, [11, 6], 2, torch.float16),
}


class Inputs(NamedTuple):
    q: torch.Tensor
    k_cache: torch.Tensor
    v_cache: torch.Tensor
    block_tables: torch.Tensor
    seq_lens: torch.Tensor
    scale: float


def make_inputs(case: Case, device: torch.device, seed: int = 0) -> Inputs:
    """Caches with spare blocks, and block tables that use them scrambled (never block b at index b)."""
    generator = torch.Generator().manual_seed(seed)
    blocks_needed = [-(-n // case.block_size) for n in case.seq_lens]
    num_blocks = sum(blocks_needed) + 3
    order = torch.randperm(num_blocks, generator=generator).tolist()
    width = max(blocks_needed) + 1  # a spare column: entries past the end must be ignored
    tables = torch.zeros(len(case.seq_lens), width, dtype=case.table_dtype)
    for row, needed in enumerate(blocks_needed):
        tables[row, :needed] = torch.tensor(order[:needed])
        order = order[needed:]
        tables[row, needed:] = num_blocks - 1  # garbage that must not be read as keys
    slots = num_blocks * case.block_size

    def random(*shape: int) -> torch.Tensor:
        return torch.randn(*shape, generator=generator).to(device=device, dtype=case.dtype)

    return Inputs(
        q=random(len(case.seq_lens), case.q_heads, case.head_dim),
        k_cache=random(slots, case.kv_heads, case.head_dim),
        v_cache=random(slots, case.kv_heads, case.head_dim),
        block_tables=tables.to(device),
        seq_lens=torch.tensor(case.seq_lens, dtype=torch.int32, device=device),
        scale=case.head_dim**-0.5,
    )


def dense_sdpa(inputs: Inputs, block_size: int) -> torch.Tensor:
    """Each sequence's keys copied out position by position, then SDPA with GQA, in float32."""
    out = torch.zeros(inputs.q.shape, dtype=torch.float32)
    for row, length in enumerate(inputs.seq_lens.tolist()):
        if length == 0:
            continue
        slots = [
            int(inputs.block_tables[row, p // block_size]) * block_size + p % block_size
            for p in range(length)
        ]
        keys = inputs.k_cache[slots].float().cpu().transpose(0, 1)  # [kv_heads, length, D]
        values = inputs.v_cache[slots].float().cpu().transpose(0, 1)
        query = inputs.q[row].float().cpu().unsqueeze(1)  # [q_heads, 1, D]
        attended = F.scaled_dot_product_attention(query, keys, values, scale=inputs.scale, enable_gqa=True)
        out[row] = attended.squeeze(1)
    return out


@pytest.mark.parametrize("case", list(CASES.values()), ids=list(CASES))
def test_kernel_matches_reference_and_sdpa(case: Case, device: torch.device) -> None:
    inputs = make_inputs(case, device)
    args = (*inputs[:5], case.block_size, inputs.scale)
    got = paged_decode_attention(*args, num_kv_splits=case.num_kv_splits, impl="triton")
    reference = paged_decode_attention_torch(*args)
    assert got.dtype == case.dtype and got.shape == inputs.q.shape
    tolerance = TOLERANCE[case.dtype]
    torch.testing.assert_close(got.float().cpu(), reference.float().cpu(), atol=tolerance, rtol=tolerance)
    expected = dense_sdpa(inputs, case.block_size)
    torch.testing.assert_close(reference.float().cpu(), expected, atol=tolerance, rtol=tolerance)
    for row, length in enumerate(case.seq_lens):
        if length == 0:
            assert torch.count_nonzero(got[row]) == 0


def test_split_count_does_not_change_the_result(device: torch.device) -> None:
    case = CASES["gqa-partial-last-block"]
    inputs = make_inputs(case, device, seed=3)
    args = (*inputs[:5], case.block_size, inputs.scale)
    outputs = [paged_decode_attention(*args, num_kv_splits=n, impl="triton").cpu() for n in (1, 2, 5)]
    torch.testing.assert_close(outputs[0], outputs[1], atol=1e-6, rtol=1e-5)
    torch.testing.assert_close(outputs[0], outputs[2], atol=1e-6, rtol=1e-5)


def test_keys_past_seq_len_are_not_read(device: torch.device) -> None:
    # Poison every slot the sequences do not own: a kernel that reads past seq_len returns NaN.
    case = CASES["gqa-partial-last-block"]
    inputs = make_inputs(case, device)
    owned = torch.zeros(inputs.k_cache.shape[0], dtype=torch.bool)
    for row, length in enumerate(case.seq_lens):
        for p in range(length):
            owned[
                int(inputs.block_tables[row, p // case.block_size]) * case.block_size + p % case.block_size
            ] = True
    k_cache, v_cache = inputs.k_cache.clone(), inputs.v_cache.clone()
    k_cache[~owned.to(k_cache.device)] = float("nan")
    v_cache[~owned.to(v_cache.device)] = float("nan")
    got = paged_decode_attention(
        inputs.q, k_cache, v_cache, inputs.block_tables, inputs.seq_lens, case.block_size, inputs.scale,
        num_kv_splits=3, impl="triton",
    )  # fmt: skip
    assert not torch.isnan(got).any()
    reference = paged_decode_attention_torch(*inputs[:5], case.block_size, inputs.scale)
    torch.testing.assert_close(got, reference, atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        ({"q": torch.zeros(2, 6)}, "q must be"),
        ({"v_cache": torch.zeros(20, 2, 8)}, "k_cache and v_cache must both be"),
        ({"q": torch.zeros(2, 5, 16)}, "not a multiple of num_kv_heads"),
        ({"block_tables": torch.zeros(3, 2, dtype=torch.int32)}, "block_tables must be"),
        ({"block_tables": torch.zeros(2, 2)}, "int32 or int64"),
        ({"seq_lens": torch.tensor([13, 99])}, "capacity"),
        ({"seq_lens": torch.tensor([13])}, "seq_lens must be"),
    ],
    ids=["q-rank", "v-shape", "gqa-ratio", "table-rows", "table-dtype", "too-long", "seq-lens-shape"],
)
def test_rejects_bad_arguments(overrides: dict[str, torch.Tensor], message: str) -> None:
    case = CASES["gqa-partial-last-block"]
    inputs = make_inputs(case, torch.device("cpu"))._replace(**overrides)
    with pytest.raises(ValueError, match=message):
        paged_decode_attention(*inputs[:5], case.block_size, inputs.scale, impl="torch")
