"""Total variation of ``[..., D, H, W]`` volumes (OPS.md ops 1-3): forward and analytic backward.

Each program streams one ``[BH, BW]`` tile of the (H, W) plane down a chunk of D planes,
carrying the previous and next planes in registers, so every voxel is read from DRAM
once (plus one halo plane per chunk); the row and column neighbours are shifted loads
of the plane just read, which hit L1. The three losses are one kernel with the loss as
a compile-time ``MODE``.

The reductions are two-stage and deterministic: each program writes its partial sums
to its own row of a fixed-size array, and one torch sum over that array finishes
(no floating-point atomics), so a result is bitwise identical run to run.
"""

from __future__ import annotations

import math

import torch
import triton
import triton.language as tl

from kernelhub_triton._launch import acc_type, on_device, sm_count

__all__ = ["l1_forward", "l1_backward", "sq_forward", "sq_backward", "iso_forward", "iso_backward",
           "not_supported_reasons"]

L1, SQ, ISO = 0, 1, 2
# Tile of 512 voxels (4 per thread at 4 warps), 32 programs per multiprocessor: the best of
# 8 configurations swept on an H200 at 512^3 (benchmarks/kernels.py --sweep, docs/benchmarks.md):
# forward+backward L1 0.65 ms and iso 0.92 ms, against 0.80-0.93 and 1.33-1.65 ms for tiles of
# 1024-4096 at 4-16 programs. Many small programs keep more plane loads in flight.
TILE = 512
PROGRAMS_PER_SM = 32
NUM_WARPS = 4


@triton.jit
def _sign(x):
    # torch.sign, which abs's gradient uses: (x > 0) - (x < 0), so 0 at 0 and at NaN
    return tl.where(x > 0, 1.0, tl.where(x < 0, -1.0, 0.0))


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
def _tv_forward_kernel(
    x_ptr,      # [B, D, H, W] contiguous volume
    part_ptr,   # [programs, NOUT] partial sums, one row per program
    D, H, W,    # volume dims
    plane,      # H * W
    tiles,      # (H, W) tiles per plane
    chunks,     # D chunks per batch item
    d_chunk,    # planes per chunk
    eps64: tl.float64,  # ISO: added under the square root
    MODE: tl.constexpr, NOUT: tl.constexpr, BH: tl.constexpr, BW: tl.constexpr, ACC: tl.constexpr,
):
    pid = tl.program_id(0)
    b, d0, d1, hw, inside, has_h, has_w, _, _ = _tile(pid, tiles, chunks, H, W, d_chunk, D, BH, BW)
    # scalar conditions join masks as "zero + x": Triton's interpreter turns bool & scalar-bool into ints
    zero = tl.zeros([BH, BW], tl.int32)
    eps = tl.full([], eps64, ACC)
    cur = tl.load(x_ptr + (b * D + d0) * plane + hw, mask=inside, other=0.0).to(ACC)
    acc_d = tl.zeros([BH, BW], ACC)
    acc_h = tl.zeros([BH, BW], ACC)
    acc_w = tl.zeros([BH, BW], ACC)
    for d in range(d0, d1):
        p = x_ptr + (b * D + d) * plane + hw
        has_d = inside & (zero + d + 1 < D)
        nxt = tl.load(p + plane, mask=has_d, other=0.0).to(ACC)
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
    out = part_ptr + pid.to(tl.int64) * NOUT
    tl.store(out, tl.sum(tl.sum(acc_d, axis=1), axis=0))
    if MODE == 0:
        tl.store(out + 1, tl.sum(tl.sum(acc_h, axis=1), axis=0))
        tl.store(out + 2, tl.sum(tl.sum(acc_w, axis=1), axis=0))


@triton.jit
def _iso_term(x, xd, xh, xw, mask, eps):
    """For the corners in ``mask``: (dd, dh, dw) / sqrt(dd^2 + dh^2 + dw^2 + eps); 0 elsewhere."""
    dd = xd - x
    dh = xh - x
    dw = xw - x
    r = 1.0 / tl.sqrt(dd * dd + dh * dh + dw * dw + eps)
    return tl.where(mask, dd * r, 0.0), tl.where(mask, dh * r, 0.0), tl.where(mask, dw * r, 0.0)


@triton.jit
def _tv_backward_kernel(
    x_ptr,      # [B, D, H, W] contiguous volume
    g_ptr,      # upstream gradient: [3] for L1, [] otherwise
    out_ptr,    # [B, D, H, W] gradient, the volume's dtype
    D, H, W, plane, tiles, chunks, d_chunk,  # as in the forward
    eps64: tl.float64,    # ISO: added under the square root
    scale64: tl.float64,  # SQ: 2; ISO: 1 / number of corners
    MODE: tl.constexpr, BH: tl.constexpr, BW: tl.constexpr, ACC: tl.constexpr,
):
    pid = tl.program_id(0)
    b, d0, d1, hw, inside, has_h, has_w, has_hm, has_wm = _tile(pid, tiles, chunks, H, W, d_chunk, D, BH, BW)
    zero = tl.zeros([BH, BW], tl.int32)  # see the forward
    eps = tl.full([], eps64, ACC)
    g0 = tl.load(g_ptr).to(ACC)
    if MODE == 0:
        g1 = tl.load(g_ptr + 1).to(ACC)
        g2 = tl.load(g_ptr + 2).to(ACC)
    else:
        g0 = g0 * tl.full([], scale64, ACC)
    p0 = x_ptr + (b * D + d0) * plane + hw
    prv = tl.load(p0 - plane, mask=inside & (zero + d0 >= 1), other=0.0).to(ACC)
    cur = tl.load(p0, mask=inside, other=0.0).to(ACC)
    if MODE == 2:
        # the D term of corner (d0 - 1, h, w); the loop carries it from plane to plane
        c_prev = has_h & has_w & (zero + d0 >= 1)
        carry, _, _ = _iso_term(prv, cur, tl.load(p0 - plane + W, mask=c_prev, other=0.0).to(ACC),
                                tl.load(p0 - plane + 1, mask=c_prev, other=0.0).to(ACC), c_prev, eps)
    for d in range(d0, d1):
        p = x_ptr + (b * D + d) * plane + hw
        has_d = inside & (zero + d + 1 < D)
        has_dm = inside & (zero + d >= 1)
        nxt = tl.load(p + plane, mask=has_d, other=0.0).to(ACC)
        xh = tl.load(p + W, mask=has_h, other=0.0).to(ACC)
        xw = tl.load(p + 1, mask=has_w, other=0.0).to(ACC)
        if MODE == 2:
            # corners (d, h, w), (d, h-1, w) and (d, h, w-1) touch this voxel; (d-1, h, w) is carried
            c0 = has_d & has_h & has_w
            td, th, tw = _iso_term(cur, nxt, xh, xw, c0, eps)
            grad = carry - td - th - tw
            carry = td
            c_h = has_d & has_hm & has_w
            a = tl.load(p - W, mask=c_h, other=0.0).to(ACC)
            _, th, _ = _iso_term(a, tl.load(p + plane - W, mask=c_h, other=0.0).to(ACC), cur,
                                 tl.load(p - W + 1, mask=c_h, other=0.0).to(ACC), c_h, eps)
            c_w = has_d & has_h & has_wm
            e = tl.load(p - 1, mask=c_w, other=0.0).to(ACC)
            _, _, tw = _iso_term(e, tl.load(p + plane - 1, mask=c_w, other=0.0).to(ACC),
                                 tl.load(p + W - 1, mask=c_w, other=0.0).to(ACC), cur, c_w, eps)
            grad = (grad + th + tw) * g0
        else:
            xhm = tl.load(p - W, mask=has_hm, other=0.0).to(ACC)
            xwm = tl.load(p - 1, mask=has_wm, other=0.0).to(ACC)
            back_d = tl.where(has_dm, cur - prv, 0.0)
            fwd_d = tl.where(has_d, nxt - cur, 0.0)
            back_h = tl.where(has_hm, cur - xhm, 0.0)
            fwd_h = tl.where(has_h, xh - cur, 0.0)
            back_w = tl.where(has_wm, cur - xwm, 0.0)
            fwd_w = tl.where(has_w, xw - cur, 0.0)
            if MODE == 0:
                grad = (g0 * (_sign(back_d) - _sign(fwd_d)) + g1 * (_sign(back_h) - _sign(fwd_h))
                        + g2 * (_sign(back_w) - _sign(fwd_w)))
            else:
                grad = g0 * ((back_d - fwd_d) + (back_h - fwd_h) + (back_w - fwd_w))
        tl.store(out_ptr + (b * D + d) * plane + hw, grad.to(out_ptr.dtype.element_ty), mask=inside)
        prv = cur
        cur = nxt


# -- launchers ---------------------------------------------------------------------------

def _layout(x: torch.Tensor) -> dict:
    """Tile shape and D chunking for a [B, D, H, W] volume, as kernel arguments."""
    B, D, H, W = x.shape
    bw = min(triton.next_power_of_2(W), 256)
    bh = min(triton.next_power_of_2(H), max(1, TILE // bw))
    tiles = triton.cdiv(H, bh) * triton.cdiv(W, bw)
    chunks = min(D, max(1, triton.cdiv(PROGRAMS_PER_SM * sm_count(x), tiles * B)))
    d_chunk = triton.cdiv(D, chunks)
    chunks = triton.cdiv(D, d_chunk)
    return dict(D=D, H=H, W=W, plane=H * W, tiles=tiles, chunks=chunks, d_chunk=d_chunk, BH=bh, BW=bw)


def _batched(volume: torch.Tensor) -> torch.Tensor:
    return volume.contiguous().view(math.prod(volume.shape[:-3]), *volume.shape[-3:])


def _out_dtype(volume: torch.Tensor) -> torch.dtype:
    return torch.float64 if volume.dtype == torch.float64 else torch.float32


def _forward(volume: torch.Tensor, mode: int, eps: float = 0.0) -> torch.Tensor:
    x = _batched(volume)
    nout = 3 if mode == L1 else 1
    if x.numel() == 0 or (mode == ISO and min(x.shape[1:]) < 2):
        return torch.zeros((3,) if mode == L1 else (), dtype=_out_dtype(volume), device=volume.device)
    lay = _layout(x)
    programs = lay["tiles"] * lay["chunks"] * x.shape[0]
    partial = torch.empty((programs, nout), dtype=_out_dtype(volume), device=x.device)
    with on_device(x):
        _tv_forward_kernel[(programs,)](x, partial, eps64=eps, MODE=mode, NOUT=nout, ACC=acc_type(x.dtype),
                                        num_warps=NUM_WARPS, **lay)
    total = partial.sum(0)  # fixed order over a fixed-size array: deterministic
    if mode == L1:
        return total
    if mode == ISO:
        return total[0] / _corners(x)
    return total[0]


def _corners(x: torch.Tensor) -> int:
    B, D, H, W = x.shape
    return B * (D - 1) * (H - 1) * (W - 1)


def _backward(grad: torch.Tensor, volume: torch.Tensor, mode: int, eps: float = 0.0) -> torch.Tensor:
    x = _batched(volume)
    out = torch.empty_like(x)
    if x.numel() == 0 or (mode == ISO and min(x.shape[1:]) < 2):
        return out.zero_().view(volume.shape)
    scale = 1.0 / _corners(x) if mode == ISO else 2.0 if mode == SQ else 1.0
    lay = _layout(x)
    programs = lay["tiles"] * lay["chunks"] * x.shape[0]
    with on_device(x):
        _tv_backward_kernel[(programs,)](x, grad.contiguous(), out, eps64=eps, scale64=scale, MODE=mode,
                                         ACC=acc_type(x.dtype), num_warps=NUM_WARPS, **lay)
    return out.view(volume.shape)


# -- what the plugin registers -----------------------------------------------------------

def l1_forward(volume: torch.Tensor) -> torch.Tensor:
    return _forward(volume, L1)


def l1_backward(grad: torch.Tensor, volume: torch.Tensor, needs) -> list:
    return [_backward(grad, volume, L1) if needs[0] else None]


def sq_forward(volume: torch.Tensor) -> torch.Tensor:
    return _forward(volume, SQ)


def sq_backward(grad: torch.Tensor, volume: torch.Tensor, needs) -> list:
    return [_backward(grad, volume, SQ) if needs[0] else None]


def iso_forward(volume: torch.Tensor, eps: float) -> torch.Tensor:
    return _forward(volume, ISO, eps)


def iso_backward(grad: torch.Tensor, volume: torch.Tensor, eps: float, needs) -> list:
    return [_backward(grad, volume, ISO, eps) if needs[0] else None]


def not_supported_reasons(args) -> list[str]:
    volume = args[0]
    plane = volume.shape[-1] * volume.shape[-2]
    if plane >= 2**31:
        return [f"an (H, W) plane of {plane} elements needs 64-bit in-plane offsets (limit 2^31 - 1)"]
    return []


