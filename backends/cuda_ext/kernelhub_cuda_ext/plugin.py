"""Registers the cuda_ext backend: C++ kernels for the TV family, trilinear and Tikhonov.

The library is compiled on first use (the first time the selector or `kernelhub list` asks
whether the backend is available), so importing kernelhub never compiles. A build that fails
or times out makes the backend unavailable with the compiler's reason.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable

import torch

from kernelhub import hookimpl
from kernelhub.spec import Backend, Impl
from kernelhub_cuda_ext import __version__

NAME = "cuda_ext"
REAL = (torch.float16, torch.bfloat16, torch.float32, torch.float64)

# op -> (forward, backward, dtypes), functions of kernelhub_cuda_ext.ops
IMPLS = {
    "tv_loss_l1_3d": ("l1_forward", "l1_backward", REAL),
    "tv_loss_sq_3d": ("sq_forward", "sq_backward", REAL),
    "tv_loss_iso_3d": ("iso_forward", "iso_backward", REAL),
    "trilinear_interp": ("trilinear_forward", "trilinear_backward", REAL),
    "tikhonov_inverse_2xn": ("tikhonov_forward", "tikhonov_backward",
                             (torch.complex64, torch.complex128, torch.float32, torch.float64)),
}
DEVICES = ("cpu",)  # CUDA kernels: not written yet (the GPU half)


def unavailable_reason() -> str | None:
    from kernelhub_cuda_ext import _lib
    return _lib.load()


def _ops_fn(name: str) -> Callable:
    target: list[Callable] = []

    def call(*args, **kwargs):
        if not target:
            target.append(getattr(importlib.import_module("kernelhub_cuda_ext.ops"), name))
        return target[0](*args, **kwargs)

    call.__name__ = call.__qualname__ = f"ops.{name}"
    return call


@hookimpl
def kernelhub_register_impls(registry) -> None:
    registry.add_backend(Backend(NAME, __version__, "C++ kernels compiled on first use (CPU; CUDA to come)",
                                 unavailable_reason))
    for op, (fwd, bwd, dtypes) in IMPLS.items():
        registry.add_impl(Impl(op=op, backend=NAME, forward=_ops_fn(fwd), backward=_ops_fn(bwd), dtypes=dtypes,
                               devices=DEVICES))
