"""Semifield convolution (docs/ops.md) in Triton: forward and analytic backward, no unfolded products.

The call is lifted to 3 spatial dims (``kernelhub.ops.semiconv.lift_3d``: 1-D and 2-D with leading
size-1 dims; for "conv" window tap t reads kernel tap taps-1-t, FLIP). A program serves BLOCK outputs of one (b, oc); each
lane walks its window in (c, tap) row-major order, reading the image through the cache and the
semifield's zero where a tap falls in the padding. The kernel's spatial sizes are compile-time
constants (the taps unroll); offsets within one image channel are 32-bit (larger channels are
rejected and fall back). One loop nest, ``_walk``, does every walk over the taps:

- STATS: the window's max (max/min; log: of mu*a, the shift), its sums (linear, root) and whether a
  NaN was seen; for max/min also the first winner's (c, tap) index, by a strict comparison in order;
- LOGSUM: log's sum of exp(mu*a - shift), a second walk;
- GRAD (log, root, linear): every tap's share of the upstream gradient.

max/min of 1-D and 2-D calls take `_tropical_kernel` instead: a program per output tile, each tap one shifted
load of the whole tile (no per-output index arithmetic per tap), forward and backward in one kernel (below). On an
H200 it is 1.5x (5x5 depthwise), 1.1x (3x3 depthwise) and 2.2x (3x3, 32 channels per group) faster forward +
backward than the walk (docs/lab/benchmarks-history.md).

The backward recomputes the statistics (the forward saves nothing). For max/min the first winner
takes the whole gradient: one atomic add into img's gradient at its position, and the kernel's
gradient as a per-program sum for each (c, tap), one atomic per program and tap. The smooth
semifields add each tap's share to img's gradient with atomics (windows overlap) and to the
kernel's with one atomic per program and tap. The atomics make the gradients' last bits vary run
to run.
"""

from __future__ import annotations

import functools
import math

import torch
import triton
import triton.language as tl

from kernelhub.ops.semiconv import lift_3d, semifield_zero
from kernelhub_triton._launch import acc_type, launch

__all__ = ["forward", "backward", "not_supported_reasons"]

BLOCK = 512
NUM_WARPS = 4
MAX, MIN, LINEAR, ROOT, LOG = 0, 1, 2, 3, 4  # SEMIFIELD_CODES
STATS, LOGSUM, GRAD = 0, 1, 2


@triton.jit
def _product(xv, kv, SF: tl.constexpr):
    if SF == 1:
        a = xv - kv
    elif SF == 0 or SF == 4:
        a = xv + kv
    else:
        a = xv * kv
    return a


@triton.jit
def _pow(a, e):
    # a ** e for a >= 0 (root semifields take inputs >= 0), as exp(e log a); a ** 0 = 1 as in torch. libdevice's pow
    # is not in Triton's interpreter, which CI runs
    return tl.where(e == 0.0, 1.0, tl.exp(e * tl.log(a)))


@triton.jit
def _shift(m):
    """logsumexp's shift: the max, or 0 where it is infinite (torch's rule)."""
    return tl.where(m - m == 0.0, m, 0.0)  # m - m is NaN for +-inf (and NaN)


@triton.jit
def _lse(acc, best, nan):
    """log's log-sum-exp from its statistics (NaN where the window held a NaN)."""
    return tl.where(nan, float("nan"), tl.log(acc) + _shift(best))


@triton.jit
def _tap(x_c, row_in, zz, yy, ow, s2, p2, d2, H, W, kw, zero):
    """The image value a tap reads (the semifield's zero in the padding), its in-image mask and offset."""
    xx = ow * s2 - p2 + kw * d2
    inb = row_in & (xx >= 0) & (xx < W)
    off = (zz * H + yy) * W + xx  # within one channel: 32-bit (larger images are rejected)
    xv = tl.load(x_c + off, mask=inb, other=0.0)
    return tl.where(inb, xv.to(zero.dtype), zero), inb, off


@triton.jit
def _walk(x_ptr, k_ptr, gx_ptr, gk_ptr, b, oc, od, oh, ow, mask,
          C, D, H, W, Cg, Og, s0, s1, s2, p0, p1, p2, d0, d1, d2,
          zero, prm, best, acc, nan, win, g, lse,
          SF: tl.constexpr, PASS: tl.constexpr, NEED_IMG: tl.constexpr, NEED_KERNEL: tl.constexpr,
          KD: tl.constexpr, KH: tl.constexpr, KW: tl.constexpr, FLIP: tl.constexpr):
    taps = KD * KH * KW
    kbase = oc * Cg * taps
    grp = oc // Og
    shift = _shift(best)
    for c in range(0, Cg):
        chan = (b * C + grp * Cg + c).to(tl.int64) * D * H * W
        x_c = x_ptr + chan
        for kd in tl.static_range(KD):
            zz = od * s0 - p0 + kd * d0
            for kh in tl.static_range(KH):
                yy = oh * s1 - p1 + kh * d1
                row_in = mask & (zz >= 0) & (zz < D) & (yy >= 0) & (yy < H)
                for kw in tl.static_range(KW):
                    tap = (kd * KH + kh) * KW + kw
                    t = c * taps + tap  # (c, tap) in window order
                    if FLIP:
                        kt = c * taps + (taps - 1 - tap)  # the kernel's index for this tap
                    else:
                        kt = t
                    xv, inb, off = _tap(x_c, row_in, zz, yy, ow, s2, p2, d2, H, W, kw, zero)
                    kv = tl.load(k_ptr + kbase + kt).to(best.dtype)
                    a = _product(xv, kv, SF)
                    if PASS == 0:
                        if SF == 0 or SF == 1:
                            nan = nan | (a != a)
                            if SF == 0:
                                take = (win < 0) | (a > best)
                            else:
                                take = (win < 0) | (a < best)
                            best = tl.where(take, a, best)
                            win = tl.where(take, t, win)
                        elif SF == 2:
                            acc += a
                        elif SF == 3:
                            acc += _pow(a, prm)
                        else:
                            v = prm * a
                            nan = nan | (v != v)
                            best = tl.maximum(best, v)
                    elif PASS == 1:
                        acc += tl.exp(prm * a - shift)
                    else:  # the smooth semifields' gradient: every tap its share
                        if SF == 2:
                            w = g
                        elif SF == 3:
                            w = g * (prm * _pow(a, prm - 1.0))
                        else:
                            w = g * tl.exp(prm * a - lse)
                        if SF == 4:
                            dx = w
                            dk = w
                        else:
                            dx = w * kv
                            dk = w * xv
                        if NEED_IMG:
                            tl.atomic_add(gx_ptr + chan + off, dx, mask=inb, sem="relaxed")
                        if NEED_KERNEL:
                            tl.atomic_add(gk_ptr + kbase + kt, tl.sum(tl.where(mask, dk, 0.0), axis=0), sem="relaxed")
    return best, acc, nan, win


@triton.jit
def _stats(x_ptr, k_ptr, b, oc, od, oh, ow, mask, C, D, H, W, Cg, Og, s0, s1, s2, p0, p1, p2, d0, d1,
           d2, zero, prm, start, SF: tl.constexpr, BLOCK: tl.constexpr, ACC: tl.constexpr,
           KD: tl.constexpr, KH: tl.constexpr, KW: tl.constexpr, FLIP: tl.constexpr):
    best = tl.zeros([BLOCK], ACC) + start
    acc = tl.zeros([BLOCK], ACC)
    nan = tl.zeros([BLOCK], tl.int1)
    win = tl.full([BLOCK], -1, tl.int32)
    best, acc, nan, win = _walk(x_ptr, k_ptr, x_ptr, x_ptr, b, oc, od, oh, ow, mask, C, D, H, W, Cg, Og,
                                s0, s1, s2, p0, p1, p2, d0, d1, d2, zero, prm, best, acc, nan, win, acc, acc,
                                SF, 0, False, False, KD, KH, KW, FLIP)
    if SF == 4:
        best, acc, nan, win = _walk(x_ptr, k_ptr, x_ptr, x_ptr, b, oc, od, oh, ow, mask, C, D, H, W, Cg, Og,
                                    s0, s1, s2, p0, p1, p2, d0, d1, d2, zero, prm, best, acc, nan, win, acc, acc,
                                    SF, 1, False, False, KD, KH, KW, FLIP)
    return best, acc, nan, win


@triton.jit
def _position(O, per, OH, OW, BLOCK: tl.constexpr):
    chunks = tl.cdiv(per, BLOCK)
    pid = tl.program_id(0)
    bo = pid // chunks
    r = (pid % chunks) * BLOCK + tl.arange(0, BLOCK)
    mask = r < per
    return bo // O, bo % O, bo.to(tl.int64) * per + r, r // (OH * OW), (r // OW) % OH, r % OW, mask


@triton.jit
def _prologue(x_ptr, k_ptr, C, D, H, W, O, Cg, Og, OD, OH, OW, s0, s1, s2, p0, p1, p2, d0, d1, d2, zero_, prm_, start_,
              SF: tl.constexpr, BLOCK: tl.constexpr, ACC: tl.constexpr, KD: tl.constexpr, KH: tl.constexpr,
              KW: tl.constexpr, FLIP: tl.constexpr):
    """What both kernels start with: the program's outputs and their windows' statistics."""
    zero, prm, start = tl.cast(zero_, ACC), tl.cast(prm_, ACC), tl.cast(start_, ACC)
    b, oc, out, od, oh, ow, mask = _position(O, OD * OH * OW, OH, OW, BLOCK)
    best, acc, nan, win = _stats(x_ptr, k_ptr, b, oc, od, oh, ow, mask, C, D, H, W, Cg, Og,
                                 s0, s1, s2, p0, p1, p2, d0, d1, d2, zero, prm, start, SF, BLOCK, ACC, KD, KH, KW, FLIP)
    return b, oc, out, od, oh, ow, mask, zero, prm, best, acc, nan, win


@triton.jit
def _semiconv_forward_kernel(x_ptr, k_ptr, o_ptr, C, D, H, W, O, Cg, Og, OD, OH, OW,
                             s0, s1, s2, p0, p1, p2, d0, d1, d2, zero_: tl.float64, prm_: tl.float64,
                             start_: tl.float64, SF: tl.constexpr, BLOCK: tl.constexpr, ACC: tl.constexpr,
                             KD: tl.constexpr, KH: tl.constexpr, KW: tl.constexpr, TP2: tl.constexpr,
                             FLIP: tl.constexpr):
    b, oc, out, od, oh, ow, mask, zero, prm, best, acc, nan, win = _prologue(
        x_ptr, k_ptr, C, D, H, W, O, Cg, Og, OD, OH, OW, s0, s1, s2, p0, p1, p2, d0, d1, d2, zero_, prm_, start_,
        SF, BLOCK, ACC, KD, KH, KW, FLIP)
    if SF == 0 or SF == 1:
        val = tl.where(nan, float("nan"), best)
    elif SF == 2:
        val = acc
    elif SF == 3:
        val = _pow(acc, 1.0 / prm)
    else:
        val = _lse(acc, best, nan) / prm
    tl.store(o_ptr + out, val.to(o_ptr.dtype.element_ty), mask=mask)


@triton.jit
def _semiconv_backward_kernel(g_ptr, x_ptr, k_ptr, gx_ptr, gk_ptr, C, D, H, W, O, Cg, Og, OD, OH, OW,
                              s0, s1, s2, p0, p1, p2, d0, d1, d2, zero_: tl.float64, prm_: tl.float64,
                              start_: tl.float64, SF: tl.constexpr, NEED_IMG: tl.constexpr,
                              NEED_KERNEL: tl.constexpr, BLOCK: tl.constexpr, ACC: tl.constexpr,
                              KD: tl.constexpr, KH: tl.constexpr, KW: tl.constexpr, TP2: tl.constexpr,
                              FLIP: tl.constexpr):
    b, oc, out, od, oh, ow, mask, zero, prm, best, acc, nan, win = _prologue(
        x_ptr, k_ptr, C, D, H, W, O, Cg, Og, OD, OH, OW, s0, s1, s2, p0, p1, p2, d0, d1, d2, zero_, prm_, start_,
        SF, BLOCK, ACC, KD, KH, KW, FLIP)
    g = tl.load(g_ptr + out, mask=mask, other=0.0).to(ACC)
    if SF == 0 or SF == 1:  # the whole gradient to the first winner: no second walk
        g = tl.where(mask & (nan == 0), g, 0.0)  # a NaN in the window: no gradient
        taps = KD * KH * KW
        if NEED_IMG:
            c = win // taps
            t = win % taps
            zz = od * s0 - p0 + (t // (KH * KW)) * d0
            yy = oh * s1 - p1 + ((t // KW) % KH) * d1
            xx = ow * s2 - p2 + (t % KW) * d2
            inb = mask & (nan == 0) & (zz >= 0) & (zz < D) & (yy >= 0) & (yy < H) & (xx >= 0) & (xx < W)
            chan = (b * C + (oc // Og) * Cg + c).to(tl.int64) * D * H * W
            tl.atomic_add(gx_ptr + chan + (zz * H + yy) * W + xx, g, mask=inb, sem="relaxed")
        if NEED_KERNEL:  # per channel c: the program's sum for each tap, one atomic per tap
            if SF == 1:
                g = -g
            tt = tl.arange(0, TP2)
            if FLIP:
                kt = taps - 1 - tt
            else:
                kt = tt
            for c in range(0, Cg):
                hits = tl.where(win[:, None] == c * taps + tt[None, :], g[:, None], 0.0)
                tl.atomic_add(gk_ptr + oc * Cg * taps + c * taps + kt, tl.sum(hits, axis=0), mask=tt < taps,
                              sem="relaxed")
    else:
        lse = acc
        if SF == 3:  # d out / d sum of a^p, times the upstream gradient
            g = g * ((1.0 / prm) * _pow(acc, 1.0 / prm - 1.0))
        if SF == 4:
            lse = _lse(acc, best, nan)
        _walk(x_ptr, k_ptr, gx_ptr, gk_ptr, b, oc, od, oh, ow, mask, C, D, H, W, Cg, Og,
              s0, s1, s2, p0, p1, p2, d0, d1, d2, zero, prm, best, acc, nan, win, g, lse,
              SF, 2, NEED_IMG, NEED_KERNEL, KD, KH, KW, FLIP)


# -- max/min in 1-D and 2-D: output tiles ----------------------------------------------------
# A program serves a [BH, BW] tile of one (b, oc) output plane; each tap is one shifted load of the tile
# (neighbouring taps hit L1), one add and one max or min, with no per-tap index arithmetic beyond the shift.
# The backward recomputes each output's first winner the same way, then adds the upstream gradient to the
# image's gradient at the winner (an atomic add) and to the kernel's (per program and tap, one atomic).
TILE_H, TILE_W, TILE_WARPS = 4, 128, 4


@triton.jit
def _tropical_kernel(x_ptr, k_ptr, o_ptr, g_ptr, gx_ptr, gk_ptr, C, H, W, O, Cg, Og, OH, OW,
                     s1, s2, p1, p2, d1, d2, SF: tl.constexpr, BACKWARD: tl.constexpr, NEED_IMG: tl.constexpr,
                     NEED_KERNEL: tl.constexpr, BH: tl.constexpr, BW: tl.constexpr, ACC: tl.constexpr,
                     KH: tl.constexpr, KW: tl.constexpr, KWP2: tl.constexpr, FLIP: tl.constexpr):
    """The forward (into ``o_ptr``) or, with BACKWARD, the gradients of ``g_ptr``'s upstream gradient (into the
    zeroed ``gx_ptr`` and ``gk_ptr``)."""
    pid = tl.program_id(0)
    n_w = tl.cdiv(OW, BW)
    per = tl.cdiv(OH, BH) * n_w
    bo = pid // per
    oh = ((pid % per) // n_w) * BH + tl.arange(0, BH)
    ow = ((pid % per) % n_w) * BW + tl.arange(0, BW)
    b = bo // O
    oc = bo % O
    taps = KH * KW
    if SF == 0:
        start = float("-inf")
    else:
        start = float("inf")
    best = tl.full([BH, BW], start, ACC)
    win = tl.full([BH, BW], -1, tl.int32)
    nan = tl.zeros([BH, BW], tl.int1)
    for c in range(0, Cg):
        x_c = x_ptr + (b * C + (oc // Og) * Cg + c).to(tl.int64) * H * W
        for kh in tl.static_range(KH):
            iy = oh * s1 - p1 + kh * d1
            row = x_c + iy * W
            row_in = (iy >= 0) & (iy < H)
            for kw in tl.static_range(KW):
                ix = ow * s2 - p2 + kw * d2
                inb = row_in[:, None] & ((ix >= 0) & (ix < W))[None, :]
                tap = kh * KW + kw
                if FLIP:
                    kv = tl.load(k_ptr + (oc * Cg + c) * taps + (taps - 1 - tap)).to(ACC)
                else:
                    kv = tl.load(k_ptr + (oc * Cg + c) * taps + tap).to(ACC)
                xv = tl.load(row[:, None] + ix[None, :], mask=inb, other=start).to(ACC)  # padding: the zero
                if SF == 0:
                    a = xv + kv
                else:
                    a = xv - kv
                if BACKWARD:  # a strict comparison in (c, tap) order: the first winner stays
                    nan = nan | (a != a)
                    if SF == 0:
                        take = a > best
                    else:
                        take = a < best
                    best = tl.where(take, a, best)
                    win = tl.where(take, c * taps + tap, win)
                elif SF == 0:
                    best = tl.maximum(best, a, propagate_nan=tl.PropagateNan.ALL)
                else:
                    best = tl.minimum(best, a, propagate_nan=tl.PropagateNan.ALL)
    omask = (oh < OH)[:, None] & (ow < OW)[None, :]
    out = bo.to(tl.int64) * OH * OW + oh[:, None] * OW + ow[None, :]
    if not BACKWARD:
        tl.store(o_ptr + out, best.to(o_ptr.dtype.element_ty), mask=omask)
    else:
        win = tl.maximum(win, 0)  # no strict win: every product was the zero, the first tap wins
        live = omask & (nan == 0)  # a NaN in the window: no gradient
        g = tl.load(g_ptr + out, mask=live, other=0.0).to(ACC)
        c = win // taps
        t = win % taps
        if NEED_IMG:
            iy = oh[:, None] * s1 - p1 + (t // KW) * d1
            ix = ow[None, :] * s2 - p2 + (t % KW) * d2
            inb = live & (iy >= 0) & (iy < H) & (ix >= 0) & (ix < W)
            chan = (b * C + (oc // Og) * Cg + c).to(tl.int64) * H * W
            tl.atomic_add(gx_ptr + chan + iy * W + ix, g, mask=inb, sem="relaxed")
        if NEED_KERNEL:  # per channel and kernel row: the program's sum for each tap, one atomic per tap
            if SF == 1:
                g = -g
            kw_ = tl.arange(0, KWP2)
            for ci in range(0, Cg):
                for kh in tl.static_range(KH):
                    hit = win[:, :, None] == (ci * taps + kh * KW + kw_)[None, None, :]
                    s = tl.sum(tl.sum(tl.where(hit, g[:, :, None], 0.0), axis=0), axis=0)
                    if FLIP:
                        kt = taps - 1 - (kh * KW + kw_)
                    else:
                        kt = kh * KW + kw_
                    tl.atomic_add(gk_ptr + (oc * Cg + ci) * taps + kt, s, mask=kw_ < KW, sem="relaxed")


def _tiled_layout(a) -> tuple | None:
    """max/min of a 1-D or 2-D call (depth 1, no depth padding): the tile kernel's grid and arguments; else None."""
    (B, C, D, H, W), (O, Cg, KD, KH, KW) = a.img.shape, a.kernel.shape
    OD, OH, OW = a.out_size
    if a.code not in (MAX, MIN) or (D, KD, OD, a.pad_begin[0]) != (1, 1, 1, 0):
        return None
    bw, bh = _tile(OH, OW)
    return (B * O * triton.cdiv(OH, bh) * triton.cdiv(OW, bw),), (
        C, H, W, O, Cg, O // a.groups, OH, OW, a.stride[1], a.stride[2], a.pad_begin[1], a.pad_begin[2],
        a.dilation[1], a.dilation[2]), {"KH": KH, "KW": KW, "KWP2": triton.next_power_of_2(KW), "FLIP": a.flip,
                                         "SF": a.code, "ACC": acc_type(a.img.dtype), "BH": bh, "BW": bw,
                                         "num_warps": TILE_WARPS}


@functools.lru_cache(maxsize=256)
def _tile(rows: int, cols: int) -> tuple[int, int]:
    """A tile of TILE_H x TILE_W outputs, wider where the plane has fewer rows (a 1-D call's plane is one row)."""
    bh = min(triton.next_power_of_2(rows), TILE_H)
    return min(triton.next_power_of_2(cols), TILE_H * TILE_W // bh), bh


def not_supported_reasons(args) -> list[str]:
    if math.prod(args[0].shape[2:]) >= 2**31:
        return ["an image channel of 2^31 elements or more (offsets within a channel are 32-bit here)"]
    return []


def _launch_args(a, semifield: str):
    """The grid, the kernels' scalar arguments and their compile-time kernel sizes for a lifted call."""
    (B, C, D, H, W), (O, Cg, KD, KH, KW) = a.img.shape, a.kernel.shape
    OD, OH, OW = a.out_size
    start = float("inf") if a.code == MIN else float("-inf")  # the max/min's start
    grid = (B * O * triton.cdiv(OD * OH * OW, BLOCK),)
    sizes = {"KD": KD, "KH": KH, "KW": KW, "TP2": triton.next_power_of_2(KD * KH * KW), "FLIP": a.flip}
    return grid, (C, D, H, W, O, Cg, O // a.groups, OD, OH, OW, *a.stride, *a.pad_begin, *a.dilation,
                  semifield_zero(semifield), a.param, start), sizes


def forward(img, kernel, semifield, stride, padding, dilation, groups, kind, group_broadcasting=False):
    a = lift_3d(img, kernel, semifield, stride, padding, dilation, groups, kind, group_broadcasting)
    x, k = a.img.contiguous(), a.kernel.contiguous()
    out = img.new_empty(a.output_shape)
    if out.numel() == 0:
        return out
    tiled = _tiled_layout(a)
    if tiled is not None:
        grid, scalars, sizes = tiled
        launch(_tropical_kernel, grid, x, k, out, x, x, x, *scalars, BACKWARD=False, NEED_IMG=False,
               NEED_KERNEL=False, **sizes)
        return out
    grid, scalars, sizes = _launch_args(a, semifield)
    launch(_semiconv_forward_kernel, grid, x, k, out, *scalars, **sizes, SF=a.code, BLOCK=BLOCK,
           ACC=acc_type(img.dtype), num_warps=NUM_WARPS)
    return out


def backward(grad, img, kernel, semifield, stride, padding, dilation, groups, kind, group_broadcasting, needs):
    a = lift_3d(img, kernel, semifield, stride, padding, dilation, groups, kind, group_broadcasting)
    x, k, g = a.img.contiguous(), a.kernel.contiguous(), a.grad_5d(grad).contiguous()
    acc = torch.float64 if img.dtype == torch.float64 else torch.float32
    gx = torch.zeros(x.shape, dtype=acc, device=x.device)
    gk = torch.zeros(k.shape, dtype=acc, device=x.device)
    tiled = _tiled_layout(a)
    if g.numel() and (needs[0] or needs[1]) and tiled is not None:
        grid, scalars, sizes = tiled
        launch(_tropical_kernel, grid, x, k, x, g, gx, gk, *scalars, BACKWARD=True, NEED_IMG=bool(needs[0]),
               NEED_KERNEL=bool(needs[1]), **sizes)
    elif g.numel() and (needs[0] or needs[1]):
        grid, scalars, sizes = _launch_args(a, semifield)
        launch(_semiconv_backward_kernel, grid, g, x, k, gx, gk, *scalars, **sizes, SF=a.code,
               NEED_IMG=bool(needs[0]), NEED_KERNEL=bool(needs[1]), BLOCK=BLOCK, ACC=acc_type(img.dtype),
               num_warps=NUM_WARPS)
    return [gx.to(img.dtype).view(img.shape) if needs[0] else None,
            gk.to(kernel.dtype).view(kernel.shape) if needs[1] else None]
