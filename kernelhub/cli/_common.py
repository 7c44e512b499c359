"""What the commands share: argument types, short dtype names, a call built from --shape and --arg, and the
status of the lock in force."""

from __future__ import annotations

import argparse
import ast
import inspect
import math
from typing import Any

import torch
from rich.console import Console

import kernelhub
from kernelhub import lock


def _dtype(name: str) -> torch.dtype:
    dtype = getattr(torch, name.removeprefix("torch."), None)
    if not isinstance(dtype, torch.dtype):
        raise argparse.ArgumentTypeError(f"unknown dtype {name!r}")
    return dtype


def default_device(chosen: str | None = None) -> str:
    """``--device`` as given, else cuda where this machine has it, else cpu (what tune, bench, lock and the lock's
    status compare against when no device is named)."""
    return chosen or ("cuda" if torch.cuda.is_available() else "cpu")


def _device(name: str) -> str:
    """``--device``: cpu, or a CUDA device this machine has (argparse names the option in its error: torch's
    own, on a machine without that device, is a long note about its CUDA library or a traceback)."""
    try:
        device = torch.device(name)
    except RuntimeError as exc:
        raise argparse.ArgumentTypeError(f"{name!r} is not a device ({exc})") from None
    if device.type == "cuda":
        count = torch.cuda.device_count() if torch.cuda.is_available() else 0
        if (device.index or 0) >= count:
            raise argparse.ArgumentTypeError(f"{name!r}: this machine has {count} CUDA device(s)"
                                             + ("" if torch.version.cuda else f" (torch {torch.__version__} is a "
                                                                              "build without CUDA)"))
    elif device.type != "cpu":
        raise argparse.ArgumentTypeError(f"{name!r}: the commands run on cpu or cuda[:N]")
    return name


def _short(dtype: torch.dtype) -> str:
    return str(dtype).removeprefix("torch.")


# dtype names as the tables print them
_SHORT = {"float16": "f16", "bfloat16": "bf16", "float32": "f32", "float64": "f64", "complex64": "c64",
          "complex128": "c128"}




def _shape(text: str) -> list[int]:
    """``--shape 4,64,64``: sizes >= 0 whose product is below 2**63 (the largest element count torch indexes)."""
    try:
        dims = [int(x) for x in text.split(",") if x.strip()]
    except ValueError:
        raise argparse.ArgumentTypeError(f"--shape must be sizes separated by commas, e.g. 4,64,64, got {text!r}") \
            from None
    if any(d < 0 for d in dims) or math.prod(dims) >= 2 ** 63 or any(d >= 2 ** 63 for d in dims):
        raise argparse.ArgumentTypeError(f"--shape sizes must be >= 0 with fewer than 2**63 elements, got {text!r}")
    return dims


def _no_arguments(p: argparse.ArgumentParser) -> None:
    """A command with only the common options (--json, --wide)."""


EXPLAIN_REAL_BYTES = 1 << 28  # `explain` allocates real tensors up to this much, fake ones (no memory) above


def _example_args(op: str, shapes: list[list[int]], values: list[str], dtype: torch.dtype, device: str,
                  fake_above: int | None = None) -> tuple:
    """Arguments for ``op``: tensors of the given shapes, other arguments from ``values`` (NAME=VALUE) or else the
    op's defaults (the spec's first small sample where an argument has none; with no shapes, that whole sample);
    validated by the spec like a real call. Where the tensors would take more than ``fake_above`` bytes they are
    fake tensors (shapes, no memory)."""
    spec = kernelhub.get_hub().registry.spec(op)
    nbytes = sum(math.prod(shape) for shape in shapes) * torch.empty((), dtype=dtype).element_size()
    if fake_above is not None and nbytes > fake_above:
        from torch._subclasses.fake_tensor import FakeTensorMode

        with FakeTensorMode():
            return _example_args(op, shapes, values, dtype, device)
    gen = torch.Generator(device=device).manual_seed(0)
    template = spec.samples("small", dtype, torch.device(device), gen)[0].args
    kwargs = {a.name: v for a, v in zip(spec.args, template)}
    if shapes:  # a call of the user's: what the op does when an argument is left out
        params = inspect.signature(spec.normalize).parameters
        kwargs.update({a.name: params[a.name].default for a in spec.args if not a.is_tensor and a.name in params
                       and params[a.name].default is not inspect.Parameter.empty})
        for i, group in _shapes_by_argument(op, spec, shapes).items():
            like = template[i][0] if spec.args[i].kind == "tensors" else template[i]
            made = [torch.randn(shape, generator=gen, device=device).to(like.dtype) for shape in group]
            kwargs[spec.args[i].name] = made if spec.args[i].kind == "tensors" else made[0]
    for item in values:
        name, _, text = item.partition("=")
        if name not in kwargs:
            raise ValueError(f"{op} has no argument {name!r}; arguments: {list(kwargs)}")
        try:
            kwargs[name] = ast.literal_eval(text)
        except (ValueError, SyntaxError):
            kwargs[name] = text
    return spec.normalize(**kwargs)


def _shapes_by_argument(op: str, spec, shapes: list[list[int]]) -> dict[int, list[list[int]]]:
    """``--shape``s in the order of the op's tensor arguments: one each, and a list argument ("tensors": the
    multiscale planes) the ones left over, one per tensor in the list (at least one)."""
    tensors = [i for i, a in enumerate(spec.args) if a.is_tensor]
    lists = [i for i in tensors if spec.args[i].kind == "tensors"]
    names = ", ".join(spec.args[i].name + (" (a list: one --shape per tensor in it)" if i in lists else "")
                      for i in tensors)
    singles = len(tensors) - len(lists)
    if (len(shapes) != singles) if not lists else (len(lists) > 1 or len(shapes) <= singles):
        want = f"{len(tensors)}" if not lists else f"{singles + 1} or more"
        raise ValueError(f"{op} takes {want} tensor shape(s), in order: {names}; got {len(shapes)}")
    grouped, k = {}, 0
    for i in tensors:
        n = len(shapes) - singles if i in lists else 1
        grouped[i], k = shapes[k:k + n], k + n
    return grouped


def lock_status(hub: Any) -> dict | None:
    """The ``[lock]`` in force (None without one): its file, strictness, how many calls it names, what drifted
    here (on CUDA where there is a GPU, else the CPU), or why it cannot be used."""
    if not hub.config.lock.file:
        return None
    status: dict = {"file": hub.config.lock.file, "strict": hub.config.lock.strict, "winners": 0, "drift": [],
                    "error": None}
    try:
        locked = lock.read(hub.config.lock.file)
    except lock.LockError as exc:
        return {**status, "error": str(exc)}
    device = default_device()
    return {**status, "winners": len(locked["winners"]),
            "drift": lock.drift_here(locked, hub.registry, hub.config, device)}


def render_lock_status(status: dict | None, console: Console) -> None:
    """A line for `lock_status` (nothing without a lock), and a line per drift."""
    if status is None:
        return
    strict = " (strict)" if status["strict"] else ""
    if status["error"]:
        console.print(f"[red]lock{strict}: {status['error']}[/]", soft_wrap=True)
    elif not status["drift"]:
        console.print(f"lock{strict}: {status['file']}, {status['winners']} calls locked; it holds here")
    else:
        console.print(f"[yellow]lock{strict}: {status['file']}, {status['winners']} calls locked; drifted here[/] "
                      "(`kernelhub lock` writes it again):")
        print_drift(status["drift"], console)


def print_drift(lines: list[str], console: Console) -> None:
    """What drifted since a lock (`kernelhub.lock.drift`), a line each."""
    for line in lines:
        console.print(f"  - {line}", soft_wrap=True)
