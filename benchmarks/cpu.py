"""Time the CPU kernel backends against torch eager and torch.compile of the reference, on the CPU.

For each op the cuda_ext backend implements, in one process, with the machine's threads
(torch.get_num_threads()): the median wall time over ``--repeat`` interleaved rounds (`kernelhub.timing.rounds`,
after warm-up) of the reference in eager mode, the reference under torch.compile (compile time excluded) and each
backend, for the forward and for forward+backward. Inputs are random (float32; complex64 for Tikhonov).

Usage: python benchmarks/run.py kernels-cpu [--backends cuda_ext] [--ops ...] [--repeat 25] [--json FILE]
"""

from __future__ import annotations

import argparse
import os
import statistics

# compile in this process: a pool of compile workers would share the cores with the timed code
os.environ.setdefault("TORCHINDUCTOR_COMPILE_THREADS", "1")

import torch  # noqa: E402
from kernels import MODES, make_step, write_rows  # benchmarks/kernels.py: which inputs get gradients per pass

import kernelhub  # noqa: E402
from kernelhub import timing  # noqa: E402

# CPU-sized inputs (the GPU benchmark shapes are too large for eager on a laptop)
SHAPES = {
    "tv_loss_l1_3d": [(128, 128, 128)],
    "tv_loss_sq_3d": [(128, 128, 128)],
    "tv_loss_iso_3d": [(128, 128, 128)],
    "kplanes_interp_tilted": [(32768, 4, 32, 64)],  # B, T, C, planes of 64 x 64
    "kplanes_interp_tilted_taps": [(32768, 4, 32, 64)],
    "trilinear_interp": [(65536, 64)],
    "tikhonov_inverse_2xn": [(115000, 2, 21)],
    "semiconv": [("tropical_max", 4, 16, 128, 128, 3), ("tropical_min", 4, 16, 128, 128, 3)],  # 3x3 depthwise
}


def make_args(op: str, shape: tuple, gen: torch.Generator) -> tuple:
    if op.startswith("tv_"):
        v = torch.randn(shape, generator=gen)
        return (v,) if op != "tv_loss_iso_3d" else (v, 1e-8)
    if op.startswith("kplanes_"):
        B, T, C, R = shape
        pts, rot = torch.rand((B, 3), generator=gen) * 2.2 - 1.1, torch.randn((T, 3, 3), generator=gen) * 0.6
        planes = torch.rand((3 * T, C, R, R), generator=gen) + 0.5
        return (pts, rot, planes, 0.01) if op.endswith("_taps") else (pts, rot, planes)
    if op == "trilinear_interp":
        n, f = shape
        return torch.randn((n, 8, f), generator=gen), torch.rand((n, 3), generator=gen) * 2 - 1
    if op == "semiconv":
        from kernelhub.ops.semiconv import SEMICONV
        sf, B, C, H, W, k = shape
        img, ker = torch.randn((B, C, H, W), generator=gen), torch.randn((C, 1, k, k), generator=gen)
        return SEMICONV.normalize(img, ker, sf, 1, k // 2, 1, C, "conv")
    return torch.randn(shape, generator=gen, dtype=torch.complex64), 0.3


def run(ops, backends, repeat: int) -> list[dict]:
    hub = kernelhub.get_hub()
    gen = torch.Generator().manual_seed(0)
    rows = []
    for op in ops:
        impls = hub.registry.impls(op)
        ref = impls[hub.registry.spec(op).reference_backend].forward
        for shape in SHAPES[op]:
            args = make_args(op, shape, gen)
            name = "x".join(map(str, shape)) if op != "semiconv" else \
                f"{shape[0]}_{'x'.join(map(str, shape[1:5]))}_k{shape[5]}x{shape[5]}_g{shape[2]}"
            out = ref(*args)
            grad = torch.randn(out.shape, generator=gen, dtype=out.dtype)
            torch._dynamo.reset()
            compiled = torch.compile(ref)
            for grads_of in MODES[op][:2]:  # forward, and forward+backward into the inputs kernels.py names first
                names = [hub.registry.spec(op).args[i].name for i in grads_of or ()]
                mode = "fwd" if grads_of is None else "fwd+bwd " + ",".join(names)
                fns = {label: timing.dropping_grads(*make_step(fn, args, grads_of, grad))
                       for label, fn in [("eager", ref), ("compiled", compiled)] + [
                           (b, kernelhub.op(op, backend=b)) for b in backends if b in impls]}
                times = {label: statistics.median(t)
                         for label, t in timing.rounds(fns, torch.device("cpu"), repeat).items()}
                for label, ms in times.items():
                    row = {"op": op, "shape": name, "mode": mode, "impl": label, "ms": ms,
                           "speedup_vs_eager": times["eager"] / ms, "speedup_vs_compiled": times["compiled"] / ms}
                    rows.append(row)
                    print(f"{op:22s} {row['shape']:12s} {mode:16s} {label:9s} {ms:9.2f} ms  "
                          f"{row['speedup_vs_eager']:6.1f}x eager  {row['speedup_vs_compiled']:6.2f}x compiled",
                          flush=True)
    return rows


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--backends", nargs="*", default=["cuda_ext"])
    parser.add_argument("--ops", nargs="*", default=list(SHAPES))
    parser.add_argument("--repeat", type=int, default=25)
    parser.add_argument("--json", help="write the rows here")
    args = parser.parse_args(argv)
    print(f"cpu: {torch.get_num_threads()} threads, torch {torch.__version__}", flush=True)
    write_rows(run(args.ops, args.backends, args.repeat), args.json)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
