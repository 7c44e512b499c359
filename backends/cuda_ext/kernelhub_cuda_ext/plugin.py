"""Registers the cuda_ext backend: C++ and CUDA kernels for the TV family, tilted K-Planes, trilinear, Tikhonov and
semiconv.

The library is compiled on first use (the first time the selector or `kernelhub list` asks
whether the backend is available), so importing kernelhub never compiles. A build that fails
or times out makes the backend unavailable with the compiler's reason.
"""

from __future__ import annotations

import math

import torch

from kernelhub import hookimpl
from kernelhub.spec import Backend, Impl
from kernelhub_cuda_ext import __version__

NAME = "cuda_ext"
REAL = (torch.float16, torch.bfloat16, torch.float32, torch.float64)

CPU_AND_CUDA = ("cpu", "cuda")
SINGLE_AND_DOUBLE = (torch.float32, torch.float64)

# What each row declares beyond its functions, dtypes and devices (`Impl` keywords):
# - can "weighted": the TV functions take a weighted handle's weights (the weighted sum in the kernels).
# - can "saves": semiconv's forward saves each output's winner, which its backward reads instead of recomputing.
# - deterministic False: the planes gradient (semiconv on CUDA: img and kernel gradients) is added with atomics,
#   its sums may differ in the last bits from run to run.
# - version 2: the op contract semiconv's functions take (no spread_gradient, no channels_add: the hub sends those
#   calls to another backend; docs/backend-guide.md).
TV = {"can": {"weighted"}}
KPLANES = {"deterministic": False}
# op -> (forward, backward, dtypes, devices, Impl keywords), functions of kernelhub_cuda_ext.ops
IMPLS = {
    "tv_loss_l1_3d": ("l1_forward", "l1_backward", REAL, CPU_AND_CUDA, TV),
    "tv_loss_sq_3d": ("sq_forward", "sq_backward", REAL, CPU_AND_CUDA, TV),
    "tv_loss_iso_3d": ("iso_forward", "iso_backward", REAL, CPU_AND_CUDA, TV),
    "kplanes_interp_tilted": ("kplanes_forward", "kplanes_backward", SINGLE_AND_DOUBLE, CPU_AND_CUDA, KPLANES),
    "kplanes_interp_tilted_ms": ("kplanes_ms_forward", "kplanes_ms_backward", SINGLE_AND_DOUBLE, CPU_AND_CUDA,
                                 KPLANES),
    "kplanes_interp_tilted_taps": ("kplanes_taps_forward", "kplanes_taps_backward", SINGLE_AND_DOUBLE, CPU_AND_CUDA,
                                   KPLANES),
    "trilinear_interp": ("trilinear_forward", "trilinear_backward", REAL, CPU_AND_CUDA, {}),
    "tikhonov_inverse_2xn": ("tikhonov_forward", "tikhonov_backward",
                             (torch.complex64, torch.complex128, torch.float32, torch.float64), CPU_AND_CUDA, {}),
    "semiconv": ("semiconv_forward", "semiconv_backward", REAL, CPU_AND_CUDA,
                 {"can": {"saves"}, "deterministic": False, "version": 2}),
}


def unavailable_reason() -> str | None:
    from kernelhub_cuda_ext import _lib
    return _lib.load()


def _cuda_built(args) -> list[str]:
    """A CUDA call needs the library's CUDA kernels, which a machine without nvcc does not build."""
    if args[0].is_cuda:
        from kernelhub_cuda_ext import _lib
        reason = _lib.cuda_reason()
        return [reason] if reason else []
    return []


def _semiconv_reasons(args) -> list[str]:
    reasons = _cuda_built(args)
    if args[0].is_cuda and math.prod(args[0].shape[2:]) >= 2**31:
        reasons.append("an image channel of 2^31 elements or more (positions within a channel are 32-bit on CUDA)")
    return reasons


REASONS = {"semiconv": _semiconv_reasons}  # beyond _cuda_built


@hookimpl
def kernelhub_register_impls(registry) -> None:
    registry.add_backend(Backend(NAME, __version__, "C++ and CUDA kernels compiled on first use",
                                 unavailable_reason))
    from kernelhub_cuda_ext import ops  # plain Python over torch.ops: importing it neither builds nor loads

    for op, (fwd, bwd, dtypes, devices, declared) in IMPLS.items():
        forward, backward = getattr(ops, fwd), getattr(ops, bwd)
        registry.add_impl(Impl(op=op, backend=NAME, forward=forward, backward=backward, dtypes=dtypes,
                               devices=devices, not_supported_reasons=REASONS.get(op, _cuda_built), **declared))
