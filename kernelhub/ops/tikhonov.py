"""Tikhonov-regularised inverse of a 2 x Z matrix per pixel (docs/ops.md)."""

from __future__ import annotations

import torch

from kernelhub.ops import _checks as c
from kernelhub.ops.tolerances import MEASURED_ERRORS, tolerances_from
from kernelhub.spec import Arg, OpSpec, SampleInput

__all__ = ["TIKHONOV"]

OP = "tikhonov_inverse_2xn"
DTYPES = (torch.complex64, torch.complex128, torch.float32, torch.float64)


def _normalize(M, lam) -> tuple:
    c.tensor(OP, "M", M, DTYPES, min_ndim=2)
    c.dim(OP, "M", M, -2, 2)
    return (M, c.positive_float(OP, "lam", lam))


_SHAPES: dict[str, list[tuple[int, ...]]] = {"small": [(3, 2, 5)], "medium": [(40, 30, 2, 21)],
                                              "edge": [(2, 0), (0, 2, 3), (4, 2, 1)], "benchmark": [(115000, 2, 21)]}


def _samples(size: str, dtype: torch.dtype, device: torch.device, gen: torch.Generator) -> list[SampleInput]:
    shapes = _SHAPES[size]
    out = [SampleInput("x".join(map(str, s)), (c.randn(s, dtype, device, gen), 0.3)) for s in shapes]
    if size == "edge":
        # pixels trailing, as a phase-microscopy stack [2, Z, Y, X] viewed as [Y, X, 2, Z] (no copy)
        stack = c.randn((2, 7, 4, 5), dtype, device, gen)
        out.append(SampleInput("permuted_view", (stack.permute(2, 3, 0, 1), 0.05)))
        # M0 == M1: M M^H is singular and only lam keeps det > 0. lam is 1, not smaller: the op's
        # condition number grows like |M|^2 / lam, and at lam = 1e-3 (~1e4) even the SVD reference
        # is 1.5e-12 away from the exact W = M0 / (2a + lam), so float64 rounding could not judge it.
        rank1 = c.randn((3, 1, 6), dtype, device, gen).expand(3, 2, 6).clone()
        out.append(SampleInput("rank1", (rank1, 1.0)))
    return out


def _bad_inputs():
    M = torch.zeros(4, 2, 3, dtype=torch.complex64)
    return [
        ((torch.zeros(4, 3, 3, dtype=torch.complex64), 0.1), {}, ValueError, "M"),
        ((torch.zeros(3, dtype=torch.complex64), 0.1), {}, ValueError, "M"),
        ((M.real.to(torch.float16), 0.1), {}, TypeError, "M"),
        ((M, 0.0), {}, ValueError, "lam"),
        ((M, "1"), {}, TypeError, "lam"),
    ]


TIKHONOV = OpSpec(
    name=OP,
    args=(Arg("M", "tensor", differentiable=True, doc="[..., 2, Z], complex or real"),
          Arg("lam", "float", doc="> 0")),
    doc="W = (M M^H + lam I)^-1 M per leading index: [..., 2, Z].",
    dtypes=DTYPES,
    tolerances=tolerances_from(MEASURED_ERRORS, OP),
    normalize=_normalize,
    output=lambda M, lam: torch.empty_like(M, memory_format=torch.contiguous_format),
    samples=_samples,
    bad_inputs=_bad_inputs,
)
