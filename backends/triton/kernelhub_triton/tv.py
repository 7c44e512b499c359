"""Total variation of ``[..., D, H, W]`` volumes (docs/ops.md): forward and analytic backward.

Each program streams one ``[BH, BW]`` tile of the (H, W) plane down a chunk of D planes,
carrying the current and next planes in registers and requesting the plane after them one
step ahead (two DRAM loads in flight per program), so every voxel is read from DRAM once
(plus one halo plane per chunk); the row and column neighbours are shifted loads of the
plane just read, which hit L1 or L2. The backward carries each voxel's D-difference term
(its sign for L1) to the next plane instead of recomputing it; the iso backward also carries the next
plane's (h-1, w) and (h, w-1) neighbours, which its corners there read, so each step reads six shifted values,
not eight. The three losses are one kernel with the loss as a compile-time ``MODE``.

The forward's reduction is deterministic: each program writes its partial sums to its own row
of an array, and the last program to finish (an integer counter, `reduction`) adds the rows
up in a fixed order and writes the result, in the same launch (no floating-point atomics, no
second kernel), so a result is bitwise identical run to run.
"""

from __future__ import annotations

import math

import torch
import triton
import triton.language as tl

from kernelhub import accumulation_dtype
from kernelhub.spec import layout_cache
from kernelhub_triton._launch import Bound, acc_type, cdiv, launch, next_power_of_2, reduction, sm_count

__all__ = ["l1_forward", "l1_backward", "sq_forward", "sq_backward", "iso_forward", "iso_backward",
           "not_supported_reasons"]

L1, SQ, ISO = 0, 1, 2
# Launch configuration by loss: (voxels per tile, warps, programs per multiprocessor for the forward and for the
# backward, the tile's widest row). A tile is as wide as the plane up to its widest row (a power of two) and as many
# rows high as its voxels then fill; D is cut into as many chunks as fill whole waves of that many programs per
# multiprocessor (`_chunks`). Iso, whose kernels hold more values a voxel: 512 voxels, 2 a thread at 8 warps, and the
# programs its registers let a multiprocessor hold (an H200: 6 of the forward's 40 registers a thread, 3 of the
# backward's 76). L1 and squared: 512 voxels, 4 a thread at 4 warps, and 35, a knob rather than a resident count,
# which keeps the chunks measured best at 256^3 and 512^3. Timed at every benchmark shape on an H200
# (benchmarks/kernels.py's sweep; docs/lab/benchmarks-history.md#measurements-behind-the-code).
LAUNCH = {L1: (512, 4, 35, 35, 256), SQ: (512, 4, 35, 35, 256), ISO: (512, 8, 6, 3, 256)}
# The backward's registers a thread at most (Triton's maxnreg; None: the compiler's choice). Iso's backward takes 76
# with triton 3.6; at 64 it spills 40 bytes a thread at 16x1024^2, none at 256^3 (scripts/kernel_resources.py), and
# --sweep iso measured it 5% faster at 512^3, even at the other sizes, with the same programs (48 with 5 programs a
# multiprocessor was slower). Not under torch.compile, whose Triton wrapper takes no such option.
BWD_REGS = {L1: None, SQ: None, ISO: 64}
# The L1 and squared forwards on volumes of up to SMALL voxels: SMALL_FWD_PER_SM programs a multiprocessor, fewer and
# longer D chunks (an H200 at 256^3 and 16x1024^2: 10-13% faster than 35, which 512^3 keeps: 8 costs it 7%;
# docs/lab/benchmarks-history.md, "The TV forwards' programs").
SMALL, SMALL_FWD_PER_SM = 2**25, 8
FINISH = 1024  # partial rows the last program adds per step


@triton.jit
def _sign(x):
    # torch.sign, which abs's gradient uses, for finite x: (x > 0) - (x < 0)
    return (x > 0).to(x.dtype) - (x < 0).to(x.dtype)


@triton.jit
def _rnorm(s, ACC: tl.constexpr):
    """1 / sqrt(s): the hardware reciprocal square root in float32; in float64, Triton's sqrt (IEEE)."""
    if ACC == tl.float64:
        return 1.0 / tl.sqrt(s)
    else:
        return tl.rsqrt(s)


@triton.jit
def _tile(pid, tiles, chunks, H, W, d_chunk, D, BH: tl.constexpr, BW: tl.constexpr):
    """A flat program id -> batch item, plane range [d0, d1), in-plane offsets and masks."""
    n_tw = tl.cdiv(W, BW)
    t = pid % tiles
    rest = pid // tiles
    d0 = (rest % chunks) * d_chunk
    b = (rest // chunks).to(tl.int64)
    h = (t // n_tw) * BH + tl.arange(0, BH)
    w = (t % n_tw) * BW + tl.arange(0, BW)
    hw = h[:, None] * W + w[None, :]
    inside = (h < H)[:, None] & (w < W)[None, :]
    has_h = inside & (h + 1 < H)[:, None]  # has a next row / column
    has_w = inside & (w + 1 < W)[None, :]
    has_hm = inside & (h >= 1)[:, None]    # has a previous row / column
    has_wm = inside & (w >= 1)[None, :]
    return b, d0, tl.minimum(d0 + d_chunk, D), hw, inside, has_h, has_w, has_hm, has_wm


@triton.jit
def _plane(x_ptr, b, d, D, plane, hw, inside, last, zero, ACC: tl.constexpr):
    """Plane ``d`` of item ``b`` at the tile, where ``d <= last`` (0 elsewhere)."""
    return tl.load(x_ptr + (b * D + d) * plane + hw, mask=inside & (zero + d <= last), other=0.0).to(ACC)


@triton.jit
def _tv_forward_kernel(
    x_ptr,      # [B, D, H, W] contiguous volume
    part_ptr,   # [programs, NOUT] partial sums, one row per program
    out_ptr,    # [NOUT] the result: the partials' sum / div64 (WEIGHTED: [], their sum weighted by w_ptr's)
    cnt_ptr,    # int32 counter, 0 at launch; the last program resets it
    w_ptr,      # WEIGHTED: [NOUT] a weighted handle's weights (else not read)
    div64: tl.float64,  # ISO: the corners, which the sum is divided by (1 otherwise), in ACC
    eps64: tl.float64,  # ISO: added under the square root (floats go positionally: `_launch._key`)
    D, H, W,    # volume dims
    plane,      # H * W
    tiles,      # (H, W) tiles per plane
    chunks,     # D chunks per batch item
    d_chunk,    # planes per chunk
    MODE: tl.constexpr, NOUT: tl.constexpr, BH: tl.constexpr, BW: tl.constexpr, ACC: tl.constexpr,
    FINISH: tl.constexpr, WEIGHTED: tl.constexpr,
):
    pid = tl.program_id(0)
    b, d0, d1, hw, inside, has_h, has_w, _, _ = _tile(pid, tiles, chunks, H, W, d_chunk, D, BH, BW)
    # scalar conditions join masks as "zero + x": Triton's interpreter turns bool & scalar-bool into ints
    zero = tl.zeros([BH, BW], tl.int32)
    eps = tl.full([], eps64, ACC)
    # planes d0 .. d1 are read, d1 only as the last one's neighbour; the next plane but one is
    # requested a step ahead, so each program keeps two DRAM plane loads in flight
    last = tl.minimum(d1, D - 1)
    cur = _plane(x_ptr, b, d0, D, plane, hw, inside, last, zero, ACC)
    nxt = _plane(x_ptr, b, d0 + 1, D, plane, hw, inside, last, zero, ACC)
    acc_d = tl.zeros([BH, BW], ACC)
    acc_h = tl.zeros([BH, BW], ACC)
    acc_w = tl.zeros([BH, BW], ACC)
    for d in range(d0, d1):
        ahead = _plane(x_ptr, b, d + 2, D, plane, hw, inside, last, zero, ACC)
        p = x_ptr + (b * D + d) * plane + hw
        has_d = inside & (zero + d + 1 < D)
        dd = tl.where(has_d, nxt - cur, 0.0)
        dh = tl.where(has_h, tl.load(p + W, mask=has_h, other=0.0).to(ACC) - cur, 0.0)
        dw = tl.where(has_w, tl.load(p + 1, mask=has_w, other=0.0).to(ACC) - cur, 0.0)
        if MODE == 0:
            acc_d += tl.abs(dd)
            acc_h += tl.abs(dh)
            acc_w += tl.abs(dw)
        elif MODE == 1:
            acc_d += dd * dd + dh * dh + dw * dw
        else:
            corner = has_d & has_h & has_w
            acc_d += tl.where(corner, tl.sqrt(dd * dd + dh * dh + dw * dw + eps), 0.0)
        cur = nxt
        nxt = ahead
    out = part_ptr + pid.to(tl.int64) * NOUT
    tl.store(out, tl.sum(tl.sum(acc_d, axis=1), axis=0))
    if MODE == 0:
        tl.store(out + 1, tl.sum(tl.sum(acc_h, axis=1), axis=0))
        tl.store(out + 2, tl.sum(tl.sum(acc_w, axis=1), axis=0))
    # the last program to finish (acq_rel: it sees every other program's partials) sums them in a fixed
    # order and resets the counter for the next launch
    programs = tl.num_programs(0)
    if tl.atomic_add(cnt_ptr, 1, sem="acq_rel") == programs - 1:
        weighted = tl.zeros([], ACC)
        for k in tl.static_range(NOUT):
            total = tl.zeros([FINISH], ACC)
            for start in range(0, programs, FINISH):
                i = start + tl.arange(0, FINISH)
                total += tl.load(part_ptr + i * NOUT + k, mask=i < programs, other=0.0, cache_modifier=".cg")
            result = tl.sum(total, axis=0) / tl.full([], div64, ACC)
            if WEIGHTED:
                weighted += result * tl.load(w_ptr + k).to(ACC)
            else:
                tl.store(out_ptr + k, result)
        if WEIGHTED:
            tl.store(out_ptr, weighted)
        tl.store(cnt_ptr, 0)


@triton.jit
def _iso_term(x, xd, xh, xw, mask, eps, ACC: tl.constexpr):
    """For the corners in ``mask``: (dd, dh, dw) / sqrt(dd^2 + dh^2 + dw^2 + eps); 0 elsewhere."""
    dd = xd - x
    dh = xh - x
    dw = xw - x
    r = tl.where(mask, _rnorm(dd * dd + dh * dh + dw * dw + eps, ACC), 0.0)
    return dd * r, dh * r, dw * r


@triton.jit
def _tv_backward_kernel(
    x_ptr,      # [B, D, H, W] contiguous volume
    g_ptr,      # upstream gradient: [3] for L1, [] otherwise (WEIGHTED: [], the weighted sum's)
    w_ptr,      # WEIGHTED: [3] for L1, [] otherwise, a weighted handle's weights (else not read)
    out_ptr,    # [B, D, H, W] gradient, the volume's dtype
    eps64: tl.float64,    # ISO: added under the square root (floats go positionally: `_launch._key`)
    scale64: tl.float64,  # SQ: 2; ISO: 1 / number of corners
    D, H, W, plane, tiles, chunks, d_chunk,  # as in the forward
    MODE: tl.constexpr, BH: tl.constexpr, BW: tl.constexpr, ACC: tl.constexpr, WEIGHTED: tl.constexpr,
):
    pid = tl.program_id(0)
    b, d0, d1, hw, inside, has_h, has_w, has_hm, has_wm = _tile(pid, tiles, chunks, H, W, d_chunk, D, BH, BW)
    zero = tl.zeros([BH, BW], tl.int32)  # see the forward
    eps = tl.full([], eps64, ACC)
    gu = tl.load(g_ptr).to(ACC)
    if WEIGHTED:  # each output element's upstream gradient: its weight times the weighted sum's
        g0 = gu * tl.load(w_ptr).to(ACC)
        if MODE == 0:
            g1 = gu * tl.load(w_ptr + 1).to(ACC)
            g2 = gu * tl.load(w_ptr + 2).to(ACC)
    else:
        g0 = gu
        if MODE == 0:
            g1 = tl.load(g_ptr + 1).to(ACC)
            g2 = tl.load(g_ptr + 2).to(ACC)
    if MODE != 0:
        g0 = g0 * tl.full([], scale64, ACC)
    last = tl.minimum(d1, D - 1)  # as in the forward: plane d + 2 is requested a step ahead
    p0 = x_ptr + (b * D + d0) * plane + hw
    has_dm = inside & (zero + d0 >= 1)
    prv = tl.load(p0 - plane, mask=has_dm, other=0.0).to(ACC)
    cur = _plane(x_ptr, b, d0, D, plane, hw, inside, last, zero, ACC)
    nxt = _plane(x_ptr, b, d0 + 1, D, plane, hw, inside, last, zero, ACC)
    # the D term of the voxel before: L1 carries sign(cur - prv), SQ cur - prv, ISO the
    # D component of corner (d - 1, h, w)
    if MODE == 0:
        carry = _sign(tl.where(has_dm, cur - prv, 0.0))
    elif MODE == 1:
        carry = tl.where(has_dm, cur - prv, 0.0)
    else:
        c_prev = has_h & has_w & has_dm
        carry, _, _ = _iso_term(prv, cur, tl.load(p0 - plane + W, mask=c_prev, other=0.0).to(ACC),
                                tl.load(p0 - plane + 1, mask=c_prev, other=0.0).to(ACC), c_prev, eps, ACC)
        # x(d, h-1, w) and x(d, h, w-1): each step reads the next plane's for its corners and carries them on
        up = tl.load(p0 - W, mask=has_hm & has_w, other=0.0).to(ACC)
        left = tl.load(p0 - 1, mask=has_h & has_wm, other=0.0).to(ACC)
    for d in range(d0, d1):
        ahead = _plane(x_ptr, b, d + 2, D, plane, hw, inside, last, zero, ACC)
        p = x_ptr + (b * D + d) * plane + hw
        has_d = inside & (zero + d + 1 < D)
        xh = tl.load(p + W, mask=has_h, other=0.0).to(ACC)
        xw = tl.load(p + 1, mask=has_w, other=0.0).to(ACC)
        if MODE == 2:
            # corners (d, h, w), (d, h-1, w) and (d, h, w-1) touch this voxel; (d-1, h, w) is carried
            c0 = has_d & has_h & has_w
            td, th, tw = _iso_term(cur, nxt, xh, xw, c0, eps, ACC)
            grad = carry - td - th - tw
            carry = td
            c_h = has_d & has_hm & has_w
            up_next = tl.load(p + plane - W, mask=c_h, other=0.0).to(ACC)
            _, th, _ = _iso_term(tl.where(c_h, up, 0.0), up_next, cur,
                                 tl.load(p - W + 1, mask=c_h, other=0.0).to(ACC), c_h, eps, ACC)
            c_w = has_d & has_h & has_wm
            left_next = tl.load(p + plane - 1, mask=c_w, other=0.0).to(ACC)
            _, _, tw = _iso_term(tl.where(c_w, left, 0.0), left_next,
                                 tl.load(p + W - 1, mask=c_w, other=0.0).to(ACC), cur, c_w, eps, ACC)
            grad = (grad + th + tw) * g0
            up = up_next  # x(d+1, h-1, w), read wherever step d + 1's corner (d+1, h-1, w) is
            left = left_next
        else:
            xhm = tl.load(p - W, mask=has_hm, other=0.0).to(ACC)
            xwm = tl.load(p - 1, mask=has_wm, other=0.0).to(ACC)
            fwd_d = tl.where(has_d, nxt - cur, 0.0)
            back_h = tl.where(has_hm, cur - xhm, 0.0)
            fwd_h = tl.where(has_h, xh - cur, 0.0)
            back_w = tl.where(has_wm, cur - xwm, 0.0)
            fwd_w = tl.where(has_w, xw - cur, 0.0)
            if MODE == 0:
                s_d = _sign(fwd_d)
                grad = g0 * (carry - s_d) + g1 * (_sign(back_h) - _sign(fwd_h)) + g2 * (_sign(back_w) - _sign(fwd_w))
                carry = s_d
            else:
                grad = g0 * ((carry - fwd_d) + (back_h - fwd_h) + (back_w - fwd_w))
                carry = fwd_d
        tl.store(out_ptr + (b * D + d) * plane + hw, grad.to(out_ptr.dtype.element_ty), mask=inside)
        cur = nxt
        nxt = ahead


# -- launchers ---------------------------------------------------------------------------

def _chunks(D: int, items: int, slots: int) -> tuple[int, int]:
    """(chunks, planes per chunk): D cut so that ``items`` (tiles of all batch items) times the chunks fill whole
    waves of ``slots`` programs (resident at once): the fewest waves, up to 4, that the programs fill to 87% or more,
    else the best filled. A last wave a third full leaves the machine two thirds idle for a program's whole time (TV
    iso's forward at 256^3 took 1.45 waves before; docs/lab/benchmarks-history.md has the times)."""
    best = (0.0, 1, D)
    for waves in range(1, 5):
        chunks = min(D, max(1, waves * slots // items))
        d_chunk = cdiv(D, chunks)
        chunks = cdiv(D, d_chunk)
        programs = items * chunks
        fill = programs / (cdiv(programs, slots) * slots)
        if fill >= 0.87:
            return chunks, d_chunk
        best = max(best, (fill, chunks, d_chunk))
    return best[1], best[2]


@layout_cache(maxsize=256)
def _layout(shape: tuple, sms: int, mode: int, dtype: torch.dtype,
            weighted: bool) -> tuple[int, Bound, int, Bound, int]:
    """The forward's programs and kernel, the backward's programs and kernel, bound to the sizes (tile shape, D
    chunking) and constants, and the corners (the iso mean's divisor) for ``dtype`` volumes of ``shape``
    ``[..., D, H, W]`` (the leading dims one batch); ``weighted``: the kernels that take a weighted handle's
    weights."""
    D, H, W = shape[-3:]
    B = math.prod(shape[:-3])
    tile, warps, fwd_per_sm, bwd_per_sm, row = LAUNCH[mode]
    if mode != ISO and B * D * H * W <= SMALL:
        fwd_per_sm = SMALL_FWD_PER_SM
    bw = min(next_power_of_2(W), row)
    bh = min(next_power_of_2(H), max(1, tile // bw))
    tiles = cdiv(H, bh) * cdiv(W, bw)
    common = dict(D=D, H=H, W=W, plane=H * W, tiles=tiles, MODE=mode, BH=bh, BW=bw, ACC=acc_type(dtype),
                  WEIGHTED=weighted, num_warps=warps)

    def chunked(per_sm: int) -> tuple[int, dict]:
        chunks, d_chunk = _chunks(D, B * tiles, per_sm * sms)
        return B * tiles * chunks, dict(common, chunks=chunks, d_chunk=d_chunk)

    fwd_programs, fwd = chunked(fwd_per_sm)
    bwd_programs, bwd = chunked(bwd_per_sm)
    if BWD_REGS[mode]:
        bwd["maxnreg"] = BWD_REGS[mode]
    return (fwd_programs, Bound(_tv_forward_kernel, NOUT=3 if mode == L1 else 1, FINISH=FINISH, **fwd),
            bwd_programs, Bound(_tv_backward_kernel, **bwd), B * (D - 1) * (H - 1) * (W - 1))


def _forward(volume: torch.Tensor, mode: int, eps: float = 0.0, weights: torch.Tensor | None = None) -> torch.Tensor:
    """The op's output; with ``weights`` (a weighted handle's, `Impl.can` "weighted") its weighted sum, 0-d."""
    x = volume.contiguous()  # the kernel indexes it as [B, D, H, W] from its pointer: no batched view needed
    dtype = accumulation_dtype(volume.dtype)  # the specs' output dtype
    out = torch.empty((3,) if mode == L1 and weights is None else (), dtype=dtype, device=volume.device)
    if x.numel() == 0 or (mode == ISO and min(x.shape[-3:]) < 2):
        return out.zero_()
    programs, kernel, _, _, corners = _layout(tuple(x.shape), sm_count(x), mode, x.dtype, weights is not None)
    partial, count = reduction(x, programs * (3 if mode == L1 else 1), dtype)  # [programs, NOUT]: the last sums
    launch(kernel, (programs,), x, partial, out, count, out if weights is None else weights.contiguous(),
           float(corners) if mode == ISO else 1.0, float(eps))
    return out


def _backward(grad: torch.Tensor, volume: torch.Tensor, mode: int, eps: float = 0.0,
              weights: torch.Tensor | None = None) -> torch.Tensor:
    """The volume's gradient; with ``weights``, for the weighted sum's 0-d upstream gradient ``grad``."""
    x = volume.contiguous()
    out = torch.empty_like(x)
    if x.numel() == 0 or (mode == ISO and min(x.shape[-3:]) < 2):
        return out.zero_()
    _, _, programs, kernel, corners = _layout(tuple(x.shape), sm_count(x), mode, x.dtype, weights is not None)
    scale = 1.0 / corners if mode == ISO else 2.0 if mode == SQ else 1.0
    launch(kernel, (programs,), x, grad.contiguous(), grad if weights is None else weights.contiguous(), out,
           float(eps), scale)
    return out


# -- what the plugin registers -----------------------------------------------------------

def l1_forward(volume: torch.Tensor, weights: torch.Tensor | None = None) -> torch.Tensor:
    return _forward(volume, L1, 0.0, weights)


def l1_backward(grad: torch.Tensor, volume: torch.Tensor, needs, weights: torch.Tensor | None = None) -> list:
    return [_backward(grad, volume, L1, 0.0, weights) if needs[0] else None]


def sq_forward(volume: torch.Tensor, weights: torch.Tensor | None = None) -> torch.Tensor:
    return _forward(volume, SQ, 0.0, weights)


def sq_backward(grad: torch.Tensor, volume: torch.Tensor, needs, weights: torch.Tensor | None = None) -> list:
    return [_backward(grad, volume, SQ, 0.0, weights) if needs[0] else None]


def iso_forward(volume: torch.Tensor, eps: float, weights: torch.Tensor | None = None) -> torch.Tensor:
    return _forward(volume, ISO, eps, weights)


def iso_backward(grad: torch.Tensor, volume: torch.Tensor, eps: float, needs,
                 weights: torch.Tensor | None = None) -> list:
    return [_backward(grad, volume, ISO, eps, weights) if needs[0] else None]


def not_supported_reasons(args) -> list[str]:
    volume = args[0]
    plane = volume.shape[-1] * volume.shape[-2]
    if plane >= 2**31:
        return [f"an (H, W) plane of {plane} elements needs 64-bit in-plane offsets (limit 2^31 - 1)"]
    return []


