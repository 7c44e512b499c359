"""What the PyTorch 2 toolchain costs with kernelhub in a step (docs/benchmarks.md, "Compiled steps").

  compile     seconds to the first result (forward + backward) of a fresh ``torch.compile(fullgraph=True)`` of
              the two-op step ``tv(v).sum() + kp(pts, R, planes).square().mean()`` (TV L1 on [2, 64, 64, 64],
              K-Planes on 65536 points, T 2, C 16, 128² planes), calling the hub, against the same step calling
              the reference's functions (kernelhub_torch_ref) directly; inductor's FX graph cache off, after a
              warm-up compile of another function
  tomography  the K-Planes tomography training step (examples/kplanes_tomography.py at its --benchmark sizes,
              Adam included): wall ms per step eager, compiled, and compiled with mode="reduce-overhead" (CUDA
              graphs), median of 5 blocks of 10 steps; and the sum of the GPU's kernel, copy and set times per
              step (torch.profiler, 5 steps), which a step whose host no longer shows approaches

    python benchmarks/run.py compile [--device cuda] [--parts compile tomography] [--json FILE]
"""

from __future__ import annotations

import argparse
import json
import math
import statistics
import sys
import time
from pathlib import Path

import torch

import kernelhub

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "examples"))


def sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def compile_seconds(device: torch.device) -> dict:
    from kernelhub_torch_ref.plugin import FORWARDS

    torch._inductor.config.fx_graph_cache = False
    g = torch.Generator().manual_seed(0)
    v = torch.randn(2, 64, 64, 64, generator=g).to(device).requires_grad_()
    pts = (torch.rand(65536, 3, generator=g) * 2 - 1).to(device)
    R = torch.linalg.qr(torch.randn(2, 3, 3, generator=g))[0].to(device)
    planes = torch.randn(6, 16, 128, 128, generator=g).to(device).requires_grad_()
    fns = {"reference": (FORWARDS["tv_loss_l1_3d"], FORWARDS["kplanes_interp_tilted"]),
           "hub": (kernelhub.op("tv_loss_l1_3d"), kernelhub.op("kplanes_interp_tilted"))}
    torch.compile(lambda x: (x * 2).sum(), fullgraph=True)(v.detach())  # dynamo's and inductor's first use
    best: dict[str, float] = {}
    for label, (tv, kp) in fns.items():
        def step(v, pts, R, planes, tv=tv, kp=kp):
            return tv(v).sum() + kp(pts, R, planes).square().mean()
        torch._dynamo.reset()
        sync(device)
        start = time.perf_counter()
        torch.autograd.grad(torch.compile(step, fullgraph=True)(v, pts, R, planes), (v, planes))
        sync(device)
        best[label] = time.perf_counter() - start
    print(f"compile: first forward + backward of the two-op step, s: reference {best['reference']:.1f}, "
          f"hub {best['hub']:.1f} ({best['hub'] / best['reference']:.2f}x)")
    return {"seconds": best, "ratio": best["hub"] / best["reference"]}


def tomography(device: torch.device) -> dict:
    from kplanes_tomography import Field, phantom, rays

    T, C, res, batch, samples, lr, tv = 4, 32, [100, 200], 2048, 300, 0.02, 1e-3
    pts_all, step_len = rays(64, 64, samples, device)
    sino = phantom(pts_all).sum(-1) * step_len
    h = 2.0 / res[-1]
    out = {}
    for mode in ("eager", "default", "reduce-overhead"):
        torch.manual_seed(0)
        torch._dynamo.reset()
        field = Field(T, C, res, device)
        opt = torch.optim.Adam(field.parameters(), lr=lr)

        def objective(pts, measured):
            dens = field(pts, h)
            proj = dens[0].view(batch, samples).sum(-1) * step_len
            return (proj - measured).square().mean() + tv * (dens[1:] - dens[:1]).abs().mean()
        fn = objective if mode == "eager" else torch.compile(objective, fullgraph=True, mode=mode)
        gen = torch.Generator().manual_seed(1)
        batches = []
        for _ in range(8):
            idx = torch.randint(0, pts_all.shape[0], (batch,), generator=gen).to(device)
            batches.append((pts_all[idx].reshape(-1, 3), sino[idx]))

        def step(k):
            loss = fn(*batches[k % len(batches)])
            opt.zero_grad(set_to_none=True)
            loss.backward()
            opt.step()
        for k in range(10):  # compiles, CUDA graph warm-up and capture
            step(k)
        blocks = []
        for _ in range(5):
            sync(device)
            start = time.perf_counter()
            for k in range(10):
                step(k)
            sync(device)
            blocks.append((time.perf_counter() - start) / 10 * 1e3)
        row = {"step_ms": statistics.median(blocks)}
        if device.type == "cuda":
            from torch.profiler import DeviceType, ProfilerActivity, profile

            sync(device)
            with profile(activities=[ProfilerActivity.CUDA]) as prof:
                for k in range(5):
                    step(k)
                sync(device)
            gpu_us = sum(e.device_time_total if hasattr(e, "device_time_total") else e.cuda_time_total
                         for e in prof.events() if e.device_type == DeviceType.CUDA)
            row["gpu_ms"] = gpu_us / 5 / 1e3
            row["wall_vs_gpu"] = row["step_ms"] / row["gpu_ms"]
        out[mode] = row
        extra = f", GPU {row['gpu_ms']:.3f} ms ({row['wall_vs_gpu']:.2f}x)" if "gpu_ms" in row else ""
        print(f"tomography ({math.prod(batches[0][0].shape[:1])} points): {mode:16s} {row['step_ms']:8.3f} ms/step"
              f"{extra}", flush=True)
    return out


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    p.add_argument("--parts", nargs="+", default=["compile", "tomography"], choices=["compile", "tomography"])
    p.add_argument("--json")
    args = p.parse_args(argv)
    device = torch.device(args.device)
    name = torch.cuda.get_device_name(device) if device.type == "cuda" else f"CPU, {torch.get_num_threads()} threads"
    results: dict = {"device": name, "torch": torch.__version__}
    if "compile" in args.parts:
        results["compile"] = compile_seconds(device)
    if "tomography" in args.parts:
        results["tomography"] = tomography(device)
    if args.json:
        Path(args.json).write_text(json.dumps(results, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
