"""Total-variation losses of a volume ``[..., D, H, W]`` (docs/ops.md)."""

from __future__ import annotations

import torch

from kernelhub.args import nbytes
from kernelhub.ops import _checks as c
from kernelhub.ops.tolerances import MEASURED_ERRORS, tolerances_from
from kernelhub.spec import Arg, OpSpec, SampleInput, Work

__all__ = ["TV_L1", "TV_SQ", "TV_ISO"]

VOLUME = Arg("volume", "tensor", differentiable=True, doc="real [..., D, H, W], ndim >= 3")


def _volume(op: str, volume: object) -> torch.Tensor:
    return c.tensor(op, "volume", volume, c.FLOATS, min_ndim=3)


_SHAPES: dict[str, list[tuple[int, ...]]] = {
    "small": [(5, 6, 7), (2, 3, 4, 5, 6)],
    "medium": [(2, 24, 40, 33)],
    "edge": [(1, 5, 6), (4, 1, 6), (4, 5, 1), (1, 1, 1), (2, 2, 2), (0, 4, 4), (3, 0, 2, 3, 4)],
    "benchmark": [(256, 256, 256), (512, 512, 512), (16, 1024, 1024)],
}


def _samples(with_eps: bool):
    def samples(size: str, dtype: torch.dtype, device: torch.device, gen: torch.Generator) -> list[SampleInput]:
        shapes = _SHAPES[size]
        extra = (1e-8,) if with_eps else ()
        out = [SampleInput("x".join(map(str, shape)), (c.randn(shape, dtype, device, gen), *extra))
               for shape in shapes]
        if size == "edge":
            v = c.randn((3, 4, 5), dtype, device, gen)
            v[1, 2, 3] = float("nan")
            out.append(SampleInput("nan", (v, *extra)))
            out.append(SampleInput("constant", (torch.full((3, 4, 5), 2.5, dtype=dtype, device=device), *extra)))
        return out
    return samples


def _work(args, out: torch.Tensor, grads_of) -> Work:
    """`kernelhub.spec.Work` of a TV loss: the volume read (forward; again in the backward, with its gradient
    written); about ten operations per voxel forward (three differences, their absolute values or squares, the
    sums) and fifteen backward."""
    volume = args[0]
    n, b, o = volume.numel(), nbytes(volume), nbytes(out)
    if grads_of is None:
        return Work(b + o, flops=10 * n)
    return Work(3 * b + 2 * o, flops=25 * n)


def _bad_inputs(with_eps: bool):
    def bad() -> list[tuple[tuple, dict, type[Exception], str]]:
        eps = (1e-8,) if with_eps else ()
        cases: list[tuple[tuple, dict, type[Exception], str]] = [
            ((torch.zeros(4, 4), *eps), {}, ValueError, "volume"),
            ((torch.zeros(3, 3, 3, dtype=torch.int64), *eps), {}, TypeError, "volume"),
            (([[[1.0]]], *eps), {}, TypeError, "volume"),
        ]
        if with_eps:
            cases += [((torch.zeros(3, 3, 3), 0.0), {}, ValueError, "eps"),
                      ((torch.zeros(3, 3, 3), -1.0), {}, ValueError, "eps")]
        return cases
    return bad


def _normalize_plain(op: str):
    def normalize(volume: torch.Tensor) -> tuple:
        return (_volume(op, volume),)
    return normalize


def _normalize_iso(volume: torch.Tensor, eps: float = 1e-8) -> tuple:
    return (_volume("tv_loss_iso_3d", volume), c.positive_float("tv_loss_iso_3d", "eps", eps))


TV_L1 = OpSpec(
    name="tv_loss_l1_3d",
    args=(VOLUME,),
    doc="Per-axis sums of |forward differences| along D, H, W: returns float [3] (raw sums).",
    dtypes=c.FLOATS,
    tolerances=tolerances_from(MEASURED_ERRORS, "tv_loss_l1_3d"),
    normalize=_normalize_plain("tv_loss_l1_3d"),
    output=lambda volume: volume.new_empty((3,), dtype=c.accumulation_dtype(volume.dtype)),
    samples=_samples(False),
    bad_inputs=_bad_inputs(False),
    work=_work,
)

TV_SQ = OpSpec(
    name="tv_loss_sq_3d",
    args=(VOLUME,),
    doc="Sum over the three axes of squared forward differences: returns a scalar (unnormalised).",
    dtypes=c.FLOATS,
    tolerances=tolerances_from(MEASURED_ERRORS, "tv_loss_sq_3d"),
    normalize=_normalize_plain("tv_loss_sq_3d"),
    output=lambda volume: volume.new_empty((), dtype=c.accumulation_dtype(volume.dtype)),
    samples=_samples(False),
    bad_inputs=_bad_inputs(False),
    work=_work,
)

TV_ISO = OpSpec(
    name="tv_loss_iso_3d",
    args=(VOLUME, Arg("eps", "float", doc="> 0, inside the square root")),
    doc="Mean over the corner set of sqrt(dd^2 + dh^2 + dw^2 + eps); 0 when D, H or W < 2.",
    dtypes=c.FLOATS,
    tolerances=tolerances_from(MEASURED_ERRORS, "tv_loss_iso_3d"),
    normalize=_normalize_iso,
    output=lambda volume, eps: volume.new_empty((), dtype=c.accumulation_dtype(volume.dtype)),
    samples=_samples(True),
    bad_inputs=_bad_inputs(True),
    work=_work,
)
