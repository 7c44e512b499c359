"""The backend's registration and its one kernel.

``tv_loss_sq_3d(volume [..., D, H, W])`` is the sum over the three axes of the squared forward
differences (docs/ops.md), in float32 for half inputs and float64 for double. The forward is one
pass per axis in plain torch; the backward is analytic: each difference d = v[i+1] - v[i] adds
2 g d to v[i+1] and subtracts it from v[i].
"""

from __future__ import annotations

import math

import torch

from kernelhub import accumulation_dtype, hookimpl
from kernelhub.spec import Backend, Impl
from kernelhub_plugin_example import __version__

NAME = "plugin_example"


def _batched(volume: torch.Tensor) -> torch.Tensor:
    return volume.reshape(math.prod(volume.shape[:-3]), *volume.shape[-3:]).to(accumulation_dtype(volume.dtype))


def forward(volume: torch.Tensor) -> torch.Tensor:
    v = _batched(volume)
    total = v.new_zeros(())
    for axis in (1, 2, 3):
        total = total + v.diff(dim=axis).square().sum()
    return total


def backward(grad: torch.Tensor, volume: torch.Tensor, needs) -> list:
    """The gradient of each differentiable input (here: volume), None where not needed."""
    if not needs[0]:
        return [None]
    v = _batched(volume)
    g = torch.zeros_like(v)
    for axis in (1, 2, 3):
        n = v.shape[axis]
        if n < 2:  # no differences along this axis (an empty or single-plane volume)
            continue
        d = 2 * grad.to(v.dtype) * v.diff(dim=axis)
        g.narrow(axis, 1, n - 1).add_(d)
        g.narrow(axis, 0, n - 1).sub_(d)
    return [g.view(volume.shape).to(volume.dtype)]


@hookimpl
def kernelhub_register_impls(registry) -> None:
    registry.add_backend(Backend(NAME, __version__, "an example third-party backend (plain torch)"))
    registry.add_impl(Impl(op="tv_loss_sq_3d", backend=NAME, forward=forward, backward=backward,
                           dtypes=(torch.float16, torch.bfloat16, torch.float32, torch.float64),
                           devices=("cpu", "cuda")))
