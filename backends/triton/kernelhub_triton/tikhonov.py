"""Tikhonov-regularised 2-row inverse (docs/ops.md): closed form forward and analytic backward.

Per pixel, with rows ``M0, M1`` of ``M [..., 2, Z]``: ``a = sum|M0|^2``, ``c = sum|M1|^2``,
``b = sum M0 conj(M1)``, ``A = a + lam``, ``C = c + lam``, ``det = A C - |b|^2`` and

    W0 = (C M0 - b M1) / det,        W1 = (A M1 - conj(b) M0) / det.

Backward, for an upstream gradient ``G`` in torch's convention (``dL/dRe + i dL/dIm``),
with ``pXY = sum conj(GX) MY``, ``s = Re sum conj(G) W``:

    alpha_a = (Re p11 - s C) / det,  alpha_c = (Re p00 - s A) / det,
    beta    = (2 s conj(b) - p01 - conj(p10)) / det,
    dM0 = (C G0 - b G1) / det + 2 alpha_a M0 + conj(beta) M1,
    dM1 = (A G1 - conj(b) G0) / det + 2 alpha_c M1 + beta M0.

Where the largest of ``a``, ``c`` and ``lam`` has a binary exponent of 500 or more (or -500 or less), the products
above would overflow (or underflow) a double although W is representable: there the algebra runs on ``M / 2^k``
and ``lam / 4^k`` (``4^k`` near that largest value) and the results are scaled back exactly (``W = W' / 2^k``,
``dM = dM' / 4^k``, powers of two); elsewhere ``k = 0`` and the arithmetic is unchanged (cuda_ext's
tikhonov_pixel.h does the same).

Complex tensors are read through their real view (real and imaginary parts interleaved).
The 2 x 2 algebra runs in float64 for every dtype: when the rows are nearly parallel,
``det`` is ``~lam (a + c)`` and cancels catastrophically in float32 (a relative error
of ~1e-4 on the spec's rank-1 edge sample); the op moves bytes, not flops, so float64
costs no measurable time.
"""

from __future__ import annotations

import math

import torch
import triton
import triton.language as tl

from kernelhub.spec import layout_cache
from kernelhub_triton._launch import Bound, cdiv, launch, next_power_of_2

__all__ = ["forward", "backward"]

# 4 pixels per program on one warp; Z in chunks of up to 32 (Z = 21 in phase microscopy: one
# chunk, read once and kept in registers). Small programs keep many independent pixels in flight: the fastest of
# the sizes measured (docs/lab/benchmarks-history.md#measurements-behind-the-code).
BLOCK_P = 4
MAX_BLOCK_Z = 32
NUM_WARPS = 1


@triton.jit
def _load_c(ptr, off, mask, COMPLEX: tl.constexpr):
    """(real, imaginary) parts in float64; the imaginary part is 0 for a real tensor."""
    re = tl.load(ptr + off, mask=mask, other=0.0).to(tl.float64)
    if COMPLEX:
        im = tl.load(ptr + off + 1, mask=mask, other=0.0).to(tl.float64)
    else:
        im = tl.zeros_like(re)
    return re, im


@triton.jit
def _store_c(ptr, off, re, im, mask, COMPLEX: tl.constexpr):
    tl.store(ptr + off, re.to(ptr.dtype.element_ty), mask=mask)
    if COMPLEX:
        tl.store(ptr + off + 1, im.to(ptr.dtype.element_ty), mask=mask)


@triton.jit
def _scale(a, c, lam64):
    """Per pixel, 2^-k for the scale of the module docstring (1.0 where k = 0): the exponent e of max(a, c, lam)
    read from its bits, k = e >> 1 where e >= 500 or e <= -500 and the value is finite."""
    m = tl.maximum(tl.maximum(a, c), lam64)
    bits = m.to(tl.int64, bitcast=True)
    e = ((bits >> 52) & 0x7FF) - 1023
    k = tl.where(((e >= 500) | (e <= -500)) & (e != 1024) & (m > 0), e >> 1, 0)
    return ((1023 - k) << 52).to(tl.float64, bitcast=True)


@triton.jit
def _load_rows(ptr, p, z, mask, s_p, s_r, s_z, COMPLEX: tl.constexpr):
    """Rows 0 and 1 at pixels ``p``, positions ``z``: (re0, im0, re1, im1) in float64."""
    off = p[:, None] * s_p + z[None, :] * s_z
    r0, i0 = _load_c(ptr, off, mask, COMPLEX)
    r1, i1 = _load_c(ptr, off + s_r, mask, COMPLEX)
    return r0, i0, r1, i1


@triton.jit
def _gram_part(m0r, m0i, m1r, m1i):
    """Over one Z chunk: sum|M0|^2, sum|M1|^2, Re and Im of sum M0 conj(M1)."""
    return (tl.sum(m0r * m0r + m0i * m0i, axis=1), tl.sum(m1r * m1r + m1i * m1i, axis=1),
            tl.sum(m0r * m1r + m0i * m1i, axis=1), tl.sum(m0i * m1r - m0r * m1i, axis=1))


@triton.jit
def _gram(m_ptr, p, p_ok, Z, s_p, s_r, s_z, BP: tl.constexpr, BZ: tl.constexpr, COMPLEX: tl.constexpr):
    """a = sum|M0|^2, c = sum|M1|^2, b = sum M0 conj(M1) for the pixels ``p``."""
    a = tl.zeros([BP], tl.float64)
    c = tl.zeros([BP], tl.float64)
    br = tl.zeros([BP], tl.float64)
    bi = tl.zeros([BP], tl.float64)
    for z0 in range(0, Z, BZ):
        z = z0 + tl.arange(0, BZ)
        mask = p_ok[:, None] & (z < Z)[None, :]
        m0r, m0i, m1r, m1i = _load_rows(m_ptr, p, z, mask, s_p, s_r, s_z, COMPLEX)
        da, dc, dbr, dbi = _gram_part(m0r, m0i, m1r, m1i)
        a += da
        c += dc
        br += dbr
        bi += dbi
    return a, c, br, bi


@triton.jit
def _residual(m0r, m0i, m1r, m1i, kr, ki):
    """r = M1 - kappa M0: the part of row 1 orthogonal to row 0."""
    return m1r - (kr * m0r - ki * m0i), m1i - (kr * m0i + ki * m0r)


@triton.jit
def _residual_norm2(m0r, m0i, m1r, m1i, kr, ki):
    r_r, r_i = _residual(m0r, m0i, m1r, m1i, kr[:, None], ki[:, None])
    return tl.sum(r_r * r_r + r_i * r_i, axis=1)


@triton.jit
def _any_scaled(f):
    """Whether any pixel of the block is at an extreme magnitude (``f`` != 1): the per-entry passes then scale their
    values; else they are compiled without the scaling, which is FP64 work on every entry (the common case)."""
    return (tl.max(f, axis=0) != 1.0) | (tl.min(f, axis=0) != 1.0)


@triton.jit
def _store_w(w_ptr, p, z, mask, Z, m0r, m0i, m1r, m1i, a, br, bi, kr, ki, rr, inv, lam, f, COMPLEX: tl.constexpr,
             SCALED: tl.constexpr):
    """W0 = ((lam + |r|^2) M0 - b r) / det (= (C M0 - b M1) / det) and W1 = (lam M1 + a r) / det
    (= (A M1 - conj(b) M0) / det) at one Z chunk; a, b, |r|^2, lam and det scaled (SCALED: ``f`` = 2^-k, the results
    times f twice)."""
    r_r, r_i = _residual(m0r, m0i, m1r, m1i, kr[:, None], ki[:, None])
    f0 = (lam + rr)[:, None]
    b_r, b_i, i_, a_, l_ = br[:, None], bi[:, None], inv[:, None], a[:, None], lam[:, None]
    w0r = (f0 * m0r - (b_r * r_r - b_i * r_i)) * i_
    w0i = (f0 * m0i - (b_r * r_i + b_i * r_r)) * i_
    w1r = (l_ * m1r + a_ * r_r) * i_
    w1i = (l_ * m1i + a_ * r_i) * i_
    if SCALED:
        f_ = f[:, None]
        w0r, w0i, w1r, w1i = w0r * f_ * f_, w0i * f_ * f_, w1r * f_ * f_, w1i * f_ * f_
    cw: tl.constexpr = 2 if COMPLEX else 1
    out = (p[:, None] * 2 * Z + z[None, :]) * cw
    _store_c(w_ptr, out, w0r, w0i, mask, COMPLEX)
    _store_c(w_ptr, out + Z * cw, w1r, w1i, mask, COMPLEX)


@triton.jit
def _write_w(w_ptr, m_ptr, p, p_ok, Z, s_p, s_r, s_z, a, br, bi, kr, ki, rr, inv, lam, f, COMPLEX: tl.constexpr,
             BZ: tl.constexpr, SCALED: tl.constexpr):
    """W at every Z chunk, M read again per chunk (Z > BZ)."""
    for z0 in range(0, Z, BZ):
        z = z0 + tl.arange(0, BZ)
        mask = p_ok[:, None] & (z < Z)[None, :]
        m0r, m0i, m1r, m1i = _load_rows(m_ptr, p, z, mask, s_p, s_r, s_z, COMPLEX)
        _store_w(w_ptr, p, z, mask, Z, m0r, m0i, m1r, m1i, a, br, bi, kr, ki, rr, inv, lam, f, COMPLEX, SCALED)


@triton.jit
def _tikhonov_forward_kernel(
    m_ptr,                  # M's real storage; part (p, row, z) at p*s_p + row*s_r + z*s_z (+1: imaginary)
    w_ptr,                  # W [P, 2, Z] contiguous, real storage
    P, Z, s_p, s_r, s_z,
    lam: tl.float64,        # > 0
    COMPLEX: tl.constexpr, BP: tl.constexpr, BZ: tl.constexpr,
    ONE_CHUNK: tl.constexpr,  # Z <= BZ: M is read once and kept in registers for all three steps
):
    p = tl.program_id(0).to(tl.int64) * BP + tl.arange(0, BP)
    p_ok = p < P
    lam64 = tl.full([], lam, tl.float64)
    if ONE_CHUNK:
        z = tl.arange(0, BZ)
        mask = p_ok[:, None] & (z < Z)[None, :]
        m0r, m0i, m1r, m1i = _load_rows(m_ptr, p, z, mask, s_p, s_r, s_z, COMPLEX)
        a, c, br, bi = _gram_part(m0r, m0i, m1r, m1i)
    else:
        a, c, br, bi = _gram(m_ptr, p, p_ok, Z, s_p, s_r, s_z, BP, BZ, COMPLEX)
    f = _scale(a, c, lam64)  # 1.0 but at extreme magnitudes (the module docstring)
    a, c, br, bi, lam_s = a * f * f, c * f * f, br * f * f, bi * f * f, lam64 * f * f
    # kappa = conj(b) / a projects row 1 on row 0 (0 where row 0 is 0)
    inv_a = tl.where(a > 0, 1.0 / a, 0.0)
    kr = br * inv_a
    ki = -bi * inv_a
    if ONE_CHUNK:
        rr = _residual_norm2(m0r, m0i, m1r, m1i, kr, ki)
    else:
        rr = tl.zeros([BP], tl.float64)
        for z0 in range(0, Z, BZ):
            z = z0 + tl.arange(0, BZ)
            mask = p_ok[:, None] & (z < Z)[None, :]
            m0r, m0i, m1r, m1i = _load_rows(m_ptr, p, z, mask, s_p, s_r, s_z, COMPLEX)
            rr += _residual_norm2(m0r, m0i, m1r, m1i, kr, ki)
    rr = rr * f * f
    # det = lam (a + c + lam) + (a c - |b|^2), with a c - |b|^2 = a |r|^2 free of cancellation
    inv = 1.0 / (lam_s * (a + c + lam_s) + a * rr)
    if ONE_CHUNK:
        if _any_scaled(f):
            _store_w(w_ptr, p, z, mask, Z, m0r, m0i, m1r, m1i, a, br, bi, kr, ki, rr, inv, lam_s, f, COMPLEX, True)
        else:
            _store_w(w_ptr, p, z, mask, Z, m0r, m0i, m1r, m1i, a, br, bi, kr, ki, rr, inv, lam_s, f, COMPLEX, False)
    else:
        if _any_scaled(f):
            _write_w(w_ptr, m_ptr, p, p_ok, Z, s_p, s_r, s_z, a, br, bi, kr, ki, rr, inv, lam_s, f, COMPLEX, BZ, True)
        else:
            _write_w(w_ptr, m_ptr, p, p_ok, Z, s_p, s_r, s_z, a, br, bi, kr, ki, rr, inv, lam_s, f, COMPLEX, BZ, False)


@triton.jit
def _tikhonov_backward_kernel(
    g_ptr,                  # upstream gradient's real storage, strides g_p, g_r, g_z
    m_ptr,                  # M's real storage, strides s_p, s_r, s_z
    d_ptr,                  # dM [P, 2, Z] contiguous, real storage
    P, Z, s_p, s_r, s_z, g_p, g_r, g_z,
    lam: tl.float64,
    COMPLEX: tl.constexpr, BP: tl.constexpr, BZ: tl.constexpr,
):
    p = tl.program_id(0).to(tl.int64) * BP + tl.arange(0, BP)
    p_ok = p < P
    a, c, br, bi = _gram(m_ptr, p, p_ok, Z, s_p, s_r, s_z, BP, BZ, COMPLEX)
    # pXY = sum conj(GX) MY
    p00r = tl.zeros([BP], tl.float64)
    p00i = tl.zeros([BP], tl.float64)
    p01r = tl.zeros([BP], tl.float64)
    p01i = tl.zeros([BP], tl.float64)
    p10r = tl.zeros([BP], tl.float64)
    p10i = tl.zeros([BP], tl.float64)
    p11r = tl.zeros([BP], tl.float64)
    for z0 in range(0, Z, BZ):
        z = z0 + tl.arange(0, BZ)
        mask = p_ok[:, None] & (z < Z)[None, :]
        m0r, m0i, m1r, m1i = _load_rows(m_ptr, p, z, mask, s_p, s_r, s_z, COMPLEX)
        g0r, g0i, g1r, g1i = _load_rows(g_ptr, p, z, mask, g_p, g_r, g_z, COMPLEX)
        p00r += tl.sum(g0r * m0r + g0i * m0i, axis=1)
        p00i += tl.sum(g0r * m0i - g0i * m0r, axis=1)
        p01r += tl.sum(g0r * m1r + g0i * m1i, axis=1)
        p01i += tl.sum(g0r * m1i - g0i * m1r, axis=1)
        p10r += tl.sum(g1r * m0r + g1i * m0i, axis=1)
        p10i += tl.sum(g1r * m0i - g1i * m0r, axis=1)
        p11r += tl.sum(g1r * m1r + g1i * m1i, axis=1)
    lam64 = tl.full([], lam, tl.float64)
    f = _scale(a, c, lam64)  # 1.0 but at extreme magnitudes (the module docstring): a, b, lam by f^2, pXY by f
    a, c, br, bi, ff = a * f * f, c * f * f, br * f * f, bi * f * f, f * f
    p00r, p00i, p01r, p01i, p10r, p10i, p11r = p00r * f, p00i * f, p01r * f, p01i * f, p10r * f, p10i * f, p11r * f
    A = a + lam64 * ff
    C = c + lam64 * ff
    inv = 1.0 / (A * C - (br * br + bi * bi))
    # s = Re sum conj(G) W = (C Re p00 - Re(b p01) + A Re p11 - Re(conj(b) p10)) / det
    s = (C * p00r - (br * p01r - bi * p01i) + A * p11r - (br * p10r + bi * p10i)) * inv
    two_alpha_a = 2.0 * (p11r - s * C) * inv
    two_alpha_c = 2.0 * (p00r - s * A) * inv
    beta_r = (2.0 * s * br - p01r - p10r) * inv
    beta_i = (-2.0 * s * bi - p01i + p10i) * inv
    if _any_scaled(f):
        _write_grad(d_ptr, g_ptr, m_ptr, p, p_ok, Z, s_p, s_r, s_z, g_p, g_r, g_z, A, C, inv, br, bi, two_alpha_a,
                    two_alpha_c, beta_r, beta_i, f, COMPLEX, BZ, True)
    else:
        _write_grad(d_ptr, g_ptr, m_ptr, p, p_ok, Z, s_p, s_r, s_z, g_p, g_r, g_z, A, C, inv, br, bi, two_alpha_a,
                    two_alpha_c, beta_r, beta_i, f, COMPLEX, BZ, False)


@triton.jit
def _write_grad(d_ptr, g_ptr, m_ptr, p, p_ok, Z, s_p, s_r, s_z, g_p, g_r, g_z, A, C, inv, br, bi, two_alpha_a,
                two_alpha_c, beta_r, beta_i, f, COMPLEX: tl.constexpr, BZ: tl.constexpr, SCALED: tl.constexpr):
    """dM at every Z chunk; SCALED: M scaled by ``f`` and the gradient times f twice."""
    cw: tl.constexpr = 2 if COMPLEX else 1
    for z0 in range(0, Z, BZ):
        z = z0 + tl.arange(0, BZ)
        mask = p_ok[:, None] & (z < Z)[None, :]
        m0r, m0i, m1r, m1i = _load_rows(m_ptr, p, z, mask, s_p, s_r, s_z, COMPLEX)
        g0r, g0i, g1r, g1i = _load_rows(g_ptr, p, z, mask, g_p, g_r, g_z, COMPLEX)
        if SCALED:
            f_ = f[:, None]
            m0r, m0i, m1r, m1i = m0r * f_, m0i * f_, m1r * f_, m1i * f_
        C_, A_, i_ = C[:, None], A[:, None], inv[:, None]
        b_r, b_i, aa, ac = br[:, None], bi[:, None], two_alpha_a[:, None], two_alpha_c[:, None]
        e_r, e_i = beta_r[:, None], beta_i[:, None]
        out = (p[:, None] * 2 * Z + z[None, :]) * cw
        # dM0 = (C G0 - b G1) / det + 2 alpha_a M0 + conj(beta) M1
        d0r = (C_ * g0r - (b_r * g1r - b_i * g1i)) * i_ + aa * m0r + (e_r * m1r + e_i * m1i)
        d0i = (C_ * g0i - (b_r * g1i + b_i * g1r)) * i_ + aa * m0i + (e_r * m1i - e_i * m1r)
        # dM1 = (A G1 - conj(b) G0) / det + 2 alpha_c M1 + beta M0
        d1r = (A_ * g1r - (b_r * g0r + b_i * g0i)) * i_ + ac * m1r + (e_r * m0r - e_i * m0i)
        d1i = (A_ * g1i - (b_r * g0i - b_i * g0r)) * i_ + ac * m1i + (e_r * m0i + e_i * m0r)
        if SCALED:
            f_ = f[:, None]
            d0r, d0i, d1r, d1i = d0r * f_ * f_, d0i * f_ * f_, d1r * f_ * f_, d1i * f_ * f_
        _store_c(d_ptr, out, d0r, d0i, mask, COMPLEX)
        _store_c(d_ptr, out + Z * cw, d1r, d1i, mask, COMPLEX)


# -- launchers ---------------------------------------------------------------------------

def _strides(t: torch.Tensor) -> tuple[int, int, int]:
    """``t [P, 2, Z]``'s (pixel, row, z) strides in real elements (`launch` hands a complex tensor to the kernels as
    its real view)."""
    s = t.stride()
    return (2 * s[0], 2 * s[1], 2 * s[2]) if t.is_complex() else s


def _pixels(M: torch.Tensor) -> torch.Tensor:
    """``M [..., 2, Z]`` as ``[P, 2, Z]``: ``M`` itself where it has three dims, else a view whenever the leading
    dims can be flattened (the permuted [Y, X, 2, Z] stack can). Each view costs the launch host time."""
    if M.dim() == 3:
        return M
    return M.reshape(math.prod(M.shape[:-2]), *M.shape[-2:])


def _block_z(Z: int) -> int:
    return min(MAX_BLOCK_Z, next_power_of_2(max(Z, 1)))


@layout_cache(maxsize=256)
def _kernels(Z: int, complex_: bool) -> tuple[Bound, Bound]:
    """The forward's and the backward's kernels bound to the constants for ``Z`` columns, complex or real."""
    bz = _block_z(Z)
    return (Bound(_tikhonov_forward_kernel, COMPLEX=complex_, BP=BLOCK_P, BZ=bz, ONE_CHUNK=Z <= bz,
                  num_warps=NUM_WARPS),
            Bound(_tikhonov_backward_kernel, COMPLEX=complex_, BP=BLOCK_P, BZ=bz, num_warps=NUM_WARPS))




def forward(M: torch.Tensor, lam: float) -> torch.Tensor:
    m = _pixels(M)
    P, _, Z = m.shape
    out = torch.empty_like(M, memory_format=torch.contiguous_format)  # the kernel writes it as [P, 2, Z]
    if P == 0 or Z == 0:
        return out
    launch(_kernels(Z, M.is_complex())[0], (cdiv(P, BLOCK_P),), m, out, P, Z, *_strides(m), lam)
    return out


def backward(grad: torch.Tensor, M: torch.Tensor, lam: float, needs) -> list:
    if not needs[0]:
        return [None]
    m = _pixels(M)
    g = _pixels(grad)
    P, _, Z = m.shape
    out = torch.empty_like(M, memory_format=torch.contiguous_format)
    if P == 0 or Z == 0:
        return [out]
    launch(_kernels(Z, M.is_complex())[1], (cdiv(P, BLOCK_P),), g, m, out, P, Z, *_strides(m), *_strides(g), lam)
    return [out]
