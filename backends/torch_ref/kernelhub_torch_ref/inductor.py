"""The inductor backend: torch_ref's forward and backward, run through `torch.compile`.

Every op's forward and backward are compiled lazily, once per (op, pass, device type, dtype), with
dynamic shapes, so a new size does not recompile (where inductor fails on symbolic sizes, as for
semiconv today, with static ones: then each new size compiles). Each key compiles a copy of the function with its own
code object: dynamo keys its caches, and their size limit, by code object, and the backwards of all ops
share one (`vjp_backward`'s closure), so without copies they would crowd each other out of the cache and
fall back to eager. The first call of a key is the compile; its seconds are kept in `COMPILE_S`, and
`kernelhub tune` / `kernelhub bench` report every backend's first call apart from their timed runs.

Compiling costs seconds, so priority alone never picks this backend (`Impl.tuned_only`): it serves a call
where `kernelhub tune` found it the fastest correct backend for the call's shape bucket, or where it is
forced or pinned. It needs what `torch.compile` needs: a C++ compiler on the CPU, Triton on CUDA.

CUDA is not served yet: on an H200 (2026-11-22) some of its CUDA safety tests (no host synchronisation,
graph capture) failed in a run that ran out of device time before they could be read. Until they pass,
the impls declare the CPU only.
"""

from __future__ import annotations

import os
import shutil
import threading
import time
import types
from collections.abc import Callable, Sequence
from typing import Any

import torch

from kernelhub.tune import first_tensor

__all__ = ["COMPILE_S", "unavailable_reason", "device_reasons", "compiled_pass"]

TUNED_ONLY = "compiles on first use (seconds): chosen only where `kernelhub tune` found it the fastest"
COMPILE_S: dict[tuple, float] = {}  # (op, pass, device type, dtype) -> seconds of its first call
_COMPILED: dict[tuple, Callable] = {}
_LOCK = threading.Lock()


def unavailable_reason() -> str | None:
    try:
        import torch._inductor.config  # noqa: F401
    except Exception as exc:
        return f"torch.compile's inductor cannot be imported: {type(exc).__name__}: {exc}"
    return None


def _cxx() -> str | None:
    return next((c for c in (os.environ.get("CXX"), "g++", "c++", "clang++") if c and shutil.which(c)), None)


def device_reasons(args: Sequence[Any]) -> list[str]:
    """Why torch.compile cannot run this call's device here, or []."""
    t = first_tensor(args)
    if t.device.type == "cpu":
        return [] if _cxx() else ["torch.compile on the CPU needs a C++ compiler (none of $CXX, g++, c++, clang++)"]
    return [f"torch.compile's inductor does not generate code for {t.device.type!r} here"]


def _own_code(fn: Callable, name: str) -> Callable:
    """A copy of ``fn`` with a code object of its own (see the module docstring)."""
    code = fn.__code__.replace(co_name=name)
    return types.FunctionType(code, fn.__globals__, name, fn.__defaults__, fn.__closure__)


def compiled_pass(op: str, which: str, fn: Callable) -> Callable:
    """``fn`` (a forward, or a backward taking ``needs=``) compiled per device type and dtype of its call."""

    def call(*args, **kwargs):
        t = first_tensor(args[1:] if which == "backward" else args)  # a backward's first argument is the upstream gradient
        key = (op, which, t.device.type, str(t.dtype))
        compiled = _COMPILED.get(key)
        if compiled is None:
            with _LOCK:
                compiled = _COMPILED.get(key)
                if compiled is None:
                    name = f"{op}_{which}_{key[2]}_{key[3].removeprefix('torch.')}"
                    start = time.perf_counter()
                    try:
                        compiled = torch.compile(_own_code(fn, name), dynamic=True)
                        out = compiled(*args, **kwargs)
                    except Exception:  # inductor cannot compile every graph with symbolic sizes (semiconv
                        # today): compile for static sizes instead (a recompile per new size)
                        compiled = torch.compile(_own_code(fn, name + "_static"), dynamic=False)
                        out = compiled(*args, **kwargs)
                    COMPILE_S[key] = time.perf_counter() - start
                    _COMPILED[key] = compiled
                    return out
        return compiled(*args, **kwargs)

    call.__name__ = f"inductor_{op}_{which}"
    return call
