"""The cuda_ext impls: the hub's arguments shaped for the library's operators (one per pass)."""

from __future__ import annotations

import math

import torch

from kernelhub.ops.semiconv import lift_3d

__all__ = ["l1_forward", "l1_backward", "sq_forward", "sq_backward", "iso_forward", "iso_backward",
           "kplanes_forward", "kplanes_backward", "kplanes_ms_forward", "kplanes_ms_backward", "kplanes_taps_forward",
           "kplanes_taps_backward", "trilinear_forward", "trilinear_backward", "tikhonov_forward", "tikhonov_backward",
           "semiconv_forward", "semiconv_backward"]

L1, SQ, ISO = 0, 1, 2


def _lib():
    return torch.ops.kernelhub_cuda_ext


def _batched(volume: torch.Tensor) -> torch.Tensor:
    return volume.contiguous().view(math.prod(volume.shape[:-3]), *volume.shape[-3:])


def _tv_backward(grad, volume, mode, eps, needs, weights) -> list:
    if not needs[0]:
        return [None]
    return [_lib().tv_backward(grad, _batched(volume), mode, eps, weights).view(volume.shape)]


# weights (the plugin registers these impls as `weighted`): the op's output weighted and summed in the kernels
def l1_forward(volume, weights=None):
    return _lib().tv_forward(_batched(volume), L1, 0.0, weights)


def l1_backward(grad, volume, needs, weights=None):
    return _tv_backward(grad, volume, L1, 0.0, needs, weights)


def sq_forward(volume, weights=None):
    return _lib().tv_forward(_batched(volume), SQ, 0.0, weights)


def sq_backward(grad, volume, needs, weights=None):
    return _tv_backward(grad, volume, SQ, 0.0, needs, weights)


def iso_forward(volume, eps, weights=None):
    return _lib().tv_forward(_batched(volume), ISO, eps, weights)


def iso_backward(grad, volume, eps, needs, weights=None):
    return _tv_backward(grad, volume, ISO, eps, needs, weights)


def _kplanes_backward(grad, pts, rotations, planes, taps, h, needs) -> list:
    """[pts, rotations, planes] gradients; ``grad`` is [taps, B, T*C] (any strides)."""
    gpl, gp, gr = _lib().kplanes_backward(grad, pts, rotations, planes, taps, h, bool(needs[2]), bool(needs[0]),
                                          bool(needs[1]))
    return [gp if needs[0] else None, gr if needs[1] else None, gpl if needs[2] else None]


def kplanes_forward(pts, rotations, planes):
    return _lib().kplanes_forward(pts, rotations, planes, 1, 0.0)[0]


def kplanes_backward(grad, pts, rotations, planes, needs):
    return _kplanes_backward(grad.unsqueeze(0), pts, rotations, planes, 1, 0.0, needs)


def kplanes_taps_forward(pts, rotations, planes, h):
    return _lib().kplanes_forward(pts, rotations, planes, 4, h)


def kplanes_taps_backward(grad, pts, rotations, planes, h, needs):
    return _kplanes_backward(grad, pts, rotations, planes, 4, h, needs)


def kplanes_ms_forward(pts, rotations, planes):
    return torch.cat([kplanes_forward(pts, rotations, p) for p in planes], dim=-1)


def kplanes_ms_backward(grad, pts, rotations, planes, needs):
    T, col, per_scale = rotations.shape[0], 0, []
    for p in planes:  # each scale's columns of the upstream gradient, read in place
        per_scale.append(kplanes_backward(grad[:, col:col + T * p.shape[1]], pts, rotations, p, needs))
        col += T * p.shape[1]
    def total(i):  # a fixed order: deterministic
        return torch.stack([g[i] for g in per_scale]).sum(0) if needs[i] else None
    return [total(0), total(1), [g[2] for g in per_scale] if needs[2] else None]


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


def semiconv_forward(img, kernel, semifield, stride, padding, dilation, groups, kind, group_broadcasting=False,
                     saving=False):
    """The output; with ``saving`` (`Impl.can` "saves": a forward whose backward follows) ``(output, saved)``, where
    ``saved`` is each output's first winner (uint8) for `semiconv_backward` where its CUDA tiled kernels take the call
    (max and min, 2-D, depthwise-like, unit stride and dilation), else None."""
    a = lift_3d(img, kernel, semifield, stride, padding, dilation, groups, kind, group_broadcasting)
    args = (a.img, a.kernel, a.code, a.param, a.groups, a.stride, a.pad_begin, a.dilation, a.out_size, a.flip)
    if not saving:
        return _lib().semiconv_forward(*args).view(a.output_shape)
    if not img.is_cuda:
        return _lib().semiconv_forward(*args).view(a.output_shape), None
    out, winners = _lib().semiconv_forward_saving(*args)
    return out.view(a.output_shape), winners if winners.numel() else None


def semiconv_backward(grad, img, kernel, semifield, stride, padding, dilation, groups, kind, group_broadcasting,
                      needs, saved=None):
    """The gradients; ``saved``: `semiconv_forward`'s winners of this call (the backward then does no search)."""
    a = lift_3d(img, kernel, semifield, stride, padding, dilation, groups, kind, group_broadcasting)
    args = (a.img, a.kernel, a.code, a.param, a.groups, a.stride, a.pad_begin, a.dilation, bool(needs[0]),
            bool(needs[1]), a.flip)
    gx, gk = (_lib().semiconv_backward(a.grad_5d(grad), *args) if saved is None
              else _lib().semiconv_backward_saved(a.grad_5d(grad), saved, *args))
    return [gx.view(img.shape) if needs[0] else None, gk.view(kernel.shape) if needs[1] else None]
