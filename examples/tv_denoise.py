"""3-D total-variation denoising with each of kernelhub's TV ops.

A phantom (balls and a box of several intensities in a D^3 volume) gets Gaussian noise. Each TV op then
denoises it by Adam steps on ``0.5 mean((x - noisy)^2) + lam * TV(x) / n``, from the noisy volume:

- ``tv_loss_l1_3d``: anisotropic TV, the per-axis sums of |forward differences| (weighted per axis);
- ``tv_loss_iso_3d``: isotropic TV, the mean over corners of sqrt(dd^2 + dh^2 + dw^2 + eps) (times n);
- ``tv_loss_sq_3d``: quadratic smoothing, the sum of squared differences.

For each op it runs the backend the hub picks and torch_ref, and prints the backend, the median time per
iteration of both, and the PSNR against the clean phantom before and after; the two backends must end at the
same PSNR (within 0.05 dB). It writes a PNG of the central slices: clean | noisy | l1 | iso | sq.

    python examples/tv_denoise.py                 # CPU: 64^3, a few seconds
    python examples/tv_denoise.py --benchmark     # a GPU: 256^3
"""

from __future__ import annotations

import argparse
import math
import statistics
import sys
from pathlib import Path

import torch

import kernelhub

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import add_io_args, save_json, timed_ms, write_png  # noqa: E402

OPS = ("tv_loss_l1_3d", "tv_loss_iso_3d", "tv_loss_sq_3d")
LAM = {"tv_loss_l1_3d": 0.08, "tv_loss_iso_3d": 0.12, "tv_loss_sq_3d": 0.3}  # chosen on the default phantom
AXIS_WEIGHTS = (1.0, 1.0, 1.0)  # D, H, W for the anisotropic TV


def phantom(D: int, device: torch.device) -> torch.Tensor:
    z, y, x = torch.meshgrid(*[torch.linspace(-1, 1, D, device=device)] * 3, indexing="ij")
    vol = torch.zeros(D, D, D, device=device)
    for (cz, cy, cx, r, v) in ((0.0, 0.0, 0.0, 0.7, 0.5), (0.2, -0.25, 0.1, 0.25, 1.0), (-0.3, 0.3, -0.2, 0.18, 0.2)):
        vol[(z - cz) ** 2 + (y - cy) ** 2 + (x - cx) ** 2 < r * r] = v
    vol[(z.abs() < 0.15) & ((y - 0.45).abs() < 0.12) & (x.abs() < 0.4)] = 0.8
    return vol


def psnr(x: torch.Tensor, clean: torch.Tensor) -> float:
    return 10 * math.log10(1.0 / (x - clean).square().mean().item())


def regulariser(op: str, tv, x: torch.Tensor) -> torch.Tensor:
    if op == "tv_loss_l1_3d":
        return tv(x) @ torch.tensor(AXIS_WEIGHTS, device=x.device) / x.numel()
    if op == "tv_loss_iso_3d":
        return tv(x)  # already a mean
    return tv(x) / x.numel()


def denoise(op: str, backend: str | None, noisy: torch.Tensor, iters: int, lr: float):
    tv = kernelhub.op(op, backend=backend)
    x = noisy.clone().requires_grad_()
    opt = torch.optim.Adam([x], lr=lr)

    def step():
        opt.zero_grad(set_to_none=True)
        loss = 0.5 * (x - noisy).square().mean() + LAM[op] * regulariser(op, tv, x)
        loss.backward()
        opt.step()
    times = [timed_ms(step, noisy.device)[1] for _ in range(iters)]
    return x.detach(), statistics.median(times[max(1, iters // 5):])  # after warm-up


def main(argv=None) -> dict:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--size", type=int, default=64, help="the volume is size^3")
    p.add_argument("--iters", type=int, default=60)
    p.add_argument("--sigma", type=float, default=0.15, help="noise standard deviation")
    p.add_argument("--lr", type=float, default=0.02)
    p.add_argument("--benchmark", action="store_true", help="256^3, for a GPU")
    add_io_args(p, "tv_denoise.png")
    args = p.parse_args(argv)
    if args.benchmark:
        args.size = 256
    device = torch.device(args.device)
    clean = phantom(args.size, device)
    gen = torch.Generator(device=device).manual_seed(0)
    noisy = clean + args.sigma * torch.randn(clean.shape, generator=gen, device=device)
    result = {"size": args.size, "iters": args.iters, "device": str(device), "noisy_psnr": psnr(noisy, clean),
              "ops": {}}
    print(f"{args.size}^3 phantom on {device}, noise sigma {args.sigma}: PSNR {result['noisy_psnr']:.2f} dB; "
          f"{args.iters} Adam iterations per run")
    slices = [clean[args.size // 2], noisy[args.size // 2]]
    for op in OPS:
        backend = kernelhub.explain(op, noisy).chosen
        x, ms = denoise(op, None, noisy, args.iters, args.lr)
        x_ref, ms_ref = denoise(op, "torch_ref", noisy, args.iters, args.lr)
        r = {"backend": backend, "ms_per_iter": ms, "ms_per_iter_torch_ref": ms_ref, "psnr": psnr(x, clean),
             "psnr_torch_ref": psnr(x_ref, clean)}
        result["ops"][op] = r
        slices.append(x[args.size // 2])
        print(f"{op:15s} {backend:9s} {ms:8.3f} ms/iter (torch_ref {ms_ref:8.3f}, {ms_ref / ms:5.1f}x)  "
              f"PSNR {r['psnr']:.2f} dB (torch_ref {r['psnr_torch_ref']:.2f})")
    write_png(Path(args.out), slices, ["clean", "noisy", *(f"TV {op.split('_')[2]}" for op in result["ops"])],
              "central slices")
    print(f"wrote {args.out}: clean | noisy | l1 | iso | sq (central slices)")
    save_json(args.json, result)
    return result


if __name__ == "__main__":
    main()
