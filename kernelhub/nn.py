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

import copy
import math
from collections.abc import Sequence
from typing import Any

import torch
from torch import nn

import kernelhub
from kernelhub import accumulation_dtype
from kernelhub.dispatch import OpHandle
from kernelhub.ops.semiconv import SEMIFIELDS, parse_semifield, pnds_class, same_padding

__all__ = ["TVLoss3d", "KPlanesField", "SemiConv", "GenericClosing", "Closing", "Opening", "from_pytorch_nd_semiconv",
           "QuadraticKernelIso2D", "QuadraticKernelSpectral2D",
           "QuadraticKernelCholesky2D", "CovSpectral2D", "CovCholesky2D", "LearnedKernel", "LearnedKernel2D",
           "SEMIFIELD_ALIASES"]

# pytorch_nd_semiconv's names for semifields the op knows under another: its tropical_min_negated is
# min(x - k), which is the op's tropical_min (docs/ops.md)
SEMIFIELD_ALIASES = {"tropical_min_negated": "tropical_min"}
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


def _count(owner: str, name: str, value: object, least: int = 1) -> int:
    """An int argument of at least ``least`` (not a bool), or a TypeError / ValueError naming the module and
    argument."""
    if not isinstance(value, int) or isinstance(value, bool):
        raise TypeError(f"{owner}: argument {name!r} must be an int >= {least}, got {value!r}")
    if value < least:
        raise ValueError(f"{owner}: argument {name!r} must be an int >= {least}, got {value!r}")
    return value


def _counts(owner: str, name: str, value: object, least: int = 1) -> None:
    """An int of at least ``least``, or a non-empty list or tuple of them."""
    for v in value if isinstance(value, (list, tuple)) and value else (value,):
        if not isinstance(v, int) or isinstance(v, bool) or v < least:
            raise (ValueError if isinstance(v, int) and not isinstance(v, bool) else TypeError)(
                f"{owner}: argument {name!r} must be an int >= {least} or a list of them, got {value!r}")


def _init_dict(owner: str, init: object) -> None:
    if init is not None and not isinstance(init, dict):
        raise TypeError(f"{owner}: argument 'init' must be a dict (pytorch_nd_semiconv's init options) or None, "
                        f"got {init!r}")


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


def _scale_space(n: int, kernel_size: int, log: bool) -> torch.Tensor:
    """``n`` variances evenly (or log-evenly) spaced in ``[1, 2 (K//2)^2]``, shuffled: the scale-space init."""
    top = max(2.0 * (kernel_size // 2) ** 2, 1.0)  # a 1x1 kernel: every variance 1 (0 would give -inf log_std)
    spaced = torch.logspace(0, math.log10(top), n) if log else torch.linspace(1.0, top, n)
    return spaced[torch.randperm(n)]


def _pos_grid_2d(kernel_size: int) -> torch.Tensor:
    """Offsets of a kernel's taps from its centre, ``[2, K*K]`` (row, column), row-major: ``-K//2 + 1 .. K//2``
    per axis, so an even kernel's centre is the tap after the middle (pytorch_nd_semiconv's grid)."""
    r = torch.arange(-kernel_size // 2 + 1, kernel_size // 2 + 1, dtype=torch.float32)
    y, x = torch.meshgrid(r, r, indexing="ij")
    return torch.stack((y.flatten(), x.flatten()))


class _Kernel2D(nn.Module):
    """What the quadratic kernels share: their sizes and the taps' offsets ``_pos_grid``, a buffer shaped as
    pytorch_nd_semiconv's (``[1, 1, 2, K*K]``, or ``[K*K, 2]`` for the spectral kernel), so its state dicts load
    into these modules unchanged."""

    _pos_grid: torch.Tensor  # buffers, declared for type checkers (nn.Module's attributes are Tensor | Module)

    def __init__(self, in_channels: int, out_channels: int, kernel_size: int, grid_last: bool = True) -> None:
        super().__init__()
        for name, value in (("in_channels", in_channels), ("out_channels", out_channels),
                            ("kernel_size", kernel_size)):
            if not isinstance(value, int) or isinstance(value, bool) or value < 1:
                raise ValueError(f"{type(self).__name__}: argument {name!r} must be a positive int, got {value!r}")
        self.in_channels, self.out_channels, self.kernel_size = in_channels, out_channels, kernel_size
        grid = _pos_grid_2d(kernel_size)
        self.register_buffer("_pos_grid", grid[None, None] if grid_last else grid.T.contiguous())

    def _shaped(self, dist: torch.Tensor) -> torch.Tensor:
        """``-dist`` ([O, I, K*K]) as the kernel ``[O, I, K, K]``."""
        return -dist.reshape(self.out_channels, self.in_channels, self.kernel_size, self.kernel_size)

    def extra_repr(self) -> str:
        return f"{self.in_channels}, {self.out_channels}, kernel_size={self.kernel_size}"


class QuadraticKernelIso2D(_Kernel2D):
    """An isotropic quadratic kernel ``-|x|^2 / s^2`` per (output, input) channel, ``[O, I, K, K]`` from
    ``forward()``; parameter ``log_std [O, I]`` (``s = exp(log_std)``). ``init={"var": ...}``: a float (that
    variance), ``"uniform"`` (variances uniform in [1, 16]), ``"ss"`` (scale-space: evenly spaced in
    [1, 2 (K//2)^2], shuffled; the default), ``"log-ss"`` (log-spaced likewise) or ``"normal"`` (truncated normal
    around 8 in [1, 16]): pytorch_nd_semiconv's parameterisation, initialisations and state dict."""

    _neg_r2: torch.Tensor

    def __init__(self, in_channels: int, out_channels: int, kernel_size: int, init: dict | None = None) -> None:
        _init_dict("QuadraticKernelIso2D", init)
        super().__init__(in_channels, out_channels, kernel_size)
        var = (init or {"var": "ss"})["var"]
        variances = torch.empty(out_channels, in_channels)
        if isinstance(var, (int, float)) and not isinstance(var, bool):
            nn.init.constant_(variances, float(var))
        elif var == "uniform":
            nn.init.uniform_(variances, 1, 16)
        elif var in ("ss", "log-ss"):
            variances[:] = _scale_space(variances.numel(), kernel_size, var == "log-ss").reshape(variances.shape)
        elif var == "normal":
            nn.init.trunc_normal_(variances, mean=8.0, a=1.0, b=16.0)
        else:
            raise ValueError(f"QuadraticKernelIso2D: init['var'] must be a float, 'uniform', 'ss', 'log-ss' or "
                             f"'normal', got {var!r}")
        self.log_std = nn.Parameter(variances.log().mul(0.5))
        # -|x|^2 per tap, made once (and again when a state dict brings a grid): a forward is then three ops, not
        # six, the same values to the bit as pytorch_nd_semiconv's (-(a / b) and (-a) / b are one rounding)
        self.register_buffer("_neg_r2", self._neg_sq_dist(), persistent=False)
        self.register_load_state_dict_post_hook(QuadraticKernelIso2D._grid_loaded)

    def _neg_sq_dist(self) -> torch.Tensor:
        with torch.no_grad():
            return self._pos_grid.pow(2).sum(-2).neg()

    @staticmethod
    def _grid_loaded(module: "QuadraticKernelIso2D", incompatible_keys) -> None:
        module._neg_r2 = module._neg_sq_dist()

    def forward(self) -> torch.Tensor:
        return (self._neg_r2 / self.log_std.mul(2).exp().unsqueeze(2)).reshape(
            self.out_channels, self.in_channels, self.kernel_size, self.kernel_size)


def _variances_2d(shape: tuple[int, ...], var, kernel_size: int, axis: int) -> torch.Tensor:
    """Initial variances of a 2-D covariance kernel, ``shape`` with the two principal axes along ``axis``:
    pytorch_nd_semiconv's options (a float, "uniform", "ss-iso", "log-ss-iso", "uniform-iso", "normal",
    "skewed")."""
    v = torch.empty(shape)
    first, second = v.select(axis, 0), v.select(axis, 1)
    if isinstance(var, (int, float)) and not isinstance(var, bool):
        nn.init.constant_(v, float(var))
    elif var == "uniform":
        nn.init.uniform_(v, 1, 16)
    elif var in ("ss-iso", "log-ss-iso"):
        first.copy_(_scale_space(first.numel(), kernel_size, var == "log-ss-iso").reshape(first.shape))
        second.copy_(first)
    elif var == "uniform-iso":
        nn.init.uniform_(first, 1, 16)
        second.copy_(first)
    elif var == "normal":
        nn.init.trunc_normal_(v, mean=8.0, std=4.0, a=1.0, b=16.0)
    elif var == "skewed":
        nn.init.uniform_(first, 1, 8.0)
        nn.init.uniform_(second, 20.0, 24.0)
    else:
        raise ValueError(f"init['var'] must be a float, 'uniform', 'ss-iso', 'log-ss-iso', 'uniform-iso', 'normal' or "
                         f"'skewed', got {var!r}")
    return v


class CovSpectral2D(nn.Module):
    """2-D covariances ``S = R(theta) diag(exp(2 log_std)) R(theta)^T`` per (output, input) channel: parameters
    ``log_std [O, I, 2]`` and ``theta [O, I]`` (the first principal axis' angle); ``inverse_cov()``
    ``[O, I, 2, 2]``. ``init={"var": ..., "theta": "spin" | "uniform"}``, default ``{"var": "skewed", "theta":
    "spin"}`` (evenly spaced angles in [0, pi), shuffled)."""

    def __init__(self, in_channels: int, out_channels: int, init: dict | None = None, kernel_size: int = 3) -> None:
        _init_dict("CovSpectral2D", init)
        super().__init__()
        init = init or {"var": "skewed", "theta": "spin"}
        variances = _variances_2d((out_channels, in_channels, 2), init.get("var", "skewed"), kernel_size, -1)
        n = out_channels * in_channels
        if init.get("theta", "spin") == "spin":
            theta = torch.linspace(0, math.pi, n + 1)[:-1][torch.randperm(n)].reshape(out_channels, in_channels)
        elif init["theta"] == "uniform":
            theta = torch.empty(out_channels, in_channels).uniform_(0, math.pi)
        else:
            raise ValueError("QuadraticKernelSpectral2D: init['theta'] must be 'spin' or 'uniform', "
                             f"got {init['theta']!r}")
        self.theta = nn.Parameter(theta)
        self.log_std = nn.Parameter(variances.log().mul(0.5))

    def inverse_cov(self) -> torch.Tensor:
        c, s = self.theta.cos(), self.theta.sin()
        rot = torch.stack((torch.stack((c, -s), -1), torch.stack((s, c), -1)), -2)  # [O, I, 2, 2]
        return rot @ torch.diag_embed(self.log_std.mul(-2).exp()) @ rot.transpose(-1, -2)

    def cov(self) -> torch.Tensor:
        return torch.linalg.inv(self.inverse_cov())

    forward = inverse_cov


class CovCholesky2D(nn.Module):
    """2-D covariances ``S = L L^T`` per (output, input) channel, ``L = [[s0, 0], [r s1, sqrt(s1^2 - (r s1)^2)]]``,
    ``s = exp(log_std)``, ``r = tanh(corr)`` (Pearson's R): parameters ``log_std [2, O, I]`` and ``corr [O, I]``
    (truncated normal, std 0.5); ``cholesky()`` ``[O, I, 2, 2]``. ``init={"var": ...}``, default ``"skewed"``."""

    def __init__(self, in_channels: int, out_channels: int, init: dict | None = None, kernel_size: int = 3) -> None:
        _init_dict("CovCholesky2D", init)
        super().__init__()
        init = init or {"var": "skewed"}
        variances = _variances_2d((2, out_channels, in_channels), init.get("var", "skewed"), kernel_size, 0)
        corr = torch.empty(out_channels, in_channels)
        nn.init.trunc_normal_(corr, mean=0.0, std=0.5, a=-1.0, b=1.0)
        self.corr = nn.Parameter(corr)
        self.log_std = nn.Parameter(variances.log().mul(0.5))

    def cholesky(self) -> torch.Tensor:
        std = self.log_std.exp()
        cross = self.corr.tanh() * std[1]
        zero = torch.zeros_like(cross)
        return torch.stack((torch.stack((std[0], zero), -1),
                            torch.stack((cross, (std[1].square() - cross.square()).sqrt()), -1)), -2)

    def cov(self) -> torch.Tensor:
        tril = self.cholesky()
        return tril @ tril.transpose(-1, -2)


class QuadraticKernelSpectral2D(_Kernel2D):
    """An anisotropic quadratic kernel ``-x^T S^-1 x`` per (output, input) channel, ``[O, I, K, K]``, with the
    covariances ``covs`` a `CovSpectral2D` (parameters ``covs.log_std [O, I, 2]``, ``covs.theta [O, I]``):
    pytorch_nd_semiconv's parameterisation, initialisations (``init`` as `CovSpectral2D`'s) and state dict."""

    def __init__(self, in_channels: int, out_channels: int, kernel_size: int, init: dict | None = None) -> None:
        _init_dict("QuadraticKernelSpectral2D", init)
        super().__init__(in_channels, out_channels, kernel_size, grid_last=False)
        self.covs = CovSpectral2D(in_channels, out_channels, init, kernel_size)

    def inspect_parameters(self) -> tuple[torch.Tensor, torch.Tensor]:
        """``(log_std [O, I, 2], theta [O, I])``."""
        return self.covs.log_std, self.covs.theta

    def forward(self) -> torch.Tensor:
        p = self._pos_grid  # [K*K, 2]
        return self._shaped(torch.einsum("kv,oivw,kw->oik", p, self.covs.inverse_cov(), p))


class QuadraticKernelCholesky2D(_Kernel2D):
    """An anisotropic quadratic kernel ``-|L^-1 x|^2`` (``S = L L^T``) per (output, input) channel,
    ``[O, I, K, K]``, with the covariances ``covs`` a `CovCholesky2D` (parameters ``covs.log_std [2, O, I]``,
    ``covs.corr [O, I]``): pytorch_nd_semiconv's parameterisation, documented initialisations (``init`` as
    `CovCholesky2D`'s, default ``"skewed"``) and state dict."""

    def __init__(self, in_channels: int, out_channels: int, kernel_size: int, init: dict | None = None) -> None:
        _init_dict("QuadraticKernelCholesky2D", init)
        super().__init__(in_channels, out_channels, kernel_size)
        self.covs = CovCholesky2D(in_channels, out_channels, init, kernel_size)

    def inspect_parameters(self) -> tuple[torch.Tensor, torch.Tensor]:
        """``(log_std [O, I, 2], corr [O, I])`` (``covs.log_std`` is stored ``[2, O, I]``)."""
        return self.covs.log_std.movedim(0, 2), self.covs.corr

    def forward(self) -> torch.Tensor:
        b = torch.linalg.solve_triangular(self.covs.cholesky(), self._pos_grid, upper=False)  # [O, I, 2, K*K]
        return self._shaped(b.pow(2).sum(-2))


class LearnedKernel(nn.Module):
    """A freely learned kernel ``[O, I, *kernel_size]`` (any number of spatial dims), initialised to zeros (the
    flat structuring element) or, with ``init="normal"``, standard normal."""

    def __init__(self, in_channels: int, out_channels: int, kernel_size: int | Sequence[int], ndim: int = 2,
                 init: str = "zero") -> None:
        super().__init__()
        _count("LearnedKernel", "in_channels", in_channels)
        _count("LearnedKernel", "out_channels", out_channels)
        if ndim not in (1, 2, 3) or isinstance(ndim, bool):
            raise ValueError(f"LearnedKernel: argument 'ndim' must be 1, 2 or 3 (semiconv's spatial dims), got "
                             f"{ndim!r}")
        _counts("LearnedKernel", "kernel_size", kernel_size)
        size = (kernel_size,) * ndim if isinstance(kernel_size, int) else tuple(kernel_size)
        if len(size) != ndim:
            raise ValueError(f"LearnedKernel: argument 'kernel_size' must be an int or {ndim} ints (ndim), got "
                             f"{kernel_size!r}")
        self.kernel = nn.Parameter(torch.zeros(out_channels, in_channels, *size))
        if init == "normal":
            nn.init.normal_(self.kernel)
        elif init != "zero":
            raise ValueError(f"LearnedKernel: init must be 'zero' or 'normal', got {init!r}")

    def forward(self) -> torch.Tensor:
        return self.kernel


class LearnedKernel2D(LearnedKernel):
    """pytorch_nd_semiconv's ``LearnedKernel2D``: a learned ``[O, I, K, K]`` kernel, standard normal at first."""

    def __init__(self, in_channels: int, out_channels: int, kernel_size: int) -> None:
        super().__init__(in_channels, out_channels, kernel_size, ndim=2, init="normal")


def _same_padding(kernel_size: Sequence[int], dilation) -> list[int]:
    """The op's ``padding="same"`` (`kernelhub.ops.semiconv.same_padding`, pytorch_nd_semiconv's) for a module's
    kernel, given to the op as pairs: the kernel's size is known only at the call, and a module's "same" is
    pytorch_nd_semiconv's at every stride, with no warning about the op's earlier meaning."""
    dil = [dilation] * len(kernel_size) if isinstance(dilation, int) else list(dilation)
    if len(dil) != len(kernel_size):
        raise ValueError(f"SemiConv: dilation {dilation!r} does not match the kernel's {len(kernel_size)} spatial dims")
    return same_padding(kernel_size, dil)


def _semifield(semifield: object) -> str:
    """The op's name of a `SemiConv` semifield (a pytorch_nd_semiconv alias resolved), checked at construction;
    a pytorch_nd_semiconv semifield object is refused with the string that names it."""
    if not isinstance(semifield, str):
        parse_semifield(semifield)  # its TypeError, with the string that names a pytorch_nd_semiconv semifield
        raise AssertionError("parse_semifield takes strings only")
    name = SEMIFIELD_ALIASES.get(semifield, semifield)
    try:
        parse_semifield(name)
    except ValueError as exc:
        raise ValueError(f"SemiConv: argument 'semifield' must be one of {[*SEMIFIELDS, *SEMIFIELD_ALIASES]}, got "
                         f"{semifield!r} ({exc})") from None
    return name


class _KernelConv(nn.Module):
    """What `SemiConv` and `GenericClosing` share: the kernel from a module (called each forward: a learnable
    kernel) or a fixed tensor (a buffer, ``fixed_kernel``), and the geometry the op takes, with
    ``padding="same"`` resolved for each call's kernel (`_same_padding`)."""

    kernel: nn.Module | None
    fixed_kernel: torch.Tensor

    def __init__(self, kernel: nn.Module | torch.Tensor, stride, padding, dilation, groups: int,
                 group_broadcasting: bool) -> None:
        super().__init__()
        owner = type(self).__name__
        if not isinstance(kernel, (nn.Module, torch.Tensor)):
            raise TypeError(f"{owner}: argument 'kernel' must be a kernel module (kernelhub.nn.QuadraticKernelIso2D, "
                            f"LearnedKernel, ...) or a tensor [O, I, *K], got {type(kernel).__name__} {kernel!r:.80}")
        _geometry(owner, stride, padding, dilation, groups, group_broadcasting)
        if isinstance(kernel, nn.Module):
            self.kernel = kernel
        else:
            self.register_buffer("fixed_kernel", torch.as_tensor(kernel))
            self.kernel = None
        self.stride, self.padding, self.dilation = stride, padding, dilation
        self.groups, self.group_broadcasting = groups, group_broadcasting

    def weight(self) -> torch.Tensor:
        return self.kernel() if self.kernel is not None else self.fixed_kernel

    def _padding_for(self, k: torch.Tensor):
        return _same_padding(k.shape[2:], self.dilation) if self.padding == "same" else self.padding


class SemiConv(_KernelConv):
    """``semiconv(x, kernel(), semifield, stride, padding, dilation, groups, kind, group_broadcasting,
    spread_gradient, channels_add)`` with the
    kernel from a module (called each forward: a learnable kernel) or a fixed tensor (a buffer). ``semifield``
    as the op takes it (docs/ops.md), or pytorch_nd_semiconv's ``"tropical_min_negated"`` (the op's
    ``tropical_min``). ``padding="same"`` is pytorch_nd_semiconv's (the stride-1 padding at any stride; an even
    kernel's extra step at the end), so a ported model computes what it did; the other padding forms are the
    op's. ``spread_gradient`` and ``channels_add`` (tropical_max and tropical_min) are pytorch_nd_semiconv's
    options of its tropical semifields (``BroadcastSemifield.tropical_max(channels_add, spread_gradient)``).
    ``backend`` forces one, as in ``kernelhub.op(name, backend=...)``."""

    def __init__(self, kernel: nn.Module | torch.Tensor, semifield: str, stride=1, padding=0, dilation=1,
                 groups: int = 1, group_broadcasting: bool = False, kind: str = "conv",
                 backend: str | None = None, *, spread_gradient: bool = False, channels_add: bool = False) -> None:
        super().__init__(kernel, stride, padding, dilation, groups, group_broadcasting)
        self.semifield = _semifield(semifield)
        if kind not in ("conv", "corr"):
            raise ValueError(f"SemiConv: argument 'kind' must be 'conv' or 'corr', got {kind!r}")
        self.kind, self.spread_gradient, self.channels_add = kind, spread_gradient, channels_add
        self._op = kernelhub.op("semiconv", backend=backend)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        k = self.weight()
        return self._op(x, k.to(x.dtype), self.semifield, self.stride, self._padding_for(k), self.dilation,
                        self.groups, self.kind, self.group_broadcasting, self.spread_gradient, self.channels_add)

    def extra_repr(self) -> str:
        return (f"semifield={self.semifield!r}, stride={self.stride}, padding={self.padding}, "
                f"dilation={self.dilation}, groups={self.groups}, group_broadcasting={self.group_broadcasting}, "
                f"kind={self.kind!r}" + "".join(f", {n}=True" for n in ("spread_gradient", "channels_add")
                                                 if getattr(self, n)))


def _geometry(owner: str, stride, padding, dilation, groups, group_broadcasting) -> None:
    """Raise TypeError naming ``owner`` and the argument where one is not of a type the op takes (at construction:
    a pytorch_nd_semiconv-style positional call, ``Closing(k, "tropical_max", ...)``, would put a semifield in
    ``stride``), and ValueError where a value is out of range (stride, dilation and groups >= 1, padding >= 0)."""
    ints = lambda v: isinstance(v, int) and not isinstance(v, bool) or isinstance(v, (list, tuple))  # noqa: E731
    for name, value, ok in (("stride", stride, ints(stride)), ("dilation", dilation, ints(dilation)),
                            ("padding", padding, ints(padding) or padding in ("same", "valid", "same_strided")),
                            ("groups", groups, isinstance(groups, int) and not isinstance(groups, bool)),
                            ("group_broadcasting", group_broadcasting, isinstance(group_broadcasting, bool))):
        if not ok:
            hint = (" (the semifields of a closing go to kernelhub.nn.GenericClosing(kernel, dilation_semifield, "
                    "erosion_semifield, ...))" if isinstance(value, str) and owner != "SemiConv" else
                    " (an int, ints, (begin, end) pairs, 'valid', 'same' or 'same_strided')" if name == "padding"
                    else "")
            raise TypeError(f"{owner}: argument {name!r} got {value!r}{hint}")
    _counts(owner, "stride", stride)
    _counts(owner, "dilation", dilation)
    _count(owner, "groups", groups)
    if not isinstance(padding, str):  # an int, ints, or (begin, end) pairs
        pairs = isinstance(padding, (list, tuple)) and padding and all(isinstance(p, (list, tuple)) for p in padding)
        for p in padding if pairs else (padding,):
            _counts(owner, "padding", list(p) if pairs else p, least=0)


class GenericClosing(_KernelConv):
    """pytorch_nd_semiconv's ``GenericClosing(kernel, conv_dilation, conv_erosion, stride, padding, dilation, groups,
    group_broadcasting)`` with the two convolutions named by their semifields: ``semiconv(x, k,
    dilation_semifield, kind="conv")`` then ``semiconv(., k, erosion_semifield, kind="corr")`` with one kernel
    ``k = kernel()`` (a module, learnable, or a fixed tensor). The kernel is the module's ``kernel`` (a state dict's
    ``kernel.*``, as the package's), so its checkpoints load with ``strict=True``. With the tropical pair this is
    a closing (`Closing`), never below its input for any kernel."""

    _KINDS = ("conv", "corr")

    def __init__(self, kernel: nn.Module | torch.Tensor, dilation_semifield: str = "tropical_max",
                 erosion_semifield: str = "tropical_min", stride=1, padding=0, dilation=1, groups: int = 1,
                 group_broadcasting: bool = False) -> None:
        super().__init__(kernel, stride, padding, dilation, groups, group_broadcasting)
        self.semifields = (_semifield(dilation_semifield), _semifield(erosion_semifield))
        self._op = kernelhub.op("semiconv")

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        k = self.weight().to(x.dtype)
        padding = self._padding_for(k)
        for semifield, kind in zip(self.semifields, self._KINDS):
            x = self._op(x, k, semifield, self.stride, padding, self.dilation, self.groups, kind,
                         self.group_broadcasting)
        return x

    def _load_from_state_dict(self, state_dict, prefix, *args, **kwargs) -> None:
        # kernelhub before 2026-11-27 kept the kernel twice, under first.kernel.* and second.kernel.* (one module):
        # such a checkpoint loads into kernel.*
        for key in [k for k in state_dict if k.startswith(prefix + "first.kernel.")]:
            state_dict[prefix + "kernel." + key[len(prefix + "first.kernel."):]] = state_dict.pop(key)
        for key in [k for k in state_dict if k.startswith(prefix + "second.kernel.")]:
            del state_dict[key]
        super()._load_from_state_dict(state_dict, prefix, *args, **kwargs)

    def extra_repr(self) -> str:
        return (f"semifields={self.semifields}, stride={self.stride}, padding={self.padding}, "
                f"dilation={self.dilation}, groups={self.groups}, group_broadcasting={self.group_broadcasting}")


class Closing(GenericClosing):
    """Morphological closing: a dilation (tropical_max, ``x + k``, kind "conv") then its adjoint erosion
    (tropical_min, ``x - k``, kind "corr") with the same kernel, so never below its input for any kernel; the
    kernel's parameters learn from both. ``Closing(kernel, stride, padding, dilation, groups, group_broadcasting)``;
    other semifields: `GenericClosing`."""

    def __init__(self, kernel: nn.Module | torch.Tensor, stride=1, padding=0, dilation=1, groups: int = 1,
                 group_broadcasting: bool = False) -> None:
        super().__init__(kernel, "tropical_max", "tropical_min", stride, padding, dilation, groups,
                         group_broadcasting)


class Opening(GenericClosing):
    """Morphological opening: the erosion (tropical_min, kind "corr") then its adjoint dilation (tropical_max, kind
    "conv") with the same kernel (`Closing`'s order reversed), never above its input."""

    _KINDS = ("corr", "conv")

    def __init__(self, kernel: nn.Module | torch.Tensor, stride=1, padding=0, dilation=1, groups: int = 1,
                 group_broadcasting: bool = False) -> None:
        super().__init__(kernel, "tropical_min", "tropical_max", stride, padding, dilation, groups,
                         group_broadcasting)


# -- from pytorch_nd_semiconv ------------------------------------------------------------------------------------
_PNDS_FAMILIES = {"tropical_max": "tropical_max", "tropical_min_negated": "tropical_min", "linear": "linear",
                  "log": "log", "root": "root"}
_PNDS_KERNELS = ("QuadraticKernelIso2D", "QuadraticKernelSpectral2D", "QuadraticKernelCholesky2D")


def _pnds_semifield(conv: nn.Module, where: str) -> tuple[str, dict]:
    """(the op's semifield string, SemiConv's tropical options) of a pytorch_nd_semiconv convolution module
    (``BroadcastSemifield.log(2.0).dynamic()``, ``SelectSemifield.tropical_max().lazy_fixed()``, ...), read from the
    constructor its semifield's functions were made in; ValueError naming ``where`` for any other."""
    sf: Any = getattr(conv, "semifield", None)  # pytorch_nd_semiconv's, untyped
    fields = [getattr(sf, f) for f in getattr(sf, "_fields", ()) if callable(getattr(sf, f))]
    family: str | None = None
    param: float | None = None
    for fn in fields:
        parts = getattr(fn, "__qualname__", "").split(".")
        if len(parts) > 2 and parts[0].endswith("Semifield") and parts[1] in _PNDS_FAMILIES:
            family = parts[1]
            cells = [c.cell_contents for c in (fn.__closure__ or ()) if isinstance(c.cell_contents, (int, float))]
            param = param if not cells else cells[0]
    if family is None or (family in ("log", "root") and param is None):
        raise ValueError(f"kernelhub.nn.from_pytorch_nd_semiconv: {where}: cannot read the semifield of "
                         f"{type(conv).__name__} (a semifield made by hand, not by one of pytorch_nd_semiconv's "
                         "constructors); replace it by kernelhub.nn.SemiConv with the semifield's name")
    name = _PNDS_FAMILIES[family] + (f":{float(param or 0.0)!r}" if family in ("log", "root") else "")
    options = {}
    if family.startswith("tropical") and type(sf).__name__ == "BroadcastSemifield":
        options["channels_add"] = sf.add_reduce_channels is not None
        options["spread_gradient"] = not sf.add_reduce.__qualname__.startswith("_repeated_dim")
    return name, options


def _pnds_kernel(kernel: nn.Module, where: str) -> nn.Module:
    """kernelhub's module for a pytorch_nd_semiconv kernel module, its state dict loaded (strict); any other
    module as it is (a kernel module of the model's own)."""
    name = pnds_class(kernel)
    if name is None:
        return kernel
    if name in _PNDS_KERNELS:
        ours = globals()[name](kernel.in_channels, kernel.out_channels, kernel.kernel_size)
    elif name == "LearnedKernel2D":
        k: torch.Tensor = kernel.kernel  # type: ignore[assignment]  # pytorch_nd_semiconv's parameter
        ours = LearnedKernel2D(k.shape[1], k.shape[0], k.shape[2])
    else:
        raise ValueError(f"kernelhub.nn.from_pytorch_nd_semiconv: {where}: no kernelhub equivalent of {name}")
    state = kernel.state_dict()
    first = next((t for t in state.values() if t.is_floating_point()), None)
    if first is not None:  # its dtype and device (a model moved with .double(), .cuda())
        ours = ours.to(device=first.device, dtype=first.dtype)
    ours.load_state_dict(state, strict=True)
    return ours


def from_pytorch_nd_semiconv(model: nn.Module, inplace: bool = False) -> nn.Module:
    """``model`` with every pytorch_nd_semiconv ``GenericConv`` replaced by `SemiConv`, every ``GenericClosing`` by
    `Closing` (its tropical pair) or `GenericClosing`, and each of its kernel modules by kernelhub's, the weights
    kept (a copy of ``model`` unless ``inplace``): the same values and gradients, through the hub. A module it
    cannot convert (a semifield made by hand, ``TorchMaxPool2D``, ``TorchLinearConv2D``) raises ValueError naming
    it and what to do; nothing is left half-converted (the copy is dropped, or ``model`` is untouched)."""
    try:
        import pytorch_nd_semiconv as pnds
    except ImportError as exc:
        raise ImportError("kernelhub.nn.from_pytorch_nd_semiconv needs pytorch_nd_semiconv installed") from exc
    if isinstance(model, (pnds.GenericConv, pnds.GenericClosing)):
        if inplace:
            raise ValueError("kernelhub.nn.from_pytorch_nd_semiconv: a GenericConv or GenericClosing cannot be "
                             "replaced in place by another class; convert the module holding it, or inplace=False")
        holder = nn.Module()
        holder.model = model
        return from_pytorch_nd_semiconv(holder).get_submodule("model")
    work = copy.deepcopy(model)
    _convert_children(work, pnds, "")  # raises before the caller's model is touched
    if inplace:
        _convert_children(model, pnds, "")
        return model
    return work


def _convert_children(module: nn.Module, pnds, prefix: str) -> None:
    for name, child in list(module.named_children()):
        where = f"{prefix}{name}"
        args = ("stride", "padding", "dilation", "groups", "group_broadcasting")
        new: nn.Module
        if isinstance(child, pnds.GenericConv):
            semifield, options = _pnds_semifield(child.conv, where)
            new = SemiConv(_pnds_kernel(child.kernel, where), semifield, **{a: getattr(child, a) for a in args},
                           kind=child.kind, **{k: v for k, v in options.items() if v})
        elif isinstance(child, pnds.GenericClosing):
            (first, o1), (second, o2) = (_pnds_semifield(c, where) for c in (child.conv_dilation, child.conv_erosion))
            if any(o1.values()) or any(o2.values()):
                raise ValueError(f"kernelhub.nn.from_pytorch_nd_semiconv: {where}: a closing with spread_gradient or "
                                 "channels_add; build it from two kernelhub.nn.SemiConv with those options")
            kernel = _pnds_kernel(child.kernel, where)
            new = Closing(kernel, *(getattr(child, a) for a in args)) if (first, second) == ("tropical_max",
                                                                                            "tropical_min") else \
                GenericClosing(kernel, first, second, *(getattr(child, a) for a in args))
        elif pnds_class(child) in ("TorchMaxPool2D", "TorchLinearConv2D"):
            raise ValueError(f"kernelhub.nn.from_pytorch_nd_semiconv: {where}: {type(child).__name__} is torch's own "
                             "layer in the package's interface; use torch.nn.MaxPool2d / torch.nn.Conv2d")
        elif pnds_class(child) in (*_PNDS_KERNELS, "LearnedKernel2D"):
            new = _pnds_kernel(child, where)
        else:
            _convert_children(child, pnds, where + ".")
            continue
        setattr(module, name, new)
