"""Registers the triton backend: fused kernels for the TV family, tilted K-Planes, trilinear, Tikhonov and semiconv.

The kernel modules import triton, so they are imported on first use: without triton (or
without a GPU) the backend still registers, and ``kernelhub list`` shows it unavailable
with the reason. With ``TRITON_INTERPRET=1`` the kernels also run on CPU tensors under
Triton's interpreter, which checks their logic in CI; such impls serve only calls that
force ``backend="triton"`` and are never selected.
"""

from __future__ import annotations

import os

import torch

from kernelhub import hookimpl
from kernelhub.spec import Backend, Impl, lazy
from kernelhub_triton import __version__

NAME = "triton"
HALF_AND_UP = (torch.float16, torch.bfloat16, torch.float32, torch.float64)
SINGLE_AND_DOUBLE = (torch.float32, torch.float64)

# What each row declares beyond its functions and dtypes (`Impl` keywords):
# - can "traceable": traced into torch.compile graphs (every launch goes through _launch.launch, which records it
#   with wrap_triton there); all but K-Planes': compiling a graph that traced them failed on torch 2.11 + triton
#   3.6 with "a leaf Variable that requires grad is being used in an in-place operation" (inductor took one of
#   their kernels for one that writes its inputs), so their calls keep the operator.
# - can "saves": semiconv's forward saves what its backward would recompute (max/min: each output's winner; root,
#   log: each window's statistic), where a backward follows.
# - can "weighted": the TV functions take a weighted handle's weights (the weighted sum in the kernels).
# - deterministic False: the planes gradient (semiconv: img and kernel gradients) is added with atomics, its sums
#   may differ in the last bits from run to run.
# - version 2: the op contract semiconv's functions take (no spread_gradient, no channels_add: the hub sends those
#   calls to another backend); their lazy wrappers hide their signatures from the registry's inference
#   (docs/backend-guide.md).
TV = {"can": {"weighted", "traceable"}}
KPLANES = {"deterministic": False}
# op -> (module, forward, backward, dtypes, not_supported_reasons or None, Impl keywords)
IMPLS = {
    "tv_loss_l1_3d": ("tv", "l1_forward", "l1_backward", HALF_AND_UP, "not_supported_reasons", TV),
    "tv_loss_sq_3d": ("tv", "sq_forward", "sq_backward", HALF_AND_UP, "not_supported_reasons", TV),
    "tv_loss_iso_3d": ("tv", "iso_forward", "iso_backward", HALF_AND_UP, "not_supported_reasons", TV),
    "kplanes_interp_tilted": ("kplanes", "forward", "backward", SINGLE_AND_DOUBLE, "not_supported_reasons",
                              KPLANES),
    "kplanes_interp_tilted_ms": ("kplanes", "ms_forward", "ms_backward", SINGLE_AND_DOUBLE, "not_supported_reasons",
                                 KPLANES),
    "kplanes_interp_tilted_taps": ("kplanes", "taps_forward", "taps_backward", SINGLE_AND_DOUBLE,
                                   "not_supported_reasons", KPLANES),
    "trilinear_interp": ("trilinear", "forward", "backward", HALF_AND_UP, None, {"can": {"traceable"}}),
    "tikhonov_inverse_2xn": ("tikhonov", "forward", "backward",
                             (torch.complex64, torch.complex128, torch.float32, torch.float64), None,
                             {"can": {"traceable"}}),
    "semiconv": ("semiconv", "forward", "backward", HALF_AND_UP, "not_supported_reasons",
                 {"can": {"traceable", "saves"}, "deterministic": False, "version": 2}),
}


def interpret_mode() -> bool:
    """Triton's own switch: TRITON_INTERPRET=1 runs every @triton.jit kernel in the interpreter."""
    return os.environ.get("TRITON_INTERPRET", "0").strip().lower() in ("1", "true", "on", "yes")


def unavailable_reason() -> str | None:
    try:
        import triton  # noqa: F401
    except Exception as exc:  # ImportError, or a broken install
        return f"triton cannot be imported ({type(exc).__name__}: {exc}); pip install triton"
    if interpret_mode():
        return None
    if not torch.cuda.is_available():
        return ("no CUDA device (torch.cuda.is_available() is False); TRITON_INTERPRET=1 runs the kernels "
                "on CPU tensors under Triton's interpreter, for tests")
    return None


def _no_reasons(args) -> list[str]:
    return []


@hookimpl
def kernelhub_register_impls(registry) -> None:
    registry.add_backend(Backend(NAME, __version__, "fused Triton kernels with analytic backwards",
                                 unavailable_reason))
    interpreted = interpret_mode()
    for op, (module, fwd, bwd, dtypes, reasons, declared) in IMPLS.items():
        forward, backward = lazy(f"kernelhub_triton.{module}", fwd), lazy(f"kernelhub_triton.{module}", bwd)
        registry.add_impl(Impl(
            op=op,
            backend=NAME,
            forward=forward,
            backward=backward,
            dtypes=dtypes,
            devices=("cuda", "cpu") if interpreted else ("cuda",),
            not_supported_reasons=lazy(f"kernelhub_triton.{module}", reasons) if reasons else _no_reasons,
            forced_only="TRITON_INTERPRET=1 runs Triton's interpreter, for tests only" if interpreted else "",
            **declared,
        ))
