"""Semifield convolution and morphology modules: `SemiConv`, `GenericClosing`, `Closing`, `Opening`
(kernelhub.nn re-exports them)."""

from __future__ import annotations

from collections.abc import Sequence

import torch
from torch import nn

import kernelhub
from kernelhub.nn._args import _count, _counts
from kernelhub.ops.semiconv import SEMIFIELDS, parse_semifield, same_padding

# pytorch_nd_semiconv's names for semifields the op knows under another: its tropical_min_negated is
# min(x - k), which is the op's tropical_min (docs/ops.md)
SEMIFIELD_ALIASES = {"tropical_min_negated": "tropical_min"}

def _same_padding(kernel_size: Sequence[int], dilation) -> list[int]:
    """The op's ``padding="same"`` (`kernelhub.ops.semiconv.same_padding`, pytorch_nd_semiconv's) for a module's
    kernel, given to the op as pairs: the kernel's size is known only at the call, and a module's "same" is
    pytorch_nd_semiconv's at every stride, with no warning about the op's earlier meaning."""
    dil = [dilation] * len(kernel_size) if isinstance(dilation, int) else list(dilation)
    if len(dil) != len(kernel_size):
        raise ValueError(f"SemiConv: dilation {dilation!r} does not match the kernel's {len(kernel_size)} spatial dims")
    return same_padding(kernel_size, dil)


def _semifield(semifield: object) -> str:
    """The op's name of a `SemiConv` semifield (a pytorch_nd_semiconv alias resolved), checked at construction;
    a pytorch_nd_semiconv semifield object is refused with the string that names it."""
    if not isinstance(semifield, str):
        parse_semifield(semifield)  # its TypeError, with the string that names a pytorch_nd_semiconv semifield
        raise AssertionError("parse_semifield takes strings only")
    name = SEMIFIELD_ALIASES.get(semifield, semifield)
    try:
        parse_semifield(name)
    except ValueError as exc:
        raise ValueError(f"SemiConv: argument 'semifield' must be one of {[*SEMIFIELDS, *SEMIFIELD_ALIASES]}, got "
                         f"{semifield!r} ({exc})") from None
    return name


class _KernelConv(nn.Module):
    """What `SemiConv` and `GenericClosing` share: the kernel from a module (called each forward: a learnable
    kernel) or a fixed tensor (a buffer, ``fixed_kernel``), and the geometry the op takes, with
    ``padding="same"`` resolved for each call's kernel (`_same_padding`)."""

    kernel: nn.Module | None
    fixed_kernel: torch.Tensor

    def __init__(self, kernel: nn.Module | torch.Tensor, stride, padding, dilation, groups: int,
                 group_broadcasting: bool) -> None:
        super().__init__()
        owner = type(self).__name__
        if not isinstance(kernel, (nn.Module, torch.Tensor)):
            raise TypeError(f"{owner}: argument 'kernel' must be a kernel module (kernelhub.nn.QuadraticKernelIso2D, "
                            f"LearnedKernel, ...) or a tensor [O, I, *K], got {type(kernel).__name__} {kernel!r:.80}")
        _geometry(owner, stride, padding, dilation, groups, group_broadcasting)
        if isinstance(kernel, nn.Module):
            self.kernel = kernel
        else:
            self.register_buffer("fixed_kernel", torch.as_tensor(kernel))
            self.kernel = None
        self.stride, self.padding, self.dilation = stride, padding, dilation
        self.groups, self.group_broadcasting = groups, group_broadcasting

    def weight(self) -> torch.Tensor:
        return self.kernel() if self.kernel is not None else self.fixed_kernel

    def _padding_for(self, k: torch.Tensor):
        return _same_padding(k.shape[2:], self.dilation) if self.padding == "same" else self.padding


class SemiConv(_KernelConv):
    """``semiconv(x, kernel(), semifield, stride, padding, dilation, groups, kind, group_broadcasting,
    spread_gradient, channels_add)`` with the
    kernel from a module (called each forward: a learnable kernel) or a fixed tensor (a buffer). ``semifield``
    as the op takes it (docs/ops.md), or pytorch_nd_semiconv's ``"tropical_min_negated"`` (the op's
    ``tropical_min``). ``padding="same"`` is pytorch_nd_semiconv's (the stride-1 padding at any stride; an even
    kernel's extra step at the end), so a ported model computes what it did; the other padding forms are the
    op's. ``spread_gradient`` and ``channels_add`` (tropical_max and tropical_min) are pytorch_nd_semiconv's
    options of its tropical semifields (``BroadcastSemifield.tropical_max(channels_add, spread_gradient)``).
    ``backend`` forces one, as in ``kernelhub.op(name, backend=...)``."""

    def __init__(self, kernel: nn.Module | torch.Tensor, semifield: str, stride=1, padding=0, dilation=1,
                 groups: int = 1, group_broadcasting: bool = False, kind: str = "conv",
                 backend: str | None = None, *, spread_gradient: bool = False, channels_add: bool = False) -> None:
        super().__init__(kernel, stride, padding, dilation, groups, group_broadcasting)
        self.semifield = _semifield(semifield)
        if kind not in ("conv", "corr"):
            raise ValueError(f"SemiConv: argument 'kind' must be 'conv' or 'corr', got {kind!r}")
        self.kind, self.spread_gradient, self.channels_add = kind, spread_gradient, channels_add
        self._op = kernelhub.op("semiconv", backend=backend)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        k = self.weight()
        return self._op(x, k.to(x.dtype), self.semifield, self.stride, self._padding_for(k), self.dilation,
                        self.groups, self.kind, self.group_broadcasting, self.spread_gradient, self.channels_add)

    def extra_repr(self) -> str:
        return (f"semifield={self.semifield!r}, stride={self.stride}, padding={self.padding}, "
                f"dilation={self.dilation}, groups={self.groups}, group_broadcasting={self.group_broadcasting}, "
                f"kind={self.kind!r}" + "".join(f", {n}=True" for n in ("spread_gradient", "channels_add")
                                                 if getattr(self, n)))


def _geometry(owner: str, stride, padding, dilation, groups, group_broadcasting) -> None:
    """Raise TypeError naming ``owner`` and the argument where one is not of a type the op takes (at construction:
    a pytorch_nd_semiconv-style positional call, ``Closing(k, "tropical_max", ...)``, would put a semifield in
    ``stride``), and ValueError where a value is out of range (stride, dilation and groups >= 1, padding >= 0)."""
    ints = lambda v: isinstance(v, int) and not isinstance(v, bool) or isinstance(v, (list, tuple))  # noqa: E731
    for name, value, ok in (("stride", stride, ints(stride)), ("dilation", dilation, ints(dilation)),
                            ("padding", padding, ints(padding) or padding in ("same", "valid", "same_strided")),
                            ("groups", groups, isinstance(groups, int) and not isinstance(groups, bool)),
                            ("group_broadcasting", group_broadcasting, isinstance(group_broadcasting, bool))):
        if not ok:
            hint = (" (the semifields of a closing go to kernelhub.nn.GenericClosing(kernel, dilation_semifield, "
                    "erosion_semifield, ...))" if isinstance(value, str) and owner != "SemiConv" else
                    " (an int, ints, (begin, end) pairs, 'valid', 'same' or 'same_strided')" if name == "padding"
                    else "")
            raise TypeError(f"{owner}: argument {name!r} got {value!r}{hint}")
    _counts(owner, "stride", stride)
    _counts(owner, "dilation", dilation)
    _count(owner, "groups", groups)
    if not isinstance(padding, str):  # an int, ints, or (begin, end) pairs
        pairs = isinstance(padding, (list, tuple)) and padding and all(isinstance(p, (list, tuple)) for p in padding)
        for p in padding if pairs else (padding,):
            _counts(owner, "padding", list(p) if pairs else p, least=0)


class GenericClosing(_KernelConv):
    """pytorch_nd_semiconv's ``GenericClosing(kernel, conv_dilation, conv_erosion, stride, padding, dilation, groups,
    group_broadcasting)`` with the two convolutions named by their semifields: ``semiconv(x, k,
    dilation_semifield, kind="conv")`` then ``semiconv(., k, erosion_semifield, kind="corr")`` with one kernel
    ``k = kernel()`` (a module, learnable, or a fixed tensor). The kernel is the module's ``kernel`` (a state dict's
    ``kernel.*``, as the package's), so its checkpoints load with ``strict=True``. With the tropical pair this is
    a closing (`Closing`), never below its input for any kernel."""

    _KINDS = ("conv", "corr")

    def __init__(self, kernel: nn.Module | torch.Tensor, dilation_semifield: str = "tropical_max",
                 erosion_semifield: str = "tropical_min", stride=1, padding=0, dilation=1, groups: int = 1,
                 group_broadcasting: bool = False) -> None:
        super().__init__(kernel, stride, padding, dilation, groups, group_broadcasting)
        self.semifields = (_semifield(dilation_semifield), _semifield(erosion_semifield))
        self._op = kernelhub.op("semiconv")

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        k = self.weight().to(x.dtype)
        padding = self._padding_for(k)
        for semifield, kind in zip(self.semifields, self._KINDS):
            x = self._op(x, k, semifield, self.stride, padding, self.dilation, self.groups, kind,
                         self.group_broadcasting)
        return x

    def _load_from_state_dict(self, state_dict, prefix, *args, **kwargs) -> None:
        # kernelhub before 2026-11-27 kept the kernel twice, under first.kernel.* and second.kernel.* (one module):
        # such a checkpoint loads into kernel.*
        for key in [k for k in state_dict if k.startswith(prefix + "first.kernel.")]:
            state_dict[prefix + "kernel." + key[len(prefix + "first.kernel."):]] = state_dict.pop(key)
        for key in [k for k in state_dict if k.startswith(prefix + "second.kernel.")]:
            del state_dict[key]
        super()._load_from_state_dict(state_dict, prefix, *args, **kwargs)

    def extra_repr(self) -> str:
        return (f"semifields={self.semifields}, stride={self.stride}, padding={self.padding}, "
                f"dilation={self.dilation}, groups={self.groups}, group_broadcasting={self.group_broadcasting}")


class Closing(GenericClosing):
    """Morphological closing: a dilation (tropical_max, ``x + k``, kind "conv") then its adjoint erosion
    (tropical_min, ``x - k``, kind "corr") with the same kernel, so never below its input for any kernel; the
    kernel's parameters learn from both. ``Closing(kernel, stride, padding, dilation, groups, group_broadcasting)``;
    other semifields: `GenericClosing`."""

    def __init__(self, kernel: nn.Module | torch.Tensor, stride=1, padding=0, dilation=1, groups: int = 1,
                 group_broadcasting: bool = False) -> None:
        super().__init__(kernel, "tropical_max", "tropical_min", stride, padding, dilation, groups,
                         group_broadcasting)


class Opening(GenericClosing):
    """Morphological opening: the erosion (tropical_min, kind "corr") then its adjoint dilation (tropical_max, kind
    "conv") with the same kernel (`Closing`'s order reversed), never above its input."""

    _KINDS = ("corr", "conv")

    def __init__(self, kernel: nn.Module | torch.Tensor, stride=1, padding=0, dilation=1, groups: int = 1,
                 group_broadcasting: bool = False) -> None:
        super().__init__(kernel, "tropical_min", "tropical_max", stride, padding, dilation, groups,
                         group_broadcasting)
