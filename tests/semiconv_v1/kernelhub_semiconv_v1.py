"""A third party's `semiconv` backend written against semiconv v1, the eight-argument contract (img, kernel,
semifield, stride, padding, dilation, groups, kind), before v2 appended `group_broadcasting`; kept unchanged.
2-D depthwise tropical max and min through `unfold`, float32 and float64; the rest declined. It declares no
version: the registry infers v1 from its forward's eight parameters (docs/backend-guide.md, "When an op's
contract changes").

`plugin(mistake)` is the plugin module's hooks for one variant (None: the correct one), registered as backend
"semiconv_v1"; pyproject.toml next to this file installs the correct one as a distribution.
"""

from __future__ import annotations

import types

import torch
import torch.nn.functional as F

from kernelhub import hookimpl
from kernelhub.spec import Backend, Impl

MISTAKES = {"kernel_sign": "tropical min adds the kernel instead of subtracting it",
            "future_version": "declares Impl(version=99), a contract this kernelhub does not know"}


def _why_not(args) -> list[str]:
    img, kernel, semifield, stride, padding, dilation, groups, kind = args  # v1: eight arguments
    reasons = []
    if img.ndim != 4:
        reasons.append("2-D images only")
    if semifield not in ("tropical_max", "tropical_min"):
        reasons.append(f"semifield {semifield!r}: tropical_max and tropical_min only")
    if groups != img.shape[1] or kernel.shape[0] != img.shape[1]:
        reasons.append("depthwise only: groups = channels, one kernel per channel")
    return reasons


def _taps(img, kernel, semifield, stride, padding, dilation, kind, mistake):
    """(out, the first winner's tap, the window's values, the padded shape, the unflipped-to-window kernel)."""
    largest = semifield == "tropical_max"
    k = kernel[:, 0].flip(-2, -1) if kind == "conv" else kernel[:, 0]  # [C, KH, KW] in window order
    x = F.pad(img, (padding[2], padding[3], padding[0], padding[1]), value=float("-inf" if largest else "inf"))
    B, C = img.shape[:2]
    cols = F.unfold(x, k.shape[-2:], dilation=tuple(dilation), stride=tuple(stride))  # [B, C*T, L]
    sign = 1.0 if largest or mistake == "kernel_sign" else -1.0
    vals = cols.view(B, C, k[0].numel(), cols.shape[-1]) + sign * k.reshape(1, C, -1, 1)
    best = vals.amax(2) if largest else vals.amin(2)
    first = (vals == best.unsqueeze(2)).to(torch.int8).argmax(2)  # argmax gives the first of equal maxima
    oh, ow = ((x.shape[i] - dilation[j] * (k.shape[i] - 1) - 1) // stride[j] + 1 for i, j in ((-2, 0), (-1, 1)))
    return best.view(B, C, oh, ow), first, vals, x.shape, largest


def _forward(mistake):
    def forward(img, kernel, semifield, stride, padding, dilation, groups, kind):
        return _taps(img, kernel, semifield, stride, padding, dilation, kind, mistake)[0]
    return forward


def _backward(mistake):
    def backward(grad, img, kernel, semifield, stride, padding, dilation, groups, kind, needs):
        out, first, vals, padded, largest = _taps(img, kernel, semifield, stride, padding, dilation, kind, mistake)
        g = torch.where(out.isnan(), torch.zeros_like(grad), grad).flatten(2)  # a NaN output sends no gradient
        onehot = F.one_hot(first, vals.shape[2]).movedim(-1, 2).to(g.dtype) * g.unsqueeze(2)  # [B, C, T, L]
        B, C, T = onehot.shape[:3]
        KH, KW = kernel.shape[-2:]
        gx = F.fold(onehot.reshape(B, C * T, onehot.shape[-1]), padded[-2:], (KH, KW), dilation=tuple(dilation),
                    stride=tuple(stride))
        gx = gx[:, :, padding[0]:padding[0] + img.shape[2], padding[2]:padding[2] + img.shape[3]]
        gk = onehot.sum((0, 3)).view(C, KH, KW) * (1.0 if largest else -1.0)
        gk = (gk.flip(-2, -1) if kind == "conv" else gk).unsqueeze(1)
        return [gx if needs[0] else None, gk if needs[1] else None]
    return backward


def _impl(mistake: str | None) -> Impl:
    extra = {"version": 99} if mistake == "future_version" else {}  # v1 declares nothing: its signature says v1
    return Impl(op="semiconv", backend="semiconv_v1", forward=_forward(mistake), backward=_backward(mistake),
                dtypes=(torch.float32, torch.float64), not_supported_reasons=_why_not, **extra)


def plugin(mistake: str | None = None) -> types.SimpleNamespace:
    """The hooks of backend "semiconv_v1" (with ``mistake`` planted, one of `MISTAKES`)."""
    if mistake not in (None, *MISTAKES):
        raise ValueError(f"mistake must be one of {sorted(MISTAKES)}, got {mistake!r}")

    @hookimpl
    def kernelhub_register_impls(registry):
        registry.add_backend(Backend("semiconv_v1", "0.1", description="2-D depthwise tropical semiconv, v1"))
        registry.add_impl(_impl(mistake))
    return types.SimpleNamespace(kernelhub_register_impls=kernelhub_register_impls)


kernelhub_register_impls = plugin().kernelhub_register_impls  # the installed distribution's entry point
