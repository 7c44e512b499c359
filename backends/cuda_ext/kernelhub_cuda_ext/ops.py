"""The cuda_ext impls: the hub's arguments shaped for the library's operators (one per pass)."""

from __future__ import annotations

import math

import torch

__all__ = ["l1_forward", "l1_backward", "sq_forward", "sq_backward", "iso_forward", "iso_backward",
           "trilinear_forward", "trilinear_backward", "tikhonov_forward", "tikhonov_backward"]

L1, SQ, ISO = 0, 1, 2


def _lib():
    return torch.ops.kernelhub_cuda_ext


def _batched(volume: torch.Tensor) -> torch.Tensor:
    return volume.contiguous().view(math.prod(volume.shape[:-3]), *volume.shape[-3:])


def _tv_backward(grad, volume, mode, eps, needs) -> list:
    if not needs[0]:
        return [None]
    return [_lib().tv_backward(grad, _batched(volume), mode, eps).view(volume.shape)]


def l1_forward(volume):
    return _lib().tv_forward(_batched(volume), L1, 0.0)


def l1_backward(grad, volume, needs):
    return _tv_backward(grad, volume, L1, 0.0, needs)


def sq_forward(volume):
    return _lib().tv_forward(_batched(volume), SQ, 0.0)


def sq_backward(grad, volume, needs):
    return _tv_backward(grad, volume, SQ, 0.0, needs)


def iso_forward(volume, eps):
    return _lib().tv_forward(_batched(volume), ISO, eps)


def iso_backward(grad, volume, eps, needs):
    return _tv_backward(grad, volume, ISO, eps, needs)


def trilinear_forward(feats, points):
    return _lib().trilinear_forward(feats, points)


def trilinear_backward(grad, feats, points, needs):
    gf, gp = _lib().trilinear_backward(grad, feats, points, bool(needs[0]), bool(needs[1]))
    return [gf if needs[0] else None, gp if needs[1] else None]


def _pixels(t: torch.Tensor) -> torch.Tensor:
    return t.reshape(math.prod(t.shape[:-2]), *t.shape[-2:])


def tikhonov_forward(M, lam):
    return _lib().tikhonov_forward(_pixels(M), lam).view(M.shape)


def tikhonov_backward(grad, M, lam, needs):
    if not needs[0]:
        return [None]
    return [_lib().tikhonov_backward(_pixels(grad), _pixels(M), lam).view(M.shape)]
