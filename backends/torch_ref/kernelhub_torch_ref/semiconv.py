"""Semifield convolution by unfolding (docs/ops.md): every product is materialised (clarity, not speed)."""

from __future__ import annotations

import torch
import torch.nn.functional as F

from kernelhub import accumulation_dtype
from kernelhub.ops.semiconv import fold_broadcast, out_channels, parse_semifield, semifield_zero


def _first_winner(a: torch.Tensor, largest: bool) -> torch.Tensor:
    """max (or min) over the last dim; the gradient goes to the first winner in that dim's order."""
    key = a.detach() if largest else -a.detach()
    best = key.amax(dim=-1, keepdim=True)  # NaN if the row holds a NaN
    rank = torch.arange(a.shape[-1], 0, -1, device=a.device, dtype=torch.int64)
    first = ((key == best) * rank).argmax(dim=-1, keepdim=True)  # unique maximum: no tie left to argmax
    out = a.gather(-1, first)
    return torch.where(best.isnan(), best, out).squeeze(-1)


def semiconv(img: torch.Tensor, kernel: torch.Tensor, semifield: str, stride: list[int], padding: list[int],
             dilation: list[int], groups: int, kind: str, group_broadcasting: bool = False,
             spread_gradient: bool = False, channels_add: bool = False) -> torch.Tensor:
    batch, channels = img.shape[0], out_channels(kernel, groups, group_broadcasting)
    img, groups = fold_broadcast(img, groups, group_broadcasting)  # one group's kernel: each group a batch entry
    name, param = parse_semifield(semifield)
    acc = accumulation_dtype(img.dtype)
    nd = img.ndim - 2
    x, k = img.to(acc), kernel.to(acc)
    if kind == "conv":
        k = k.flip(list(range(2, 2 + nd)))
    pads = [p for i in reversed(range(nd)) for p in (padding[2 * i], padding[2 * i + 1])]  # F.pad: last dim first
    x = F.pad(x, pads, value=semifield_zero(semifield))
    ksize = k.shape[2:]
    for i in range(nd):  # windows appended as trailing dims: [B, C, *out, *taps]
        x = x.unfold(2 + i, dilation[i] * (ksize[i] - 1) + 1, stride[i])[..., ::dilation[i]]
    B, C = x.shape[:2]
    out_sizes = x.shape[2:2 + nd]
    O, G = k.shape[0], groups
    Cg, Og = C // G, O // G
    xs = x.reshape(B, G, 1, Cg, *out_sizes, *ksize)
    ks = k.reshape(1, G, Og, Cg, *([1] * nd), *ksize)
    if name in ("tropical_max", "log"):
        a = xs + ks
    elif name == "tropical_min":
        a = xs - ks
    else:
        a = xs * ks
    # [B, G, Og, Cg, *out, *taps] -> [B, G, Og, *out, Cg * taps]: (c, tap) in row-major order; with channels_add
    # [B, G, Og, *out, Cg, taps]: each channel's taps reduced, then the channels summed
    a = a.movedim(3, 3 + nd).flatten(4 + nd) if channels_add else a.movedim(3, 3 + nd).flatten(3 + nd)
    if name in ("tropical_max", "tropical_min"):
        largest = name == "tropical_max"
        if spread_gradient:  # amax's and amin's gradients are shared evenly by equal values
            r = a.amax(-1) if largest else a.amin(-1)
        else:
            r = _first_winner(a, largest)
        if channels_add:
            r = r.sum(-1)
    elif name == "linear":
        r = a.sum(-1)
    elif name == "root":
        r = a.pow(param).sum(-1).pow(1.0 / param)
    else:
        r = torch.logsumexp(param * a, dim=-1) / param
    return r.reshape(batch, channels, *out_sizes).to(img.dtype)
