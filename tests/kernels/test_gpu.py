"""On a CUDA device: the swap kernel's bandwidth against per-block copies, and the decode kernel at a
realistic size.  Timings are printed (``-s``), never asserted; the copies' contents are."""

from __future__ import annotations

from collections.abc import Callable

import pytest
import torch

from clairvoyant.kernels.kv_pages import (
    copy_pages_loop,
    gather_pages,
    gather_pages_torch,
    page_shape,
    scatter_pages,
)
from clairvoyant.kernels.paged_attention import paged_decode_attention, paged_decode_attention_torch

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device"),
]

# SmolLM2-135M: 30 layers, 3 KV heads of 64, blocks of 16 tokens, bfloat16.
LAYERS, KV_HEADS, HEAD_DIM, BLOCK_SIZE, NUM_BLOCKS, NUM_PAGES = 30, 3, 64, 16, 2048, 128


def seconds_per_call(fn: Callable[[], object], repeats: int = 20) -> float:
    for _ in range(3):
        fn()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    torch.cuda.synchronize()
    start.record()
    for _ in range(repeats):
        fn()
    end.record()
    torch.cuda.synchronize()
    return start.elapsed_time(end) / 1e3 / repeats


def test_swap_kernel_bandwidth_against_per_block_copies(device: torch.device) -> None:
    generator = torch.Generator(device=device).manual_seed(0)
    shape = (LAYERS, 2, NUM_BLOCKS * BLOCK_SIZE, KV_HEADS, HEAD_DIM)
    kv = torch.randn(shape, generator=generator, device=device).to(torch.bfloat16)
    ids = torch.randperm(NUM_BLOCKS, generator=generator, device=device)[:NUM_PAGES]
    staging = torch.empty(page_shape(kv, NUM_PAGES, BLOCK_SIZE), dtype=kv.dtype, device=device)
    host = torch.empty(staging.shape, dtype=kv.dtype, pin_memory=True)
    host_ids = ids.tolist()
    moved = staging.numel() * staging.element_size()

    def kernel_to_host() -> None:
        gather_pages(kv, ids, BLOCK_SIZE, out=staging, impl="triton")
        host.copy_(staging, non_blocking=True)

    def loop_to_host() -> None:
        copy_pages_loop(kv, host_ids, host, BLOCK_SIZE, direction="gather")

    figures = {
        "triton gather, device to device": seconds_per_call(
            lambda: gather_pages(kv, ids, BLOCK_SIZE, out=staging, impl="triton")
        ),
        "per-block copy_, device to device": seconds_per_call(
            lambda: copy_pages_loop(kv, host_ids, staging, BLOCK_SIZE, direction="gather")
        ),
        "triton gather + one copy to pinned host": seconds_per_call(kernel_to_host),
        "per-block copy_ to pinned host": seconds_per_call(loop_to_host),
    }
    for name, seconds in figures.items():
        print(f"{name}: {moved / seconds / 1e9:.1f} GB/s ({seconds * 1e3:.3f} ms for {NUM_PAGES} pages)")

    expected = gather_pages_torch(kv, ids, BLOCK_SIZE)
    kernel_to_host()
    torch.cuda.synchronize()
    assert torch.equal(host.to(device), expected)
    loop_to_host()
    torch.cuda.synchronize()
    assert torch.equal(host.to(device), expected)
    restored = torch.zeros_like(kv)
    scatter_pages(restored, ids, expected, BLOCK_SIZE, impl="triton")
    assert torch.equal(gather_pages_torch(restored, ids, BLOCK_SIZE), expected)
    assert torch.count_nonzero(restored) == torch.count_nonzero(expected)  # nothing written elsewhere


def test_decode_kernel_at_a_realistic_size(device: torch.device) -> None:
    generator = torch.Generator(device=device).manual_seed(0)
    batch, q_heads = 16, 9
    seq_lens = torch.randint(1, 2000, (batch,), generator=generator, device=device, dtype=torch.int32)
    max_blocks = -(-2000 // BLOCK_SIZE)
    tables = torch.randperm(NUM_BLOCKS, generator=generator, device=device)[: batch * max_blocks]
    tables = tables.view(batch, max_blocks).to(torch.int32)
    k_cache = torch.randn(NUM_BLOCKS * BLOCK_SIZE, KV_HEADS, HEAD_DIM, generator=generator, device=device)
    v_cache = torch.randn(k_cache.shape, generator=generator, device=device)
    q = torch.randn(batch, q_heads, HEAD_DIM, generator=generator, device=device)
    args = (
        q.bfloat16(),
        k_cache.bfloat16(),
        v_cache.bfloat16(),
        tables,
        seq_lens,
        BLOCK_SIZE,
        HEAD_DIM**-0.5,
    )
    got = paged_decode_attention(*args, impl="triton")
    expected = paged_decode_attention_torch(*args)
    torch.testing.assert_close(got.float(), expected.float(), atol=2e-2, rtol=2e-2)
    seconds = seconds_per_call(lambda: paged_decode_attention(*args, impl="triton"))
    print(f"paged decode, {batch} sequences of up to 2,000 keys: {seconds * 1e6:.0f} us")
