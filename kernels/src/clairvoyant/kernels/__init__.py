"""Triton kernels with torch reference versions.

``kv_pages``: move KV pages between the paged cache and a page-first staging buffer.
``paged_attention``: split-KV decode attention over block tables.
Each takes ``impl="auto" | "triton" | "torch"``; ``auto`` picks Triton for CUDA tensors when it imports.
"""

from clairvoyant.kernels._triton import triton_available

__all__ = ["triton_available"]
