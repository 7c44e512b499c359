"""Total variation of [..., D, H, W] volumes, literally (docs/ops.md)."""

from __future__ import annotations

import math

import torch

from kernelhub import accumulation_dtype


def _batched(volume: torch.Tensor) -> torch.Tensor:
    """[..., D, H, W] -> [B, D, H, W] in the accumulation dtype."""
    batch = math.prod(volume.shape[:-3])
    return volume.reshape(batch, *volume.shape[-3:]).to(accumulation_dtype(volume.dtype))


def _diffs(v: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    return v[:, 1:] - v[:, :-1], v[:, :, 1:] - v[:, :, :-1], v[..., 1:] - v[..., :-1]


def tv_loss_l1_3d(volume: torch.Tensor) -> torch.Tensor:
    return torch.stack([d.abs().sum() for d in _diffs(_batched(volume))])


def tv_loss_sq_3d(volume: torch.Tensor) -> torch.Tensor:
    return sum(d.square().sum() for d in _diffs(_batched(volume)))


def tv_loss_iso_3d(volume: torch.Tensor, eps: float) -> torch.Tensor:
    v = _batched(volume)
    if min(v.shape[1:]) < 2 or v.shape[0] == 0:
        return v.new_zeros(())  # empty corner set: loss 0 and gradient 0, never NaN
    corner = v[:, :-1, :-1, :-1]
    dd = v[:, 1:, :-1, :-1] - corner
    dh = v[:, :-1, 1:, :-1] - corner
    dw = v[:, :-1, :-1, 1:] - corner
    return torch.sqrt(dd.square() + dh.square() + dw.square() + eps).mean()
