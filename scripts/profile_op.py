"""Forward + backward of one op with one backend forced, at its first benchmark sample (or the first whose name
contains SAMPLE), four times: what ``scripts/gpu_check.sh profile`` runs under Nsight Compute (``ncu``), which
profiles a few of its kernels' launches.

    python3 scripts/profile_op.py OP BACKEND DTYPE [SAMPLE]     (DTYPE: float32, complex64, ...)
"""
from __future__ import annotations

import sys

import torch

import kernelhub
from kernelhub import testing


def main(argv: list[str]) -> int:
    op, backend, dtype = argv[0], argv[1], getattr(torch, argv[2])
    sample = next(s for s in testing.samples(op, "benchmark", dtype, "cuda") if len(argv) < 4 or argv[3] in s.name)
    args = testing.with_grad(op, sample.args)
    fn = kernelhub.op(op, backend=backend)
    leaves = testing.leaves(op, args)
    for _ in range(4):
        out = fn(*args)
        torch.autograd.grad(out, leaves, torch.randn_like(out))
    torch.cuda.synchronize()
    print("profiled", op, backend, dtype, sample.name, tuple(out.shape))
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
