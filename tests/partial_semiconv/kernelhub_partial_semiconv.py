"""A partial `semiconv` backend, the kind a third party writes around a morphology routine: 2-D, depthwise,
tropical max and min, stride 1, dilation 1, symmetric padding, float32 and float64; every other call declined
with its reason. kernelhub's own tests run `kernelhub check` on it (tests/test_partial_backend.py), and on copies
with a mistake planted (`MISTAKES`), each of which the check must fail.

`plugin(mistake)` is the plugin module's hooks for one variant (None: the correct one), registered as backend
"partial"; pyproject.toml next to this file installs the correct one as a distribution.
"""

from __future__ import annotations

import types

import torch
import torch.nn.functional as F

from kernelhub import hookimpl
from kernelhub.spec import Backend, Impl

MISTAKES = {
    "erosion_origin": "an erosion reads the kernel unflipped for kind='conv' (the origin of the structuring element)",
    "log_as_dilation": "accepts 'log:mu' semifields but computes a dilation",
    "ignores_stride": "does not decline stride or dilation > 1, and computes stride 1, dilation 1",
    "column_major_ties": "walks the window's taps column-major, so ties go to another winner",
}


def _why_not(mistake: str | None):
    families = ("tropical_max", "tropical_min") + (("log",) if mistake == "log_as_dilation" else ())

    def why(args) -> list[str]:
        img, kernel, semifield, stride, padding, dilation, groups, kind, bcast = args
        reasons = []
        if img.ndim != 4:
            reasons.append("2-D images only")
        if semifield.partition(":")[0] not in families:
            reasons.append(f"semifield {semifield!r}: tropical_max and tropical_min only")
        if groups != img.shape[1] or kernel.shape[0] != img.shape[1] or bcast:
            reasons.append("depthwise only: groups = channels, one kernel per channel, no group broadcasting")
        if mistake != "ignores_stride" and (max(stride) > 1 or max(dilation) > 1):
            reasons.append("stride 1 and dilation 1 only")
        if padding[0::2] != padding[1::2]:
            reasons.append("symmetric padding only")
        return reasons
    return why


def _windows(img, kernel, semifield, padding, kind, mistake):
    """(out, index of each output's winning tap, the taps in walking order, the padded shape, flipped)."""
    largest = not semifield.startswith("tropical_min")  # a planted 'log' is computed as a dilation
    flip = kind == "conv" and not (mistake == "erosion_origin" and not largest)
    k = kernel[:, 0].flip(-2, -1) if flip else kernel[:, 0]  # [C, KH, KW], window order
    x = F.pad(img, (padding[2], padding[3], padding[0], padding[1]), value=float("-inf" if largest else "inf"))
    kh, kw = k.shape[-2:]
    oh, ow = x.shape[-2] - kh + 1, x.shape[-1] - kw + 1
    taps = [(i, j) for j in range(kw) for i in range(kh)] if mistake == "column_major_ties" else \
        [(i, j) for i in range(kh) for j in range(kw)]  # the contract's order: row-major over the window
    best = arg = None
    for t, (i, j) in enumerate(taps):
        v = x[:, :, i:i + oh, j:j + ow] + (k[:, i, j] if largest else -k[:, i, j]).view(1, -1, 1, 1)
        if best is None:
            best, arg = v, torch.zeros(v.shape, dtype=torch.int64, device=v.device)
            continue
        better = ((v > best) if largest else (v < best)) | (v.isnan() & ~best.isnan())  # the first NaN stays
        best, arg = torch.where(better, v, best), torch.where(better, t, arg)
    return best, arg, taps, x.shape, flip, largest


def _forward(mistake):
    def forward(img, kernel, semifield, stride, padding, dilation, groups, kind, bcast):
        return _windows(img, kernel, semifield, padding, kind, mistake)[0]
    return forward


def _backward(mistake):
    def backward(grad, img, kernel, semifield, stride, padding, dilation, groups, kind, bcast, needs):
        best, arg, taps, padded, flip, largest = _windows(img, kernel, semifield, padding, kind, mistake)
        grad = torch.where(best.isnan(), torch.zeros_like(grad), grad)  # a NaN output sends no gradient
        gx = grad.new_zeros(padded)
        gk = grad.new_zeros((kernel.shape[0], *kernel.shape[2:]))
        oh, ow = best.shape[-2:]
        for t, (i, j) in enumerate(taps):
            m = grad * (arg == t)
            gx[:, :, i:i + oh, j:j + ow] += m
            gk[:, i, j] += m.sum((0, 2, 3)) if largest else -m.sum((0, 2, 3))
        gx = gx[:, :, padding[0]:padding[0] + img.shape[2], padding[2]:padding[2] + img.shape[3]]
        gk = (gk.flip(-2, -1) if flip else gk).unsqueeze(1)
        return [gx if needs[0] else None, gk if needs[1] else None]
    return backward


def plugin(mistake: str | None = None) -> types.SimpleNamespace:
    """The hooks of backend "partial" (with ``mistake`` planted, one of `MISTAKES`)."""
    if mistake is not None and mistake not in MISTAKES:
        raise ValueError(f"mistake must be one of {sorted(MISTAKES)}, got {mistake!r}")

    @hookimpl
    def kernelhub_register_impls(registry):
        registry.add_backend(Backend("partial", "0.1", description="2-D depthwise tropical semiconv (a test)"))
        registry.add_impl(Impl(op="semiconv", backend="partial", forward=_forward(mistake),
                               backward=_backward(mistake), dtypes=(torch.float32, torch.float64),
                               not_supported_reasons=_why_not(mistake)))
    return types.SimpleNamespace(kernelhub_register_impls=kernelhub_register_impls)


kernelhub_register_impls = plugin().kernelhub_register_impls  # the installed distribution's entry point
