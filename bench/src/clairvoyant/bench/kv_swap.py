"""``kv-swap``: throughput of moving KV pages between the paged cache and a page-first staging buffer.

    python -m clairvoyant.bench.kv_swap                      # saves bench/results/kv-swap/kv-swap.{json,md}
    python -m clairvoyant.bench.kv_swap --pages 1,16 --methods loop,torch
    python -m clairvoyant.bench kv-swap                      # the same figures, JSON under --out-dir

Each method gathers ``P`` random blocks of the cache into pages (swap out) and scatters them back
(swap in): ``loop`` is ``copy_pages_loop`` (one ``copy_`` per block, layer and K|V, the baseline),
``torch`` the ``index_select``/``index_copy_`` reference, ``triton`` the kernel (on CPU, in Triton's
interpreter: that figure measures the interpreter, not the kernel's design).  GB/s counts the pages'
payload once; "x loop" is the ratio to the loop's GB/s measured in the same run.  The default page
is SmolLM2-135M's: 30 layers, 3 KV heads of 64, blocks of 16 tokens, float32.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from collections.abc import Callable
from typing import Any

import torch

from clairvoyant.bench.common import (
    BENCHMARKS,
    RESULTS_DIR,
    BenchResult,
    format_table,
    progress,
    run_standalone,
)
from clairvoyant.kernels.kv_pages import (
    copy_pages_loop,
    gather_pages,
    gather_pages_torch,
    page_shape,
    scatter_pages,
    scatter_pages_torch,
)

METHODS = ("loop", "torch", "triton")
COLUMNS = ["pages", "direction", "method", "MB moved", "ms per call", "GB/s", "x loop"]


def _triton_ready(device: torch.device) -> str | None:
    """``None`` when the kernel can run on ``device``, else why not.  On CPU this turns on Triton's
    interpreter, which only takes effect if the kernel module was not imported yet."""
    if device.type == "cpu":
        os.environ.setdefault("TRITON_INTERPRET", "1")
    try:
        from clairvoyant.kernels import _kv_pages_triton
    except ImportError:
        return "triton is not installed"
    if _kv_pages_triton.interpreted() != (device.type == "cpu"):
        return "the kernel was defined for another device (TRITON_INTERPRET set too late or on CUDA)"
    return None


def _seconds_per_call(fn: Callable[[], object], device: torch.device, repeats: int, budget_s: float) -> float:
    """Median wall time of ``fn`` after one warm-up call; stops early once ``budget_s`` is spent."""

    def timed() -> float:
        started = time.perf_counter()
        fn()
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        return time.perf_counter() - started

    timed()
    times: list[float] = []
    deadline = time.perf_counter() + budget_s
    while len(times) < repeats and (not times or time.perf_counter() < deadline):
        times.append(timed())
    return statistics.median(times)


def _calls(
    method: str, kv: torch.Tensor, ids: torch.Tensor, pages: torch.Tensor, block_size: int
) -> dict[str, Callable[[], object]]:
    """The gather and scatter call of ``method``, moving the same blocks to and from ``pages``."""
    id_list = ids.tolist()
    if method == "loop":
        return {
            "gather": lambda: copy_pages_loop(kv, id_list, pages, block_size, direction="gather"),
            "scatter": lambda: copy_pages_loop(kv, id_list, pages, block_size, direction="scatter"),
        }
    if method == "torch":
        return {
            "gather": lambda: gather_pages_torch(kv, ids, block_size, out=pages),
            "scatter": lambda: scatter_pages_torch(kv, ids, pages, block_size),
        }
    return {
        "gather": lambda: gather_pages(kv, ids, block_size, out=pages, impl="triton"),
        "scatter": lambda: scatter_pages(kv, ids, pages, block_size, impl="triton"),
    }


@BENCHMARKS.register("kv-swap")
class KvSwap:
    help = "KV page gather/scatter throughput (GB/s): Triton kernel, torch reference, per-block copy loop"

    def add_arguments(self, parser: argparse.ArgumentParser) -> None:
        parser.add_argument("--pages", default="1,16,128", help="comma-separated page counts")
        parser.add_argument("--methods", default=",".join(METHODS), help=f"comma-separated, of {METHODS}")
        parser.add_argument("--layers", type=int, default=30)
        parser.add_argument("--kv-heads", type=int, default=3)
        parser.add_argument("--head-dim", type=int, default=64)
        parser.add_argument("--block-size", type=int, default=16)
        parser.add_argument(
            "--num-blocks", type=int, default=0, help="cache size; default twice the most pages"
        )
        parser.add_argument("--dtype", default="float32", choices=["float32", "float16", "bfloat16"])
        parser.add_argument("--device", default="cpu", help="cpu (Triton interpreted) or cuda")
        parser.add_argument("--threads", type=int, default=1, help="torch CPU threads (the loop uses one)")
        parser.add_argument("--repeats", type=int, default=5, help="timed calls per figure (median)")
        parser.add_argument("--budget-s", type=float, default=2.0, help="stop repeating a figure after this")
        parser.add_argument("--seed", type=int, default=0)

    def run(self, args: argparse.Namespace) -> BenchResult:
        page_counts = [int(p) for p in args.pages.split(",") if p]
        requested = {m for m in args.methods.split(",") if m}
        if not requested <= set(METHODS) or "loop" not in requested:
            raise SystemExit(
                f"--methods must include loop (the baseline) and only {METHODS}, got {args.methods}"
            )
        methods = [m for m in METHODS if m in requested]  # loop first: the others' ratios need it
        device = torch.device(args.device)
        notes: list[str] = []
        if "triton" in methods and (why := _triton_ready(device)) is not None:
            methods.remove("triton")
            notes.append(f"triton skipped: {why}")
        if "triton" in methods and device.type == "cpu":
            notes.append(
                "triton ran in Triton's interpreter (TRITON_INTERPRET=1): one Python program per item"
            )
        num_blocks = args.num_blocks or 2 * max(page_counts)
        threads = torch.get_num_threads()
        torch.set_num_threads(args.threads)
        try:
            rows = self._measure(args, methods, page_counts, num_blocks, device)
        finally:
            torch.set_num_threads(threads)
        largest = max(page_counts)
        # Three significant digits: the interpreter's ratios are far below the table's two decimals.
        summary = {
            f"{method} {direction} x loop at {largest} pages": f"{ratio:.3g}"
            for count, direction, method, *_, ratio in rows
            if count == largest and method != "loop"
        }
        params = {k: v for k, v in vars(args).items() if k not in ("command", "out_dir")}
        return BenchResult("kv-swap", COLUMNS, rows, summary, notes, {**params, "num_blocks": num_blocks})

    @staticmethod
    def _measure(
        args: argparse.Namespace,
        methods: list[str],
        page_counts: list[int],
        num_blocks: int,
        device: torch.device,
    ) -> list[list[Any]]:
        dtype = getattr(torch, args.dtype)
        generator = torch.Generator().manual_seed(args.seed)
        shape = (args.layers, 2, num_blocks * args.block_size, args.kv_heads, args.head_dim)
        kv = torch.randn(shape, generator=generator).to(device=device, dtype=dtype)
        rows: list[list[Any]] = []
        for count in page_counts:
            ids = torch.randperm(num_blocks, generator=generator)[:count].to(device)
            pages = torch.empty(page_shape(kv, count, args.block_size), dtype=dtype, device=device)
            moved = pages.numel() * pages.element_size()
            expected = gather_pages_torch(kv, ids, args.block_size)
            loop_rate: dict[str, float] = {}
            for method in methods:
                # Gather runs first and fills ``pages``; scatter then refills the blocks, cleared here.
                for direction, call in _calls(method, kv, ids, pages, args.block_size).items():
                    if direction == "gather":
                        pages.zero_()
                    else:
                        scatter_pages_torch(kv, ids, torch.zeros_like(pages), args.block_size)
                    seconds = _seconds_per_call(call, device, args.repeats, args.budget_s)
                    landed = pages if direction == "gather" else gather_pages_torch(kv, ids, args.block_size)
                    if not torch.equal(landed, expected):
                        raise RuntimeError(f"{method} {direction} moved the wrong data for {count} pages")
                    rate = moved / seconds / 1e9
                    loop_rate.setdefault(direction, rate)
                    rows.append([count, direction, method, moved / 1e6, seconds * 1e3, rate,
                                 rate / loop_rate[direction]])  # fmt: skip
                    progress(f"{count} pages, {direction}, {method}: {rate:.3f} GB/s")
        return rows


def markdown(result: BenchResult) -> str:
    """The table (numbers to three significant digits), summary and notes as a Markdown page."""
    rows = [[f"{v:.3g}" if isinstance(v, float) else v for v in row] for row in result.rows]
    lines = [f"# {result.name}", "", format_table(result.columns, rows), ""]
    lines += [
        f"- {key}: {value:.3f}" if isinstance(value, float) else f"- {key}: {value}"
        for key, value in result.summary.items()
    ]
    lines += [f"- note: {note}" for note in result.notes]
    params = ", ".join(f"{key}={value}" for key, value in result.params.items())
    return "\n".join([*lines, "", f"Parameters: {params}", ""])


def main(argv: list[str] | None = None) -> int:
    return run_standalone(KvSwap(), argv, prog="python -m clairvoyant.bench.kv_swap", description=__doc__,
                          out_dir=RESULTS_DIR / "kv-swap", markdown=markdown)  # fmt: skip

if __name__ == "__main__":
    sys.exit(main())
