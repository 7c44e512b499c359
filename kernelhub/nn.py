"""Modules over the ops: what applications build models with (docs/user-guide.md, "Modules").

Plain `torch.nn.Module`s with no kernel code: every op call goes through the hub (`kernelhub.op`), so
selection, tuning, the kill switch and `kernelhub.explain` apply to them as to a direct call.

- `TVLoss3d`: the normalised, weighted total-variation term of ptychography and tomography codes, one scalar.
- `SemiConv`, `Closing`, `Opening`: semifield convolution and morphology, with the kernel given by a module
  (`QuadraticKernelIso2D`, `LearnedKernel`) or a tensor; the API of pytorch_nd_semiconv's ``GenericConv`` /
  ``GenericClosing`` and its isotropic quadratic kernel (same parameterisation and initialisations), so a model
  ports by changing imports (the user guide's porting table).
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import torch
from torch import nn

import kernelhub
from kernelhub import accumulation_dtype

__all__ = ["TVLoss3d", "SemiConv", "Closing", "Opening", "QuadraticKernelIso2D", "LearnedKernel", "SEMIFIELD_ALIASES"]

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
    ``"mean"`` divides the squared sum by the number of differences and takes the iso op's mean as it is, ``"sum"``
    multiplies the iso mean back by its number of corners.

    Its forward and backward are one hub forward and one hub backward plus a product with coefficients kept on
    the device per shape (no host synchronisation, no copy per step). ``backend`` forces one, as in
    ``kernelhub.op(name, backend=...)``.
    """

    def __init__(self, kind: str = "l1", weights: float | Sequence[float] = 1.0, reduction: str = "mean",
                 eps: float = 1e-8, backend: str | None = None) -> None:
        super().__init__()
        if kind not in _TV_OPS:
            raise ValueError(f"TVLoss3d: kind must be one of {list(_TV_OPS)}, got {kind!r}")
        if reduction not in ("mean", "sum"):
            raise ValueError(f"TVLoss3d: reduction must be 'mean' or 'sum', got {reduction!r}")
        w = (float(weights),) * 3 if isinstance(weights, (int, float)) else tuple(float(x) for x in weights)
        if len(w) != 3 or any(x < 0 or not math.isfinite(x) for x in w):
            raise ValueError(f"TVLoss3d: weights must be a number or three (wz, wy, wx), finite and >= 0, got {weights!r}")
        if kind != "l1" and len(set(w)) != 1:
            raise ValueError(f"TVLoss3d: kind={kind!r} sums the three axes in one term, so it takes one weight, "
                             f"got {weights!r} (per-axis weights need kind='l1')")
        self.kind, self.weights, self.reduction, self.eps = kind, w, reduction, eps
        self._op = kernelhub.op(_TV_OPS[kind], backend=backend)
        self._coefficients: dict[tuple, torch.Tensor | float] = {}

    def _scale(self, volume: torch.Tensor) -> torch.Tensor | float:
        """The per-axis coefficients (l1: a tensor [3] on the volume's device) or the one factor (sq, iso)."""
        D, H, W = volume.shape[-3:]
        key = (D, H, W, volume.device, volume.dtype)
        scale = self._coefficients.get(key)
        if scale is None:
            count = ((D - 1) * H * W, D * (H - 1) * W, D * H * (W - 1))
            w = self.weights
            if self.kind == "l1":
                active = [a for a in range(3) if w[a] > 0 and count[a] > 0]
                c = [w[a] / count[a] / len(active) if a in active else 0.0 for a in range(3)] \
                    if self.reduction == "mean" else list(w)
                scale = torch.tensor(c, dtype=accumulation_dtype(volume.dtype), device=volume.device)
            elif self.kind == "sq":
                scale = w[0] / max(sum(count), 1) if self.reduction == "mean" else w[0]
            else:
                corners = max(D - 1, 0) * max(H - 1, 0) * max(W - 1, 0)
                scale = w[0] if self.reduction == "mean" else w[0] * corners
            self._coefficients[key] = scale
        return scale

    def forward(self, volume: torch.Tensor) -> torch.Tensor:
        scale = self._scale(volume)
        if self.kind == "l1":
            return torch.dot(self._op(volume), scale)
        out = self._op(volume, self.eps) if self.kind == "iso" else self._op(volume)
        if self.kind == "iso" and self.reduction == "sum":  # the op averages over the corners of each volume
            scale = scale * math.prod(volume.shape[:-3])
        return out * scale

    def extra_repr(self) -> str:
        return f"kind={self.kind!r}, weights={self.weights}, reduction={self.reduction!r}"


def _pos_grid_2d(kernel_size: int) -> torch.Tensor:
    """Offsets of a kernel's taps from its centre, ``[2, k*k]`` (row, column), row-major."""
    r = torch.arange(kernel_size, dtype=torch.float32) - (kernel_size // 2)
    y, x = torch.meshgrid(r, r, indexing="ij")
    return torch.stack((y.flatten(), x.flatten()))


class QuadraticKernelIso2D(nn.Module):
    """An isotropic quadratic kernel ``-|x|^2 / s^2`` per (output, input) channel, ``[O, I, K, K]`` from
    ``forward()``; parameter ``log_std [O, I]`` (``s = exp(log_std)``). ``init={"var": ...}``: a float (that
    variance), ``"uniform"`` (variances uniform in [1, 16]), ``"ss"`` (scale-space: evenly spaced in
    [1, 2 (K//2)^2], shuffled; the default), ``"log-ss"`` (log-spaced likewise) or ``"normal"`` (truncated normal
    around 8 in [1, 16]): pytorch_nd_semiconv's parameterisation and initialisations."""

    def __init__(self, in_channels: int, out_channels: int, kernel_size: int, init: dict | None = None) -> None:
        super().__init__()
        var = (init or {"var": "ss"})["var"]
        variances = torch.empty(out_channels, in_channels)
        top = 2 * (kernel_size // 2) ** 2
        n = out_channels * in_channels
        if isinstance(var, (int, float)) and not isinstance(var, bool):
            nn.init.constant_(variances, float(var))
        elif var == "uniform":
            nn.init.uniform_(variances, 1, 16)
        elif var in ("ss", "log-ss"):
            spaced = torch.linspace(1, top, n) if var == "ss" else torch.logspace(0, math.log10(max(top, 1)), n)
            variances[:] = spaced[torch.randperm(n)].reshape(out_channels, in_channels)
        elif var == "normal":
            nn.init.trunc_normal_(variances, mean=8.0, a=1.0, b=16.0)
        else:
            raise ValueError(f"QuadraticKernelIso2D: init['var'] must be a float, 'uniform', 'ss', 'log-ss' or "
                             f"'normal', got {var!r}")
        self.log_std = nn.Parameter(variances.log().mul(0.5))
        self.in_channels, self.out_channels, self.kernel_size = in_channels, out_channels, kernel_size
        self.register_buffer("_pos_grid", _pos_grid_2d(kernel_size))

    def forward(self) -> torch.Tensor:
        dist = self._pos_grid.pow(2).sum(0) / self.log_std.mul(2).exp().unsqueeze(2)
        return -dist.reshape(self.out_channels, self.in_channels, self.kernel_size, self.kernel_size)

    def extra_repr(self) -> str:
        return f"{self.in_channels}, {self.out_channels}, kernel_size={self.kernel_size}"


class LearnedKernel(nn.Module):
    """A freely learned kernel ``[O, I, *kernel_size]`` (any number of spatial dims), initialised to zeros (the
    flat structuring element) or, with ``init="normal"``, standard normal."""

    def __init__(self, in_channels: int, out_channels: int, kernel_size: int | Sequence[int], ndim: int = 2,
                 init: str = "zero") -> None:
        super().__init__()
        size = (kernel_size,) * ndim if isinstance(kernel_size, int) else tuple(kernel_size)
        self.kernel = nn.Parameter(torch.zeros(out_channels, in_channels, *size))
        if init == "normal":
            nn.init.normal_(self.kernel)
        elif init != "zero":
            raise ValueError(f"LearnedKernel: init must be 'zero' or 'normal', got {init!r}")

    def forward(self) -> torch.Tensor:
        return self.kernel


class SemiConv(nn.Module):
    """``semiconv(x, kernel(), semifield, stride, padding, dilation, groups, kind, group_broadcasting)`` with the
    kernel from a module (called each forward: a learnable kernel) or a fixed tensor (a buffer). ``semifield``
    as the op takes it (docs/ops.md), or pytorch_nd_semiconv's ``"tropical_min_negated"`` (the op's
    ``tropical_min``). ``backend`` forces one, as in ``kernelhub.op(name, backend=...)``."""

    def __init__(self, kernel: nn.Module | torch.Tensor, semifield: str, stride=1, padding=0, dilation=1,
                 groups: int = 1, group_broadcasting: bool = False, kind: str = "conv",
                 backend: str | None = None) -> None:
        super().__init__()
        if isinstance(kernel, nn.Module):
            self.kernel = kernel
        else:
            self.register_buffer("fixed_kernel", torch.as_tensor(kernel))
            self.kernel = None
        self.semifield = SEMIFIELD_ALIASES.get(semifield, semifield)
        self.stride, self.padding, self.dilation = stride, padding, dilation
        self.groups, self.group_broadcasting, self.kind = groups, group_broadcasting, kind
        self._op = kernelhub.op("semiconv", backend=backend)

    def weight(self) -> torch.Tensor:
        return self.kernel() if self.kernel is not None else self.fixed_kernel

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        k = self.weight()
        return self._op(x, k.to(x.dtype), self.semifield, self.stride, self.padding, self.dilation, self.groups,
                        self.kind, self.group_broadcasting)

    def extra_repr(self) -> str:
        return (f"semifield={self.semifield!r}, stride={self.stride}, padding={self.padding}, "
                f"dilation={self.dilation}, groups={self.groups}, group_broadcasting={self.group_broadcasting}, "
                f"kind={self.kind!r}")


class _Morphology(nn.Module):
    """Two semiconvs with one kernel ``b``, ``first`` then ``second``: the dilation ``max_y x(p - y) + b(y)``
    (tropical_max, kind "conv") and its adjoint erosion ``min_y x(p + y) - b(y)`` (tropical_min, kind "corr"), so
    a closing is never below its input and an opening never above it, for any kernel."""

    _ORDER: tuple[str, str] = ("tropical_max", "tropical_min")
    _KIND = {"tropical_max": "conv", "tropical_min": "corr"}

    def __init__(self, kernel: nn.Module | torch.Tensor, stride=1, padding=0, dilation=1, groups: int = 1,
                 group_broadcasting: bool = False) -> None:
        super().__init__()
        first, second = self._ORDER
        self.first = SemiConv(kernel, first, stride, padding, dilation, groups, group_broadcasting, self._KIND[first])
        self.second = SemiConv(kernel, second, stride, padding, dilation, groups, group_broadcasting,
                               self._KIND[second])

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.second(self.first(x))


class Closing(_Morphology):
    """Morphological closing: a dilation (tropical_max, ``x + k``) then an erosion (tropical_min, ``x - k``) with
    the same kernel; the kernel module's parameters are shared, so they learn from both."""

    _ORDER = ("tropical_max", "tropical_min")


class Opening(_Morphology):
    """Morphological opening: an erosion then a dilation with the same kernel (`Closing`'s order reversed)."""

    _ORDER = ("tropical_min", "tropical_max")
