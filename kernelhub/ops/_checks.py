"""Argument checks shared by the op specs. Every error names the op and the argument."""

from __future__ import annotations

from collections.abc import Sequence

import torch

FLOATS = (torch.float16, torch.bfloat16, torch.float32, torch.float64)


def tensor(op: str, name: str, x: object, dtypes: Sequence[torch.dtype], min_ndim: int = 0,
           ndim: int | None = None) -> torch.Tensor:
    if not isinstance(x, torch.Tensor):
        raise TypeError(f"{op}: argument {name!r} must be a torch.Tensor, got {type(x).__name__}")
    if x.layout is not torch.strided or x.is_nested:
        kind = "nested" if x.is_nested else str(x.layout).removeprefix("torch.").lstrip("_")
        raise TypeError(f"{op}: argument {name!r} must be a dense (strided) tensor, got a {kind} one "
                        "(.to_dense() first)")
    if x.dtype not in dtypes:
        raise TypeError(f"{op}: argument {name!r} must have dtype in {[str(d) for d in dtypes]}, got {x.dtype}")
    if ndim is not None and x.ndim != ndim:
        raise ValueError(f"{op}: argument {name!r} must have {ndim} dims, got shape {tuple(x.shape)}")
    if x.ndim < min_ndim:
        raise ValueError(f"{op}: argument {name!r} must have at least {min_ndim} dims, got shape {tuple(x.shape)}")
    return x


def same(op: str, first: tuple[str, torch.Tensor], *others: tuple[str, torch.Tensor]) -> None:
    """Every tensor has the first one's device and dtype."""
    name0, t0 = first
    for name, t in others:
        if t.device != t0.device:
            raise ValueError(f"{op}: argument {name!r} is on {t.device} but {name0!r} is on {t0.device}; "
                             "all tensors must be on one device")
        if t.dtype != t0.dtype:
            raise TypeError(f"{op}: argument {name!r} has dtype {t.dtype} but {name0!r} has {t0.dtype}; "
                            "they must match")


def dim(op: str, name: str, x: torch.Tensor, axis: int, expected: int) -> None:
    if x.shape[axis] != expected:
        raise ValueError(f"{op}: argument {name!r} must have size {expected} in dim {axis}, "
                         f"got shape {tuple(x.shape)}")


def _as_float(op: str, name: str, value: object) -> float:
    """``float(value)`` of an int or float (not a bool); an int too large for a float is a ValueError naming the
    op and argument, not Python's OverflowError."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise TypeError(f"{op}: argument {name!r} must be a float, got {type(value).__name__}")
    try:
        return float(value)
    except OverflowError:  # only an int overflows a float
        raise ValueError(f"{op}: argument {name!r} must be a finite number, got an int of "
                         f"{int(value).bit_length()} bits (too large for a float)") from None


def positive_float(op: str, name: str, value: object) -> float:
    x = _as_float(op, name, value)
    if not x > 0 or x == float("inf"):
        raise ValueError(f"{op}: argument {name!r} must be a finite number > 0, got {value!r}")
    return x


def finite_float(op: str, name: str, value: object) -> float:
    x = _as_float(op, name, value)
    if x != x or abs(x) == float("inf"):
        raise ValueError(f"{op}: argument {name!r} must be finite, got {value!r}")
    return x


def accumulation_dtype(dtype: torch.dtype) -> torch.dtype:
    """float64 stays float64 (complex128 too); everything else computes in float32 (complex64)."""
    if dtype in (torch.float64, torch.complex128):
        return dtype
    return torch.complex64 if dtype.is_complex else torch.float32


def randn(shape: Sequence[int], dtype: torch.dtype, device: torch.device, gen: torch.Generator,
          low: float | None = None, high: float | None = None) -> torch.Tensor:
    """Random values from ``gen`` (a generator on ``device``): normal, or uniform in [low, high)."""
    base = accumulation_dtype(dtype)
    if low is not None:
        assert high is not None, "randn: low without high"
        x = torch.rand(tuple(shape), generator=gen, dtype=base, device=device) * (high - low) + low
    else:
        x = torch.randn(tuple(shape), generator=gen, dtype=base, device=device)
    return x.to(dtype)
