"""Trilinear interpolation from the 8 corner values of each point's cell (docs/ops.md)."""

from __future__ import annotations

import torch

from kernelhub import accumulation_dtype


def trilinear_interp(feats: torch.Tensor, points: torch.Tensor) -> torch.Tensor:
    acc = accumulation_dtype(feats.dtype)
    uvw = (points.to(acc) + 1) / 2  # not clamped: outside [-1, 1] extrapolates linearly
    u, v, w = uvw[:, 0], uvw[:, 1], uvw[:, 2]
    wu = torch.stack([1 - u, u], dim=1)  # bit i of corner k = 4i + 2j + l
    wv = torch.stack([1 - v, v], dim=1)
    ww = torch.stack([1 - w, w], dim=1)
    weights = (wu[:, :, None, None] * wv[:, None, :, None] * ww[:, None, None, :]).reshape(-1, 8)
    return (weights[:, :, None] * feats.to(acc)).sum(dim=1).to(feats.dtype)
