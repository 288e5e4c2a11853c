"""Whether Triton can run here, and the choice between a Triton kernel and its torch reference.

``impl`` is one of ``"auto"`` (Triton when every tensor is on CUDA and Triton imports, else the torch
reference), ``"triton"`` (the kernel always: on CPU tensors this needs ``TRITON_INTERPRET=1`` set
before the kernels are defined, i.e. before Triton is first imported) or ``"torch"`` (the reference).
"""

from __future__ import annotations

import functools
from typing import Literal

import torch

Impl = Literal["auto", "triton", "torch"]
IMPLS: tuple[str, ...] = ("auto", "triton", "torch")


@functools.cache
def triton_available() -> bool:
    """Triton imports (it may still have no device to run on: see ``use_triton``)."""
    try:
        import triton  # noqa: F401
        import triton.language  # noqa: F401
    except ImportError:
        return False
    return True


def is_interpreted(kernel: object) -> bool:
    """``kernel`` (a ``@triton.jit`` function) runs in Triton's numpy interpreter, on CPU tensors:
    ``TRITON_INTERPRET=1`` was set when it was defined."""
    return type(kernel).__name__ == "InterpretedFunction"


def use_triton(impl: str, *tensors: torch.Tensor) -> bool:
    """Resolve ``impl`` for a call on ``tensors``; raises ``ValueError`` on an unknown name, and when
    ``"triton"`` is forced but Triton does not import."""
    if impl not in IMPLS:
        raise ValueError(f"impl must be one of {IMPLS}, got {impl!r}")
    if impl == "torch":
        return False
    if impl == "auto":
        return all(t.is_cuda for t in tensors) and triton_available()
    if not triton_available():
        raise ValueError("impl='triton' but triton does not import (pip install -e kernels)")
    return True


def check_launchable(kernel: object, *tensors: torch.Tensor) -> None:
    """Raise ``ValueError`` unless ``kernel`` can run on ``tensors``: all on one CUDA device for a
    compiled kernel, all on the CPU for an interpreted one."""
    devices = {t.device for t in tensors}
    if len(devices) != 1:
        raise ValueError(f"tensors must share one device, got {sorted(str(d) for d in devices)}")
    device = devices.pop()
    if is_interpreted(kernel) and device.type != "cpu":
        raise ValueError(
            f"Triton runs in its interpreter (TRITON_INTERPRET=1): tensors must be on CPU, not {device}"
        )
    if not is_interpreted(kernel) and device.type != "cuda":
        raise ValueError(
            f"the Triton kernel needs CUDA tensors, got {device}; on CPU set TRITON_INTERPRET=1 before "
            "triton is imported"
        )
