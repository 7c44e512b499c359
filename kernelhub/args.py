"""A call's canonical arguments: each is a tensor, a list of tensors (a "tensors" argument) or something else
(an int, a float, a string, a list of ints). `tensors_of` is the one place that tells them apart; every
other walk over a call's arguments (keys, buckets, messages, sizes, casts) is built on it.

Public for backends: `first_tensor` (the tensor whose device and dtype key a decision), `bucket` (the
tuner's shape bucket) and `tensors_of`; docs/backend-guide.md lists what backends may import.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from typing import Any

import torch

__all__ = ["tensors_of", "all_tensors", "map_tensors", "first_tensor", "describe_args", "bucket", "arg_key",
           "nbytes"]


def tensors_of(arg: Any) -> list[torch.Tensor] | None:
    """The tensors of one argument: ``[arg]`` for a tensor, the list itself for a non-empty list or tuple of
    tensors, None for anything else."""
    if isinstance(arg, torch.Tensor):
        return [arg]
    if isinstance(arg, (list, tuple)) and arg and isinstance(arg[0], torch.Tensor):
        return list(arg)
    return None


def all_tensors(args: Sequence[Any]) -> Iterator[torch.Tensor]:
    """Every tensor of the call, in order (a list argument's one by one)."""
    for a in args:
        yield from tensors_of(a) or ()


def map_tensors(args: Sequence[Any], fn: Callable[[torch.Tensor], Any]) -> tuple:
    """``fn`` applied to every tensor of ``args`` (a list argument stays a list); other arguments as given."""
    out = []
    for a in args:
        ts = tensors_of(a)
        out.append(a if ts is None else fn(a) if isinstance(a, torch.Tensor) else [fn(t) for t in ts])
    return tuple(out)


def first_tensor(args: Sequence[Any]) -> torch.Tensor:
    """The call's first tensor (or first tensor of a list): its device and dtype key the decision."""
    for t in all_tensors(args):
        return t
    raise TypeError("no tensor argument")


def describe_args(args: Sequence[Any]) -> str:
    """A call's arguments for messages: ``float32[4, 16, 16, 16]@cpu``, lists in brackets, the rest as repr."""
    def one(t: torch.Tensor) -> str:
        return f"{str(t.dtype).removeprefix('torch.')}{list(t.shape)}@{t.device}"

    parts = []
    for a in args:
        ts = tensors_of(a)
        parts.append(repr(a) if ts is None else one(a) if isinstance(a, torch.Tensor)
                     else "[" + ", ".join(map(one, ts)) + "]")
    return ", ".join(parts)


def _pow2(n: int) -> int:
    return 1 << (n - 1).bit_length() if n > 1 else n


def bucket(args: Sequence[Any]) -> str:
    """The tuner's shape bucket of a call: every dimension of every tensor rounded up to a power of two; the
    integer, boolean and string arguments (and lists of them) as they are, since they select kernel paths;
    float arguments left out."""
    def shape(t: torch.Tensor) -> str:
        return "x".join(str(_pow2(s)) for s in t.shape) or "scalar"

    parts = []
    for a in args:
        ts = tensors_of(a)
        if ts is not None:
            parts.append(shape(a) if isinstance(a, torch.Tensor) else "[" + ",".join(map(shape, ts)) + "]")
        elif isinstance(a, (bool, int, str)) or (isinstance(a, (list, tuple))
                                                 and all(isinstance(x, (bool, int, str)) for x in a)):
            parts.append(repr(a))
    return " ".join(parts)


def arg_key(a: Any) -> Any:
    """One argument's part of the selector's decision key: a tensor's device, dtype, layout, shape and strides (a
    sparse COO tensor reads strides of 0, like an expanded dense one: the layout tells them apart; one with no
    strides or sizes, CSR, nested, mkldnn, is keyed by its layout, and the op's argument check refuses it); a
    float's type only (impls may not object to a float's value, so one decision serves every lam, eps, h);
    a list of tensors as their keys, any other list (canonical: of ints) as a tuple; anything else as it is.
    On every call's hot path: no function call per list element
    (docs/lab/benchmarks-history.md#measurements-behind-the-code)."""
    if isinstance(a, torch.Tensor):
        try:
            return (a.device, a.dtype, a.layout, a.shape, a.stride())
        except (RuntimeError, NotImplementedError):
            return (a.device, a.dtype, a.layout, "no strides")
    kind = type(a)
    if kind is float:
        return float
    if kind is list or kind is tuple:
        if a and isinstance(a[0], torch.Tensor):
            return tuple([arg_key(t) for t in a])
        return tuple(a)
    return a


def nbytes(arg: Any) -> int:
    """Bytes held by one argument's tensors (0 for an argument that is not a tensor or a list of them)."""
    return sum(t.numel() * t.element_size() for t in tensors_of(arg) or ())
