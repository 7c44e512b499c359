"""Tilted K-Planes interpolation (docs/ops.md): rotate points, sample three planes, multiply."""

from __future__ import annotations

import torch

from kernelhub.args import nbytes
from kernelhub.ops import _checks as c
from kernelhub.ops.tolerances import MEASURED_ERRORS, tolerances_from
from kernelhub.spec import Arg, OpSpec, SampleInput, Work

__all__ = ["KPLANES", "KPLANES_MS", "KPLANES_TAPS", "KPLANES_OPS"]

DTYPES = (torch.float32, torch.float64)
PTS = Arg("pts", "tensor", differentiable=True, doc="[B, 3] in [-1, 1]^3 (outside reads the border)")
ROT = Arg("rotations", "tensor", differentiable=True, doc="[T, 3, 3], any matrices")
PLANES = Arg("planes", "tensor", differentiable=True, doc="[3T, C, H, W], plane t*3+p")


def _check(op: str, pts, rotations, planes_list) -> None:
    c.tensor(op, "pts", pts, DTYPES, ndim=2)
    c.dim(op, "pts", pts, 1, 3)
    c.tensor(op, "rotations", rotations, DTYPES, ndim=3)
    if tuple(rotations.shape[1:]) != (3, 3):
        raise ValueError(f"{op}: argument 'rotations' must have shape [T, 3, 3], got {tuple(rotations.shape)}")
    T = rotations.shape[0]
    if T == 0:
        raise ValueError(f"{op}: argument 'rotations' must hold at least one matrix (T >= 1)")
    for i, planes in enumerate(planes_list):
        name = "planes" if len(planes_list) == 1 and op != "kplanes_interp_tilted_ms" else f"planes[{i}]"
        c.tensor(op, name, planes, DTYPES, ndim=4)
        if planes.shape[0] != 3 * T:
            raise ValueError(f"{op}: argument {name!r} must have 3*T = {3 * T} planes in dim 0 "
                             f"(T from 'rotations'), got shape {tuple(planes.shape)}")
        if planes.shape[2] < 1 or planes.shape[3] < 1:
            raise ValueError(f"{op}: argument {name!r} must have H, W >= 1, got shape {tuple(planes.shape)}")
        c.same(op, ("pts", pts), ("rotations", rotations), (name, planes))


def _normalize(pts, rotations, planes) -> tuple:
    _check("kplanes_interp_tilted", pts, rotations, [planes])
    return (pts, rotations, planes)


def _normalize_ms(pts, rotations, planes) -> tuple:
    op = "kplanes_interp_tilted_ms"
    if isinstance(planes, torch.Tensor) or not isinstance(planes, (list, tuple)) or not planes:
        raise TypeError(f"{op}: argument 'planes' must be a non-empty list of [3T, C, H, W] tensors, "
                        f"got {type(planes).__name__}")
    _check(op, pts, rotations, list(planes))
    return (pts, rotations, list(planes))


def _normalize_taps(pts, rotations, planes, h) -> tuple:
    op = "kplanes_interp_tilted_taps"
    _check(op, pts, rotations, [planes])
    return (pts, rotations, planes, c.finite_float(op, "h", h))


def _make(dtype, device, gen, B, T, C, H, W, scales=1):
    pts = c.randn((B, 3), dtype, device, gen, low=-1.15, high=1.15)  # some points outside the cube
    rot = c.randn((T, 3, 3), dtype, device, gen) * 0.6  # not orthonormal on purpose
    planes = [c.randn((3 * T, C, H + s, W + 2 * s), dtype, device, gen, low=0.5, high=1.5)
              for s in range(scales)]
    return pts, rot, planes


_SIZES = {
    "small": [(37, 2, 3, 5, 6)],
    "medium": [(500, 3, 8, 17, 13)],
    "edge": [(1, 1, 1, 1, 1), (0, 2, 3, 4, 5), (7, 1, 2, 1, 5)],
    "benchmark": [(614400, 4, 32, 200, 200), (614400, 8, 32, 200, 200)],
}


def _edge_points(dtype, device, gen, T=2, C=3, H=5, W=6):
    # on the border, beyond it, at the centre; identity rotations so the border is hit exactly
    pts = torch.tensor([[1.0, -1.0, 0.0], [-1.0, 1.0, 1.0], [1.5, -2.0, 0.3], [0.0, 0.0, 0.0]],
                       dtype=dtype, device=device)
    rot = torch.eye(3, dtype=dtype, device=device).repeat(T, 1, 1)
    planes = c.randn((3 * T, C, H, W), dtype, device, gen)
    return pts, rot, planes


def _samples(kind: str):
    def samples(size: str, dtype: torch.dtype, device: torch.device, gen: torch.Generator) -> list[SampleInput]:
        out = []
        for B, T, C, H, W in _SIZES[size]:
            pts, rot, planes = _make(dtype, device, gen, B, T, C, H, W, scales=2 if kind == "ms" else 1)
            name = f"B{B}_T{T}_C{C}_{H}x{W}"
            out.append(SampleInput(name, _args(kind, pts, rot, planes)))
        if size == "edge":
            pts, rot, planes = _edge_points(dtype, device, gen)
            out.append(SampleInput("border", _args(kind, pts, rot, [planes, planes[:, :2]] if kind == "ms"
                                                   else [planes])))
        return out
    return samples


def _args(kind, pts, rot, planes):
    if kind == "ms":
        return (pts, rot, list(planes))
    if kind == "taps":
        return (pts, rot, planes[0], 0.01)
    return (pts, rot, planes[0])


def _bad_inputs(kind: str):
    def bad():
        pts, rot, planes = torch.zeros(4, 3), torch.eye(3).repeat(2, 1, 1), torch.zeros(6, 2, 3, 3)
        wrap = (lambda p: [p]) if kind == "ms" else (lambda p: p)
        tail = (0.1,) if kind == "taps" else ()
        cases = [
            ((torch.zeros(4, 2), rot, wrap(planes), *tail), {}, ValueError, "pts"),
            ((pts, torch.zeros(2, 3, 2), wrap(planes), *tail), {}, ValueError, "rotations"),
            ((pts, rot, wrap(torch.zeros(5, 2, 3, 3)), *tail), {}, ValueError, "planes"),
            ((pts.double(), rot, wrap(planes), *tail), {}, TypeError, "dtype"),
            ((pts.half(), rot.half(), wrap(planes.half()), *tail), {}, TypeError, "pts"),
        ]
        if kind == "taps":
            cases.append(((pts, rot, planes, float("nan")), {}, ValueError, "h"))
        if kind == "ms":
            cases.append(((pts, rot, planes), {}, TypeError, "planes"))
        return cases
    return bad


def _size(args) -> int:
    """The size ranges' measure of a K-Planes call: points x T x C (C summed over the scales), the output's elements
    per tap. The points alone do not order the backends: the same points at T 2, C 16 and at T 4, C 32 fall on
    either side of the backends' crossing (docs/ops.md, "Size ranges")."""
    pts, rotations, planes = args[0], args[1], args[2]
    return pts.shape[0] * rotations.shape[0] * sum(p.shape[1] for p in (planes if isinstance(planes, list)
                                                                         else [planes]))


def _work(taps: int):
    """`kernelhub.spec.Work` of a K-Planes call at ``taps`` positions per point: DRAM, the points, rotations and
    planes read and the output written once (the planes fit in L2: their taps are gathers, not DRAM reads);
    gathers, the four texels of every channel at each (point, tilt, plane, scale, tap); about 8 operations per
    texel channel (the bilinear weights) and 2 per channel for the product of the three planes. Backward: the
    upstream gradient, points and rotations read again, each gradient written, the texels gathered again (the
    product rule needs the other planes' samples), one atomic add per texel channel into the planes' gradient,
    twice the forward's operations."""
    def work(args, out: torch.Tensor, grads_of) -> Work:
        pts, rotations, planes = args[0], args[1], args[2]
        channels = 3 * taps * _size(args)  # (point, tilt, plane, tap, channel), the channels of every scale
        gathers = 4 * channels * pts.element_size()
        flops = 8 * channels + 2 * channels // 3
        dram = nbytes(pts) + nbytes(rotations) + nbytes(planes) + nbytes(out)
        if grads_of is None:
            return Work(dram, gathers, 0, flops)
        dram += nbytes(out) + nbytes(pts) + nbytes(rotations) + sum(nbytes(args[i]) for i in grads_of)
        return Work(dram, 2 * gathers, 4 * channels if 2 in grads_of else 0, 3 * flops)
    return work


def _out(pts, rotations, planes):
    return pts.new_empty((pts.shape[0], rotations.shape[0] * planes.shape[1]))


KPLANES = OpSpec(
    name="kplanes_interp_tilted",
    args=(PTS, ROT, PLANES),
    doc="out[b, t*C+c] = product over the planes XY, ZX, YZ of bilinear samples at R_t @ pts[b]: [B, T*C].",
    dtypes=DTYPES,
    tolerances=tolerances_from(MEASURED_ERRORS, "kplanes_interp_tilted"),
    normalize=_normalize,
    output=_out,
    samples=_samples("single"),
    bad_inputs=_bad_inputs("single"),
    work=_work(1),
    size=_size,
)

KPLANES_MS = OpSpec(
    name="kplanes_interp_tilted_ms",
    args=(PTS, ROT, Arg("planes", "tensors", differentiable=True, doc="list of [3T, C_s, H_s, W_s], one per scale")),
    doc="kplanes_interp_tilted at every scale, concatenated along the last dim: [B, T*sum(C_s)].",
    dtypes=DTYPES,
    tolerances=tolerances_from(MEASURED_ERRORS, "kplanes_interp_tilted_ms"),
    normalize=_normalize_ms,
    output=lambda pts, rotations, planes: pts.new_empty(
        (pts.shape[0], rotations.shape[0] * sum(p.shape[1] for p in planes))),
    samples=_samples("ms"),
    bad_inputs=_bad_inputs("ms"),
    work=_work(1),
    size=_size,
)

KPLANES_TAPS = OpSpec(
    name="kplanes_interp_tilted_taps",
    args=(PTS, ROT, PLANES, Arg("h", "float", doc="finite-difference step; no gradient")),
    doc="[4, B, T*C]: tap 0 at pts, tap i at pts + h*e_i (i = 1..3).",
    dtypes=DTYPES,
    tolerances=tolerances_from(MEASURED_ERRORS, "kplanes_interp_tilted_taps"),
    normalize=_normalize_taps,
    output=lambda pts, rotations, planes, h: pts.new_empty((4, *_out(pts, rotations, planes).shape)),
    samples=_samples("taps"),
    bad_inputs=_bad_inputs("taps"),
    work=_work(4),
    size=_size,
)

# for backends that treat all three alike
KPLANES_OPS = tuple(spec.name for spec in (KPLANES, KPLANES_MS, KPLANES_TAPS))
