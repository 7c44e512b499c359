"""Semifield convolution (docs/ops.md) in Triton: forward and analytic backward, no unfolded products.

The call is lifted to 3 spatial dims (``kernelhub.ops.semiconv.lift_plan``: 1-D and 2-D with leading size-1 dims;
for "conv" window tap t reads kernel tap taps-1-t, FLIP). The kernel's spatial sizes are compile-time constants
(the taps unroll); offsets within one image channel are 32-bit (larger channels are rejected and fall back).

max/min (`_tropical_kernel`): a program serves rows of output segments, RB rows by BW columns at a time (about 256
outputs, so a narrow image, 64 wide say, still fills every lane), and each tap is one load of the segments shifted by
the tap (no per-output index arithmetic per tap), the semifield's zero in the padding; a dense call's forward
computes several output channels at once, so that each load serves them all. Each output's first winner
(a strict comparison in (c, tap) order) is what the backward needs: a forward whose backward follows saves it (one
byte an output where the window has fewer than 128 taps; `Impl.can` "saves"), else the backward searches again.
The backward adds the upstream gradient at the winner into the image's gradient (atomics: windows overlap), and
`_tropical_kernel_grad` sums the kernel's gradient from the winners.

linear, root, log: the forward walks (`_walk`): a program serves BLOCK outputs of one (b, oc); each lane walks its
window in (c, tap) row-major order, reading the image through the cache, for the window's sums (linear, root), or
log's max of mu*a (the shift) and whether a NaN was seen, then log's sum of exp(mu*a - shift) in a second walk. The
backward gathers (`_semiconv_gather_kernel`): a program serves BLOCK image positions of one (b, c) channel (the
image and its padding) and sums, over every output window that reads each one, that tap's share of the upstream
gradient: the image's gradient is written once, no atomics. A tap's share needs its output's statistic (root's sum,
log's log-sum-exp; linear's needs none): a forward whose backward follows saves it, else the backward computes it
first (the forward kernel, writing the statistic only). The kernel's gradient is one atomic per program and tap.

The atomics make the gradients' last bits vary run to run.
"""
from __future__ import annotations

import math
from typing import NamedTuple

import torch
import triton
import triton.language as tl

from kernelhub import accumulation_dtype
from kernelhub.ops.semiconv import Lifted, lift_plan, zero_of
from kernelhub.spec import layout_cache
from kernelhub_triton._launch import Bound, acc_type, cdiv, launch, next_power_of_2, sm_count

__all__ = ["forward", "backward", "not_supported_reasons"]

BLOCK = 512
NUM_WARPS = 4  # linear's, root's and log's forward
GATHER_WARPS = 8  # their backward: faster than 4 on an H200, where the forward is slower at 8 (benchmarks/kernels.py's
# semiconv sweep; docs/lab/benchmarks-history.md#measurements-behind-the-code)
MAX, MIN, LINEAR, ROOT, LOG = 0, 1, 2, 3, 4  # SEMIFIELD_CODES
STATS, LOGSUM = 0, 1  # _walk's passes


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
    """The image value a tap reads (the semifield's zero in the padding)."""
    xx = ow * s2 - p2 + kw * d2
    inb = row_in & (xx >= 0) & (xx < W)
    off = (zz * H + yy) * W + xx  # within one channel: 32-bit (larger images are rejected)
    xv = tl.load(x_c + off, mask=inb, other=0.0)
    return tl.where(inb, xv.to(zero.dtype), zero)


@triton.jit
def _walk(x_ptr, k_ptr, b, oc, od, oh, ow, mask, C, D, H, W, Cg, Og, s0, s1, s2, p0, p1, p2, d0, d1, d2,
          zero, prm, best, acc, nan, SF: tl.constexpr, PASS: tl.constexpr,
          KD: tl.constexpr, KH: tl.constexpr, KW: tl.constexpr, FLIP: tl.constexpr):
    """One walk over every window's taps: STATS (the sums, or log's max of mu*a and NaN flag) or LOGSUM."""
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
                    xv = _tap(x_c, row_in, zz, yy, ow, s2, p2, d2, H, W, kw, zero)
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
                    else:
                        acc += tl.exp(prm * a - shift)
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
def _semiconv_forward_kernel(x_ptr, k_ptr, o_ptr, s_ptr, C, D, H, W, O, Cg, Og, OD, OH, OW,
                             s0, s1, s2, p0, p1, p2, d0, d1, d2, zero_: tl.float64, prm_: tl.float64,
                             SF: tl.constexpr, STORE_OUT: tl.constexpr, STORE_STAT: tl.constexpr, BLOCK: tl.constexpr,
                             ACC: tl.constexpr, KD: tl.constexpr, KH: tl.constexpr, KW: tl.constexpr,
                             FLIP: tl.constexpr):
    """The output (STORE_OUT) and/or the statistic a tap's share of the gradient needs (STORE_STAT: root's sum of
    a^p, log's log-sum-exp, in the accumulation type)."""
    zero, prm = tl.cast(zero_, ACC), tl.cast(prm_, ACC)
    b, oc, out, od, oh, ow, mask = _position(O, OD * OH * OW, OH, OW, BLOCK)
    best = tl.full([BLOCK], float("-inf"), ACC)  # log's max of mu * a (its shift)
    acc = tl.zeros([BLOCK], ACC)
    nan = tl.zeros([BLOCK], tl.int1)
    best, acc, nan = _walk(x_ptr, k_ptr, b, oc, od, oh, ow, mask, C, D, H, W, Cg, Og, s0, s1, s2, p0, p1, p2,
                           d0, d1, d2, zero, prm, best, acc, nan, SF, 0, KD, KH, KW, FLIP)
    if SF == 4:
        best, acc, nan = _walk(x_ptr, k_ptr, b, oc, od, oh, ow, mask, C, D, H, W, Cg, Og, s0, s1, s2, p0, p1, p2,
                               d0, d1, d2, zero, prm, best, acc, nan, SF, 1, KD, KH, KW, FLIP)
    if SF == 4:
        stat = _lse(acc, best, nan)
    else:
        stat = acc
    if STORE_OUT:
        if SF == 2:
            val = acc
        elif SF == 3:
            val = _pow(acc, 1.0 / prm)
        else:
            val = stat / prm
        tl.store(o_ptr + out, val.to(o_ptr.dtype.element_ty), mask=mask)
    if STORE_STAT:
        tl.store(s_ptr + out, stat, mask=mask)


@triton.jit
def _semiconv_gather_kernel(g_ptr, s_ptr, x_ptr, k_ptr, gx_ptr, gk_ptr, C, D, H, W, O, Cg, Og, OD, OH, OW,
                            s0, s1, s2, p0, p1, p2, d0, d1, d2, ZD, ZH, ZW, zero_: tl.float64, prm_: tl.float64,
                            SF: tl.constexpr, NEED_IMG: tl.constexpr, NEED_KERNEL: tl.constexpr, BLOCK: tl.constexpr,
                            ACC: tl.constexpr, KD: tl.constexpr, KH: tl.constexpr, KW: tl.constexpr,
                            FLIP: tl.constexpr):
    """The smooth semifields' backward: BLOCK positions of one (b, c) channel's ZD x ZH x ZW span (the image and
    the padding its windows read, from (-p0, -p1, -p2)), each summing its taps' shares over every output window that
    reads it: output o = (position + padding - tap * dilation) / stride where that divides and lies in the output.
    Padding positions take the semifield's zero and add only to the kernel's gradient, as the windows read them."""
    zero, prm = tl.cast(zero_, ACC), tl.cast(prm_, ACC)
    per = ZD * ZH * ZW
    chunks = tl.cdiv(per, BLOCK)
    pid = tl.program_id(0)
    bc = pid // chunks
    r = (pid % chunks) * BLOCK + tl.arange(0, BLOCK)
    mask = r < per
    z = r // (ZH * ZW) - p0
    y = (r // ZW) % ZH - p1
    xx = r % ZW - p2
    b = bc // C
    ic = bc % C
    grp = ic // Cg
    c = ic % Cg
    inimg = mask & (z >= 0) & (z < D) & (y >= 0) & (y < H) & (xx >= 0) & (xx < W)
    chan = bc.to(tl.int64) * D * H * W
    off = (z * H + y) * W + xx  # within one channel: 32-bit (larger images are rejected)
    xv = tl.load(x_ptr + chan + off, mask=inimg, other=0.0)
    xv = tl.where(inimg, xv.to(ACC), zero)
    gx = tl.zeros([BLOCK], ACC)
    taps = KD * KH * KW
    for j in range(0, Og):
        oc = grp * Og + j
        obase = (b * O + oc).to(tl.int64) * OD * OH * OW
        kbase = (oc * Cg + c) * taps
        for kd in tl.static_range(KD):
            nz = z + p0 - kd * d0
            oz = nz // s0
            vz = mask & (nz >= 0) & (oz * s0 == nz) & (oz < OD)
            for kh in tl.static_range(KH):
                ny = y + p1 - kh * d1
                oy = ny // s1
                vzy = vz & (ny >= 0) & (oy * s1 == ny) & (oy < OH)
                for kw in tl.static_range(KW):
                    nx = xx + p2 - kw * d2
                    ox = nx // s2
                    valid = vzy & (nx >= 0) & (ox * s2 == nx) & (ox < OW)
                    tap = (kd * KH + kh) * KW + kw
                    if FLIP:
                        kt = kbase + (taps - 1 - tap)  # the kernel's index for this tap
                    else:
                        kt = kbase + tap
                    kv = tl.load(k_ptr + kt).to(ACC)
                    o = obase + (oz * OH + oy) * OW + ox
                    gv = tl.load(g_ptr + o, mask=valid, other=0.0).to(ACC)
                    a = _product(xv, kv, SF)
                    if SF == 2:
                        w = gv
                    elif SF == 3:  # d out / d sum of a^p, times d a^p / d a
                        sv = tl.load(s_ptr + o, mask=valid, other=1.0)
                        w = gv * ((1.0 / prm) * _pow(sv, 1.0 / prm - 1.0)) * (prm * _pow(a, prm - 1.0))
                    else:
                        sv = tl.load(s_ptr + o, mask=valid, other=0.0)
                        w = gv * tl.exp(prm * a - sv)
                    if SF == 4:
                        dx = w
                        dk = w
                    else:
                        dx = w * kv
                        dk = w * xv
                    if NEED_IMG:
                        gx += tl.where(valid, dx, 0.0)
                    if NEED_KERNEL:
                        tl.atomic_add(gk_ptr + kt, tl.sum(tl.where(valid, dk, 0.0), axis=0), sem="relaxed")
    if NEED_IMG:
        tl.store(gx_ptr + chan + off, gx.to(gx_ptr.dtype.element_ty), mask=inimg)


# -- max/min: output rows ---------------------------------------------------------------------
# A program serves ROWS rows of BW outputs of one (b, oc, od) output plane, RB rows at a time with one output column
# per lane (a dense call's forwards: of OCB output channels of one group at once, [OCB, RB, BW]): each tap is one load
# of the row segments shifted by the tap (neighbouring taps hit L1; a warp's load is 32 adjacent elements, which
# serves the OCB channels), one add and one max or min. MODE: FORWARD stores the output; SAVING the output and each
# output's first winner ``c * taps + tap`` (-1 where the window holds a NaN); SEARCH (the backward without saved
# winners) the winner, and with NEED_IMG adds the upstream gradient at it into the image's gradient (an atomic add);
# SAVED (the backward with them) reads the winners and adds. The kernel's gradient is then one pass over the winners
# (`_tropical_kernel_grad`: per program, a one-hot sum per window index, one atomic each) where a window has MAX_BINS
# indices or fewer; a larger window (a dense call's) would take a one-hot pass per MAX_BINS indices, so there the row
# kernel adds each output's upstream gradient at its winner's kernel entry itself (NEED_KERNEL: one atomic an output,
# spread over the O x Cg x taps entries, into COPIES copies of them by program).
FORWARD, SAVING, SEARCH, SAVED = 0, 1, 2, 3
ROWS, ROW_WIDTH, ROW_WARPS = 8, 256, 4
ROW_BLOCK = 256  # outputs a program computes at a time (RB x BW)
# windows of DENSE channels or more (dense calls): DENSE_BLOCK outputs at a time on DENSE_WARPS warps, the fastest of
# the semiconv sweep (benchmarks/kernels.py) for the dense benchmark sample on an H200; the depthwise calls (one
# channel a window) keep 256 on 4 (measured at 32 channels and at 1, not between;
# docs/lab/benchmarks-history.md#measurements-behind-the-code)
DENSE, DENSE_BLOCK, DENSE_WARPS = 8, 512, 8
# a dense call's backward row kernels (the winner search or the saved winners, with the gradients' atomics): outputs
# at a time, warps, registers a thread at most (--sweep semiconv: 256 on 4 at 48 registers made the dense sample's
# forward+backward 5% faster, its forward 5% slower, so the forward keeps DENSE_BLOCK on DENSE_WARPS)
DENSE_BWD = (256, 4, 48)
# a dense call's forwards compute DENSE_CHANNELS output channels of one group at once (a program's outputs times
# them): each load of an image row serves them all, where a program per channel loads it once each; registers a
# thread at most DENSE_REGS (--sweep semiconv on an H200: the dense sample's forward+backward 9% faster at 64 than at
# the compiler's choice, the saving forward's 104 with triton 3.6, though it spills 48 bytes a thread at 64)
DENSE_CHANNELS, DENSE_REGS = 4, 64
# the row kernels' registers a thread at most (Triton's maxnreg; None: the compiler's choice, 94 for the 3-D saving
# forward with triton 3.6, 20 warps a multiprocessor; it spills 64 bytes a thread at 64 and 152 at 48:
# scripts/kernel_resources.py)
ROW_REGS = None
MAX_BINS = 32  # window indices the kernel-gradient pass sums at a time, at most
# where the row kernels add the kernel's gradient (one atomic an output), they add into KERNEL_COPIES copies of it, a
# program into copy pid % KERNEL_COPIES, summed afterwards: a dense call's outputs all land on O x Cg x taps entries,
# and the programs of one output channel, adjacent in the grid, would otherwise contend for its few hundred entries;
# fewer copies where they would hold more than COPIES_ELEMENTS values (a large kernel's entries contend less, and its
# copies would cost memory and a sum)
KERNEL_COPIES, COPIES_ELEMENTS = 32, 2**22
GRAD_BLOCK = 256  # outputs per program of that pass
# that pass's warps: its one-hot sums are BINS x GRAD_BLOCK values a program, 64 a thread at 4 warps and 32 bins (95
# registers with triton 3.6, at most 20 warps a multiprocessor), 32 at 8 (47 registers; scripts/kernel_resources.py)
GRAD_WARPS = 8


@triton.jit
def _tropical_kernel(x_ptr, k_ptr, o_ptr, w_ptr, g_ptr, gx_ptr, gk_ptr, C, D, H, W, O, Cg, Og, OD, OH, OW, s0, s1, s2,
                     p0, p1, p2, d0, d1, d2, SF: tl.constexpr, MODE: tl.constexpr, NEED_IMG: tl.constexpr,
                     NEED_KERNEL: tl.constexpr, ROWS: tl.constexpr, RB: tl.constexpr, BW: tl.constexpr,
                     ACC: tl.constexpr, KD: tl.constexpr, KH: tl.constexpr, KW: tl.constexpr, FLIP: tl.constexpr,
                     COPIES: tl.constexpr, OCB: tl.constexpr):
    pid = tl.program_id(0)
    n_w = tl.cdiv(OW, BW)
    n_h = tl.cdiv(OH, ROWS)
    per = OD * n_h * n_w
    n_ob = tl.cdiv(Og, OCB)  # blocks of OCB output channels a group
    bo = pid // per  # (b, a group's block)
    rest = pid % per
    # scalar conditions join masks as tensors: the interpreter makes bool & bool ints
    od = tl.zeros([1, 1, 1], tl.int32) + rest // (n_h * n_w)
    oh0 = ((rest // n_w) % n_h) * ROWS
    ow = (rest % n_w) * BW + tl.arange(0, BW)[None, None, :]
    b = bo // (O // Og * n_ob)
    grp = (bo // n_ob) % (O // Og)
    j = (bo % n_ob) * OCB + tl.arange(0, OCB)[:, None, None]  # the block's output channels within their group
    oc = grp * Og + j
    taps = KD * KH * KW
    chan0 = (b * C + grp * Cg).to(tl.int64) * D * H * W
    if SF == 0:
        start = float("-inf")
    else:
        start = float("inf")
    for r0 in range(0, ROWS, RB):
        oh = oh0 + r0 + tl.arange(0, RB)[None, :, None]
        live = (ow < OW) & (oh < OH) & (j < Og)
        out = (b * O + oc).to(tl.int64) * OD * OH * OW + (od * OH + oh) * OW + ow  # [OCB, RB, BW]
        if MODE == 3:
            win = tl.load(w_ptr + out, mask=live, other=-1).to(tl.int32)
        else:
            best = tl.full([OCB, RB, BW], start, ACC)
            win = tl.full([OCB, RB, BW], -1, tl.int32)
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
                            # each of the block's output channels' entry; one load of the row serves them all
                            if FLIP:
                                kv = tl.load(k_ptr + (oc * Cg + c) * taps + (taps - 1 - tap), mask=j < Og).to(ACC)
                            else:
                                kv = tl.load(k_ptr + (oc * Cg + c) * taps + tap, mask=j < Og).to(ACC)
                            # padding reads the semifield's zero
                            xv = tl.load(row + ix, mask=row_in & (ix >= 0) & (ix < W), other=start).to(ACC)
                            if SF == 0:
                                a = xv + kv
                            else:
                                a = xv - kv
                            # the first winner: a strict comparison in (c, tap) order keeps the first; once a NaN
                            # made best NaN no later tap wins, and the window gets no gradient
                            if SF == 0:
                                if MODE != 0:
                                    win = tl.where(a > best, c * taps + tap, win)
                                best = tl.maximum(best, a, propagate_nan=tl.PropagateNan.ALL)
                            else:
                                if MODE != 0:
                                    win = tl.where(a < best, c * taps + tap, win)
                                best = tl.minimum(best, a, propagate_nan=tl.PropagateNan.ALL)
            if MODE != 0:
                win = tl.where(best != best, -1, tl.maximum(win, 0))  # no strict win: all were the zero, tap 0 wins
                tl.store(w_ptr + out, win.to(w_ptr.dtype.element_ty), mask=live)
            if MODE < 2:
                tl.store(o_ptr + out, best.to(o_ptr.dtype.element_ty), mask=live)
        if NEED_IMG or NEED_KERNEL:
            won = live & (win >= 0)
            g = tl.load(g_ptr + out, mask=won, other=0.0).to(ACC)
            t = win % taps
            if NEED_IMG:
                iz = od * s0 - p0 + (t // (KH * KW)) * d0
                iy = oh * s1 - p1 + ((t // KW) % KH) * d1
                ix = ow * s2 - p2 + (t % KW) * d2
                hit = won & (iz >= 0) & (iz < D) & (iy >= 0) & (iy < H) & (ix >= 0) & (ix < W)
                tl.atomic_add(gx_ptr + chan0 + (win // taps) * D * H * W + (iz * H + iy) * W + ix, g, mask=hit,
                              sem="relaxed")
            if NEED_KERNEL:  # windows of more than MAX_BINS indices: one atomic an output (`_row_layout`)
                kt, g = _kernel_share(win, g, taps, SF, FLIP)
                copy = (pid % COPIES).to(tl.int64) * O * Cg * taps  # the program's copy (KERNEL_COPIES)
                tl.atomic_add(gk_ptr + copy + oc * Cg * taps + kt, g, mask=won, sem="relaxed")


@triton.jit
def _kernel_share(win, g, taps, SF: tl.constexpr, FLIP: tl.constexpr):
    """Where an upstream gradient ``g`` won by window index ``win`` (c * taps + tap) goes in the kernel's gradient,
    and what it adds there: conv (FLIP) reads kernel tap taps - 1 - tap; min's product x - k passes -g."""
    if FLIP:
        t = win % taps
        win = (win - t) + (taps - 1 - t)
    if SF == 1:
        g = -g
    return win, g


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
        kt, s = _kernel_share(idx, tl.sum(acc, axis=1), TAPS, SF, FLIP)
        tl.atomic_add(gk_ptr + (bo % O) * Cg * TAPS + kt, s, mask=idx < Cg * TAPS, sem="relaxed")


class _Rows(NamedTuple):
    """max/min's row kernel for one call: its grids (the forwards', the backwards') and a Bound per MODE (the
    backwards' by what they add: NEED_IMG, NEED_KERNEL), the kernel-gradient pass's grid and Bound, and the winners'
    dtype."""
    grid: tuple
    bwd_grid: tuple  # the backward row kernels' (a dense call's take a layout of their own)
    forward: Bound
    saving: Bound
    search: dict  # by (NEED_IMG, NEED_KERNEL)
    saved: dict  # by (NEED_IMG, NEED_KERNEL)
    grad_grid: tuple
    grad: Bound | None  # None: the row kernels add the kernel's gradient (a window of more than MAX_BINS indices)
    winner: torch.dtype
    copies: int  # the copies of the kernel's gradient the row kernels add into (KERNEL_COPIES; 1 where they add none)


class _Smooth(NamedTuple):
    """linear, root and log for one call: the forward's grid and Bounds (the output; the output and the statistic;
    the statistic alone, None for linear, which needs none), the positions per channel the gather serves (`_span`),
    and its grid and Bounds by (NEED_IMG, NEED_KERNEL)."""
    grid: tuple
    forward: Bound
    saving: Bound | None
    stats: Bound | None
    span: tuple[int, int, int]
    gather_grid: tuple
    gather: dict


class _Call(NamedTuple):
    """What the launchers need of a call, fixed by its shapes, arguments and dtype and the GPU's multiprocessors
    (`_call`): the kernels bound to the lifted call's sizes (`lift_plan`)."""
    output_shape: tuple
    rows: _Rows | None  # max/min
    smooth: _Smooth | None  # linear, root, log


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
    if a.code in (MAX, MIN):
        return _Call(a.output_shape, _row_layout(a, img5, kernel5, dtype, sms), None)
    return _Call(a.output_shape, None, _smooth_layout(a, img5, kernel5, dtype))


def _sizes(a, img_shape, kernel_shape) -> dict:
    """The sizes every semiconv kernel but the gradient pass takes after its tensors, by name, the kernel's spatial
    sizes and the semifield."""
    (_, C, D, H, W), (O, Cg, KD, KH, KW) = img_shape, kernel_shape
    (OD, OH, OW), (s0, s1, s2), (p0, p1, p2), (d0, d1, d2) = a.out_size, a.stride, a.pad_begin, a.dilation
    return dict(C=C, D=D, H=H, W=W, O=O, Cg=Cg, Og=O // a.groups, OD=OD, OH=OH, OW=OW, s0=s0, s1=s1, s2=s2, p0=p0,
                p1=p1, p2=p2, d0=d0, d1=d1, d2=d2, KD=KD, KH=KH, KW=KW, FLIP=a.flip, SF=a.code)


def _row_layout(a, img_shape, kernel_shape, dtype, sms) -> _Rows:
    """max/min's kernels for a lifted call: RB rows of BW columns at a time (BW a power of two up to ROW_WIDTH, RB
    up to ROW_BLOCK / BW, or DENSE_BLOCK / BW for a dense call), ROWS rows a program (a multiple of RB)."""
    B, O = img_shape[0], kernel_shape[0]
    OD, OH, OW = a.out_size
    dense = kernel_shape[1] >= DENSE
    window, planes, per = math.prod(kernel_shape[1:]), B * O, OD * OH * OW
    atomic = window > MAX_BINS  # the row kernels add the kernel's gradient
    copies = max(1, min(KERNEL_COPIES, COPIES_ELEMENTS // (O * window))) if atomic else 1

    def layout(block, warps, regs, ocb=1):  # the grid and the row kernels' launch settings
        bw = min(next_power_of_2(OW), ROW_WIDTH)
        rb = min(next_power_of_2(OH), max(1, block // bw))
        rows = max(rb, ROWS // rb * rb)
        blocks = a.groups * cdiv(O // a.groups, ocb)  # of ocb output channels, within a group each
        return (B * blocks * OD * cdiv(OH, rows) * cdiv(OW, bw),), dict(
            _sizes(a, img_shape, kernel_shape), ACC=acc_type(dtype), ROWS=rows, RB=rb, BW=bw, COPIES=copies, OCB=ocb,
            num_warps=warps, **({"maxnreg": regs} if regs else {}))

    if dense:
        grid, fixed = layout(DENSE_BLOCK, DENSE_WARPS, DENSE_REGS, min(DENSE_CHANNELS, next_power_of_2(O // a.groups)))
        bwd_grid, bwd = layout(*DENSE_BWD)
    else:
        grid, fixed = layout(ROW_BLOCK, ROW_WARPS, ROW_REGS)
        bwd_grid, bwd = grid, fixed
    split = max(1, min(cdiv(per, GRAD_BLOCK), cdiv(4 * sms, max(planes, 1))))  # no planes: an empty batch
    grad = Bound(_tropical_kernel_grad, O=O, Cg=kernel_shape[1], per=per, split=split, SF=a.code, BLOCK=GRAD_BLOCK,
                 BINS=min(MAX_BINS, next_power_of_2(window)), ACC=acc_type(dtype),
                 TAPS=math.prod(kernel_shape[2:]), FLIP=a.flip, num_warps=GRAD_WARPS)
    both = [(img, ker) for img in (False, True) for ker in ((False, True) if atomic else (False,))]
    return _Rows(grid, bwd_grid,
                 Bound(_tropical_kernel, MODE=FORWARD, NEED_IMG=False, NEED_KERNEL=False, **fixed),
                 Bound(_tropical_kernel, MODE=SAVING, NEED_IMG=False, NEED_KERNEL=False, **fixed),
                 {n: Bound(_tropical_kernel, MODE=SEARCH, NEED_IMG=n[0], NEED_KERNEL=n[1], **bwd) for n in both},
                 {n: Bound(_tropical_kernel, MODE=SAVED, NEED_IMG=n[0], NEED_KERNEL=n[1], **bwd) for n in both},
                 (planes * split,), None if atomic else grad, _winner_dtype(window), copies)


def _span(a, img_shape, kernel_shape) -> tuple[int, int, int]:
    """Per spatial dim, the positions the gather serves from -padding: the image and every padding position a
    window reads."""
    return tuple(max(n + p, (o - 1) * s + (k - 1) * d + 1) for n, p, o, s, k, d in
                 zip(img_shape[2:], a.pad_begin, a.out_size, a.stride, kernel_shape[2:], a.dilation))


def _smooth_layout(a, img_shape, kernel_shape, dtype) -> _Smooth:
    """linear's, root's and log's kernels for a lifted call."""
    B, C, O = img_shape[0], img_shape[1], kernel_shape[0]
    OD, OH, OW = a.out_size
    fixed = dict(_sizes(a, img_shape, kernel_shape), zero_=zero_of(a.semifield, a.param),
                 prm_=a.param, BLOCK=BLOCK, ACC=acc_type(dtype), num_warps=NUM_WARPS)
    stat = a.code != LINEAR
    ZD, ZH, ZW = _span(a, img_shape, kernel_shape)
    return _Smooth((B * O * cdiv(OD * OH * OW, BLOCK),),
                   Bound(_semiconv_forward_kernel, STORE_OUT=True, STORE_STAT=False, **fixed),
                   Bound(_semiconv_forward_kernel, STORE_OUT=True, STORE_STAT=True, **fixed) if stat else None,
                   Bound(_semiconv_forward_kernel, STORE_OUT=False, STORE_STAT=True, **fixed) if stat else None,
                   (ZD, ZH, ZW), (B * C * cdiv(ZD * ZH * ZW, BLOCK),),
                   {(img, ker): Bound(_semiconv_gather_kernel, NEED_IMG=img, NEED_KERNEL=ker, ZD=ZD, ZH=ZH, ZW=ZW,
                                      **{**fixed, "num_warps": GATHER_WARPS})
                    for img in (False, True) for ker in (False, True)})


def _winner_dtype(window: int) -> torch.dtype:
    """The smallest integer type holding a window index (c * taps + tap) and -1."""
    return torch.int8 if window < 2**7 else torch.int16 if window < 2**15 else torch.int32


def not_supported_reasons(args) -> list[str]:
    if math.prod(args[0].shape[2:]) >= 2**31:
        return ["an image channel of 2^31 elements or more (offsets within a channel are 32-bit here)"]
    smooth = _call(*args).smooth  # the launchers' own layout, cached for the call
    if smooth is not None and math.prod(smooth.span) >= 2**31:
        return ["an image channel with the padding its windows read of 2^31 positions or more (positions are 32-bit "
                "here)"]
    return []


def forward(img, kernel, semifield, stride, padding, dilation, groups, kind, group_broadcasting=False, saving=False):
    """The output; with ``saving`` (`Impl.can` "saves": a forward whose backward follows) ``(output, saved)``:
    max/min's first winners, root's and log's statistics, None for linear."""
    call = _call(img, kernel, semifield, stride, padding, dilation, groups, kind, group_broadcasting)
    out = torch.empty(call.output_shape, dtype=img.dtype, device=img.device)
    saved = None
    if out.numel() == 0:
        return (out, saved) if saving else out
    x, k = img.contiguous(), kernel.contiguous()
    if call.rows is not None:
        if saving:
            saved = torch.empty(out.shape, dtype=call.rows.winner, device=img.device)
            launch(call.rows.saving, call.rows.grid, x, k, out, saved, x, x, x)
        else:
            launch(call.rows.forward, call.rows.grid, x, k, out, x, x, x, x)
    elif saving and call.smooth.saving is not None:
        saved = torch.empty(out.shape, dtype=accumulation_dtype(img.dtype), device=img.device)
        launch(call.smooth.saving, call.smooth.grid, x, k, out, saved)
    else:
        launch(call.smooth.forward, call.smooth.grid, x, k, out, x)
    return (out, saved) if saving else out


def backward(grad, img, kernel, semifield, stride, padding, dilation, groups, kind, group_broadcasting, needs,
             saved=None):
    """The gradients; ``saved``: the saving forward's winners or statistics of this call (the backward then does no
    search and computes no statistic)."""
    call = _call(img, kernel, semifield, stride, padding, dilation, groups, kind, group_broadcasting)
    x, k, g = img.contiguous(), kernel.contiguous(), grad.contiguous()
    acc = accumulation_dtype(img.dtype)
    gk = torch.zeros_like(kernel, dtype=acc, memory_format=torch.contiguous_format)
    if not g.numel() or not (needs[0] or needs[1]):
        return [torch.zeros_like(img) if needs[0] else None, gk.to(kernel.dtype) if needs[1] else None]
    rows, smooth = call.rows, call.smooth
    if rows is not None:
        gx = torch.zeros_like(img, dtype=acc, memory_format=torch.contiguous_format)
        in_rows = (bool(needs[0]), bool(needs[1]) and rows.grad is None)  # what the row kernel adds
        gks = gk.new_zeros((rows.copies, *gk.shape)) if in_rows[1] else gk  # its copies (KERNEL_COPIES)
        if saved is None:
            saved = torch.empty(g.shape, dtype=rows.winner, device=img.device)  # each output's (c, tap) winner
            launch(rows.search[in_rows], rows.bwd_grid, x, k, saved, saved, g, gx, gks)
        elif any(in_rows):
            launch(rows.saved[in_rows], rows.bwd_grid, x, k, saved, saved, g, gx, gks)
        if in_rows[1]:
            gk = gks.sum(0)
        if needs[1] and rows.grad is not None:
            launch(rows.grad, rows.grad_grid, saved, g, gk)
        return [gx.to(img.dtype) if needs[0] else None, gk.to(kernel.dtype) if needs[1] else None]
    if saved is None and smooth.stats is not None:
        saved = torch.empty(g.shape, dtype=acc, device=img.device)
        launch(smooth.stats, smooth.grid, x, k, saved, saved)
    gx = torch.empty_like(img, memory_format=torch.contiguous_format) if needs[0] else x  # every element written
    launch(smooth.gather[bool(needs[0]), bool(needs[1])], smooth.gather_grid, g, g if saved is None else saved, x, k,
           gx, gk)
    return [gx if needs[0] else None, gk.to(kernel.dtype) if needs[1] else None]
