"""Tilted K-Planes interpolation through F.grid_sample, literally (OPS.md ops 4-5)."""

from __future__ import annotations

import torch
import torch.nn.functional as F

# plane p samples (first along W, second along H): XY = (q0, q1), ZX = (q2, q0), YZ = (q1, q2)
PAIRS = ((0, 1), (2, 0), (1, 2))


def kplanes_interp_tilted(pts: torch.Tensor, rotations: torch.Tensor, planes: torch.Tensor) -> torch.Tensor:
    T, B = rotations.shape[0], pts.shape[0]
    _, C, H, W = planes.shape
    q = torch.einsum("tij,bj->tbi", rotations, pts)  # [T, B, 3]
    per_t = planes.reshape(T, 3, C, H, W)
    out = None
    for p, (a, b) in enumerate(PAIRS):
        grid = torch.stack([q[..., a], q[..., b]], dim=-1).unsqueeze(2)  # [T, B, 1, 2]
        s = F.grid_sample(per_t[:, p], grid, mode="bilinear", padding_mode="border", align_corners=True)
        s = s[..., 0]  # [T, C, B]
        out = s if out is None else out * s
    return out.permute(2, 0, 1).reshape(B, T * C)


def kplanes_interp_tilted_ms(pts: torch.Tensor, rotations: torch.Tensor, planes: list[torch.Tensor]) -> torch.Tensor:
    return torch.cat([kplanes_interp_tilted(pts, rotations, p) for p in planes], dim=-1)


def kplanes_interp_tilted_taps(pts: torch.Tensor, rotations: torch.Tensor, planes: torch.Tensor,
                               h: float) -> torch.Tensor:
    shifted = [pts] + [pts + h * torch.eye(3, dtype=pts.dtype, device=pts.device)[i] for i in range(3)]
    return torch.stack([kplanes_interp_tilted(p, rotations, planes) for p in shifted])
