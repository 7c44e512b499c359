"""Host (CPU) time of one semiconv forward + backward step per GPU backend, and a torch.profiler table of where it goes.

Usage (on a GPU machine): python benchmarks/run.py host-semiconv
"""

from __future__ import annotations

import argparse
import time

import torch

import kernelhub
from kernelhub import testing


def main(argv: list[str] | None = None) -> None:
    argparse.ArgumentParser(description=__doc__.splitlines()[0]).parse_args(argv)
    s = [x for x in testing.samples("semiconv", "benchmark", torch.float32, "cuda", seed=0)
         if "tropical_max_16x32x256x256_k3x3_g32" in x.name][0]
    img, ker = (a.detach().requires_grad_() for a in s.args[:2])
    rest = s.args[2:]
    for backend in ("triton", "cuda_ext"):
        op = kernelhub.op("semiconv", backend=backend)
        g = torch.randn_like(op(img, ker, *rest))

        def step():
            img.grad = ker.grad = None
            op(img, ker, *rest).backward(g)
        for _ in range(10):
            step()
        torch.cuda.synchronize()
        for label, fn in (("fwd", lambda: op(img, ker, *rest)), ("fwd+bwd", step)):
            t0 = time.perf_counter()
            for _ in range(20):
                fn()
            host = (time.perf_counter() - t0) / 20 * 1e3
            torch.cuda.synchronize()
            total = (time.perf_counter() - t0) / 20 * 1e3
            print(f"{backend:9s} {label:8s} host {host:.3f} ms/step, with the GPU {total:.3f} ms/step")
        with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) as prof:
            for _ in range(5):
                step()
            torch.cuda.synchronize()
        print(prof.key_averages().table(sort_by="cpu_time_total", row_limit=14, max_name_column_width=50))


if __name__ == "__main__":
    main()
