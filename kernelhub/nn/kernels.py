"""The kernels of semifield convolutions: pytorch_nd_semiconv's quadratic kernels (same parameterisations and
initialisations) and learned ones (kernelhub.nn re-exports them)."""

from __future__ import annotations

import math
from collections.abc import Sequence

import torch
from torch import nn

from kernelhub.nn._args import _count, _counts, _init_dict


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
