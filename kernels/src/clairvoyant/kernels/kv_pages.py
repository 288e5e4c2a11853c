"""Move a batch of KV pages between the paged cache and a page-first staging buffer, by block id.

The two layouts (one *item* is one layer's K or V of one block: ``block_size * H * D`` contiguous
elements in both)::

    kv     [L, 2, num_blocks * block_size, H, D]    the runner's cache (runners/base.py)
            item (layer, k|v, block b) = kv[layer, k|v, b*block_size : (b+1)*block_size]
    pages  [P, L, 2, block_size, H, D]              staging: page p is one contiguous object
            item (p, layer, k|v)       = pages[p, layer, k|v]

    gather_pages:  pages[p, layer, k|v] <- kv[layer, k|v, block block_ids[p]]
    scatter_pages: kv[layer, k|v, block block_ids[p]] <- pages[p, layer, k|v]

The Triton kernel follows SGLang's ``transfer_kv`` (layer-first to page-first): one program per
(page, layer, K|V) item, the item's offsets computed from an index tensor of block ids, the bytes
moved as the widest machine words that divide the item (SGLang moves 8-byte words), so the copy is
bit-exact for every dtype.  Both tensors live on one device: a swap to host memory gathers into a
device staging buffer, then moves it as one contiguous copy.  ``copy_pages_loop`` is the baseline:
one ``copy_`` per contiguous item, what vLLM's ``swap_blocks`` does with one ``cudaMemcpyAsync`` per
block and layer.

Block ids may be a list or an int64/int32 tensor, in any order; ids in a list or a CPU tensor are
range-checked, ids already on the GPU are not (checking would synchronise the device).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Literal

import torch

from clairvoyant.kernels._triton import Impl, use_triton

BlockIds = Sequence[int] | torch.Tensor


def page_shape(kv: torch.Tensor, num_pages: int, block_size: int) -> tuple[int, ...]:
    """The staging shape ``[P, L, 2, block_size, H, D]`` of ``num_pages`` pages of ``kv``."""
    layers, _, _, heads, head_dim = kv.shape
    return (num_pages, layers, 2, block_size, heads, head_dim)


def _check_kv(kv: torch.Tensor, block_size: int) -> int:
    """Validate the cache; return its number of blocks."""
    if kv.dim() != 5 or kv.shape[1] != 2:
        raise ValueError(f"kv must be [layers, 2, slots, kv_heads, head_dim], got shape {tuple(kv.shape)}")
    if block_size <= 0 or kv.shape[2] % block_size != 0:
        raise ValueError(f"block_size {block_size} must be positive and divide the {kv.shape[2]} slots of kv")
    if not kv.is_contiguous():
        raise ValueError("kv must be contiguous")
    return kv.shape[2] // block_size


def _block_ids(block_ids: BlockIds, num_blocks: int, device: torch.device) -> torch.Tensor:
    """``block_ids`` as an int64 tensor on ``device``, range-checked unless it is already on a GPU."""
    if isinstance(block_ids, torch.Tensor):
        if block_ids.dim() != 1:
            raise ValueError(f"block_ids must be one-dimensional, got shape {tuple(block_ids.shape)}")
        if block_ids.dtype not in (torch.int32, torch.int64):
            raise ValueError(f"block_ids must be int32 or int64, got {block_ids.dtype}")
        ids = block_ids
    else:
        ids = torch.tensor(list(block_ids), dtype=torch.int64)
    if ids.numel() == 0:
        raise ValueError("block_ids is empty")
    if not ids.is_cuda:
        low, high = int(ids.min()), int(ids.max())
        if low < 0 or high >= num_blocks:
            raise ValueError(f"block ids must lie in [0, {num_blocks}), got min {low}, max {high}")
    return ids.to(device=device, dtype=torch.int64).contiguous()


def _check_pages(
    pages: torch.Tensor,
    kv: torch.Tensor,
    num_pages: int,
    block_size: int,
    name: str,
    *,
    same_device: bool = True,
) -> None:
    expected = page_shape(kv, num_pages, block_size)
    if tuple(pages.shape) != expected:
        raise ValueError(f"{name} must have shape {expected}, got {tuple(pages.shape)}")
    if pages.dtype != kv.dtype:
        raise ValueError(f"{name} has dtype {pages.dtype}, kv has {kv.dtype}")
    if same_device and pages.device != kv.device:
        raise ValueError(f"{name} is on {pages.device}, kv on {kv.device}")
    if not pages.is_contiguous():
        raise ValueError(f"{name} must be contiguous")


def gather_pages(
    kv: torch.Tensor,
    block_ids: BlockIds,
    block_size: int,
    *,
    out: torch.Tensor | None = None,
    impl: Impl = "auto",
) -> torch.Tensor:
    """Copy blocks ``block_ids`` of ``kv`` into pages ``[P, L, 2, block_size, H, D]`` (``out`` if given)."""
    num_blocks = _check_kv(kv, block_size)
    ids = _block_ids(block_ids, num_blocks, kv.device)
    if out is None:
        out = torch.empty(page_shape(kv, len(ids), block_size), dtype=kv.dtype, device=kv.device)
    else:
        _check_pages(out, kv, len(ids), block_size, "out")
    if use_triton(impl, kv, out):
        from clairvoyant.kernels import _kv_pages_triton

        _kv_pages_triton.move_pages(kv, ids, out, block_size, to_pages=True)
    else:
        _gather_torch(kv, ids, out, block_size)
    return out


def scatter_pages(
    kv: torch.Tensor, block_ids: BlockIds, pages: torch.Tensor, block_size: int, *, impl: Impl = "auto"
) -> None:
    """Copy ``pages`` ``[P, L, 2, block_size, H, D]`` into blocks ``block_ids`` of ``kv``, in place.

    Repeated ids are allowed but which page lands there is unspecified (as with ``index_copy_``).
    """
    num_blocks = _check_kv(kv, block_size)
    ids = _block_ids(block_ids, num_blocks, kv.device)
    _check_pages(pages, kv, len(ids), block_size, "pages")
    if use_triton(impl, kv, pages):
        from clairvoyant.kernels import _kv_pages_triton

        _kv_pages_triton.move_pages(kv, ids, pages, block_size, to_pages=False)
    else:
        _scatter_torch(kv, ids, pages, block_size)


def gather_pages_torch(
    kv: torch.Tensor, block_ids: BlockIds, block_size: int, *, out: torch.Tensor | None = None
) -> torch.Tensor:
    """Reference ``gather_pages``: one ``index_select`` over the blocks."""
    return gather_pages(kv, block_ids, block_size, out=out, impl="torch")


def scatter_pages_torch(kv: torch.Tensor, block_ids: BlockIds, pages: torch.Tensor, block_size: int) -> None:
    """Reference ``scatter_pages``: one ``index_copy_`` over the blocks."""
    scatter_pages(kv, block_ids, pages, block_size, impl="torch")


def _blocks_view(kv: torch.Tensor, block_size: int) -> torch.Tensor:
    """``kv`` as ``[L, 2, num_blocks, item]``: one row per (layer, K|V, block) item."""
    layers, _, slots, _, _ = kv.shape
    return kv.view(layers, 2, slots // block_size, -1)


def _page_first_view(kv: torch.Tensor, block_size: int) -> torch.Tensor:
    """``kv`` seen page-first, ``[num_blocks, L * 2, item]`` (a strided view, no copy): indexing its
    dim 0 picks whole pages, which is the fast path of ``index_select``/``index_copy_`` on CPU."""
    layers, _, slots, _, _ = kv.shape
    return kv.view(layers * 2, slots // block_size, -1).transpose(0, 1)


def _gather_torch(kv: torch.Tensor, ids: torch.Tensor, out: torch.Tensor, block_size: int) -> None:
    torch.index_select(_page_first_view(kv, block_size), 0, ids, out=out.view(len(ids), kv.shape[0] * 2, -1))


def _scatter_torch(kv: torch.Tensor, ids: torch.Tensor, pages: torch.Tensor, block_size: int) -> None:
    _page_first_view(kv, block_size).index_copy_(0, ids, pages.view(len(ids), kv.shape[0] * 2, -1))


def copy_pages_loop(
    kv: torch.Tensor,
    block_ids: BlockIds,
    pages: torch.Tensor,
    block_size: int,
    *,
    direction: Literal["gather", "scatter"],
) -> None:
    """Baseline: one ``copy_`` per contiguous (block, layer, K|V) item, ``P * L * 2`` copies in all.

    Each copy is between two contiguous ranges of one dtype, so on CUDA it is one
    ``cudaMemcpyAsync``: vLLM's ``swap_blocks`` issued per block of each layer's K and V cache.
    ``direction="gather"`` fills ``pages`` from ``kv``; ``"scatter"`` writes ``pages`` into ``kv``.
    Unlike the kernel, ``pages`` may be on another device (GPU cache, pinned host pages).
    """
    if direction not in ("gather", "scatter"):
        raise ValueError(f"direction must be 'gather' or 'scatter', got {direction!r}")
    num_blocks = _check_kv(kv, block_size)
    ids = block_ids.tolist() if isinstance(block_ids, torch.Tensor) else list(block_ids)
    _block_ids(ids, num_blocks, torch.device("cpu"))  # validation only
    _check_pages(pages, kv, len(ids), block_size, "pages", same_device=False)
    blocks = _blocks_view(kv, block_size)
    items = pages.view(len(ids), kv.shape[0], 2, -1)
    for page, block in enumerate(ids):
        for layer in range(kv.shape[0]):
            for half in range(2):
                if direction == "gather":
                    items[page, layer, half].copy_(blocks[layer, half, block])
                else:
                    blocks[layer, half, block].copy_(items[page, layer, half])
