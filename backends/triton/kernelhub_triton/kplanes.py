"""Tilted K-Planes interpolation (docs/ops.md): rotate, bilinear sampling of three planes and their
product in one kernel, forward and analytic backward.

For a point ``p`` and each t, ``q = R_t p``; plane p of t samples the pair XY = (q0, q1), ZX = (q2, q0),
YZ = (q1, q2) exactly as ``F.grid_sample(..., mode="bilinear", padding_mode="border",
align_corners=True)``: ``x = (u + 1) / 2 * (W - 1)`` clipped to ``[0, W - 1]`` (likewise y with H), the
four neighbours weighted bilinearly, a neighbour beyond the last row or column contributing nothing.
``out[b, t*C + c]`` is the product of the three samples. The taps variant evaluates the point and its
three shifts ``p + h e_i`` (``q + h R_t[:, i]``) in the same program.

The kernels read the planes channels-last (``[3T, H, W, C]``, one contiguous copy per call), so a
neighbour's C channels are one contiguous load. One program serves a block of points for every t and
tap. The backward recomputes the samples and gives:

- ``planes``: ``grad * (product of the other two samples) * weight`` added with atomics into a
  channels-last float buffer (atomics: the sum order varies run to run, so the impl is not
  deterministic; under ``torch.use_deterministic_algorithms(True)`` the selector does not pick it);
- the coordinates: the bilinear derivative times ``(W - 1) / 2`` (``(H - 1) / 2``), zero where the
  coordinate was clipped or lies on the border (torch's rule), reduced over C in the program;
- ``pts``: ``sum_t R_t^T dq_t`` over every tap (the taps are shifts of the same point), written once per
  point; ``rotations``: ``sum_b dq_t(b) (p_b + h e_tap)^T`` as one partial [T, 3, 3] per program, summed in
  a fixed order afterwards (deterministic).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from kernelhub import accumulation_dtype
from kernelhub.spec import layout_cache
from kernelhub_triton._launch import Bound, acc_type, cdiv, launch, next_power_of_2

__all__ = ["forward", "backward", "ms_forward", "ms_backward", "taps_forward", "taps_backward",
           "not_supported_reasons"]

BLOCK_B = 32
NUM_WARPS = 4


@triton.jit
def _axis(u, n, valid, ACC: tl.constexpr):
    """Unnormalise (align_corners) and clip (border) one coordinate: the lower index, the upper index, its
    weight, whether the upper neighbour exists, and d(index)/d(u) (0 where clipped or on the border)."""
    x = (u + 1.0) * 0.5 * (n - 1)
    inside = (x > 0.0) & (x < n - 1)
    x = tl.where(x > 0.0, x, 0.0)  # NaN goes to 0 (an index in range, as in cuda_ext)
    x = tl.where(x < n - 1, x, n - 1.0)
    x0f = tl.floor(x)
    w = x - x0f
    x0 = x0f.to(tl.int32)
    x1 = x0 + 1
    has1 = valid & (x1 < n)
    dx = tl.where(inside, 0.5 * (n - 1), 0.0).to(ACC)
    return x0, tl.minimum(x1, n - 1), w, has1, dx


@triton.jit
def _corners(pl_ptr, plane, u, v, H, W, C, c, valid, cmask, ACC: tl.constexpr):
    """The four neighbours' addresses ([BB, BC]) in one channels-last plane, their masks and weights."""
    x0, x1, wx, hasx1, dx = _axis(u, W, valid, ACC)
    y0, y1, wy, hasy1, dy = _axis(v, H, valid, ACC)
    base = pl_ptr + plane * (H * W * C)  # < 2^31: larger planes are rejected (not_supported_reasons)
    m = valid[:, None] & cmask[None, :]
    r0 = base + (y0.to(tl.int64) * W)[:, None] * C + c[None, :]
    r1 = base + (y1.to(tl.int64) * W)[:, None] * C + c[None, :]
    return (r0 + (x0 * C)[:, None], r0 + (x1 * C)[:, None], r1 + (x0 * C)[:, None], r1 + (x1 * C)[:, None],
            m, m & hasx1[:, None], m & hasy1[:, None], m & (hasx1 & hasy1)[:, None], wx[:, None], wy[:, None],
            dx[:, None], dy[:, None])


@triton.jit
def _sample(pl_ptr, plane, u, v, H, W, C, c, valid, cmask, ACC: tl.constexpr):
    """The bilinear sample at (u, v) of one plane's C channels, and its derivatives by u and by v."""
    a00, a01, a10, a11, m00, m01, m10, m11, wx, wy, dx, dy = _corners(pl_ptr, plane, u, v, H, W, C, c, valid,
                                                                      cmask, ACC)
    v00 = tl.load(a00, mask=m00, other=0.0).to(ACC)
    v01 = tl.load(a01, mask=m01, other=0.0).to(ACC)
    v10 = tl.load(a10, mask=m10, other=0.0).to(ACC)
    v11 = tl.load(a11, mask=m11, other=0.0).to(ACC)
    s = (1.0 - wy) * ((1.0 - wx) * v00 + wx * v01) + wy * ((1.0 - wx) * v10 + wx * v11)
    return s, ((1.0 - wy) * (v01 - v00) + wy * (v11 - v10)) * dx, ((1.0 - wx) * (v10 - v00) + wx * (v11 - v01)) * dy


@triton.jit
def _point(pts_ptr, b, valid, s_pb, s_pc, tap: tl.constexpr, h, ACC: tl.constexpr):
    """The tap's point: p, or p + h e_i for tap i (h in ACC, from the kernel's float64 argument: a plain float
    argument would be rounded to float32)."""
    p0 = tl.load(pts_ptr + b * s_pb, mask=valid, other=0.0).to(ACC)
    p1 = tl.load(pts_ptr + b * s_pb + s_pc, mask=valid, other=0.0).to(ACC)
    p2 = tl.load(pts_ptr + b * s_pb + 2 * s_pc, mask=valid, other=0.0).to(ACC)
    if tap == 1:
        p0 += h
    elif tap == 2:
        p1 += h
    elif tap == 3:
        p2 += h
    return p0, p1, p2


@triton.jit
def _rot(rot_ptr, t, s_rt, s_ri, s_rj, i: tl.constexpr, ACC: tl.constexpr):
    r = rot_ptr + t * s_rt + i * s_ri
    return tl.load(r).to(ACC), tl.load(r + s_rj).to(ACC), tl.load(r + 2 * s_rj).to(ACC)


@triton.jit
def _kplanes_forward_kernel(
    pts_ptr, rot_ptr, pl_ptr,      # pts [B, 3], rotations [T, 3, 3] (any strides), planes [3T, H, W, C]
    out_ptr,                       # out: element (tap, b, t*C + c) at tap*s_ot + b*s_ob + col0 + t*C + c
    B, T, C, H, W,
    h64: tl.float64,               # the taps' step h (TAPS == 4)
    s_pb, s_pc, s_rt, s_ri, s_rj, s_ot, s_ob, col0,
    TAPS: tl.constexpr, BB: tl.constexpr, BC: tl.constexpr, ACC: tl.constexpr,
):
    h = tl.full([], h64, ACC)
    b = tl.program_id(0).to(tl.int64) * BB + tl.arange(0, BB)
    valid = b < B
    c = tl.arange(0, BC)
    cmask = c < C
    for t in range(T):
        r00, r01, r02 = _rot(rot_ptr, t, s_rt, s_ri, s_rj, 0, ACC)
        r10, r11, r12 = _rot(rot_ptr, t, s_rt, s_ri, s_rj, 1, ACC)
        r20, r21, r22 = _rot(rot_ptr, t, s_rt, s_ri, s_rj, 2, ACC)
        for tap in tl.static_range(TAPS):
            p0, p1, p2 = _point(pts_ptr, b, valid, s_pb, s_pc, tap, h, ACC)
            q0 = r00 * p0 + r01 * p1 + r02 * p2
            q1 = r10 * p0 + r11 * p1 + r12 * p2
            q2 = r20 * p0 + r21 * p1 + r22 * p2
            s0, _e, _f = _sample(pl_ptr, t * 3 + 0, q0, q1, H, W, C, c, valid, cmask, ACC)
            s1, _e, _f = _sample(pl_ptr, t * 3 + 1, q2, q0, H, W, C, c, valid, cmask, ACC)
            s2, _e, _f = _sample(pl_ptr, t * 3 + 2, q1, q2, H, W, C, c, valid, cmask, ACC)
            acc = s0 * s1 * s2
            dst = out_ptr + tap * s_ot + b[:, None] * s_ob + col0 + t * C + c[None, :]
            tl.store(dst, acc.to(out_ptr.dtype.element_ty), mask=valid[:, None] & cmask[None, :])


@triton.jit
def _scatter(gpl_ptr, plane, u, v, H, W, C, c, valid, cmask, gs, ACC: tl.constexpr):
    """Add ``gs`` times each neighbour's weight into the planes gradient (atomics)."""
    a00, a01, a10, a11, m00, m01, m10, m11, wx, wy, _dx, _dy = _corners(gpl_ptr, plane, u, v, H, W, C, c, valid,
                                                                        cmask, ACC)
    tl.atomic_add(a00, gs * ((1.0 - wx) * (1.0 - wy)), mask=m00, sem="relaxed")
    tl.atomic_add(a01, gs * (wx * (1.0 - wy)), mask=m01, sem="relaxed")
    tl.atomic_add(a10, gs * ((1.0 - wx) * wy), mask=m10, sem="relaxed")
    tl.atomic_add(a11, gs * (wx * wy), mask=m11, sem="relaxed")


@triton.jit
def _kplanes_backward_kernel(
    g_ptr,                         # upstream gradient: (tap, b, t*C + c) at tap*s_gt + b*s_gb + col0 + (t*C + c)*s_gc
    pts_ptr, rot_ptr, pl_ptr,
    gpl_ptr,                       # planes gradient [3T, H, W, C] (ACC dtype, zeroed), if NEED_PLANES
    gpts_ptr,                      # pts gradient [B, 3] (ACC dtype), if NEED_PTS
    grot_ptr,                      # rotations gradient partials [programs, T, 9] (ACC dtype), if NEED_ROT
    B, T, C, H, W,
    h64: tl.float64,               # the taps' step h (TAPS == 4)
    s_pb, s_pc, s_rt, s_ri, s_rj, s_gt, s_gb, s_gc, col0,
    TAPS: tl.constexpr, NEED_PLANES: tl.constexpr, NEED_PTS: tl.constexpr, NEED_ROT: tl.constexpr,
    BB: tl.constexpr, BC: tl.constexpr, ACC: tl.constexpr,
):
    h = tl.full([], h64, ACC)
    pid = tl.program_id(0)
    b = pid.to(tl.int64) * BB + tl.arange(0, BB)
    valid = b < B
    c = tl.arange(0, BC)
    cmask = c < C
    m = valid[:, None] & cmask[None, :]
    gp0 = tl.zeros([BB], ACC)
    gp1 = tl.zeros([BB], ACC)
    gp2 = tl.zeros([BB], ACC)
    for t in range(T):
        r00, r01, r02 = _rot(rot_ptr, t, s_rt, s_ri, s_rj, 0, ACC)
        r10, r11, r12 = _rot(rot_ptr, t, s_rt, s_ri, s_rj, 1, ACC)
        r20, r21, r22 = _rot(rot_ptr, t, s_rt, s_ri, s_rj, 2, ACC)
        gr = tl.zeros([BB, 16], ACC)  # this t's rotation gradient, 9 of 16 columns used, per point
        k = tl.arange(0, 16)
        for tap in tl.static_range(TAPS):
            p0, p1, p2 = _point(pts_ptr, b, valid, s_pb, s_pc, tap, h, ACC)
            q0 = r00 * p0 + r01 * p1 + r02 * p2
            q1 = r10 * p0 + r11 * p1 + r12 * p2
            q2 = r20 * p0 + r21 * p1 + r22 * p2
            g = tl.load(g_ptr + tap * s_gt + b[:, None] * s_gb + col0 + (t * C + c[None, :]) * s_gc,
                        mask=m, other=0.0).to(ACC)
            # the three samples and their derivatives along x (W) and y (H), [BB, BC] each
            s0, ex0, ey0 = _sample(pl_ptr, t * 3 + 0, q0, q1, H, W, C, c, valid, cmask, ACC)
            s1, ex1, ey1 = _sample(pl_ptr, t * 3 + 1, q2, q0, H, W, C, c, valid, cmask, ACC)
            s2, ex2, ey2 = _sample(pl_ptr, t * 3 + 2, q1, q2, H, W, C, c, valid, cmask, ACC)
            gs0 = g * s1 * s2
            gs1 = g * s0 * s2
            gs2 = g * s0 * s1
            if NEED_PLANES:
                _scatter(gpl_ptr, t * 3 + 0, q0, q1, H, W, C, c, valid, cmask, gs0, ACC)
                _scatter(gpl_ptr, t * 3 + 1, q2, q0, H, W, C, c, valid, cmask, gs1, ACC)
                _scatter(gpl_ptr, t * 3 + 2, q1, q2, H, W, C, c, valid, cmask, gs2, ACC)
            # d/dq: plane 0 reads (q0, q1), plane 1 (q2, q0), plane 2 (q1, q2)
            dq0 = tl.sum(gs0 * ex0 + gs1 * ey1, axis=1)
            dq1 = tl.sum(gs0 * ey0 + gs2 * ex2, axis=1)
            dq2 = tl.sum(gs1 * ex1 + gs2 * ey2, axis=1)
            if NEED_PTS:
                gp0 += r00 * dq0 + r10 * dq1 + r20 * dq2
                gp1 += r01 * dq0 + r11 * dq1 + r21 * dq2
                gp2 += r02 * dq0 + r12 * dq1 + r22 * dq2
            if NEED_ROT:  # dR[i, j] = dq_i * p_j, column 3i + j
                i3 = k // 3
                j3 = k % 3
                dqi = tl.where(i3[None, :] == 0, dq0[:, None], tl.where(i3[None, :] == 1, dq1[:, None],
                                                                        dq2[:, None]))
                pj = tl.where(j3[None, :] == 0, p0[:, None], tl.where(j3[None, :] == 1, p1[:, None], p2[:, None]))
                gr += tl.where(valid[:, None] & (k[None, :] < 9), dqi * pj, 0.0)
        if NEED_ROT:
            tl.store(grot_ptr + (pid * T + t) * 9 + k, tl.sum(gr, axis=0), mask=k < 9)
    if NEED_PTS:
        tl.store(gpts_ptr + b * 3, gp0, mask=valid)
        tl.store(gpts_ptr + b * 3 + 1, gp1, mask=valid)
        tl.store(gpts_ptr + b * 3 + 2, gp2, mask=valid)


def not_supported_reasons(args) -> list[str]:
    planes = args[2] if isinstance(args[2], (list, tuple)) else [args[2]]
    if any(p.numel() >= 2**31 for p in planes):
        return ["a planes tensor of 2^31 elements or more (plane offsets are 32-bit here)"]
    return []


def _channels_last(planes: torch.Tensor) -> torch.Tensor:
    return planes.permute(0, 2, 3, 1).contiguous()


@layout_cache(maxsize=256)
def _forward_kernel(taps: int, C: int, dtype: torch.dtype) -> Bound:
    return Bound(_kplanes_forward_kernel, TAPS=taps, BB=BLOCK_B, BC=max(next_power_of_2(C), 2), ACC=acc_type(dtype),
                 num_warps=NUM_WARPS)


@layout_cache(maxsize=256)
def _backward_kernel(taps: int, C: int, dtype: torch.dtype, need_pl: bool, need_p: bool, need_r: bool) -> Bound:
    return Bound(_kplanes_backward_kernel, TAPS=taps, NEED_PLANES=need_pl, NEED_PTS=need_p, NEED_ROT=need_r,
                 BB=BLOCK_B, BC=max(next_power_of_2(C), 2), ACC=acc_type(dtype), num_warps=NUM_WARPS)


def _launch_forward(pts, rotations, planes, out, taps, h, col0):
    B, T = pts.shape[0], rotations.shape[0]
    _, C, H, W = planes.shape
    if B == 0 or C == 0:
        return
    launch(_forward_kernel(taps, C, pts.dtype), (cdiv(B, BLOCK_B),),
           pts, rotations, _channels_last(planes), out, B, T, C, H, W, float(h),
           *pts.stride(), *rotations.stride(), out.stride(0) if taps > 1 else 0, out.stride(-2), col0)


def _launch_backward(grad, pts, rotations, planes, needs, taps, h, col0):
    """[planes grad, pts grad, rotations grad] (None where not needed) of one planes tensor."""
    B, T = pts.shape[0], rotations.shape[0]
    _, C, H, W = planes.shape
    acc = accumulation_dtype(pts.dtype)
    need_pl, need_p, need_r = (bool(n) for n in needs)
    run = B > 0 and C > 0 and (need_pl or need_p or need_r)
    programs = cdiv(B, BLOCK_B)
    # the planes gradient is the atomics' target (zeroed); each program writes its points' gradients and its
    # rows of the rotations gradient's partials (summed below in a fixed order: deterministic), so those are
    # zeroed only where no kernel runs
    new = torch.empty if run else torch.zeros
    if torch.compiler.is_compiling():
        # torch's analysis of which tensors a user-defined Triton kernel writes follows the planes gradient's scatter
        # addresses back to the loads of the points and rotations they are computed from, and takes those for
        # writes: the compiled graph would copy the kernel's "result" back into the caller's points (an in-place
        # write into a leaf that requires grad: an error). So the graph hands the kernel copies of both (small).
        pts, rotations = pts.clone(), rotations.clone()
    gpl = torch.zeros((3 * T, H, W, C), dtype=acc, device=pts.device) if need_pl else None
    gp = new((B, 3), dtype=acc, device=pts.device) if need_p else None
    gr = new((programs, T, 9), dtype=acc, device=pts.device) if need_r else None
    if run:
        launch(_backward_kernel(taps, C, pts.dtype, need_pl, need_p, need_r), (programs,),
               grad, pts, rotations, _channels_last(planes), gpl if need_pl else pts, gp if need_p else pts,
               gr if need_r else pts, B, T, C, H, W, float(h), *pts.stride(), *rotations.stride(),
               grad.stride(0) if taps > 1 else 0, grad.stride(-2), grad.stride(-1), col0 * grad.stride(-1))
    if gpl is not None:
        # in the planes' own layout, as torch's convolutions give theirs: for channels-last planes (KPlanesField's)
        # the kernel's [3T, H, W, C] buffer is that layout already; NCHW planes get an NCHW copy
        gpl = gpl.permute(0, 3, 1, 2).to(planes.dtype)
        if not planes.is_contiguous(memory_format=torch.channels_last):
            gpl = gpl.contiguous()
    return [gpl, None if gp is None else gp.to(pts.dtype),
            None if gr is None else gr.sum(0).view(T, 3, 3).to(rotations.dtype)]


def forward(pts: torch.Tensor, rotations: torch.Tensor, planes: torch.Tensor) -> torch.Tensor:
    out = torch.empty((pts.shape[0], rotations.shape[0] * planes.shape[1]), dtype=pts.dtype, device=pts.device)
    _launch_forward(pts, rotations, planes, out, 1, 0.0, 0)
    return out


def backward(grad: torch.Tensor, pts: torch.Tensor, rotations: torch.Tensor, planes: torch.Tensor, needs) -> list:
    gpl, gp, gr = _launch_backward(grad, pts, rotations, planes, (needs[2], needs[0], needs[1]), 1, 0.0, 0)
    return [gp, gr, gpl]


def taps_forward(pts: torch.Tensor, rotations: torch.Tensor, planes: torch.Tensor, h: float) -> torch.Tensor:
    out = torch.empty((4, pts.shape[0], rotations.shape[0] * planes.shape[1]), dtype=pts.dtype, device=pts.device)
    _launch_forward(pts, rotations, planes, out, 4, h, 0)
    return out


def taps_backward(grad: torch.Tensor, pts: torch.Tensor, rotations: torch.Tensor, planes: torch.Tensor, h: float,
                  needs) -> list:
    gpl, gp, gr = _launch_backward(grad, pts, rotations, planes, (needs[2], needs[0], needs[1]), 4, h, 0)
    return [gp, gr, gpl]


def ms_forward(pts: torch.Tensor, rotations: torch.Tensor, planes: list[torch.Tensor]) -> torch.Tensor:
    T = rotations.shape[0]
    out = torch.empty((pts.shape[0], T * sum(p.shape[1] for p in planes)), dtype=pts.dtype, device=pts.device)
    col = 0
    for p in planes:  # one launch per scale, each writing its columns
        _launch_forward(pts, rotations, p, out, 1, 0.0, col)
        col += T * p.shape[1]
    return out


def ms_backward(grad: torch.Tensor, pts: torch.Tensor, rotations: torch.Tensor, planes: list[torch.Tensor],
                needs) -> list:
    T = rotations.shape[0]
    gpls, gps, grs, col = [], [], [], 0
    for p in planes:
        gpl, gp, gr = _launch_backward(grad, pts, rotations, p, (needs[2], needs[0], needs[1]), 1, 0.0, col)
        gpls.append(gpl)
        gps.append(gp)
        grs.append(gr)
        col += T * p.shape[1]
    def total(gs):  # a fixed order: deterministic
        return None if gs[0] is None else torch.stack(gs).sum(0)
    return [total(gps), total(grs), gpls if needs[2] else None]
