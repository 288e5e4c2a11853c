"""The Triton KV page mover equals its torch reference bit for bit, and both equal plain slicing."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, NamedTuple

import pytest
import torch

from clairvoyant.kernels.kv_pages import (
    copy_pages_loop,
    gather_pages,
    gather_pages_torch,
    page_shape,
    scatter_pages,
    scatter_pages_torch,
)

pytestmark = pytest.mark.unit


class Case(NamedTuple):
    layers: int
    kv_heads: int
    head_dim: int
    block_size: int
    num_blocks: int
    block_ids: list[int]
    dtype: torch.dtype


CASES = {
    "one-page": Case(2, 2, 8, 4, 5, [3], torch.float32),
    "unsorted-gaps": Case(3, 1, 8, 4, 9, [6, 1, 4], torch.float32),
    "all-reversed-bf16": Case(2, 2, 4, 2, 6, [5, 4, 3, 2, 1, 0], torch.bfloat16),
    "odd-fp16": Case(2, 3, 5, 3, 7, [2, 6, 0], torch.float16),  # 90-byte items: 2-byte words
    "odd-fp32": Case(1, 3, 5, 3, 4, [1, 3], torch.float32),  # 180-byte items: 4-byte words
    "odd-bytes": Case(2, 3, 5, 3, 5, [4, 0], torch.uint8),  # 45-byte items: byte words
}
CASE = pytest.mark.parametrize("case", list(CASES.values()), ids=list(CASES))


def make_kv(case: Case, device: torch.device, seed: int = 0) -> torch.Tensor:
    shape = (case.layers, 2, case.num_blocks * case.block_size, case.kv_heads, case.head_dim)
    generator = torch.Generator().manual_seed(seed)
    if case.dtype == torch.uint8:
        return torch.randint(0, 256, shape, generator=generator, dtype=torch.uint8).to(device)
    return torch.randn(shape, generator=generator).to(device=device, dtype=case.dtype)


def sliced(kv: torch.Tensor, block: int, block_size: int) -> torch.Tensor:
    """Block ``block`` of every layer, K and V: ``[L, 2, block_size, H, D]``, by plain slicing."""
    return kv[:, :, block * block_size : (block + 1) * block_size]


@CASE
def test_gather_matches_reference_and_slices(case: Case, device: torch.device) -> None:
    kv = make_kv(case, device)
    pages = gather_pages(kv, case.block_ids, case.block_size, impl="triton")
    reference = gather_pages_torch(kv, case.block_ids, case.block_size)
    assert pages.shape == (len(case.block_ids), case.layers, 2, case.block_size, case.kv_heads, case.head_dim)
    assert torch.equal(pages, reference)
    for page, block in enumerate(case.block_ids):
        assert torch.equal(pages[page], sliced(kv, block, case.block_size))


@CASE
def test_scatter_matches_reference_and_leaves_other_blocks(case: Case, device: torch.device) -> None:
    kv = make_kv(case, device)
    pages = make_kv(case, device, seed=1).view(case.layers, 2, case.num_blocks, -1)
    pages = pages[:, :, : len(case.block_ids)].permute(2, 0, 1, 3).contiguous()
    pages = pages.view(page_shape(kv, len(case.block_ids), case.block_size))
    by_kernel, by_torch = kv.clone(), kv.clone()
    scatter_pages(by_kernel, case.block_ids, pages, case.block_size, impl="triton")
    scatter_pages_torch(by_torch, case.block_ids, pages, case.block_size)
    assert torch.equal(by_kernel, by_torch)
    for block in range(case.num_blocks):
        expected = (
            pages[case.block_ids.index(block)]
            if block in case.block_ids
            else sliced(kv, block, case.block_size)
        )
        assert torch.equal(sliced(by_kernel, block, case.block_size), expected)


@CASE
def test_round_trip_restores_the_blocks(case: Case, device: torch.device) -> None:
    original = make_kv(case, device)
    kv = original.clone()
    ids = torch.tensor(case.block_ids, dtype=torch.int32, device=device)  # a tensor of int32 ids
    pages = gather_pages(kv, ids, case.block_size, impl="triton")
    for block in case.block_ids:
        sliced(kv, block, case.block_size).zero_()
    changed = len(case.block_ids) > 0 and not torch.equal(kv, original)
    scatter_pages(kv, ids, pages, case.block_size, impl="triton")
    assert changed  # the zeroing really removed data, so the equality below is the scatter's doing
    assert torch.equal(kv, original)


@CASE
def test_copy_loop_matches_reference_both_ways(case: Case, device: torch.device) -> None:
    kv = make_kv(case, device)
    pages = torch.empty(page_shape(kv, len(case.block_ids), case.block_size), dtype=kv.dtype, device=device)
    copy_pages_loop(kv, case.block_ids, pages, case.block_size, direction="gather")
    assert torch.equal(pages, gather_pages_torch(kv, case.block_ids, case.block_size))
    target, expected = torch.zeros_like(kv), torch.zeros_like(kv)
    copy_pages_loop(target, case.block_ids, pages, case.block_size, direction="scatter")
    scatter_pages_torch(expected, case.block_ids, pages, case.block_size)
    assert torch.equal(target, expected)


def test_gather_into_out_fills_and_returns_it(device: torch.device) -> None:
    case = CASES["unsorted-gaps"]
    kv = make_kv(case, device)
    out = torch.full(page_shape(kv, 3, case.block_size), -1.0, device=device)
    returned = gather_pages(kv, case.block_ids, case.block_size, out=out, impl="triton")
    assert returned is out
    assert torch.equal(out, gather_pages_torch(kv, case.block_ids, case.block_size))


def test_auto_on_cpu_uses_the_reference() -> None:
    # On CPU tensors "auto" must not need the interpreter: it picks the torch version.
    case = CASES["one-page"]
    kv = make_kv(case, torch.device("cpu"))
    assert torch.equal(gather_pages(kv, [4, 0], 4), torch.stack([sliced(kv, 4, 4), sliced(kv, 0, 4)]))


@pytest.mark.parametrize(
    ("change", "message"),
    [
        (lambda kv, ids, pages: (kv[0], ids, pages), "kv must be"),
        (lambda kv, ids, pages: (kv, [0, 5], pages[:2]), r"block ids must lie in \[0, 5\)"),
        (lambda kv, ids, pages: (kv, [-1], pages[:1]), "block ids must lie"),
        (lambda kv, ids, pages: (kv, [], pages[:0]), "block_ids is empty"),
        (lambda kv, ids, pages: (kv, torch.tensor([[0]]), pages[:1]), "one-dimensional"),
        (lambda kv, ids, pages: (kv, torch.tensor([0.0]), pages[:1]), "int32 or int64"),
        (lambda kv, ids, pages: (kv, ids, pages[:1]), "pages must have shape"),
        (lambda kv, ids, pages: (kv, ids, pages.double()), "dtype"),
        (lambda kv, ids, pages: (kv.transpose(3, 4).contiguous().transpose(3, 4), ids, pages), "contiguous"),
    ],
    ids=["rank", "id-too-big", "id-negative", "empty", "ids-2d", "ids-float", "pages-shape", "pages-dtype",
         "kv-strided"],
)  # fmt: skip
def test_scatter_rejects_bad_arguments(change: Callable[..., tuple[Any, ...]], message: str) -> None:
    kv = torch.zeros(2, 2, 5 * 4, 2, 8)
    pages = torch.zeros(page_shape(kv, 2, 4))
    kv, ids, pages = change(kv, [1, 2], pages)
    with pytest.raises(ValueError, match=message):
        scatter_pages(kv, ids, pages, 4, impl="torch")


def test_block_size_must_divide_slots_and_impl_be_known() -> None:
    kv = torch.zeros(1, 2, 10, 1, 4)
    with pytest.raises(ValueError, match="block_size 4 must be positive and divide the 10 slots"):
        gather_pages(kv, [0], 4)
    with pytest.raises(ValueError, match="impl must be one of"):
        gather_pages(kv, [0], 5, impl="cuda")  # type: ignore[arg-type]
