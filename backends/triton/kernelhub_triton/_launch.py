"""What every launcher here shares: accumulation dtype, device guard, grid sizing."""

from __future__ import annotations

import contextlib
import functools

import torch
import triton.language as tl


def acc_type(dtype: torch.dtype):
    """fp32 accumulation for half and single inputs, fp64 for double (OPS.md)."""
    return tl.float64 if dtype in (torch.float64, torch.complex128) else tl.float32


def on_device(t: torch.Tensor):
    """Launch on ``t``'s GPU: Triton launches on the *current* device, which may be another one."""
    return torch.cuda.device(t.device) if t.is_cuda else contextlib.nullcontext()


@functools.cache
def _sm_count(index: int) -> int:
    return torch.cuda.get_device_properties(index).multi_processor_count


def sm_count(t: torch.Tensor) -> int:
    """Multiprocessors of ``t``'s GPU (a fixed small number under the interpreter)."""
    return _sm_count(t.device.index if t.device.index is not None else torch.cuda.current_device()) \
        if t.is_cuda else 4
