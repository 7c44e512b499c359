"""Tilted K-Planes interpolation through F.grid_sample, literally (docs/ops.md)."""

from __future__ import annotations

import torch
import torch.nn.functional as F

# plane p samples (first along W, second along H): XY = (q0, q1), ZX = (q2, q0), YZ = (q1, q2)
PAIRS = ((0, 1), (2, 0), (1, 2))


def _interp(q: torch.Tensor, per_t: torch.Tensor) -> torch.Tensor:
    """[N, C, B] features of N sets of rotated points ``q`` [N, B, 3] on their planes ``per_t`` [N, 3, C, H, W]."""
    out = None
    for p, (a, b) in enumerate(PAIRS):
        grid = torch.stack([q[..., a], q[..., b]], dim=-1).unsqueeze(2)  # [N, B, 1, 2]
        s = F.grid_sample(per_t[:, p], grid, mode="bilinear", padding_mode="border", align_corners=True)
        s = s[..., 0]  # [N, C, B]
        out = s if out is None else out * s
    return out


def kplanes_interp_tilted(pts: torch.Tensor, rotations: torch.Tensor, planes: torch.Tensor) -> torch.Tensor:
    T, B = rotations.shape[0], pts.shape[0]
    _, C, H, W = planes.shape
    q = torch.einsum("tij,bj->tbi", rotations, pts)  # [T, B, 3]
    return _interp(q, planes.reshape(T, 3, C, H, W)).permute(2, 0, 1).reshape(B, T * C)


def kplanes_interp_tilted_ms(pts: torch.Tensor, rotations: torch.Tensor, planes: list[torch.Tensor]) -> torch.Tensor:
    return torch.cat([kplanes_interp_tilted(pts, rotations, p) for p in planes], dim=-1)


def kplanes_interp_tilted_taps(pts: torch.Tensor, rotations: torch.Tensor, planes: torch.Tensor,
                               h: float) -> torch.Tensor:
    # the four taps as one set of 4B points: one interpolation (one graph for inductor to compile, not four); the
    # rotations' gradient is summed per tap and then added, as four calls do (one sum over 4B points rounds worse)
    T, B = rotations.shape[0], pts.shape[0]
    _, C, H, W = planes.shape
    steps = torch.cat([pts.new_zeros(1, 3), h * torch.eye(3, dtype=pts.dtype, device=pts.device)])  # [4, 3]
    shifted = pts.unsqueeze(0) + steps.unsqueeze(1)  # [4, B, 3]
    q = torch.einsum("ktij,kbj->tkbi", rotations.unsqueeze(0).expand(4, T, 3, 3), shifted)  # [T, 4, B, 3]
    s = _interp(q.reshape(T, 4 * B, 3), planes.reshape(T, 3, C, H, W))  # [T, C, 4B]
    return s.reshape(T, C, 4, B).permute(2, 3, 0, 1).reshape(4, B, T * C)
