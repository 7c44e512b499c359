"""What triton's kernels cost per thread as they launch at an op's samples, compiled for a GPU architecture on any
machine: registers, spilled bytes, shared memory and SASS instructions per kernel launch of a forward and backward
(the saving forward where the impl saves). No GPU is needed (ptxas, cuobjdump and nvdisasm come with triton): the
launchers run on CPU tensors with every launch recorded instead of run, and each recorded launch is compiled the way
Triton's own launch would compile it (its specialisation of the arguments, the Bound's constants and num_warps).
Registers bound how many warps a multiprocessor holds (65536 registers an SM on Hopper), so a kernel change can be
checked for them before a GPU session; a candidate's times still come from the GPU (docs/lab/README.md).

    python3 scripts/kernel_resources.py OP [--size benchmark] [--sample SUBSTRING] [--dtype float32] [--arch 90]
        [--sms 132] [--set NAME=VALUE ...]

--sms: the multiprocessors the launchers size their grids for (132: an H200's). --set: a compile option or a
constant for every launch, over the Bound's (maxnreg=64, num_warps=8, BH=4: what a change would cost before it is
written). The counts are the installed triton's: a different release allocates differently (the iso TV backward at
256^3: 76 registers with triton 3.6, 47 with 3.9), so for the GPU machine's numbers run it with that machine's
triton (3.6: ``pip install --no-deps --target DIR triton==3.6.0``, then ``PYTHONPATH=DIR``; Nsight Compute on the
H200 read the same registers for the TV kernels). Uses Triton's internal compile entry points
(`create_function_from_signature`, `JITFunction._pack_args`, as of triton 3.6-3.9): where a release changes them the
script says so and stops.
"""
from __future__ import annotations

import argparse
import collections
import importlib
import os
import re
import subprocess
import sys
import tempfile

import torch

import kernelhub
from kernelhub import testing


def record_launches(op: str, args: tuple, sms: int) -> list[tuple]:
    """(Bound, grid, call arguments) of each launch of the triton impl's forward and backward on these arguments,
    none of them run."""
    from kernelhub_triton import plugin

    launches = []

    def record(bound, grid, *call):
        launches.append((bound, grid, call))

    module = importlib.import_module(f"kernelhub_triton.{plugin.IMPLS[op][0]}")  # the op's launchers
    kept = [(name, getattr(module, name)) for name in ("launch", "sm_count") if hasattr(module, name)]
    try:
        module.launch = record
        if hasattr(module, "sm_count"):
            module.sm_count = lambda t: sms
        registry = kernelhub.get_hub().registry
        impl, spec = registry.impls(op)["triton"], registry.spec(op)
        if "saves" in impl.can:
            out, saved = impl.forward(*args, saving=True)
            extra = {"saved": saved}
        else:
            out, extra = impl.forward(*args), {}
        needs = [True] * len(spec.differentiable)
        impl.backward(torch.ones_like(out), *args, needs=needs, **extra)
    finally:
        for name, value in kept:
            setattr(module, name, value)
    return launches


def compile_launch(bound, call: tuple, arch: int, overrides: dict | None = None):
    """The launch compiled as Triton's launch would compile it for sm_<arch>: (the kernel's name, its constants
    beyond the sizes, num_warps, the compiled kernel)."""
    import triton
    from kernelhub_triton._launch import _real
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource, compile, make_backend
    from triton.runtime.jit import create_function_from_signature

    fn = bound.kernel
    kwargs = {**bound.kwargs, **(overrides or {})}
    target = GPUTarget("cuda", arch, 32)
    backend = make_backend(target)
    try:
        binder = create_function_from_signature(fn.signature, fn.params, backend)
        bound_args, specialization, options = binder(*_real(call), **kwargs)
        options, signature, constexprs, attrs = fn._pack_args(backend, kwargs, bound_args, specialization, options)
    except (AttributeError, TypeError, ValueError) as exc:
        raise SystemExit(f"kernel_resources: triton {triton.__version__}'s compile entry points differ from the ones "
                         f"this script knows ({type(exc).__name__}: {exc})") from exc
    kernel = compile(ASTSource(fn, signature, constexprs, attrs), target=target, options=options.__dict__)
    shown = {k: v for k, v in kwargs.items() if k.isupper() or k in ("num_warps", "maxnreg")}
    return fn.__name__, shown, kernel


def resources(kernel) -> dict:
    """Registers, spilled bytes (the stack frame and local memory), static shared bytes and SASS instructions of a
    compiled kernel."""
    import triton

    tools = os.path.join(os.path.dirname(triton.__file__), "backends", "nvidia", "bin")
    with tempfile.TemporaryDirectory() as d:
        path = os.path.join(d, "kernel.cubin")
        with open(path, "wb") as f:
            f.write(kernel.asm["cubin"])
        usage = subprocess.run([os.path.join(tools, "cuobjdump"), "--dump-resource-usage", path],
                               capture_output=True, text=True, check=True).stdout
        sass = subprocess.run([os.path.join(tools, "nvdisasm"), "-c", path], capture_output=True, text=True,
                              check=True).stdout
    fields = dict(re.findall(r"(REG|STACK|LOCAL|SHARED):(\d+)", usage))
    ops = collections.Counter(m.group(1).split(".")[0] for m in
                              re.finditer(r"^\s*/\*[0-9a-f]+\*/\s+(?:@!?U?P\w+\s+)?([A-Z][A-Z0-9_.]*)", sass, re.M))
    # ptxas spills registers into the thread's stack frame (cuobjdump's STACK; its LOCAL stays 0 for them), which
    # the SASS's LDL and STL instructions read and write
    spilled = int(fields.get("STACK", 0)) + int(fields.get("LOCAL", 0))
    return {"registers": int(fields.get("REG", 0)), "spilled": spilled,
            "shared": int(fields.get("SHARED", 0)), "sass": sum(ops.values()), "ops": ops}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("op")
    parser.add_argument("--size", default="benchmark", help="the samples (benchmark, small, ...)")
    parser.add_argument("--sample", help="only the samples whose name contains this")
    parser.add_argument("--dtype", default="float32")
    parser.add_argument("--arch", type=int, default=90)
    parser.add_argument("--sms", type=int, default=132)
    parser.add_argument("--set", nargs="*", default=[], metavar="NAME=VALUE")
    args = parser.parse_args(argv)
    overrides = {k: int(v) if v.lstrip("-").isdigit() else v for k, v in (kv.split("=", 1) for kv in args.set)}
    dtype = getattr(torch, args.dtype)
    seen = set()
    for sample in testing.samples(args.op, args.size, dtype, "cpu"):
        if args.sample and args.sample not in sample.name:
            continue
        for bound, grid, call in record_launches(args.op, sample.args, args.sms):
            name, shown, kernel = compile_launch(bound, call, args.arch, overrides)
            if kernel.metadata.hash in seen:  # the same compiled kernel, launched again
                continue
            seen.add(kernel.metadata.hash)
            r = resources(kernel)
            warps = shown.get("num_warps", 4)
            resident = min(64, 65536 // max(1, r["registers"] * 32) // warps * warps) if r["registers"] else 0
            top = ", ".join(f"{op} {n}" for op, n in r["ops"].most_common(6))
            spilled = f"{r['spilled']} B spilled (LDL {r['ops']['LDL']}, STL {r['ops']['STL']})"
            print(f"{sample.name} {name} grid {grid[0]}: {r['registers']} registers, {spilled}, "
                  f"{r['shared']} B shared, {r['sass']} SASS ({top}); at most {resident} warps an SM by registers "
                  f"| {' '.join(f'{k}={v}' for k, v in shown.items())}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
