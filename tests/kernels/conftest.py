"""Kernel tests run the Triton kernels for real: compiled on CUDA where a device is present, else in
Triton's interpreter on CPU tensors.

``TRITON_INTERPRET=1`` counts when a kernel is *defined*, i.e. when its module is imported; the kernel
modules import lazily, on first use, so setting it here (at collection, before any test runs) is
early enough even when other tests imported torch or triton first.  The ``device`` fixture checks
that it took effect, so a kernel defined too early fails the tests instead of passing them unrun.
"""

from __future__ import annotations

import os

import pytest
import torch

if not torch.cuda.is_available():
    os.environ["TRITON_INTERPRET"] = "1"


@pytest.fixture(scope="session")
def device() -> torch.device:
    """Where the kernels run: CUDA when available (compiled), else the CPU (interpreted)."""
    pytest.importorskip("triton", reason="triton is not installed (pip install -e kernels)")
    from clairvoyant.kernels import _kv_pages_triton, _paged_attention_triton

    interpreted = {_kv_pages_triton.interpreted(), _paged_attention_triton.interpreted()}
    if torch.cuda.is_available():
        assert interpreted == {False}, "TRITON_INTERPRET is set on a CUDA machine: kernels would not compile"
        return torch.device("cuda")
    assert interpreted == {True}, (
        "the kernels were defined without TRITON_INTERPRET=1 (a kernel module was imported before "
        "tests/kernels/conftest.py set it): they cannot run on CPU tensors"
    )
    return torch.device("cpu")
