"""Modules over the ops: what applications build models with (docs/user-guide.md, "Modules").

Plain `torch.nn.Module`s with no kernel code: every op call goes through the hub (`kernelhub.op`), so
selection, tuning, the kill switch and `kernelhub.explain` apply to them as to a direct call.

- `TVLoss3d`: the normalised, weighted total-variation term of ptychography and tomography codes, one scalar.
- `KPlanesField`: tilted multi-scale K-Planes planes and rotations, features at points (and at TV taps).
- `SemiConv`, `GenericClosing`, `Closing`, `Opening`: semifield convolution and morphology, with the kernel given
  by a module (`QuadraticKernelIso2D`, `QuadraticKernelSpectral2D`, `QuadraticKernelCholesky2D`, `LearnedKernel`)
  or a tensor; the API of pytorch_nd_semiconv's ``GenericConv`` / ``GenericClosing`` and its quadratic kernels (same
  parameterisations and initialisations), so a model ports by changing imports (the user guide's porting table).

There is no trilinear or Tikhonov module: ``trilinear_interp`` takes each point's eight corner features (no state
a module would keep), and ``tikhonov_inverse_2xn``'s gradient does not reach ``lam``, so a learnable lambda has
nothing to learn from; call those ops directly.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import torch
from torch import nn

import kernelhub
from kernelhub import accumulation_dtype
from kernelhub.dispatch import OpHandle

# laid out by subject (kernels: the semifield convolutions' kernels; semiconv: the convolution and morphology
# modules; pnds: porting a pytorch_nd_semiconv model); everything public is imported from here
from kernelhub.nn._args import _count, _counts
from kernelhub.nn.kernels import (  # noqa: F401
    CovCholesky2D,
    CovSpectral2D,
    LearnedKernel,
    LearnedKernel2D,
    QuadraticKernelCholesky2D,
    QuadraticKernelIso2D,
    QuadraticKernelSpectral2D,
)
from kernelhub.nn.pnds import from_pytorch_nd_semiconv  # noqa: F401
from kernelhub.nn.semiconv import SEMIFIELD_ALIASES, Closing, GenericClosing, Opening, SemiConv  # noqa: F401

__all__ = ["TVLoss3d", "KPlanesField", "SemiConv", "GenericClosing", "Closing", "Opening", "from_pytorch_nd_semiconv",
           "QuadraticKernelIso2D", "QuadraticKernelSpectral2D",
           "QuadraticKernelCholesky2D", "CovSpectral2D", "CovCholesky2D", "LearnedKernel", "LearnedKernel2D",
           "SEMIFIELD_ALIASES"]

_TV_OPS = {"l1": "tv_loss_l1_3d", "sq": "tv_loss_sq_3d", "iso": "tv_loss_iso_3d"}


class TVLoss3d(nn.Module):
    """Total variation of ``volume [..., D, H, W]`` (the leading dims a batch of volumes, summed), one scalar.

    ``kind="l1"``: ``sum_a c_a * S_a`` with ``S = tv_loss_l1_3d(volume)`` the per-axis sums of absolute forward
    differences and, for ``reduction="mean"``, ``c_a = w_a / count_a / n`` where ``count = [(D-1)HW, D(H-1)W,
    DH(W-1)]`` (per volume) and ``n`` the number of active axes (weight > 0 and count > 0): the mean absolute
    difference along each active axis, weighted, averaged over the axes (what ptychography codes use);
    ``reduction="sum"``: ``c_a = w_a``. ``kind="sq"`` (squared differences) and ``kind="iso"`` (the corner-wise
    gradient norm, ``eps``) have one sum over the axes, so one weight: ``weights`` a number (or three equal ones);
    ``"mean"`` divides the squared sum by the number of differences in one volume and takes the iso op's mean
    (over every volume's corners) as it is, ``"sum"`` multiplies the iso mean back by the number of corners.

    Its forward and backward are one hub forward and one hub backward, with the weighting inside the op's
    autograd node (`OpHandle.weighted`: one node; per volume size one weighted handle, its coefficients a tensor
    kept on the device; no host synchronisation, no copy per step), and inside the kernels where the backend
    fuses it (cuda_ext and triton: one kernel each way). ``backend`` forces one, as in
    ``kernelhub.op(name, backend=...)``. Modules serialise (``torch.save``, ``copy.deepcopy``) through their handles.
    """

    def __init__(self, kind: str = "l1", weights: float | Sequence[float] = 1.0, reduction: str = "mean",
                 eps: float = 1e-8, backend: str | None = None) -> None:
        super().__init__()
        if kind not in _TV_OPS:
            raise ValueError(f"TVLoss3d: kind must be one of {list(_TV_OPS)}, got {kind!r}")
        if reduction not in ("mean", "sum"):
            raise ValueError(f"TVLoss3d: reduction must be 'mean' or 'sum', got {reduction!r}")
        given = weights.tolist() if isinstance(weights, torch.Tensor) else weights

        def number(x: object) -> bool:
            return isinstance(x, (int, float)) and not isinstance(x, bool)
        w: tuple[float, ...] = ()
        if isinstance(given, (int, float)) and not isinstance(given, bool):
            w = (float(given),) * 3
        elif isinstance(given, (list, tuple)) and all(number(x) for x in given):  # a string is neither
            w = tuple(float(x) for x in given)
        if len(w) != 3 or any(x < 0 or not math.isfinite(x) for x in w):
            raise ValueError("TVLoss3d: weights must be a number or three (wz, wy, wx), finite and >= 0, "
                             f"got {weights!r}")
        if kind != "l1" and len(set(w)) != 1:
            raise ValueError(f"TVLoss3d: kind={kind!r} sums the three axes in one term, so it takes one weight, "
                             f"got {weights!r} (per-axis weights need kind='l1')")
        self.kind, self.weights, self.reduction, self.eps = kind, w, reduction, eps
        self._op = kernelhub.op(_TV_OPS[kind], backend=backend)
        self._weighted: dict[tuple, OpHandle] = {}

    def _handle(self, volume: torch.Tensor) -> OpHandle:
        """The op's handle weighted by the coefficients of its output (l1: per axis, a tensor [3]; sq, iso: a 0-d
        tensor), in the op's output dtype on the volume's device, made once per volume size (with the batch only
        for iso's "sum")."""
        if not isinstance(volume, torch.Tensor) or volume.dim() < 3:
            raise ValueError(f"TVLoss3d: argument 'volume' must be a tensor [..., D, H, W], got "
                             f"{tuple(volume.shape) if isinstance(volume, torch.Tensor) else type(volume).__name__}")
        batched = self.kind == "iso" and self.reduction == "sum"
        key = (volume.shape if batched else volume.shape[-3:], volume.device, volume.dtype)
        handle = self._weighted.get(key)
        if handle is None:
            if len(self._weighted) >= 64:  # sizes that keep changing: keep a few, not every one seen
                self._weighted.clear()
            D, H, W = volume.shape[-3:]
            count = ((D - 1) * H * W, D * (H - 1) * W, D * H * (W - 1))
            w = self.weights
            if self.kind == "l1":
                active = [a for a in range(3) if w[a] > 0 and count[a] > 0]
                c: list[float] | float = [w[a] / count[a] / len(active) if a in active else 0.0 for a in range(3)] \
                    if self.reduction == "mean" else list(w)
            elif self.kind == "sq":
                c = w[0] / max(sum(count), 1) if self.reduction == "mean" else w[0]
            else:  # the op averages over the corners of each volume; "sum" multiplies back by every volume's
                corners = max(D - 1, 0) * max(H - 1, 0) * max(W - 1, 0) * math.prod(volume.shape[:-3])
                c = w[0] if self.reduction == "mean" else w[0] * corners
            handle = self._op.weighted(torch.tensor(c, dtype=accumulation_dtype(volume.dtype), device=volume.device))
            # a tensor made while a graph is traced is the graph's: kept, it would be an output of the graph that a
            # later run overwrites (CUDA graphs, mode="reduce-overhead"); traced, the graph makes it each run
            if not torch.compiler.is_compiling():
                self._weighted[key] = handle
        return handle

    def forward(self, volume: torch.Tensor) -> torch.Tensor:
        if self.kind == "iso":
            return self._handle(volume)(volume, self.eps)
        return self._handle(volume)(volume)

    def extra_repr(self) -> str:
        return f"kind={self.kind!r}, weights={self.weights}, reduction={self.reduction!r}"


class KPlanesField(nn.Module):
    """Tilted multi-scale K-Planes features. ``T`` tilts (rotation 0 the identity, the others small random
    rotations by ``tilt`` radians about random axes; a buffer, or a parameter with ``learn_rotations=True``) and
    one planes parameter ``[3T, C, R, R]`` per resolution R, initialised ``1 + 0.1 N(0, 1)`` (the K-Planes
    tomography example's init; ``seed`` draws both), stored channels-last (``torch.channels_last``: the layout the
    kernels read, so no copy per call; ``.to(device)`` and optimizers keep it).

    ``forward(points)``: the features ``[B, T*C*scales]`` (``kplanes_interp_tilted_ms``: one call for every scale);
    ``forward(points, tv_taps=h)``: ``[4, B, T*C*scales]``, the features at the points (tap 0) and at
    ``points + h e_i`` (taps 1-3, for a finite-difference TV), each scale one fused ``kplanes_interp_tilted_taps``
    call. ``backend`` forces one, as in ``kernelhub.op(name, backend=...)``.
    """

    def __init__(self, T: int, C: int, resolutions: Sequence[int], tilt: float = 0.3, learn_rotations: bool = False,
                 seed: int = 0, backend: str | None = None) -> None:
        super().__init__()
        _count("KPlanesField", "T", T)
        _count("KPlanesField", "C", C)
        if not isinstance(resolutions, (list, tuple)) or not resolutions:
            raise TypeError(f"KPlanesField: argument 'resolutions' must be a non-empty list of plane sizes "
                            f"(ints >= 1), got {resolutions!r}")
        _counts("KPlanesField", "resolutions", list(resolutions))
        if isinstance(tilt, bool) or not isinstance(tilt, (int, float)) or not math.isfinite(tilt):
            raise (TypeError if not isinstance(tilt, (int, float)) or isinstance(tilt, bool) else ValueError)(
                f"KPlanesField: argument 'tilt' must be a finite number (radians), got {tilt!r}")
        g = torch.Generator().manual_seed(seed)
        rotations = [torch.eye(3)]
        for _ in range(T - 1):
            a = torch.randn(3, generator=g)
            a = a / a.norm() * tilt
            skew = torch.tensor([[0.0, -a[2], a[1]], [a[2], 0.0, -a[0]], [-a[1], a[0], 0.0]])
            rotations.append(torch.linalg.matrix_exp(skew))
        if learn_rotations:
            self.rotations = nn.Parameter(torch.stack(rotations))
        else:
            self.register_buffer("rotations", torch.stack(rotations))
        # channels-last, the layout the triton and cuda_ext kernels read: no copy of the planes per call (and their
        # backwards give the planes gradient in this layout, so none of it either)
        self.planes = nn.ParameterList(
            [nn.Parameter((1.0 + 0.1 * torch.randn(3 * T, C, r, r, generator=g)).contiguous(
                memory_format=torch.channels_last)) for r in resolutions])
        self._ms = kernelhub.op("kplanes_interp_tilted_ms", backend=backend)
        self._taps = kernelhub.op("kplanes_interp_tilted_taps", backend=backend)

    @property
    def features(self) -> int:
        return sum(self.rotations.shape[0] * p.shape[1] for p in self.planes)

    def forward(self, points: torch.Tensor, tv_taps: float | None = None) -> torch.Tensor:
        if tv_taps is None:
            return self._ms(points, self.rotations, list(self.planes))
        return torch.cat([self._taps(points, self.rotations, p, tv_taps) for p in self.planes], dim=-1)
