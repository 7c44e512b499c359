"""Trilinear interpolation from per-point corner values (docs/ops.md): forward and analytic backward.

``out[n, f] = sum_k w_k(points[n]) * feats[n, k, f]`` with ``u, v, w = (points + 1) / 2`` and
corner ``k = 4i + 2j + l`` weighted ``(i ? u : 1-u) (j ? v : 1-v) (l ? w : 1-w)``.
Inputs are read through their strides (no copies for views). The backward gives
``feats`` its gradient directly (``w_k * grad``) and reduces the ``points`` gradient over
F inside one program per block of points, so no atomics are needed.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from kernelhub.spec import layout_cache
from kernelhub_triton._launch import Bound, acc_type, cdiv, launch, next_power_of_2

__all__ = ["forward", "backward"]

# 16 points x 256 features per step: 4096 values, 16 per thread at 8 warps.
BLOCK_N = 16
BLOCK_F = 256
NUM_WARPS = 8


@triton.jit
def _uvw(p_ptr, n, mask, s_pn, s_pc, ACC: tl.constexpr):
    u = (tl.load(p_ptr + n * s_pn, mask=mask, other=0.0).to(ACC) + 1.0) * 0.5
    v = (tl.load(p_ptr + n * s_pn + s_pc, mask=mask, other=0.0).to(ACC) + 1.0) * 0.5
    w = (tl.load(p_ptr + n * s_pn + 2 * s_pc, mask=mask, other=0.0).to(ACC) + 1.0) * 0.5
    return u, v, w


@triton.jit
def _pick(bit: tl.constexpr, t):
    # the factor of corner bit ``bit`` along one axis: t or 1 - t
    if bit:
        return t
    else:
        return 1.0 - t


@triton.jit
def _trilinear_forward_kernel(
    f_ptr,                # feats [N, 8, F], any strides
    p_ptr,                # points [N, 3], any strides
    o_ptr,                # out [N, F] contiguous
    N, F,
    s_fn, s_fk, s_ff,     # feats strides
    s_pn, s_pc,           # points strides
    BN: tl.constexpr, BF: tl.constexpr, ACC: tl.constexpr,
):
    n = tl.program_id(0).to(tl.int64) * BN + tl.arange(0, BN)
    f = tl.program_id(1) * BF + tl.arange(0, BF)
    n_ok = n < N
    mask = n_ok[:, None] & (f < F)[None, :]
    u, v, w = _uvw(p_ptr, n, n_ok, s_pn, s_pc, ACC)
    acc = tl.zeros([BN, BF], ACC)
    base = f_ptr + n[:, None] * s_fn + f[None, :] * s_ff
    for k in tl.static_range(8):
        wk = _pick(k & 4, u) * _pick(k & 2, v) * _pick(k & 1, w)
        acc += wk[:, None] * tl.load(base + k * s_fk, mask=mask, other=0.0).to(ACC)
    tl.store(o_ptr + n[:, None] * F + f[None, :], acc.to(o_ptr.dtype.element_ty), mask=mask)


@triton.jit
def _trilinear_backward_kernel(
    g_ptr,                # upstream gradient [N, F], any strides
    f_ptr,                # feats [N, 8, F], any strides
    p_ptr,                # points [N, 3], any strides
    gf_ptr,               # feats gradient [N, 8, F] contiguous (if NEED_FEATS)
    gp_ptr,               # points gradient [N, 3] contiguous (if NEED_POINTS)
    N, F,
    s_gn, s_gf, s_fn, s_fk, s_ff, s_pn, s_pc,
    NEED_FEATS: tl.constexpr, NEED_POINTS: tl.constexpr,
    BN: tl.constexpr, BF: tl.constexpr, ACC: tl.constexpr,
):
    n = tl.program_id(0).to(tl.int64) * BN + tl.arange(0, BN)
    n_ok = n < N
    u, v, w = _uvw(p_ptr, n, n_ok, s_pn, s_pc, ACC)
    acc_u = tl.zeros([BN, BF], ACC)
    acc_v = tl.zeros([BN, BF], ACC)
    acc_w = tl.zeros([BN, BF], ACC)
    for f0 in range(0, F, BF):
        f = f0 + tl.arange(0, BF)
        mask = n_ok[:, None] & (f < F)[None, :]
        g = tl.load(g_ptr + n[:, None] * s_gn + f[None, :] * s_gf, mask=mask, other=0.0).to(ACC)
        for k in tl.static_range(8):
            fu, fv, fw = _pick(k & 4, u), _pick(k & 2, v), _pick(k & 1, w)
            if NEED_FEATS:
                tl.store(gf_ptr + n[:, None] * (8 * F) + k * F + f[None, :],
                         ((fu * fv * fw)[:, None] * g).to(gf_ptr.dtype.element_ty), mask=mask)
            if NEED_POINTS:
                gx = g * tl.load(f_ptr + n[:, None] * s_fn + k * s_fk + f[None, :] * s_ff,
                                 mask=mask, other=0.0).to(ACC)
                su = ((k >> 2) & 1) * 2.0 - 1.0  # d(factor)/du: +1 for u, -1 for 1 - u
                sv = ((k >> 1) & 1) * 2.0 - 1.0
                sw = (k & 1) * 2.0 - 1.0
                acc_u += (su * fv * fw)[:, None] * gx
                acc_v += (fu * sv * fw)[:, None] * gx
                acc_w += (fu * fv * sw)[:, None] * gx
    if NEED_POINTS:
        # d(u)/d(point) = 1/2
        out = gp_ptr + n * 3
        tl.store(out, (0.5 * tl.sum(acc_u, axis=1)).to(gp_ptr.dtype.element_ty), mask=n_ok)
        tl.store(out + 1, (0.5 * tl.sum(acc_v, axis=1)).to(gp_ptr.dtype.element_ty), mask=n_ok)
        tl.store(out + 2, (0.5 * tl.sum(acc_w, axis=1)).to(gp_ptr.dtype.element_ty), mask=n_ok)


def _block_f(F: int) -> int:
    return max(16, min(BLOCK_F, next_power_of_2(F)))


def _contiguous_strides(F: int) -> dict:
    """The strides of contiguous feats [N, 8, F] and points [N, 3], by the kernels' argument names."""
    return dict(s_fn=8 * F, s_fk=F, s_ff=1, s_pn=3, s_pc=1)


@layout_cache(maxsize=256)
def _forward_kernel(F: int, dtype: torch.dtype, contiguous: bool) -> Bound:
    """The forward bound to its constants and, for contiguous feats and points, to their strides (then a call
    passes none: seven fewer arguments to key and hand over per launch)."""
    strides = _contiguous_strides(F) if contiguous else {}
    return Bound(_trilinear_forward_kernel, **strides, BN=BLOCK_N, BF=_block_f(F), ACC=acc_type(dtype),
                 num_warps=NUM_WARPS)


@layout_cache(maxsize=256)
def _backward_kernel(F: int, dtype: torch.dtype, need_f: bool, need_p: bool, contiguous: bool) -> Bound:
    """The backward bound as the forward, the upstream gradient's strides too."""
    strides = dict(s_gn=F, s_gf=1, **_contiguous_strides(F)) if contiguous else {}
    return Bound(_trilinear_backward_kernel, **strides, NEED_FEATS=need_f, NEED_POINTS=need_p, BN=BLOCK_N,
                 BF=_block_f(F), ACC=acc_type(dtype), num_warps=NUM_WARPS)


def forward(feats: torch.Tensor, points: torch.Tensor) -> torch.Tensor:
    N, _, F = feats.shape
    out = torch.empty((N, F), dtype=feats.dtype, device=feats.device)
    if out.numel() == 0:
        return out
    contiguous = feats.is_contiguous() and points.is_contiguous()  # size-1 dims' strides never reach an address
    kernel = _forward_kernel(F, feats.dtype, contiguous)
    strides = () if contiguous else (*feats.stride(), *points.stride())
    launch(kernel, (cdiv(N, BLOCK_N), cdiv(F, kernel.kwargs["BF"])), feats, points, out, N, F, *strides)
    return out


def backward(grad: torch.Tensor, feats: torch.Tensor, points: torch.Tensor, needs) -> list:
    N, _, F = feats.shape
    need_f, need_p = bool(needs[0]), bool(needs[1])
    # new contiguous gradients of the inputs' shapes ([N, 8, F], [N, 3]): empty_like with a memory format is the
    # cheapest allocation to call (docs/lab/benchmarks-history.md#measurements-behind-the-code)
    gf = torch.empty_like(feats, memory_format=torch.contiguous_format) if need_f else None
    gp = torch.empty_like(points, memory_format=torch.contiguous_format) if need_p else None
    if N == 0 or F == 0 or not (need_f or need_p):
        return [None if gf is None else gf.zero_(), None if gp is None else gp.zero_()]
    contiguous = grad.is_contiguous() and feats.is_contiguous() and points.is_contiguous()
    strides = () if contiguous else (*grad.stride(), *feats.stride(), *points.stride())
    launch(_backward_kernel(F, feats.dtype, need_f, need_p, contiguous), (cdiv(N, BLOCK_N),),
           grad, feats, points, gf if need_f else feats, gp if need_p else points, N, F, *strides)
    return [gf, gp]
