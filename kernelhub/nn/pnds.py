"""`from_pytorch_nd_semiconv`: a pytorch_nd_semiconv model's modules replaced by kernelhub.nn's (kernelhub.nn
re-exports it)."""

from __future__ import annotations

import copy
from collections.abc import Callable
from typing import Any

import torch
from torch import nn

from kernelhub.nn.kernels import (
    LearnedKernel2D,
    QuadraticKernelCholesky2D,
    QuadraticKernelIso2D,
    QuadraticKernelSpectral2D,
)
from kernelhub.nn.semiconv import Closing, GenericClosing, SemiConv
from kernelhub.ops.semiconv import pnds_class

# -- from pytorch_nd_semiconv ------------------------------------------------------------------------------------
_PNDS_FAMILIES = {"tropical_max": "tropical_max", "tropical_min_negated": "tropical_min", "linear": "linear",
                  "log": "log", "root": "root"}
_PNDS_KERNELS: dict[str, Callable[..., nn.Module]] = {
    "QuadraticKernelIso2D": QuadraticKernelIso2D, "QuadraticKernelSpectral2D": QuadraticKernelSpectral2D,
    "QuadraticKernelCholesky2D": QuadraticKernelCholesky2D}  # its class name: ours


def _pnds_semifield(conv: nn.Module, where: str) -> tuple[str, dict]:
    """(the op's semifield string, SemiConv's tropical options) of a pytorch_nd_semiconv convolution module
    (``BroadcastSemifield.log(2.0).dynamic()``, ``SelectSemifield.tropical_max().lazy_fixed()``, ...), read from the
    constructor its semifield's functions were made in; ValueError naming ``where`` for any other."""
    sf: Any = getattr(conv, "semifield", None)  # pytorch_nd_semiconv's, untyped
    fields = [getattr(sf, f) for f in getattr(sf, "_fields", ()) if callable(getattr(sf, f))]
    family: str | None = None
    param: float | None = None
    for fn in fields:
        parts = getattr(fn, "__qualname__", "").split(".")
        if len(parts) > 2 and parts[0].endswith("Semifield") and parts[1] in _PNDS_FAMILIES:
            family = parts[1]
            cells = [c.cell_contents for c in (fn.__closure__ or ()) if isinstance(c.cell_contents, (int, float))]
            param = param if not cells else cells[0]
    if family is None or (family in ("log", "root") and param is None):
        raise ValueError(f"kernelhub.nn.from_pytorch_nd_semiconv: {where}: cannot read the semifield of "
                         f"{type(conv).__name__} (a semifield made by hand, not by one of pytorch_nd_semiconv's "
                         "constructors); replace it by kernelhub.nn.SemiConv with the semifield's name")
    name = _PNDS_FAMILIES[family] + (f":{float(param or 0.0)!r}" if family in ("log", "root") else "")
    options = {}
    if family.startswith("tropical") and type(sf).__name__ == "BroadcastSemifield":
        options["channels_add"] = sf.add_reduce_channels is not None
        options["spread_gradient"] = not sf.add_reduce.__qualname__.startswith("_repeated_dim")
    return name, options


def _pnds_kernel(kernel: nn.Module, where: str) -> nn.Module:
    """kernelhub's module for a pytorch_nd_semiconv kernel module, its state dict loaded (strict); any other
    module as it is (a kernel module of the model's own)."""
    name = pnds_class(kernel)
    if name is None:
        return kernel
    ours: nn.Module
    if name in _PNDS_KERNELS:
        ours = _PNDS_KERNELS[name](kernel.in_channels, kernel.out_channels, kernel.kernel_size)
    elif name == "LearnedKernel2D":
        k: torch.Tensor = kernel.kernel  # type: ignore[assignment]  # pytorch_nd_semiconv's parameter
        ours = LearnedKernel2D(k.shape[1], k.shape[0], k.shape[2])
    else:
        raise ValueError(f"kernelhub.nn.from_pytorch_nd_semiconv: {where}: no kernelhub equivalent of {name}")
    state = kernel.state_dict()
    first = next((t for t in state.values() if t.is_floating_point()), None)
    if first is not None:  # its dtype and device (a model moved with .double(), .cuda())
        ours = ours.to(device=first.device, dtype=first.dtype)
    ours.load_state_dict(state, strict=True)
    return ours


def from_pytorch_nd_semiconv(model: nn.Module, inplace: bool = False) -> nn.Module:
    """``model`` with every pytorch_nd_semiconv ``GenericConv`` replaced by `SemiConv`, every ``GenericClosing`` by
    `Closing` (its tropical pair) or `GenericClosing`, and each of its kernel modules by kernelhub's, the weights
    kept (a copy of ``model`` unless ``inplace``): the same values and gradients, through the hub. A module it
    cannot convert (a semifield made by hand, ``TorchMaxPool2D``, ``TorchLinearConv2D``) raises ValueError naming
    it and what to do; nothing is left half-converted (the copy is dropped, or ``model`` is untouched)."""
    try:
        import pytorch_nd_semiconv as pnds
    except ImportError as exc:
        raise ImportError("kernelhub.nn.from_pytorch_nd_semiconv needs pytorch_nd_semiconv installed") from exc
    if isinstance(model, (pnds.GenericConv, pnds.GenericClosing)):
        if inplace:
            raise ValueError("kernelhub.nn.from_pytorch_nd_semiconv: a GenericConv or GenericClosing cannot be "
                             "replaced in place by another class; convert the module holding it, or inplace=False")
        holder = nn.Module()
        holder.model = model
        return from_pytorch_nd_semiconv(holder).get_submodule("model")
    work = copy.deepcopy(model)
    _convert_children(work, pnds, "")  # raises before the caller's model is touched
    if inplace:
        _convert_children(model, pnds, "")
        return model
    return work


def _convert_children(module: nn.Module, pnds, prefix: str) -> None:
    for name, child in list(module.named_children()):
        where = f"{prefix}{name}"
        args = ("stride", "padding", "dilation", "groups", "group_broadcasting")
        new: nn.Module
        if isinstance(child, pnds.GenericConv):
            semifield, options = _pnds_semifield(child.conv, where)
            new = SemiConv(_pnds_kernel(child.kernel, where), semifield, **{a: getattr(child, a) for a in args},
                           kind=child.kind, **{k: v for k, v in options.items() if v})
        elif isinstance(child, pnds.GenericClosing):
            (first, o1), (second, o2) = (_pnds_semifield(c, where) for c in (child.conv_dilation, child.conv_erosion))
            if any(o1.values()) or any(o2.values()):
                raise ValueError(f"kernelhub.nn.from_pytorch_nd_semiconv: {where}: a closing with spread_gradient or "
                                 "channels_add; build it from two kernelhub.nn.SemiConv with those options")
            kernel = _pnds_kernel(child.kernel, where)
            new = Closing(kernel, *(getattr(child, a) for a in args)) if (first, second) == ("tropical_max",
                                                                                            "tropical_min") else \
                GenericClosing(kernel, first, second, *(getattr(child, a) for a in args))
        elif pnds_class(child) in ("TorchMaxPool2D", "TorchLinearConv2D"):
            raise ValueError(f"kernelhub.nn.from_pytorch_nd_semiconv: {where}: {type(child).__name__} is torch's own "
                             "layer in the package's interface; use torch.nn.MaxPool2d / torch.nn.Conv2d")
        elif pnds_class(child) in (*_PNDS_KERNELS, "LearnedKernel2D"):
            new = _pnds_kernel(child, where)
        else:
            _convert_children(child, pnds, where + ".")
            continue
        setattr(module, name, new)
