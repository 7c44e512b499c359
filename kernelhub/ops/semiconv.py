"""Semifield convolution: morphology (max-plus, min-plus) and its smooth relatives (docs/ops.md).

Canonical arguments: ``(img, kernel, semifield, stride[n], padding[2n] as (begin, end)
pairs, dilation[n], groups, kind, group_broadcasting, spread_gradient, channels_add)`` with n the number of spatial
dims (contract v3; docs/ops.md lists the versions).
"""

from __future__ import annotations

import math
import re
import warnings
from typing import Any, NamedTuple

import torch

from kernelhub.args import nbytes
from kernelhub.ops import _checks as c
from kernelhub.ops.tolerances import MEASURED_ERRORS, tolerances_from
from kernelhub.spec import Arg, Case, Change, OpSpec, SampleInput, SampleSpace, Work, layout_cache

__all__ = ["SEMICONV", "parse_semifield", "zero_of", "semifield_zero", "output_size", "Lifted", "lift_3d",
           "lift_plan", "fold_broadcast", "out_channels"]

OP = "semiconv"
SEMIFIELDS = ("tropical_max", "tropical_min", "linear", "root:p", "log:mu")
_NUMBER = re.compile(r"[+-]?(\d+\.?\d*|\.\d+)([eE][+-]?\d+)?")
_INT_MAX = 2**31 - 1  # stride, padding and dilation beyond this reach no kernel (32-bit sizes there)


def pnds_class(obj: object) -> str | None:
    """The class name of a pytorch_nd_semiconv object (what its users port from), None for anything else."""
    kind = type(obj)
    return kind.__name__ if kind.__module__.split(".")[0] == "pytorch_nd_semiconv" else None


def parse_semifield(semifield: object) -> tuple[str, float]:
    """``"root:2"`` -> ("root", 2.0); ``"tropical_max"`` -> ("tropical_max", 0.0); a TypeError for anything but a
    string."""
    if not isinstance(semifield, str):
        hint = ""
        if pnds_class(semifield) is not None:
            hint = (" (a pytorch_nd_semiconv semifield: pass its name and parameter instead, e.g. "
                    "BroadcastSemifield.log(2.0) -> 'log:2.0', BroadcastSemifield.tropical_min_negated() -> "
                    "'tropical_min' ('tropical_min_negated' in kernelhub.nn), and its tropical options as "
                    "spread_gradient=True, channels_add=True; kernelhub.nn.from_pytorch_nd_semiconv converts a model)")
        raise TypeError(f"{OP}: argument 'semifield' must be a str, got {type(semifield).__name__}{hint}")
    name, sep, param = semifield.partition(":")
    if name in ("tropical_max", "tropical_min", "linear") and not sep:
        return name, 0.0
    if name in ("root", "log") and sep:
        value = float(param) if _NUMBER.fullmatch(param) else float("nan")  # no "1_000", "inf", " 2"
        if value != 0 and math.isfinite(value):
            return name, value
        raise ValueError(f"{OP}: argument 'semifield' {semifield!r}: the parameter must be a finite number != 0")
    raise ValueError(f"{OP}: argument 'semifield' must be one of {list(SEMIFIELDS)}, got {semifield!r}")


def semifield_zero(semifield: str) -> float:
    return zero_of(*parse_semifield(semifield))


def zero_of(name: str, p: float) -> float:
    """The semifield's zero (what padding holds) from its parsed name and parameter."""
    if name == "tropical_max" or (name == "log" and p > 0):
        return float("-inf")
    if name == "tropical_min" or name == "log":
        return float("inf")
    return 0.0


def output_size(n: int, k: int, stride: int, pad_begin: int, pad_end: int, dilation: int) -> int:
    return (n + pad_begin + pad_end - dilation * (k - 1) - 1) // stride + 1


class Lifted(NamedTuple):
    """A call in the 3-spatial-dim form kernels take: 1-D and 2-D get leading size-1 dims, and only the begin
    padding is kept (the end padding is in the output size). The kernel is not flipped here (torch.flip would add
    host time to every call on CUDA): for kind="conv" a kernel reads kernel tap ``taps - 1 - t`` for window
    tap t (reversing every spatial dim reverses the row-major tap index). A group-broadcasting call is the
    plain call it equals (`fold_broadcast`): each group of img a batch entry of its own, groups 1."""
    img: torch.Tensor          # [B', C', D, H, W] (a view of the caller's img where strides allow)
    kernel: torch.Tensor       # [O', Cg, KD, KH, KW], a view of the caller's kernel (not flipped)
    semifield: str             # tropical_max | tropical_min | linear | root | log
    code: int                  # its index in SEMIFIELD_CODES
    param: float               # p (root) or mu (log), else 0
    stride: tuple[int, int, int]
    pad_begin: tuple[int, int, int]
    dilation: tuple[int, int, int]
    out_size: tuple[int, int, int]
    flip: bool                 # kind == "conv"
    groups: int                # the groups the kernels see (1 for a group-broadcasting call)
    output_shape: tuple[int, ...]  # the op's output shape (the caller's: [B, O, *out])

    def grad_5d(self, grad: torch.Tensor) -> torch.Tensor:
        """The upstream gradient ([B, O, *out]) in the lifted call's output layout [B', O', OD, OH, OW]."""
        return grad.reshape(self.img.shape[0], self.kernel.shape[0], *self.out_size)


SEMIFIELD_CODES = {"tropical_max": 0, "tropical_min": 1, "linear": 2, "root": 3, "log": 4}


def out_channels(kernel: torch.Tensor, groups: int, group_broadcasting: bool) -> int:
    """The output's channels O: the kernel's rows, times the groups where one group's kernel serves them all."""
    return kernel.shape[0] * (groups if group_broadcasting else 1)


def fold_broadcast(img: torch.Tensor, groups: int, group_broadcasting: bool) -> tuple[torch.Tensor, int]:
    """(img, groups) of the plain call a call equals: with group broadcasting, img [B, G*Cg, *S] as
    [B*G, Cg, *S] and groups 1, so the one group's kernel serves every group (its gradient adds over them)
    with no repeated copy; the plain call's output [B*G, Og, *out] is the op's [B, G*Og, *out]."""
    shape, plain_groups = folded_shape(tuple(img.shape), groups, group_broadcasting)
    return (img, groups) if plain_groups == groups else (img.reshape(shape), plain_groups)


def folded_shape(shape: tuple, groups: int, group_broadcasting: bool) -> tuple[tuple, int]:
    """`fold_broadcast` on shapes: (img's shape, groups) of the plain call a call with img of ``shape`` equals."""
    if not group_broadcasting or groups == 1:
        return shape, groups
    return (shape[0] * groups, shape[1] // groups, *shape[2:]), 1


def lift_3d(img, kernel, semifield, stride, padding, dilation, groups, kind, group_broadcasting=False) -> Lifted:
    """A call's canonical arguments (after the spec's normalize) in the form the kernels take (`Lifted`): two
    reshapes (views where strides allow) and the call's plan, computed once per shapes and arguments."""
    plan = lift_plan(tuple(img.shape), tuple(kernel.shape), semifield, tuple(stride), tuple(padding),
                     tuple(dilation), groups, kind, group_broadcasting)
    return Lifted(img.reshape(plan[0]), kernel.reshape(plan[1]), *plan[2:])


@layout_cache(maxsize=1024)
def lift_plan(img_shape, kernel_shape, semifield, stride, padding, dilation, groups, kind,
              group_broadcasting) -> tuple:
    """`Lifted`'s fields for a call of these shapes and arguments (tuples), the two tensors as the shapes they
    take (the group-broadcasting fold, `fold_broadcast`, and the leading size-1 dims in one reshape each): for a
    launcher that indexes contiguous tensors from their pointers and needs no reshaped view of them."""
    nd = len(img_shape) - 2
    one = (1,) * (3 - nd)
    name, param = parse_semifield(semifield)
    sizes = tuple(output_size(img_shape[2 + i], kernel_shape[2 + i], stride[i], padding[2 * i], padding[2 * i + 1],
                              dilation[i]) for i in range(nd))
    out_shape = (img_shape[0], kernel_shape[0] * (groups if group_broadcasting else 1), *sizes)
    (B, C, *spatial), groups = folded_shape(img_shape, groups, group_broadcasting)
    return ((B, C, *one, *spatial), (*kernel_shape[:2], *one, *kernel_shape[2:]), name,
            SEMIFIELD_CODES[name], param, one + stride, (0,) * (3 - nd) + padding[0::2], one + dilation, one + sizes,
            kind == "conv", groups, out_shape)


def _ints(name: str, value, nd: int, minimum: int) -> list[int]:
    if isinstance(value, int) and not isinstance(value, bool):
        value = [value] * nd
    if not isinstance(value, (list, tuple)) or len(value) != nd or not all(
            isinstance(v, int) and not isinstance(v, bool) for v in value):
        raise TypeError(f"{OP}: argument {name!r} must be an int or {nd} ints (one per spatial dim), got {value!r}")
    if any(v < minimum or v > _INT_MAX for v in value):
        raise ValueError(f"{OP}: argument {name!r} must be >= {minimum} and < 2**31, got {value!r}")
    return list(value)


def same_padding(ksize, dilation) -> list[int]:
    """``padding="same"`` (pytorch_nd_semiconv's, docs/ops.md) for kernel sizes ``ksize`` and dilations
    ``dilation`` (one per spatial dim): per dim ``k - 1`` dilated steps, the odd one at the end, whatever the
    stride, as ``[begin, end]`` per dim (the canonical form)."""
    return [p for k, d in zip(ksize, dilation) for p in (((k - 1) // 2) * d, (k - 1 - (k - 1) // 2) * d)]


def _padding(padding, nd: int, spatial, ksize, stride, dilation) -> list[int]:
    if padding == "valid":
        return [0] * (2 * nd)
    if padding in ("same", "same_strided"):
        flat: list[int] = []
        changed = False
        for n, k, s, d in zip(spatial, ksize, stride, dilation):
            plain = same_padding([k], [d])
            total = max((math.ceil(n / s) - 1) * s + d * (k - 1) + 1 - n, 0)
            strided = [total // 2, total - total // 2]  # ceil(n / s) outputs; the odd step goes at the end
            flat += strided if padding == "same_strided" else plain
            changed |= plain != strided
        if changed and padding == "same":
            warnings.warn(f"{OP}: padding='same' is pytorch_nd_semiconv's (k - 1 dilated steps per dim, the odd one "
                          "at the end, at any stride), which here differs from the stride-aware 'same' of kernelhub "
                          "before 2026-11-27: pass padding='same_strided' for that one, or the padding itself "
                          "(docs/ops.md)", FutureWarning, stacklevel=2)
        return flat
    if isinstance(padding, str):
        raise ValueError(f"{OP}: argument 'padding' must be an int, ints, (begin, end) pairs, 'valid', 'same' or "
                         f"'same_strided', got {padding!r}")
    if isinstance(padding, (list, tuple)) and padding and all(isinstance(p, (list, tuple)) for p in padding):
        if len(padding) != nd or not all(len(p) == 2 for p in padding):
            raise ValueError(f"{OP}: argument 'padding' as pairs needs {nd} (begin, end) pairs, got {padding!r}")
        flat = [v for p in padding for v in p]
        _ints("padding", flat, 2 * nd, 0)
        return flat
    if isinstance(padding, (list, tuple)) and len(padding) == 2 * nd:  # the canonical flat form
        return _ints("padding", list(padding), 2 * nd, 0)
    return [v for p in _ints("padding", padding, nd, 0) for v in (p, p)]


# _normalize's checked geometries: `_seen_key` -> (stride, padding, dilation) in canonical form, as tuples
_SEEN: dict[tuple, tuple] = {}
_MAX_SEEN = 4096


def _frozen(value):
    """An int, a str, or a list / tuple of ints or of int pairs, as a hashable key whose equality means the same
    checks pass (ints by exact type: True and 2.0 equal 1 and 2 but fail the checks); None for anything else."""
    kind = type(value)
    if kind is int or kind is str:
        return value
    if kind is not list and kind is not tuple:
        return None
    out = []
    for v in value:
        t = type(v)
        if t is int:
            out.append(v)
        elif (t is list or t is tuple) and len(v) == 2 and type(v[0]) is int and type(v[1]) is int:
            out.append((v[0], v[1]))
        else:
            return None
    return tuple(out)


def _seen_key(img, kernel, semifield, stride, padding, dilation, groups, kind, group_broadcasting, spread_gradient,
              channels_add):
    """Everything `_checked` looks at: both tensors' dtype, shape and device, and the other arguments (`_frozen`);
    None where one of them is not of a plain type."""
    if not (isinstance(img, torch.Tensor) and isinstance(kernel, torch.Tensor) and type(semifield) is str
            and type(groups) is int and type(kind) is str and type(group_broadcasting) is bool
            and type(spread_gradient) is bool and type(channels_add) is bool):
        return None
    key = (img.dtype, img.shape, img.device, kernel.dtype, kernel.shape, kernel.device, semifield, _frozen(stride),
           _frozen(padding), _frozen(dilation), groups, kind, group_broadcasting, spread_gradient, channels_add)
    return None if None in key[7:10] else key


def _normalize(img, kernel, semifield="tropical_max", stride=1, padding=0, dilation=1, groups=1,
               kind="conv", group_broadcasting=False, spread_gradient=False, channels_add=False) -> tuple:
    """The canonical arguments, checked (`_checked`) the first time a call's metadata and other arguments are seen
    and looked up after that, at a fraction of the checks' cost
    (docs/lab/benchmarks-history.md#measurements-behind-the-code).
    Under dynamo the checks run every time (no shared state in a trace); symbolic shapes are not looked up."""
    rest = (group_broadcasting, spread_gradient, channels_add)
    if torch.compiler.is_compiling():
        return _checked(img, kernel, semifield, stride, padding, dilation, groups, kind, *rest)
    key = _seen_key(img, kernel, semifield, stride, padding, dilation, groups, kind, *rest)
    try:
        geometry = None if key is None else _SEEN.get(key)
    except TypeError:  # a symbolic size (unhashable)
        key = geometry = None
    if geometry is None:
        args = _checked(img, kernel, semifield, stride, padding, dilation, groups, kind, *rest)
        if key is not None:
            if len(_SEEN) >= _MAX_SEEN:
                _SEEN.clear()
            _SEEN[key] = (tuple(args[3]), tuple(args[4]), tuple(args[5]))
        return args
    stride, padding, dilation = geometry
    return (img, kernel, semifield, [*stride], [*padding], [*dilation], groups, kind, *rest)


def _checked(img, kernel, semifield="tropical_max", stride=1, padding=0, dilation=1, groups=1,
             kind="conv", group_broadcasting=False, spread_gradient=False, channels_add=False) -> tuple:
    c.tensor(OP, "img", img, c.FLOATS)
    if img.ndim not in (3, 4, 5):
        raise ValueError(f"{OP}: argument 'img' must be [B, C, *S] with 1, 2 or 3 spatial dims, "
                         f"got shape {tuple(img.shape)}")
    nd = img.ndim - 2
    c.tensor(OP, "kernel", kernel, c.FLOATS, ndim=img.ndim)
    c.same(OP, ("img", img), ("kernel", kernel))
    parse_semifield(semifield)
    if kind not in ("conv", "corr"):
        raise ValueError(f"{OP}: argument 'kind' must be 'conv' or 'corr', got {kind!r}")
    if isinstance(groups, bool) or not isinstance(groups, int) or groups < 1:
        raise ValueError(f"{OP}: argument 'groups' must be an int >= 1, got {groups!r}")
    for name, flag in (("group_broadcasting", group_broadcasting), ("spread_gradient", spread_gradient),
                       ("channels_add", channels_add)):
        if not isinstance(flag, bool):
            raise TypeError(f"{OP}: argument {name!r} must be a bool, got {flag!r}")
        if flag and name != "group_broadcasting" and semifield not in ("tropical_max", "tropical_min"):
            raise ValueError(f"{OP}: argument {name!r} applies to the semifields tropical_max and tropical_min, "
                             f"got semifield {semifield!r}")
    C, O = img.shape[1], out_channels(kernel, groups, group_broadcasting)
    if C % groups or O % groups:
        raise ValueError(f"{OP}: argument 'groups' = {groups} must divide img channels C = {C} and "
                         f"kernel outputs O = {O}")
    if kernel.shape[1] != C // groups:
        raise ValueError(f"{OP}: argument 'kernel' must have C/groups = {C // groups} input channels in dim 1, "
                         f"got shape {tuple(kernel.shape)}")
    if C == 0:  # docs/ops.md: the (+) over an empty window is not defined here
        raise ValueError(f"{OP}: argument 'img' must have at least one channel (the (+) over (c, tap) of an "
                         f"empty window has no value), got shape {tuple(img.shape)}")
    ksize = list(kernel.shape[2:])
    if any(k < 1 for k in ksize):
        raise ValueError(f"{OP}: argument 'kernel' must have spatial sizes >= 1, got shape {tuple(kernel.shape)}")
    stride = _ints("stride", stride, nd, 1)
    dilation = _ints("dilation", dilation, nd, 1)
    spatial = list(img.shape[2:])
    pad = _padding(padding, nd, spatial, ksize, stride, dilation)
    sizes = []
    for i in range(nd):
        size = output_size(spatial[i], ksize[i], stride[i], pad[2 * i], pad[2 * i + 1], dilation[i])
        if size <= 0:
            raise ValueError(f"{OP}: output size {size} <= 0 in spatial dim {i}: input {spatial[i]}, kernel "
                             f"{ksize[i]}, stride {stride[i]}, padding {pad[2 * i:2 * i + 2]}, "
                             f"dilation {dilation[i]}; check 'padding' or 'kernel'")
        sizes.append(size)
    if math.prod(sizes) * img.shape[0] * O >= 2**48:  # no allocation of that size can succeed
        raise ValueError(f"{OP}: the output would be [{img.shape[0]}, {O}, "
                         f"{', '.join(map(str, sizes))}]; check 'padding', 'stride' and 'dilation'")
    return (img, kernel, semifield, stride, pad, dilation, groups, kind, group_broadcasting, spread_gradient,
            channels_add)


def _output(img, kernel, semifield, stride, padding, dilation, groups, kind, group_broadcasting, spread_gradient=False,
            channels_add=False):
    nd = img.ndim - 2
    sizes = [output_size(img.shape[2 + i], kernel.shape[2 + i], stride[i], padding[2 * i], padding[2 * i + 1],
                         dilation[i]) for i in range(nd)]
    return img.new_empty((img.shape[0], out_channels(kernel, groups, group_broadcasting), *sizes))


_CASES: dict[str, list[tuple]] = {
    # name: (img shape, kernel shape, semifield, stride, padding, dilation, groups, kind)
    "small": [
        ((2, 3, 9, 8), (3, 1, 3, 3), "tropical_max", 1, 1, 1, 3, "conv"),
        ((2, 3, 9, 8), (2, 3, 3, 2), "tropical_min", 1, "same", 1, 1, "corr"),
        ((2, 2, 11), (4, 2, 3), "linear", 2, [(1, 2)], 1, 1, "conv"),
        ((1, 2, 5, 6, 4), (2, 1, 2, 3, 2), "log:2.5", 1, [(1, 0), (0, 1), (1, 1)], 1, 2, "corr"),
        ((2, 4, 7, 9), (4, 2, 3, 3), "root:3", (2, 1), "valid", (1, 2), 2, "conv"),
        ((2, 2, 7, 6), (2, 2, 3, 3), "log:-1.5", 1, 2, 1, 1, "conv"),
        ((1, 6, 5, 4), (2, 2, 3, 3), "tropical_max", 1, 1, 1, 3, "conv", True),  # one group's kernel, 3 groups
    ],
    "medium": [
        ((2, 8, 24, 20), (8, 1, 5, 5), "tropical_max", 1, 2, 1, 8, "conv"),
        ((2, 4, 20, 18), (6, 4, 3, 3), "tropical_min", 2, "same_strided", 1, 1, "corr"),
        ((2, 4, 8, 9, 7), (4, 2, 3, 3, 3), "log:1", 1, 1, 1, 2, "conv"),
        ((2, 6, 16, 15), (6, 3, 3, 3), "root:2", 1, 1, 2, 2, "corr"),
        ((3, 4, 40), (4, 4, 5), "linear", 1, "same", 1, 1, "conv"),
    ],
    "edge": [
        ((1, 1, 3, 3), (1, 1, 5, 5), "tropical_max", 1, 2, 1, 1, "conv"),   # kernel larger than the image
        ((1, 2, 2, 3), (2, 1, 3, 3), "tropical_min", 1, 2, 1, 2, "corr"),   # windows of padding only
        ((0, 2, 5, 5), (2, 2, 3, 3), "linear", 1, 0, 1, 1, "conv"),        # empty batch
        ((1, 1, 4), (1, 1, 1), "log:3", 1, 0, 1, 1, "corr"),
        ((2, 4, 9), (1, 1, 3), "linear", 2, "same", 1, 4, "corr", True),  # depthwise, one kernel for all
        ((1, 4, 3, 4, 3), (3, 2, 2, 2, 2), "log:1", 1, 1, 1, 2, "conv", True),
    ],
    "benchmark": [  # issue 8: 3x3 depthwise dilation against F.max_pool2d; dense, 5x5, 3-D and log beside it
        ((16, 32, 256, 256), (32, 1, 3, 3), "tropical_max", 1, 1, 1, 32, "conv"),
        # dense at B=4: at B=16 the unfold reference's forward asks for 72 GiB more than the H200's free memory
        ((4, 32, 256, 256), (32, 32, 3, 3), "tropical_max", 1, 1, 1, 1, "conv"),
        ((16, 32, 256, 256), (32, 1, 5, 5), "tropical_max", 1, 2, 1, 32, "conv"),
        ((16, 32, 256, 256), (32, 1, 3, 3), "log:1", 1, 1, 1, 32, "conv"),
        ((8, 16, 64, 64, 64), (16, 1, 3, 3, 3), "tropical_max", 1, 1, 1, 16, "conv"),
    ],
}


def _samples(size: str, dtype: torch.dtype, device: torch.device, gen: torch.Generator) -> list[SampleInput]:
    out = []
    for ishape, kshape, sf, stride, pad, dil, groups, kind, *bcast in _CASES[size]:
        name, p = parse_semifield(sf)
        if name == "root":  # root semifields take inputs >= 0
            img, ker = (c.randn(ishape, dtype, device, gen, low=0.1, high=2.0),
                        c.randn(kshape, dtype, device, gen, low=0.1, high=2.0))
        else:
            img, ker = c.randn(ishape, dtype, device, gen), c.randn(kshape, dtype, device, gen)
        args = _normalize(img, ker, sf, stride, pad, dil, groups, kind, *bcast)
        out.append(SampleInput(f"{sf}_{'x'.join(map(str, ishape))}_k{'x'.join(map(str, kshape[2:]))}_g{groups}"
                               + ("_bcast" if bcast and bcast[0] else ""), args))
    if size == "edge":
        # integer values: many exact ties, the winner must be the first in (c, tap) order
        img = torch.randint(0, 3, (2, 4, 6, 6), generator=gen, device=device).to(dtype)
        ker = torch.randint(0, 2, (4, 2, 3, 3), generator=gen, device=device).to(dtype)
        for sf in ("tropical_max", "tropical_min"):
            out.append(SampleInput(f"ties_{sf}", _normalize(img, ker, sf, 1, 1, 1, 2, "conv")))
        nan = c.randn((1, 2, 5, 5), dtype, device, gen)
        nan[0, 1, 2, 2] = float("nan")
        out.append(SampleInput("nan", _normalize(nan, c.randn((2, 2, 3, 3), dtype, device, gen), "tropical_max",
                                                 1, 1, 1, 1, "conv")))
    return out


# -- the sample space: what the conformance kit draws from for a partial impl (kernelhub.testing.reach) -----------
_FAMILIES = ("tropical_max", "tropical_min", "linear", "root", "log")
_REQUIRED = {
    "small": (*(f"semifield={f}" for f in _FAMILIES), "kind=conv", "kind=corr", "dims=1", "dims=2", "dims=3",
              "stride>1", "dilation>1", "groups>1", "group_broadcasting", "padding=asymmetric", "spread_gradient",
              "channels_add"),
    "edge": ("ties=tropical_max/conv", "ties=tropical_max/corr", "ties=tropical_min/conv", "ties=tropical_min/corr",
             "values=nan", "values=inf", "batch=0", "ties=spread_gradient"),
}


def _integral(t: torch.Tensor) -> bool:
    return t.numel() > 0 and bool(torch.isfinite(t).all()) and torch.equal(t, t.round())


def _tags(args: tuple) -> frozenset[str]:
    """The parts of semiconv's parameter space one canonical call exercises (`SampleSpace.tags`)."""
    img, kernel, semifield, stride, padding, dilation, groups, kind, bcast, spread, chan_add = args
    name, _ = parse_semifield(semifield)
    nd = img.ndim - 2
    tags = {f"semifield={name}", f"kind={kind}", f"dims={nd}"}
    tags |= {t for t, on in (("stride>1", max(stride) > 1), ("dilation>1", max(dilation) > 1),
                             ("groups>1", groups > 1), ("group_broadcasting", bcast),
                             ("spread_gradient", spread), ("channels_add", chan_add),
                             ("padding=asymmetric", any(padding[2 * i] != padding[2 * i + 1] for i in range(nd))),
                             ("batch=0", img.shape[0] == 0),
                             ("values=nan", bool(img.isnan().any() or kernel.isnan().any())),
                             ("values=inf", bool(img.isinf().any() or kernel.isinf().any()))) if on}
    if name in ("tropical_max", "tropical_min") and _integral(img) and _integral(kernel):
        # small integers: many exact ties, decided by the (c, tap) order (or shared, spread_gradient)
        tags.add("ties=spread_gradient" if spread else f"ties={name}/{kind}")
    return frozenset(tags)


def _draw(size: str, tag: str, i: int, dtype: torch.dtype, device: torch.device, gen: torch.Generator) -> SampleInput:
    """A random call carrying ``tag`` (`SampleSpace.draw`). Each other parameter is drawn on its own, the plain
    choice more often than the others (2-D, stride 1, dilation 1, symmetric padding, no group broadcasting), so a
    partial impl that takes only plain calls meets one in about every 20 draws, and one that takes more meets
    those too. ``i`` numbers the draws of a check: the generator carries the sequence."""
    key, _, value = tag.partition("=")
    pick = lambda options: options[int(torch.randint(len(options), (1,), generator=gen, device=device))]  # noqa: E731
    chance = lambda p: float(torch.rand((), generator=gen, device=device)) < p  # noqa: E731
    v3 = tag in ("spread_gradient", "channels_add", "ties=spread_gradient")  # the v3 flags (`SEMICONV.changes`)
    family = value if key == "semifield" else value.split("/")[0] if key == "ties" and not v3 else \
        pick(("tropical_max", "tropical_min")) if v3 else pick(_FAMILIES)
    if key in ("values", "batch") and pick((0, 1)):
        family = pick(("tropical_max", "tropical_min"))  # the contract's NaN and Inf rules are the max/min ones
    kind = value if key == "kind" else value.split("/")[1] if key == "ties" and not v3 else pick(("conv", "corr"))
    nd = int(value) if key == "dims" else 2 if chance(0.5) else pick((1, 3))
    stride = [pick((2, 3)) if (tag == "stride>1" and d == 0) or chance(0.1) else 1 for d in range(nd)]
    dilation = [2 if (tag == "dilation>1" and d == 0) or chance(0.1) else 1 for d in range(nd)]
    bcast = tag == "group_broadcasting" or chance(0.15)
    mode = "grouped" if tag in ("groups>1", "group_broadcasting") and chance(0.5) else \
        "depthwise" if tag in ("groups>1", "group_broadcasting") else pick(("dense", "depthwise", "grouped"))
    cin = {"dense": pick((1, 2, 3)), "depthwise": pick((2, 3)), "grouped": 4}[mode]
    groups = {"dense": 1, "depthwise": cin, "grouped": 2}[mode]
    out = cin if mode == "depthwise" else pick((2, 4)) if mode == "grouped" else pick((1, 2, 3))
    if bcast and groups == 1:
        bcast = False
    ksize = [pick((1, 2, 3)) if nd < 3 else pick((1, 2)) for _ in range(nd)]
    if key == "ties":  # two taps or more in every dim: a row-major and a column-major walk differ
        ksize = [pick((2, 3)) if nd < 3 else 2 for _ in range(nd)]
    if tag == "padding=asymmetric":
        ksize[0] = pick((2, 3))
    reach = [dilation[d] * (ksize[d] - 1) + 1 for d in range(nd)]
    spatial = [reach[d] + pick((0, 1, 2, 3)) for d in range(nd)]
    # padding below each dim's reach: every window holds an image pixel (the edge samples have padding-only ones;
    # here a window of -inf would make gradcheck's finite differences NaN)
    padding: Any  # pairs, an int or a string, as users pass it
    if tag == "padding=asymmetric" or chance(0.15):
        padding = [(lambda b, e: (b, e) if pick((0, 1)) else (e, b))(0, pick(range(1, r))) if r > 1 else (0, 0)
                   for r in reach]
    else:
        padding = pick((0, "valid", "same", [(1, 1)] * nd, 1))
        if padding in (1, [(1, 1)] * nd) and min(reach) < 2:
            padding = 0
        if padding == "same" and (max(stride) > 1 or any(d > 1 and k % 2 == 0 for d, k in zip(dilation, ksize))):
            padding = "same_strided"  # where the two "same" differ, the stride-aware one (docs/ops.md)
    batch = 0 if tag == "batch=0" else pick((1, 2))
    kshape = (out // groups if bcast else out, cin // groups, *ksize)
    ishape = (batch, cin, *spatial)
    if key == "ties":
        img = torch.randint(0, 3, ishape, generator=gen, device=device).to(dtype)
        ker = torch.randint(0, 2, kshape, generator=gen, device=device).to(dtype)
    elif family == "root":
        img, ker = c.randn(ishape, dtype, device, gen, 0.1, 2.0), c.randn(kshape, dtype, device, gen, 0.1, 2.0)
    else:
        img, ker = c.randn(ishape, dtype, device, gen), c.randn(kshape, dtype, device, gen)
    if tag in ("values=nan", "values=inf") and img.numel():
        flat = img.view(-1)
        flat[int(torch.randint(flat.numel(), (1,), generator=gen, device=device))] = \
            float("nan") if tag == "values=nan" else pick((1.0, -1.0)) * float("inf")
    semifield = {"root": f"root:{pick((2, 3))}", "log": f"log:{pick((-1.5, 0.5, 1, 2.5))}"}.get(family, family)
    flags = (tag in ("spread_gradient", "ties=spread_gradient") or (v3 and chance(0.5)),
             tag == "channels_add" or (v3 and chance(0.5))) if v3 else (False, False)
    args = _normalize(img, ker, semifield, stride, padding, dilation, groups, kind, bcast, *flags)
    return SampleInput(f"drawn_{tag}_{i}_{semifield}_{kind}_{'x'.join(map(str, ishape))}_k{'x'.join(map(str, kshape))}"
                       f"_s{'x'.join(map(str, stride))}_d{'x'.join(map(str, dilation))}_p{'x'.join(map(str, args[4]))}"
                       f"_g{groups}" + ("_bcast" if bcast else "") + ("_spread" if flags[0] else "")
                       + ("_chadd" if flags[1] else ""), args)


def _bad_inputs():
    img, ker = torch.zeros(1, 2, 5, 5), torch.zeros(2, 2, 3, 3)
    return [
        ((torch.zeros(2, 5), ker), {}, ValueError, "img"),
        ((img, torch.zeros(2, 2, 3)), {}, ValueError, "kernel"),
        ((img, ker, "tropical"), {}, ValueError, "semifield"),
        ((img, ker, "root:0"), {}, ValueError, "semifield"),
        ((img, ker), {"padding": "full"}, ValueError, "padding"),
        ((img, ker), {"stride": 0}, ValueError, "stride"),
        ((img, ker), {"groups": 3}, ValueError, "groups"),
        ((img, ker), {"kind": "xcorr"}, ValueError, "kind"),
        ((img, torch.zeros(2, 2, 7, 7)), {}, ValueError, "output size"),
        ((img, ker.double()), {}, TypeError, "kernel"),
        ((torch.zeros(1, 0, 6, 6), torch.zeros(2, 0, 3, 3)), {}, ValueError, "img"),  # no channel: no window
        ((img, ker, "tropical_max:"), {}, ValueError, "semifield"),
        ((img, ker, "root:1_000"), {}, ValueError, "semifield"),
        ((img, ker), {"padding": 2**62}, ValueError, "padding"),
        ((img, ker), {"group_broadcasting": 1}, TypeError, "group_broadcasting"),
        ((img, ker, "linear"), {"spread_gradient": True}, ValueError, "spread_gradient"),
        ((img, ker, "log:1"), {"channels_add": True}, ValueError, "channels_add"),
        ((img, ker), {"channels_add": 0}, TypeError, "channels_add"),
        ((torch.zeros(1, 4, 5, 5), torch.zeros(2, 1, 3, 3)), {"groups": 2, "group_broadcasting": True}, ValueError,
         "kernel"),  # one group's kernel takes C/groups = 2 channels
    ]


def _tropical_2d_depthwise(img, kernel, semifield, stride, padding, dilation, groups, kind,
                           group_broadcasting=False, spread_gradient=False, channels_add=False) -> bool:
    """`TROPICAL_2D_DEPTHWISE`'s test."""
    if semifield not in ("tropical_max", "tropical_min") or img.ndim != 4 or kernel.shape[1] != 1:
        return False
    kh, kw = kernel.shape[2:]
    return (all(s == 1 for s in stride) and all(d == 1 for d in dilation) and kh <= 16 and kw <= 7
            and max(padding[0:2]) < kh and max(padding[2:4]) < kw)


TROPICAL_2D_DEPTHWISE = Case(
    "tropical_2d_depthwise",
    "max/min on 2-D images, one input channel per group, unit stride and dilation, kernels up to 16 x 7 and "
    "padding below the kernel's size on each side: the calls cuda_ext's tiled kernels serve (docs/ops.md)",
    _tropical_2d_depthwise)


def _work(args, out: torch.Tensor, grads_of) -> Work:
    """`kernelhub.spec.Work` of a semiconv call (docs/ops.md, "Least work"): the image and kernel read and the output
    written once (a window's taps reuse what a tile holds, not DRAM), and per tap (one input channel of the group
    at one kernel position) of each output the semifield's operations:

    - max and min: an add and a max (`minmax`). The backward needs only the winners, which the forward saves (a
      byte an output under 256 taps a window, else two: written, read again); each gradient is one add an output,
      and the image is not read again;
    - linear: a multiply-add; again for each gradient, from the image and kernel read again;
    - log: an add, a max (the window's, for a stable sum), a multiply-add and an exponential, and a logarithm an
      output; the backward's shares are an exponential a tap again, over the window's log-sum-exp, which is the
      output (read again), and a multiply-add a tap for each gradient;
    - root: a multiply, a power (a logarithm and an exponential) and an add, and a root (the same two) an output;
      the backward's shares a power a tap again, over the window's sum (from the output, read again), and a
      multiply-add a tap for each gradient.
    """
    img, kernel, semifield = args[0], args[1], args[2]
    name, _ = parse_semifield(semifield)
    window = kernel[0].numel() if kernel.shape[0] else 0
    outs, taps = out.numel(), out.numel() * window
    dram = nbytes(img) + nbytes(kernel) + nbytes(out)
    if name in ("tropical_max", "tropical_min"):
        if grads_of is None:
            return Work(dram, flops=taps, minmax=taps)
        winners = 2 * outs * (1 if window < 256 else 2)
        return Work(dram + winners + nbytes(out) + sum(nbytes(args[i]) for i in grads_of),
                    flops=taps + outs * len(grads_of), minmax=taps)
    fwd = {"linear": Work(dram, flops=2 * taps),
           "log": Work(dram, flops=3 * taps, minmax=taps, special=taps + outs),
           "root": Work(dram, flops=2 * taps, special=2 * taps + 2 * outs)}[name]
    if grads_of is None:
        return fwd
    dram += nbytes(out) + nbytes(img) + nbytes(kernel) + sum(nbytes(args[i]) for i in grads_of)
    saved = 0 if name == "linear" else nbytes(out)
    shares = {"linear": 0, "log": taps, "root": 2 * taps}[name]
    return Work(dram + saved, flops=fwd.flops + 2 * taps * len(grads_of), minmax=fwd.minmax,
                special=fwd.special + shares)


SEMICONV = OpSpec(
    name=OP,
    args=(Arg("img", "tensor", differentiable=True, doc="[B, C, *S], 1-3 spatial dims"),
          Arg("kernel", "tensor", differentiable=True, doc="[O, C/groups, *K]"),
          Arg("semifield", "str", doc=" | ".join(SEMIFIELDS)),
          Arg("stride", "ints"), Arg("padding", "ints", doc="(begin, end) per spatial dim, flattened"),
          Arg("dilation", "ints"), Arg("groups", "int"), Arg("kind", "str", doc="'conv' flips the kernel, 'corr' not"),
          Arg("group_broadcasting", "bool", doc="the kernel [O/groups, C/groups, *K] serves every group"),
          Arg("spread_gradient", "bool", doc="max/min: an output's gradient split evenly among its tied winners"),
          Arg("channels_add", "bool", doc="max/min: the channels' maxima (minima) summed, not max-ed (min-ed)")),
    doc="Convolution in a semifield: out = (+)_(c, tap) img_pad (x) kernel'; max/min gradients go to the first winner.",
    dtypes=c.FLOATS,
    tolerances=tolerances_from(MEASURED_ERRORS, OP),
    normalize=_normalize,
    output=_output,
    samples=_samples,
    bad_inputs=_bad_inputs,
    space=SampleSpace(tags=_tags, required=_REQUIRED, draw=_draw),
    cases=(TROPICAL_2D_DEPTHWISE,),
    work=_work,
    changes=(Change(2, (("group_broadcasting", False),), "group broadcasting: one kernel serves every group",
                    tags=("group_broadcasting",)),
             Change(3, (("spread_gradient", False), ("channels_add", False)),
                    "pytorch_nd_semiconv's tropical options: spread_gradient, channels_add",
                    tags=("spread_gradient", "channels_add", "ties=spread_gradient"))),
)
