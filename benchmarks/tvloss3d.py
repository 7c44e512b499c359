"""What kernelhub.nn.TVLoss3d costs over one bare ``tv_loss_l1_3d`` call, forward + backward, and where.

Per call, on ptycho_tv's ``--benchmark`` volumes (two stacked ``[8, 512, 512]``) and a 4x64³ batch: wall time with
the device synchronised around each call (what the example reports; median of ``--n``) and host time per call with
no synchronisation (median over rounds of 10 calls back to back, then one synchronisation); the variants
interleaved, 10 calls of each in turn. Variants: the bare op with ``backward(ones)``;
``TVLoss3d`` (a weighted handle: ``S . c`` inside the op's autograd node, and inside the kernels where the backend
fuses it, `Impl.can` "weighted") given its upstream gradient as the bare
op is, and with ``backward()`` (torch fills the scalar's upstream one: a launch that a step pays once for its whole
loss, not per term); the same weighting spelled ``torch.dot(S, c)``, ``(S * c).sum()`` and ``torch.mv`` (one
cuBLAS gemv each way) by hand, each its own autograd node after the op's.

Usage: python benchmarks/tvloss3d.py [--device cuda] [--backend B] [--json PATH]
"""

from __future__ import annotations

import argparse
import json
import statistics
import time

import torch

import kernelhub
from kernelhub import nn as khnn


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    p.add_argument("--json")
    p.add_argument("--n", type=int, default=200)
    p.add_argument("--backend", default=None, help="force this backend (the op and TVLoss3d alike)")
    args = p.parse_args(argv)
    dev = torch.device(args.device)
    sync = torch.cuda.synchronize if dev.type == "cuda" else (lambda: None)
    op = kernelhub.op("tv_loss_l1_3d", backend=args.backend)
    results = []
    for shape in ((2, 8, 512, 512), (4, 64, 64, 64)):
        vol = torch.randn(shape, device=dev)
        tv = khnn.TVLoss3d("l1", (0.5, 1.0, 1.0), backend=args.backend)
        c = tv._handle(vol).weights  # the coefficients TVLoss3d keeps per volume size
        ones, one = torch.ones(3, device=dev), torch.ones((), device=dev)

        def leaf():
            return vol.detach().requires_grad_()
        variants = {
            "bare op, backward(ones)": lambda: op(leaf()).backward(ones),
            "TVLoss3d, backward(one)": lambda: tv(leaf()).backward(one),
            "TVLoss3d, backward()": lambda: tv(leaf()).backward(),
            "op then torch.dot(S, c)": lambda: torch.dot(op(leaf()), c).backward(one),
            "op then (S * c).sum()": lambda: (op(leaf()) * c).sum().backward(one),
            "op then torch.mv(c, S)": lambda: torch.mv(c[None], op(leaf())).squeeze(0).backward(one),  # cuBLAS gemv
            "op.weighted(c)(v)": lambda: op.weighted(c)(leaf()).backward(one),
        }
        for fn in variants.values():  # warm-up
            for _ in range(10):
                fn()
        sync()
        # interleaved: each round runs every variant in turn (so a drift of the host's speed hits them alike)
        walls: dict[str, list[float]] = {name: [] for name in variants}
        hosts: dict[str, list[float]] = {name: [] for name in variants}
        for _ in range(args.n // 10):
            for name, fn in variants.items():
                for _ in range(10):
                    sync()
                    t0 = time.perf_counter()
                    fn()
                    sync()
                    walls[name].append((time.perf_counter() - t0) * 1e6)
                sync()
                t0 = time.perf_counter()
                for _ in range(10):
                    fn()
                hosts[name].append((time.perf_counter() - t0) / 10 * 1e6)
                sync()
        for name in variants:
            results.append({"shape": list(shape), "variant": name, "wall_us": statistics.median(walls[name]),
                            "host_us": statistics.median(hosts[name])})
        base = next(r for r in results if r["shape"] == list(shape) and r["variant"].startswith("bare"))
        print(f"{list(shape)} on {dev} ({args.backend or kernelhub.explain('tv_loss_l1_3d', vol).chosen}):")
        for r in results:
            if r["shape"] == list(shape):
                print(f"  {r['variant']:26s} wall {r['wall_us']:7.1f} µs ({r['wall_us'] / base['wall_us']:.2f}x)  "
                      f"host {r['host_us']:7.1f} µs ({r['host_us'] / base['host_us']:.2f}x)")
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"device": str(dev), "rows": results}, f, indent=1)


if __name__ == "__main__":
    main()
