"""Trilinear interpolation from per-point corner values (docs/ops.md)."""

from __future__ import annotations

import torch

from kernelhub.args import nbytes
from kernelhub.ops import _checks as c
from kernelhub.ops.tolerances import MEASURED_ERRORS, tolerances_from
from kernelhub.spec import Arg, OpSpec, SampleInput, Work

__all__ = ["TRILINEAR"]

OP = "trilinear_interp"


def _normalize(feats, points) -> tuple:
    c.tensor(OP, "feats", feats, c.FLOATS, ndim=3)
    c.dim(OP, "feats", feats, 1, 8)
    c.tensor(OP, "points", points, c.FLOATS, ndim=2)
    c.dim(OP, "points", points, 1, 3)
    if points.shape[0] != feats.shape[0]:
        raise ValueError(f"{OP}: argument 'points' has N = {points.shape[0]} rows but 'feats' has "
                         f"N = {feats.shape[0]}; they must match")
    c.same(OP, ("feats", feats), ("points", points))
    return (feats, points)


def _samples(size: str, dtype: torch.dtype, device: torch.device, gen: torch.Generator) -> list[SampleInput]:
    shapes = {"small": [(13, 5)], "medium": [(2000, 33)], "edge": [(0, 4), (3, 1)],
              "benchmark": [(262144, 256), (2097152, 32)]}[size]  # wide features; many points, few features
    out = []
    for n, f in shapes:
        # a few points outside [-1, 1]: the op extrapolates linearly there
        out.append(SampleInput(f"N{n}_F{f}", (c.randn((n, 8, f), dtype, device, gen),
                                              c.randn((n, 3), dtype, device, gen, low=-1.1, high=1.1))))
    if size == "edge":
        pts = torch.tensor([[-1.0, -1.0, -1.0], [1.0, 1.0, 1.0], [0.0, 0.5, -0.5]], dtype=dtype, device=device)
        feats = c.randn((3, 8, 4), dtype, device, gen)
        feats[2, 3, 1] = float("nan")
        out.append(SampleInput("corners_nan", (feats, pts)))
    return out


def _bad_inputs():
    f, p = torch.zeros(4, 8, 2), torch.zeros(4, 3)
    return [
        ((torch.zeros(4, 7, 2), p), {}, ValueError, "feats"),
        ((f, torch.zeros(4, 2)), {}, ValueError, "points"),
        ((f, torch.zeros(5, 3)), {}, ValueError, "points"),
        ((f, p.double()), {}, TypeError, "points"),
        ((f.int(), p), {}, TypeError, "feats"),
    ]


def _work(args, out: torch.Tensor, grads_of) -> Work:
    """`kernelhub.spec.Work` of a trilinear call: the features, points and output once; backward, the upstream
    gradient and the points again, the features again where the points get a gradient, each gradient written.
    Operations per point: 16 per feature forward (eight weighted corners), 8 per feature for the features'
    gradient and 48 for the points'."""
    feats, points = args
    f = feats.shape[0] * feats.shape[2]  # points x features
    dram = nbytes(feats) + nbytes(points) + nbytes(out)
    if grads_of is None:
        return Work(dram, flops=16 * f)
    dram += nbytes(out) + nbytes(points) + (nbytes(feats) if 1 in grads_of else 0)
    dram += sum(nbytes(args[i]) for i in grads_of)
    return Work(dram, flops=16 * f + (8 * f if 0 in grads_of else 0) + (48 * f if 1 in grads_of else 0))


TRILINEAR = OpSpec(
    name=OP,
    args=(Arg("feats", "tensor", differentiable=True, doc="[N, 8, F], corner k = 4i + 2j + l"),
          Arg("points", "tensor", differentiable=True, doc="[N, 3] in [-1, 1] (not clamped)")),
    doc="out[n] = sum_k weight_k(points[n]) * feats[n, k]: [N, F].",
    dtypes=c.FLOATS,
    tolerances=tolerances_from(MEASURED_ERRORS, OP),
    normalize=_normalize,
    output=lambda feats, points: feats.new_empty((feats.shape[0], feats.shape[2])),
    samples=_samples,
    bad_inputs=_bad_inputs,
    work=_work,
)
