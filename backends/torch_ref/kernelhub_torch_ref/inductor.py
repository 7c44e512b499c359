"""The inductor backend: torch_ref's forward and backward, run through `torch.compile`.

Every op's forward and backward are compiled lazily, once per (op, pass, device type, dtype, shape
bucket), the tuner's bucket (`kernelhub.args.bucket`: each dimension rounded up to a power of two). Within a
key, the first size compiles with static shapes and a second size recompiles with dynamic ones
(`torch.compile`'s automatic dynamic shapes), so a key compiles a few times, not once per size (the
symbolic graphs still guard on some size thresholds and on the inputs' dispatch keys; `graphs()` counts).
Static first, because inductor's kernels for symbolic sizes can be several times slower (measured:
docs/lab/benchmarks-history.md#measurements-behind-the-code). Where inductor fails on symbolic sizes (semiconv once
raised `InductorError:
Exponent must be non-negative`), the key goes on with static shapes only: a recompile per size, bounded by
dynamo's cache size limit, after which dynamo runs that key eagerly. Each key compiles a copy of the
function with its own code object and name: dynamo keys its caches, and their size limit, by code object
(the backwards of all ops share one, `vjp_backward`'s closure, so without copies they would crowd each
other out of the cache and fall back to eager), and its memory of which sizes changed by code name (so a
new bucket starts from static shapes). The first call of a key is the compile; its seconds are kept in
`COMPILE_S`, and `kernelhub tune` / `kernelhub bench` report every backend's first call apart from their
timed runs.

Compiling costs seconds, so priority alone never picks this backend (`Impl.tuned_only`): it serves a call
where `kernelhub tune` found it the fastest correct backend for the call's shape bucket, or where it is
forced or pinned. It needs what `torch.compile` needs: a C++ compiler on the CPU, Triton on CUDA.

What is compiled is what the reference differentiates (plugin.py): torch_ref's forward, except for
Tikhonov, whose SVD forward (a LAPACK/cuSOLVER call that inductor leaves to ATen, and that synchronises
on CUDA) is replaced by the closed form whose gradient the reference already uses. Where the backward
scatters (K-Planes' grid_sample, semiconv's unfolded products), the compiled GPU backward adds with
atomics and the impl says it is not deterministic.
"""

from __future__ import annotations

import hashlib
import importlib.util
import os
import shutil
import threading
import time
import types
from collections.abc import Callable, Sequence
from typing import Any

import torch

from kernelhub.args import bucket, first_tensor

__all__ = ["COMPILE_S", "unavailable_reason", "device_reasons", "reasons", "wrong_code_reasons", "compiled_pass",
           "graphs"]

TUNED_ONLY = "compiles on first use (seconds): chosen only where `kernelhub tune` found it the fastest"
COMPILE_S: dict[tuple, float] = {}  # (op, pass, device type, dtype, bucket) -> seconds of its first call
_COMPILED: dict[tuple, tuple[Callable, bool]] = {}  # key -> (compiled function, static shapes only)
_LOCK = threading.RLock()


def unavailable_reason() -> str | None:
    # found, not imported: importing inductor imports dynamo (a large part of a process's start, paid by every CLI
    # command that decides a call); an install where it is found but fails to import raises at the first
    # compile, and the hub falls back from a raising impl
    try:
        found = importlib.util.find_spec("torch._inductor") is not None
    except Exception as exc:
        return f"torch.compile's inductor cannot be found: {type(exc).__name__}: {exc}"
    return None if found else "torch.compile's inductor is not part of this torch"


def _cxx() -> str | None:
    return next((c for c in (os.environ.get("CXX"), "g++", "c++", "clang++") if c and shutil.which(c)), None)


def device_reasons(args: Sequence[Any]) -> list[str]:
    """Why torch.compile cannot run this call's device here, or []."""
    t = first_tensor(args)
    if t.device.type == "cpu":
        return [] if _cxx() else ["torch.compile on the CPU needs a C++ compiler (none of $CXX, g++, c++, clang++)"]
    if t.device.type == "cuda":
        from torch.utils._triton import has_triton

        return [] if has_triton() else ["torch.compile on CUDA needs Triton (not importable, or the GPU is older "
                                        "than inductor supports)"]
    return [f"torch.compile's inductor does not generate code for {t.device.type!r} here"]


# calls where torch.compile's code was measured wrong: rejected with the measurement, so they fall back
# (benchmarks/inductor_semiconv_root.py re-measures the semiconv one)
_WRONG_ON_CUDA = {
    "semiconv": (lambda args: str(args[2]).startswith("root"),
                 "torch.compile's CUDA code gives a wrong img gradient for the root semifield (relative error "
                 "0.68-0.84 at p=2 against float64 in float32 and float64, every padding and dilation tried; "
                 "forward and kernel gradient right; torch 2.11, H200, 2026-11-22)"),
}


def wrong_code_reasons(op: str, device_type: str, args: Sequence[Any]) -> list[str]:
    """The measured reason torch.compile's code is wrong for this call, or []."""
    match, why = _WRONG_ON_CUDA.get(op, (None, ""))
    return [why] if device_type == "cuda" and match is not None and match(args) else []


def reasons(op: str) -> Callable[[Sequence[Any]], list[str]]:
    """The inductor impl's not_supported_reasons for ``op``."""
    return lambda args: device_reasons(args) or wrong_code_reasons(op, first_tensor(args).device.type, args)


def _own_code(fn: Callable, name: str) -> Callable:
    """A copy of ``fn`` with a code object of its own (see the module docstring)."""
    code = fn.__code__.replace(co_name=name)
    return types.FunctionType(code, fn.__globals__, name, fn.__defaults__, fn.__closure__)


def graphs() -> dict[tuple, int]:
    """How many graphs dynamo holds for each key: its compiles (a recompile storm would show here)."""
    from torch._dynamo.eval_frame import _debug_get_cache_entry_list

    return {key: len(_debug_get_cache_entry_list(fn._torchdynamo_orig_callable.__code__))
            for key, (fn, _) in _COMPILED.items()}


def compiled_pass(op: str, which: str, fn: Callable) -> Callable:
    """``fn`` (a forward, or a backward taking ``needs=``) compiled per device type, dtype and shape bucket."""

    def name(key):
        # the bucket in the name too: dynamo remembers which sizes changed per code name (automatic dynamic),
        # and a new bucket must start from static shapes, not from another bucket's symbolic ones
        digest = hashlib.sha1(key[4].encode()).hexdigest()[:10]
        return f"{op}_{which}_{key[2]}_{key[3].removeprefix('torch.')}_{digest}"

    def static(key):
        return torch.compile(_own_code(fn, name(key) + "_static"), dynamic=False)

    def run(key, compiled, args, kwargs):
        # grad mode off and no input requiring grad, whoever calls: the hub's own autograd glue differentiates a
        # pass, never autograd through it (no double backward), and dynamo guards on both, so the fast path's
        # calls (grad off, inside an autograd.Function, inputs requiring grad) and the operator's (below
        # autograd) would compile every key twice
        args = [a.detach() if isinstance(a, torch.Tensor) and a.requires_grad else a for a in args]
        with torch.no_grad():
            try:
                return compiled[0](*args, **kwargs)
            except torch._dynamo.exc.TorchDynamoException:
                if compiled[1]:
                    raise
                # the recompile for symbolic sizes failed (semiconv: `InductorError: Exponent must be
                # non-negative`): this key compiles for static sizes from now on
                with _LOCK:
                    _COMPILED[key] = compiled = (static(key), True)
                return compiled[0](*args, **kwargs)

    def call(*args, **kwargs):
        tensors = args[1:] if which == "backward" else args  # a backward's first argument is the upstream gradient
        t = first_tensor(tensors)
        if type(t) is not torch.Tensor and type(t) is not torch.nn.Parameter:
            # traced into a torch.compile graph (`Impl.can` "traceable"; a functional tensor): the graph's own compile
            # compiles fn, fused with the ops around it; or a tensor subclass, which fn serves as torch_ref does
            return fn(*args, **kwargs)
        key = (op, which, t.device.type, str(t.dtype), bucket(tensors))
        compiled = _COMPILED.get(key)
        if compiled is None:
            with _LOCK:  # the first call of a key compiles it (static shapes; symbolic from a second size on)
                if key not in _COMPILED:
                    start = time.perf_counter()
                    compiled = _COMPILED[key] = (torch.compile(_own_code(fn, name(key)), dynamic=None), False)
                    out = run(key, compiled, args, kwargs)
                    COMPILE_S[key] = time.perf_counter() - start
                    return out
                compiled = _COMPILED[key]
        return run(key, compiled, args, kwargs)

    call.__name__ = f"inductor_{op}_{which}"
    return call
