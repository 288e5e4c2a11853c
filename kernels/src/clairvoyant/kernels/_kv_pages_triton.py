"""The Triton kernel behind ``kv_pages.gather_pages`` / ``scatter_pages`` (imported only when used).

Both tensors are read as machine words (int64 where the item size allows), so the copy is a bit copy
for every dtype; in words::

    kv     [L * 2, num_blocks, item_words]     row (layer*2 + k|v, block)
    pages  [P, L * 2, item_words]              row (page, layer*2 + k|v)

    program (page, item = layer*2 + k|v):
        kv_start   = item * num_blocks * item_words + block_ids[page] * item_words
        page_start = (page * L * 2 + item) * item_words
        copy item_words words, BLOCK at a time
"""

from __future__ import annotations

import contextlib

import torch
import triton
import triton.language as tl

from clairvoyant.kernels._triton import check_launchable, is_interpreted

# Words per program and loop step: a 12 KiB SmolLM2 page item is 1,536 int64 words.
_MAX_BLOCK = 1024


@triton.jit
def _move_pages_kernel(
    kv_ptr,
    pages_ptr,
    block_ids_ptr,
    num_blocks,
    ITEM_WORDS: tl.constexpr,
    ITEMS_PER_PAGE: tl.constexpr,
    TO_PAGES: tl.constexpr,
    BLOCK: tl.constexpr,
):
    page = tl.program_id(0).to(tl.int64)
    item = tl.program_id(1).to(tl.int64)
    block = tl.load(block_ids_ptr + page).to(tl.int64)
    kv_start = (item * num_blocks + block) * ITEM_WORDS
    page_start = (page * ITEMS_PER_PAGE + item) * ITEM_WORDS
    for offset in range(0, ITEM_WORDS, BLOCK):
        words = offset + tl.arange(0, BLOCK)
        inside = words < ITEM_WORDS
        if TO_PAGES:
            data = tl.load(kv_ptr + kv_start + words, mask=inside)
            tl.store(pages_ptr + page_start + words, data, mask=inside)
        else:
            data = tl.load(pages_ptr + page_start + words, mask=inside)
            tl.store(kv_ptr + kv_start + words, data, mask=inside)


def interpreted() -> bool:
    """The kernel runs in Triton's interpreter (``TRITON_INTERPRET=1`` was set when it was defined)."""
    return is_interpreted(_move_pages_kernel)


def _word_dtype(item_bytes: int, *tensors: torch.Tensor) -> torch.dtype:
    """The widest integer type that divides an item and every tensor's start address."""
    for size, dtype in ((8, torch.int64), (4, torch.int32), (2, torch.int16)):
        if item_bytes % size == 0 and all(t.data_ptr() % size == 0 for t in tensors):
            return dtype
    return torch.uint8


def move_pages(
    kv: torch.Tensor, block_ids: torch.Tensor, pages: torch.Tensor, block_size: int, *, to_pages: bool
) -> None:
    """Copy between ``kv`` and ``pages`` (validated contiguous by the caller) along ``block_ids`` (int64)."""
    check_launchable(_move_pages_kernel, kv, pages, block_ids)
    layers, _, slots, heads, head_dim = kv.shape
    item_bytes = block_size * heads * head_dim * kv.element_size()
    word = _word_dtype(item_bytes, kv, pages)
    item_words = item_bytes // torch.empty((), dtype=word).element_size()
    block = min(triton.next_power_of_2(item_words), _MAX_BLOCK)
    grid = (len(block_ids), layers * 2)
    with torch.cuda.device(kv.device) if kv.is_cuda else contextlib.nullcontext():
        _move_pages_kernel[grid](
            kv.view(-1).view(word),
            pages.view(-1).view(word),
            block_ids,
            slots // block_size,
            ITEM_WORDS=item_words,
            ITEMS_PER_PAGE=layers * 2,
            TO_PAGES=to_pages,
            BLOCK=block,
        )
