"""Tilted K-Planes tomography: fit a multiscale K-Planes field to a synthetic phantom's projections.

A 3-D phantom (a few ellipsoids) is projected along rays in parallel beams from several angles around
the z axis. A tilted K-Planes field (T tilted copies of the XY / ZX / YZ planes, several scales, C channels)
and a small linear decoder predict the density at the rays' sample points; the loss is the projections'
squared error plus a volume-TV term. One `kplanes_interp_tilted_taps` call per scale evaluates every
sample point and its three finite-difference taps: tap 0 feeds the data term and taps 1-3 the TV term, so
the planes' gradient is accumulated once for both.

The same training step runs with the hub's choice of backend (the fastest correct one on this device)
and, for timing only (`--ref-steps`, 30 by default), with torch_ref forced; the script prints the backend
used, the median step time of each and the reconstruction's PSNR, and writes a PNG of the reconstructed
central slice next to the phantom's.

    python examples/kplanes_tomography.py                 # small setting (CPU: well under a minute)
    python examples/kplanes_tomography.py --benchmark     # 2048 rays x 300 samples, T=4, C=32, 200x200 planes
"""

from __future__ import annotations

import argparse
import math
import statistics
import sys
from pathlib import Path

import torch

import kernelhub
from kernelhub.nn import KPlanesField

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import timed_ms, write_png  # noqa: E402

ELLIPSOIDS = [  # (centre, semi-axes, density)
    ((0.0, 0.0, 0.0), (0.7, 0.55, 0.6), 1.0),
    ((0.2, -0.1, 0.1), (0.2, 0.3, 0.25), -0.5),
    ((-0.25, 0.2, -0.1), (0.15, 0.15, 0.3), 0.6),
    ((0.0, 0.35, 0.25), (0.1, 0.1, 0.1), 0.8),
]


def phantom(x: torch.Tensor) -> torch.Tensor:
    """Density at points [..., 3] in [-1, 1]^3."""
    d = torch.zeros(x.shape[:-1], dtype=x.dtype, device=x.device)
    for centre, axes, rho in ELLIPSOIDS:
        r = ((x - torch.tensor(centre, dtype=x.dtype, device=x.device)) / torch.tensor(axes, dtype=x.dtype,
                                                                                       device=x.device))
        d = d + rho * (r.square().sum(-1) <= 1).to(x.dtype)
    return d


def rays(angles: int, det: int, samples: int, device) -> tuple[torch.Tensor, float]:
    """Sample points [angles * det * det, samples, 3] of parallel rays around z, and the step length."""
    th = torch.arange(angles, device=device) * math.pi / angles
    u = torch.linspace(-0.9, 0.9, det, device=device)
    s = torch.linspace(-0.95, 0.95, samples, device=device)
    d = torch.stack([th.cos(), th.sin(), torch.zeros_like(th)], -1)  # ray direction in the xy plane
    n = torch.stack([-th.sin(), th.cos(), torch.zeros_like(th)], -1)  # detector axis in the xy plane
    U, V = torch.meshgrid(u, u, indexing="ij")  # detector (in-plane, z)
    origin = U.reshape(1, -1, 1) * n[:, None] + V.reshape(1, -1, 1) * torch.tensor([0.0, 0.0, 1.0], device=device)
    pts = origin[:, :, None, :] + s.view(1, 1, -1, 1) * d[:, None, None, :]
    return pts.reshape(-1, samples, 3), float(s[1] - s[0])


class Field(torch.nn.Module):
    """Tilted K-Planes (`kernelhub.nn.KPlanesField`: T tilts, the identity first, one [3T, C, R, R] planes tensor
    per scale; its ops forced to ``backend``, or chosen by the hub for None) and a linear decoder."""

    def __init__(self, T: int, C: int, resolutions: list[int], device, backend: str | None = None,
                 seed: int = 0) -> None:
        super().__init__()
        self.kplanes = KPlanesField(T, C, resolutions, seed=seed, backend=backend).to(device)
        self.decoder = torch.nn.Linear(self.kplanes.features, 1).to(device)
        with torch.no_grad():
            self.decoder.weight.mul_(0.1)

    def forward(self, pts: torch.Tensor, h: float) -> torch.Tensor:
        """Density at pts and at its three taps: [4, B]."""
        return torch.nn.functional.softplus(self.decoder(self.kplanes(pts, tv_taps=h))[..., 0])


def train(args, backend: str | None, pts_all, sino, step_len, device, steps: int) -> tuple[Field, list[float], str]:
    torch.manual_seed(0)
    field = Field(args.T, args.C, args.res, device, backend)
    # the decoder at a tenth of the planes' rate: at the full rate, with T*C*scales features near 1, its first
    # steps can push every density into softplus's flat tail, where training stalls
    opt = torch.optim.Adam([{"params": field.kplanes.planes.parameters()},
                            {"params": field.decoder.parameters(), "lr": args.lr / 10}], lr=args.lr)
    n_rays, S, _ = pts_all.shape
    h = 2.0 / args.res[-1]
    times = []
    gen = torch.Generator(device="cpu").manual_seed(1)

    def objective(pts, measured):
        dens = field(pts, h)  # [4, batch * S]
        proj = dens[0].view(args.batch, S).sum(-1) * step_len
        data = (proj - measured).square().mean()
        tv = (dens[1:] - dens[:1]).abs().mean()
        return data + args.tv * tv
    if getattr(args, "compile", "none") != "none":  # the forward and its backward compiled; Adam stays eager
        objective = torch.compile(objective, fullgraph=True, mode=args.compile)
    for _ in range(steps):
        idx = torch.randint(0, n_rays, (args.batch,), generator=gen).to(device)
        pts = pts_all[idx].reshape(-1, 3)

        def step():
            loss = objective(pts, sino[idx])
            opt.zero_grad(set_to_none=True)
            loss.backward()
            opt.step()
        times.append(timed_ms(step, device)[1])
    used = kernelhub.explain("kplanes_interp_tilted_taps", pts, field.kplanes.rotations, field.kplanes.planes[0],
                             h).chosen \
        if backend is None else backend
    return field, times, used


def central_slice(field: Field, n: int, device) -> torch.Tensor:
    u = torch.linspace(-1, 1, n, device=device)
    X, Y = torch.meshgrid(u, u, indexing="ij")
    pts = torch.stack([X, Y, torch.zeros_like(X)], -1).reshape(-1, 3)
    with torch.no_grad():
        return field(pts, 0.0)[0].view(n, n)


def psnr(x: torch.Tensor, ref: torch.Tensor) -> float:
    mse = (x - ref).square().mean().item()
    peak = ref.max().item() - ref.min().item()
    return 10 * math.log10(peak * peak / max(mse, 1e-12))


def main(argv=None) -> dict:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--benchmark", action="store_true", help="2048 rays x 300 samples, T=4, C=32, 200x200 planes")
    p.add_argument("--steps", type=int, default=None)
    p.add_argument("--ref-steps", type=int, default=30, help="steps of the torch_ref run, which is only timed")
    p.add_argument("--lr", type=float, default=None)
    p.add_argument("--batch", type=int, default=None)
    p.add_argument("--out", default="kplanes_tomography.png")
    p.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    p.add_argument("--compile", default="none", choices=["none", "default", "reduce-overhead"],
                   help="torch.compile the step's forward and loss (fullgraph) in this mode; reduce-overhead replays "
                        "CUDA graphs")
    args = p.parse_args(argv)
    small = dict(angles=12, det=24, samples=32, batch=128, T=2, C=8, res=[12, 24], steps=200, lr=0.05, tv=1e-3)
    bench = dict(angles=64, det=64, samples=300, batch=2048, T=4, C=32, res=[100, 200], steps=300, lr=0.02,
                 tv=1e-3)
    for k, v in (bench if args.benchmark else small).items():
        if getattr(args, k, None) is None:
            setattr(args, k, v)
    device = torch.device(args.device)
    pts_all, step_len = rays(args.angles, args.det, args.samples, device)
    sino = phantom(pts_all).sum(-1) * step_len  # the measured projections
    print(f"device {device}: {pts_all.shape[0]} rays x {args.samples} samples, batch {args.batch} rays "
          f"({args.batch * args.samples} points), T={args.T}, C={args.C}, scales {args.res}, {args.steps} steps")
    results = {}
    for label, backend, steps in (("best", None, args.steps), ("torch_ref", "torch_ref", args.ref_steps)):
        field, times, used = train(args, backend, pts_all, sino, step_len, device, steps)
        warm = times[len(times) // 3:]  # past the first calls (compiles, allocations)
        results[label] = {"backend": used, "step_ms": statistics.median(warm), "field": field}
        print(f"{label:9s} backend {used:9s}: median step {results[label]['step_ms']:8.2f} ms")
    n = 64
    u = torch.linspace(-1, 1, n, device=device)
    X, Y = torch.meshgrid(u, u, indexing="ij")
    truth = phantom(torch.stack([X, Y, torch.zeros_like(X)], -1))
    recon = central_slice(results["best"]["field"], n, device)
    quality = psnr(recon, truth)
    flat = psnr(torch.full_like(truth, truth.mean().item()), truth)  # what knowing only the mean gives
    speedup = results["torch_ref"]["step_ms"] / results["best"]["step_ms"]
    same = " (the same backend: no kernel backend serves this call here)" \
        if results["best"]["backend"] == "torch_ref" else ""
    print(f"speed-up of {results['best']['backend']} over torch_ref: {speedup:.2f}x{same}")
    print(f"central slice PSNR {quality:.1f} dB (a flat image at the phantom's mean: {flat:.1f} dB)")
    write_png(Path(args.out), [truth, recon], ["truth", "K-Planes reconstruction"])
    print(f"wrote {args.out} (phantom | reconstruction, central z slice)")
    return {"psnr": quality, "flat_psnr": flat, "speedup": speedup, "best": results["best"]["backend"],
            "step_ms": {k: r["step_ms"] for k, r in results.items()}}


if __name__ == "__main__":
    main()
