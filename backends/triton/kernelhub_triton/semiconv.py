"""Semifield convolution (docs/ops.md) in Triton: forward and analytic backward, no unfolded products.

The call is lifted to 3 spatial dims (``kernelhub.ops.semiconv.lift_plan``: 1-D and 2-D with leading size-1 dims;
for "conv" window tap t reads kernel tap taps-1-t, FLIP). The kernel's spatial sizes are compile-time constants
(the taps unroll); offsets within one image channel are 32-bit (larger channels are rejected and fall back).

max/min (`_tropical_kernel`): a program serves rows of output segments, one output column per lane, and each tap
is one load of the segment shifted by the tap (no per-output index arithmetic per tap), the semifield's zero in
the padding. The backward recomputes each output's first winner (a strict comparison in (c, tap) order), adds
the upstream gradient at the winner into the image's gradient (atomics: windows overlap) and writes the winner;
`_tropical_kernel_grad` then sums the kernel's gradient from those winners. It is faster forward + backward
than the walk below, which served max/min before, at every kernel size measured
(docs/lab/benchmarks-history.md#measurements-behind-the-code).

linear, root, log (the walk): a program serves BLOCK outputs of one (b, oc); each lane walks its window in
(c, tap) row-major order, reading the image through the cache. One loop nest, ``_walk``, does every walk:

- STATS: the window's sums (linear, root), or log's max of mu*a (the shift) and whether a NaN was seen;
- LOGSUM: log's sum of exp(mu*a - shift), a second walk;
- GRAD: every tap's share of the upstream gradient.

The backward recomputes the statistics (the forward saves nothing) and adds each tap's share to img's gradient
with atomics and to the kernel's with one atomic per program and tap. The atomics make the gradients' last bits
vary run to run (max/min's too).
"""
from __future__ import annotations

import math
from typing import NamedTuple

import torch
import triton
import triton.language as tl

from kernelhub.ops.semiconv import Lifted, lift_plan, zero_of
from kernelhub.spec import layout_cache
from kernelhub_triton._launch import Bound, acc_type, cdiv, launch, next_power_of_2, sm_count

__all__ = ["forward", "backward", "not_supported_reasons"]

BLOCK = 512
NUM_WARPS = 4
MAX, MIN, LINEAR, ROOT, LOG = 0, 1, 2, 3, 4  # SEMIFIELD_CODES
STATS, LOGSUM, GRAD = 0, 1, 2


@triton.jit
def _product(xv, kv, SF: tl.constexpr):
    if SF == 4:
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
          zero, prm, best, acc, nan, g, lse,
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
                    if FLIP:
                        kt = c * taps + (taps - 1 - tap)  # the kernel's index for this tap
                    else:
                        kt = c * taps + tap
                    xv, inb, off = _tap(x_c, row_in, zz, yy, ow, s2, p2, d2, H, W, kw, zero)
                    kv = tl.load(k_ptr + kbase + kt).to(best.dtype)
                    a = _product(xv, kv, SF)
                    if PASS == 0:
                        if SF == 2:
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
    return best, acc, nan


@triton.jit
def _stats(x_ptr, k_ptr, b, oc, od, oh, ow, mask, C, D, H, W, Cg, Og, s0, s1, s2, p0, p1, p2, d0, d1,
           d2, zero, prm, SF: tl.constexpr, BLOCK: tl.constexpr, ACC: tl.constexpr,
           KD: tl.constexpr, KH: tl.constexpr, KW: tl.constexpr, FLIP: tl.constexpr):
    best = tl.full([BLOCK], float("-inf"), ACC)  # log's max of mu * a (its shift)
    acc = tl.zeros([BLOCK], ACC)
    nan = tl.zeros([BLOCK], tl.int1)
    best, acc, nan = _walk(x_ptr, k_ptr, x_ptr, x_ptr, b, oc, od, oh, ow, mask, C, D, H, W, Cg, Og,
                           s0, s1, s2, p0, p1, p2, d0, d1, d2, zero, prm, best, acc, nan, acc, acc,
                           SF, 0, False, False, KD, KH, KW, FLIP)
    if SF == 4:
        best, acc, nan = _walk(x_ptr, k_ptr, x_ptr, x_ptr, b, oc, od, oh, ow, mask, C, D, H, W, Cg, Og,
                               s0, s1, s2, p0, p1, p2, d0, d1, d2, zero, prm, best, acc, nan, acc, acc,
                               SF, 1, False, False, KD, KH, KW, FLIP)
    return best, acc, nan


@triton.jit
def _position(O, per, OH, OW, BLOCK: tl.constexpr):
    chunks = tl.cdiv(per, BLOCK)
    pid = tl.program_id(0)
    bo = pid // chunks
    r = (pid % chunks) * BLOCK + tl.arange(0, BLOCK)
    mask = r < per
    return bo // O, bo % O, bo.to(tl.int64) * per + r, r // (OH * OW), (r // OW) % OH, r % OW, mask


@triton.jit
def _prologue(x_ptr, k_ptr, C, D, H, W, O, Cg, Og, OD, OH, OW, s0, s1, s2, p0, p1, p2, d0, d1, d2, zero_, prm_,
              SF: tl.constexpr, BLOCK: tl.constexpr, ACC: tl.constexpr, KD: tl.constexpr, KH: tl.constexpr,
              KW: tl.constexpr, FLIP: tl.constexpr):
    """What both kernels start with: the program's outputs and their windows' statistics."""
    zero, prm = tl.cast(zero_, ACC), tl.cast(prm_, ACC)
    b, oc, out, od, oh, ow, mask = _position(O, OD * OH * OW, OH, OW, BLOCK)
    best, acc, nan = _stats(x_ptr, k_ptr, b, oc, od, oh, ow, mask, C, D, H, W, Cg, Og,
                            s0, s1, s2, p0, p1, p2, d0, d1, d2, zero, prm, SF, BLOCK, ACC, KD, KH, KW, FLIP)
    return b, oc, out, od, oh, ow, mask, zero, prm, best, acc, nan


@triton.jit
def _semiconv_forward_kernel(x_ptr, k_ptr, o_ptr, C, D, H, W, O, Cg, Og, OD, OH, OW,
                             s0, s1, s2, p0, p1, p2, d0, d1, d2, zero_: tl.float64, prm_: tl.float64,
                             SF: tl.constexpr, BLOCK: tl.constexpr, ACC: tl.constexpr,
                             KD: tl.constexpr, KH: tl.constexpr, KW: tl.constexpr, FLIP: tl.constexpr):
    b, oc, out, od, oh, ow, mask, zero, prm, best, acc, nan = _prologue(
        x_ptr, k_ptr, C, D, H, W, O, Cg, Og, OD, OH, OW, s0, s1, s2, p0, p1, p2, d0, d1, d2, zero_, prm_,
        SF, BLOCK, ACC, KD, KH, KW, FLIP)
    if SF == 2:
        val = acc
    elif SF == 3:
        val = _pow(acc, 1.0 / prm)
    else:
        val = _lse(acc, best, nan) / prm
    tl.store(o_ptr + out, val.to(o_ptr.dtype.element_ty), mask=mask)


@triton.jit
def _semiconv_backward_kernel(g_ptr, x_ptr, k_ptr, gx_ptr, gk_ptr, C, D, H, W, O, Cg, Og, OD, OH, OW,
                              s0, s1, s2, p0, p1, p2, d0, d1, d2, zero_: tl.float64, prm_: tl.float64,
                              SF: tl.constexpr, NEED_IMG: tl.constexpr, NEED_KERNEL: tl.constexpr,
                              BLOCK: tl.constexpr, ACC: tl.constexpr, KD: tl.constexpr, KH: tl.constexpr,
                              KW: tl.constexpr, FLIP: tl.constexpr):
    b, oc, out, od, oh, ow, mask, zero, prm, best, acc, nan = _prologue(
        x_ptr, k_ptr, C, D, H, W, O, Cg, Og, OD, OH, OW, s0, s1, s2, p0, p1, p2, d0, d1, d2, zero_, prm_,
        SF, BLOCK, ACC, KD, KH, KW, FLIP)
    g = tl.load(g_ptr + out, mask=mask, other=0.0).to(ACC)
    lse = acc
    if SF == 3:  # d out / d sum of a^p, times the upstream gradient
        g = g * ((1.0 / prm) * _pow(acc, 1.0 / prm - 1.0))
    if SF == 4:
        lse = _lse(acc, best, nan)
    _walk(x_ptr, k_ptr, gx_ptr, gk_ptr, b, oc, od, oh, ow, mask, C, D, H, W, Cg, Og,
          s0, s1, s2, p0, p1, p2, d0, d1, d2, zero, prm, best, acc, nan, g, lse,
          SF, 2, NEED_IMG, NEED_KERNEL, KD, KH, KW, FLIP)


# -- max/min: output rows ---------------------------------------------------------------------
# A program serves ROWS rows of BW outputs of one (b, oc, od) output plane, one output column per lane: each tap is one
# load of a row segment shifted by the tap (neighbouring taps hit L1; a warp's load is 32 adjacent elements), one
# add and one max or min. The backward recomputes each output's first winner the same way, adds the upstream
# gradient at the winner into the image's gradient (an atomic add) and writes the winner's index; the kernel's
# gradient is then one pass over those indices (`_tropical_kernel_grad`: per program, a one-hot sum per window
# index, one atomic each).
ROWS, ROW_WIDTH, ROW_WARPS = 8, 256, 4
MAX_BINS = 32  # window indices the kernel-gradient pass sums at a time, at most
GRAD_BLOCK = 256  # outputs per program of that pass


@triton.jit
def _tropical_kernel(x_ptr, k_ptr, o_ptr, g_ptr, gx_ptr, C, D, H, W, O, Cg, Og, OD, OH, OW, s0, s1, s2, p0, p1, p2,
                     d0, d1, d2, SF: tl.constexpr, BACKWARD: tl.constexpr, NEED_IMG: tl.constexpr,
                     ROWS: tl.constexpr, BW: tl.constexpr, ACC: tl.constexpr, KD: tl.constexpr, KH: tl.constexpr,
                     KW: tl.constexpr, FLIP: tl.constexpr):
    """The forward (the output into ``o_ptr``) or, with BACKWARD, each output's first winner ``c * taps + tap``
    into ``o_ptr`` (-1 where the window holds a NaN) and ``g_ptr``'s upstream gradient at the winners into the
    zeroed ``gx_ptr`` (NEED_IMG)."""
    pid = tl.program_id(0)
    n_w = tl.cdiv(OW, BW)
    n_h = tl.cdiv(OH, ROWS)
    per = OD * n_h * n_w
    bo = pid // per
    rest = pid % per
    zero = tl.zeros([BW], tl.int32)  # scalar conditions join masks as tensors: the interpreter makes bool & bool ints
    od = zero + rest // (n_h * n_w)
    oh0 = ((rest // n_w) % n_h) * ROWS
    ow = (rest % n_w) * BW + tl.arange(0, BW)
    b = bo // O
    oc = bo % O
    taps = KD * KH * KW
    chan0 = (b * C + (oc // Og) * Cg).to(tl.int64) * D * H * W
    if SF == 0:
        start = float("-inf")
    else:
        start = float("inf")
    for r in range(0, ROWS):
        oh = zero + oh0 + r
        best = tl.full([BW], start, ACC)
        win = tl.full([BW], -1, tl.int32)
        for c in range(0, Cg):
            x_c = x_ptr + chan0 + c * D * H * W
            for kd in tl.static_range(KD):
                iz = od * s0 - p0 + kd * d0
                for kh in tl.static_range(KH):
                    iy = oh * s1 - p1 + kh * d1
                    row = x_c + (iz * H + iy) * W
                    row_in = (iz >= 0) & (iz < D) & (iy >= 0) & (iy < H)
                    for kw in tl.static_range(KW):
                        ix = ow * s2 - p2 + kw * d2
                        tap = (kd * KH + kh) * KW + kw
                        if FLIP:
                            kv = tl.load(k_ptr + (oc * Cg + c) * taps + (taps - 1 - tap)).to(ACC)
                        else:
                            kv = tl.load(k_ptr + (oc * Cg + c) * taps + tap).to(ACC)
                        # padding reads the semifield's zero
                        xv = tl.load(row + ix, mask=row_in & (ix >= 0) & (ix < W), other=start).to(ACC)
                        if SF == 0:
                            a = xv + kv
                        else:
                            a = xv - kv
                        # the backward's winner: a strict comparison in (c, tap) order keeps the first; once a
                        # NaN made best NaN no later tap wins, and the window gets no gradient
                        if SF == 0:
                            if BACKWARD:
                                win = tl.where(a > best, c * taps + tap, win)
                            best = tl.maximum(best, a, propagate_nan=tl.PropagateNan.ALL)
                        else:
                            if BACKWARD:
                                win = tl.where(a < best, c * taps + tap, win)
                            best = tl.minimum(best, a, propagate_nan=tl.PropagateNan.ALL)
        live = (ow < OW) & (oh < OH)
        out = bo.to(tl.int64) * OD * OH * OW + (od * OH + oh) * OW + ow
        if not BACKWARD:
            tl.store(o_ptr + out, best.to(o_ptr.dtype.element_ty), mask=live)
        else:
            win = tl.where(best != best, -1, tl.maximum(win, 0))  # no strict win: all were the zero, tap 0 wins
            tl.store(o_ptr + out, win.to(o_ptr.dtype.element_ty), mask=live)
            if NEED_IMG:
                t = win % taps
                iz = od * s0 - p0 + (t // (KH * KW)) * d0
                iy = oh * s1 - p1 + ((t // KW) % KH) * d1
                ix = ow * s2 - p2 + (t % KW) * d2
                hit = live & (win >= 0) & (iz >= 0) & (iz < D) & (iy >= 0) & (iy < H) & (ix >= 0) & (ix < W)
                g = tl.load(g_ptr + out, mask=hit, other=0.0).to(ACC)
                tl.atomic_add(gx_ptr + chan0 + (win // taps) * D * H * W + (iz * H + iy) * W + ix, g, mask=hit,
                              sem="relaxed")


@triton.jit
def _tropical_kernel_grad(w_ptr, g_ptr, gk_ptr, O, Cg, per, split, SF: tl.constexpr, BLOCK: tl.constexpr,
                          BINS: tl.constexpr, ACC: tl.constexpr, TAPS: tl.constexpr, FLIP: tl.constexpr):
    """The kernel's gradient from the winners: for each window index (c, tap), the sum of the upstream gradients
    of the outputs it won. A program takes every ``split``-th block of one (b, oc) plane's outputs, sums one-hot
    per lane and BINS indices at a time, and adds each index's total with one atomic (few programs per kernel
    entry: the atomics on one address serialise)."""
    pid = tl.program_id(0)
    bo = pid // split
    base = bo.to(tl.int64) * per
    for first in range(0, Cg * TAPS, BINS):
        idx = first + tl.arange(0, BINS)
        acc = tl.zeros([BINS, BLOCK], ACC)
        for start in range((pid % split) * BLOCK, per, split * BLOCK):
            j = start + tl.arange(0, BLOCK)
            w = tl.load(w_ptr + base + j, mask=j < per, other=-1).to(tl.int32)
            g = tl.load(g_ptr + base + j, mask=(w >= first) & (w < first + BINS), other=0.0).to(ACC)
            acc += tl.where(w[None, :] == idx[:, None], g[None, :], 0.0)
        s = tl.sum(acc, axis=1)
        if SF == 1:
            s = -s
        if FLIP:
            kt = (idx // TAPS) * TAPS + (TAPS - 1 - idx % TAPS)
        else:
            kt = idx
        tl.atomic_add(gk_ptr + (bo % O) * Cg * TAPS + kt, s, mask=idx < Cg * TAPS, sem="relaxed")


class _Call(NamedTuple):
    """What the launchers need of a call, fixed by its shapes, arguments and dtype and the GPU's multiprocessors
    (`_call`): the kernels bound to the lifted call's sizes (`lift_plan`)."""
    output_shape: tuple
    rows: tuple | None  # max/min: the row kernel's grid, forward and backwards (without, with the image's gradient)
    walk: tuple | None  # smooth semifields: the window walk's grid, forward and backwards by (NEED_IMG, NEED_KERNEL)
    grad: tuple | None  # max/min: the kernel-gradient pass's grid and kernel
    winner: torch.dtype | None  # max/min: the winners' dtype


def _call(img, kernel, semifield, stride, padding, dilation, groups, kind, group_broadcasting) -> _Call:
    """The call's `_Call`, made once per shapes, arguments, dtype and device kind. The kernels index the
    contiguous image, kernel, upstream gradient and outputs from their pointers in the lifted call's layout, the
    same memory as the op's own shapes: no reshaped view per call."""
    return _call_of(tuple(img.shape), tuple(kernel.shape), semifield, tuple(stride), tuple(padding), tuple(dilation),
                    groups, kind, group_broadcasting, img.dtype, sm_count(img))


@layout_cache(maxsize=1024)
def _call_of(img_shape, kernel_shape, semifield, stride, padding, dilation, groups, kind, group_broadcasting, dtype,
             sms) -> _Call:
    plan = lift_plan(img_shape, kernel_shape, semifield, stride, padding, dilation, groups, kind, group_broadcasting)
    a, img5, kernel5 = Lifted(None, None, *plan[2:]), plan[0], plan[1]
    rows, grad, winner = _row_layout(a, img5, kernel5, dtype), None, None
    if rows is not None:
        window, planes, per = math.prod(kernel5[1:]), img5[0] * kernel5[0], math.prod(a.out_size)
        split = max(1, min(cdiv(per, GRAD_BLOCK), cdiv(4 * sms, max(planes, 1))))  # no planes: an empty batch
        grad = (planes * split,), Bound(
            _tropical_kernel_grad, O=kernel5[0], Cg=kernel5[1], per=per, split=split, SF=a.code, BLOCK=GRAD_BLOCK,
            BINS=min(MAX_BINS, next_power_of_2(window)), ACC=acc_type(dtype), TAPS=math.prod(kernel5[2:]),
            FLIP=a.flip, num_warps=ROW_WARPS)
        winner = _winner_dtype(window)
    walk = None if rows is not None else _walk_layout(a, img5, kernel5, dtype)  # max/min never walk
    return _Call(a.output_shape, rows, walk, grad, winner)


def _sizes(a, img_shape, kernel_shape) -> dict:
    """The sizes every semiconv kernel but the gradient pass takes after its tensors, by name, the kernel's spatial
    sizes and the semifield."""
    (_, C, D, H, W), (O, Cg, KD, KH, KW) = img_shape, kernel_shape
    (OD, OH, OW), (s0, s1, s2), (p0, p1, p2), (d0, d1, d2) = a.out_size, a.stride, a.pad_begin, a.dilation
    return dict(C=C, D=D, H=H, W=W, O=O, Cg=Cg, Og=O // a.groups, OD=OD, OH=OH, OW=OW, s0=s0, s1=s1, s2=s2, p0=p0,
                p1=p1, p2=p2, d0=d0, d1=d1, d2=d2, KD=KD, KH=KH, KW=KW, FLIP=a.flip, SF=a.code)


def _row_layout(a, img_shape, kernel_shape, dtype) -> tuple | None:
    """max/min: the row kernel's grid, forward and backwards; else (the smooth semifields) None."""
    if a.code not in (MAX, MIN):
        return None
    B, O = img_shape[0], kernel_shape[0]
    OD, OH, OW = a.out_size
    bw = min(next_power_of_2(OW), ROW_WIDTH)
    rows = min(OH, ROWS)
    fixed = dict(_sizes(a, img_shape, kernel_shape), ACC=acc_type(dtype), ROWS=rows, BW=bw,
                 num_warps=ROW_WARPS)
    return (B * O * OD * cdiv(OH, rows) * cdiv(OW, bw),), Bound(_tropical_kernel, BACKWARD=False, NEED_IMG=False,
                                                               **fixed), \
        tuple(Bound(_tropical_kernel, BACKWARD=True, NEED_IMG=need, **fixed) for need in (False, True))


def _walk_layout(a, img_shape, kernel_shape, dtype) -> tuple:
    """The window walk's grid, forward and backwards (by NEED_IMG, NEED_KERNEL) for a lifted call."""
    B, O = img_shape[0], kernel_shape[0]
    OD, OH, OW = a.out_size
    fixed = dict(_sizes(a, img_shape, kernel_shape), zero_=zero_of(a.semifield, a.param),
                 prm_=a.param, BLOCK=BLOCK, ACC=acc_type(dtype), num_warps=NUM_WARPS)
    return (B * O * cdiv(OD * OH * OW, BLOCK),), Bound(_semiconv_forward_kernel, **fixed), \
        {(img, ker): Bound(_semiconv_backward_kernel, NEED_IMG=img, NEED_KERNEL=ker, **fixed)
         for img in (False, True) for ker in (False, True)}


def _winner_dtype(window: int) -> torch.dtype:
    """The smallest integer type holding a window index (c * taps + tap) and -1."""
    return torch.int8 if window < 2**7 else torch.int16 if window < 2**15 else torch.int32


def not_supported_reasons(args) -> list[str]:
    if math.prod(args[0].shape[2:]) >= 2**31:
        return ["an image channel of 2^31 elements or more (offsets within a channel are 32-bit here)"]
    return []


def forward(img, kernel, semifield, stride, padding, dilation, groups, kind, group_broadcasting=False):
    call = _call(img, kernel, semifield, stride, padding, dilation, groups, kind, group_broadcasting)
    out = torch.empty(call.output_shape, dtype=img.dtype, device=img.device)
    if out.numel() == 0:
        return out
    x, k = img.contiguous(), kernel.contiguous()
    if call.rows is not None:
        grid, kernel_fwd, _ = call.rows
        launch(kernel_fwd, grid, x, k, out, x, x)
    else:
        grid, kernel_fwd, _ = call.walk
        launch(kernel_fwd, grid, x, k, out)
    return out


def backward(grad, img, kernel, semifield, stride, padding, dilation, groups, kind, group_broadcasting, needs):
    call = _call(img, kernel, semifield, stride, padding, dilation, groups, kind, group_broadcasting)
    x, k, g = img.contiguous(), kernel.contiguous(), grad.contiguous()
    acc = torch.float64 if img.dtype == torch.float64 else torch.float32
    gx = torch.zeros_like(img, dtype=acc, memory_format=torch.contiguous_format)
    gk = torch.zeros_like(kernel, dtype=acc, memory_format=torch.contiguous_format)
    if g.numel() and (needs[0] or needs[1]) and call.rows is not None:
        grid, _, kernels_bwd = call.rows
        win = torch.empty(g.shape, dtype=call.winner, device=img.device)  # each output's winner, (c, tap) index
        launch(kernels_bwd[1 if needs[0] else 0], grid, x, k, win, g, gx)  # dynamo indexes by int, not bool
        if needs[1]:
            grid, kernel_grad = call.grad
            launch(kernel_grad, grid, win, g, gk)
    elif g.numel() and (needs[0] or needs[1]):
        grid, _, kernels_bwd = call.walk
        launch(kernels_bwd[bool(needs[0]), bool(needs[1])], grid, g, x, k, gx, gk)
    return [gx.to(img.dtype) if needs[0] else None, gk.to(kernel.dtype) if needs[1] else None]
