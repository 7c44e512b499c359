"""2-D phase and absorption from a through-focus stack, with a Tikhonov filter bank from ``tikhonov_inverse_2xn``.

A weak object ``t = exp(-mu + i phi)`` (absorption ``mu``, phase ``phi``: a few smooth cells on a flat field) is
imaged by a coherent microscope at ``--planes`` defocus distances (objective NA ``--na``, wavelength
``--wavelength``, a little coma so that the transfer functions are complex); the intensities are simulated
exactly (``|IFFT(FFT(t) * pupil * exp(i chi_z))|^2``) with Gaussian noise. Linearised, each spatial frequency k
of the stack is ``y_z(k) = FFT(I_z - 1)(k) = M[0, z](k) mu^(k) + M[1, z](k) phi^(k)``, with the weak-object
transfer functions ``M[0, z] = -(H_z(k) + conj(H_z(-k)))`` and ``M[1, z] = i (H_z(k) - conj(H_z(-k)))``
(``H_z`` the pupil with defocus ``z``). The Tikhonov solution per pixel is ``x(k) = conj(W(k)) y(k)`` with the
filter bank ``W = (M M^H + lam I)^-1 M``: ``tikhonov_inverse_2xn(M, lam)``, on the permuted view ``[Y, X, 2, Z]``
of the transfer functions as they are built (``[2, Z, Y, X]``), without a copy.

The same reconstruction is made with the SVD path phase-retrieval codes use, ``U diag(S / (S^2 + lam)) Vh``
from ``torch.linalg.svd`` in the same dtype. It prints the backend, the time to build the filter bank both ways
and the speed-up, the Pearson correlation of the two paths' images (gate: >= 0.9999 for phase and absorption)
and of each against the truth, and writes a PNG: phase truth | hub | SVD, then absorption truth | hub | SVD.

    python examples/phase_2d.py                 # CPU: 256^2, 5 planes, a second
    python examples/phase_2d.py --benchmark     # a GPU: 2048^2, 9 planes
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


def cells(N: int, device, seed: int) -> torch.Tensor:
    """A flat field with smooth elliptical blobs (peak 1), [N, N] float32: 12 per 256^2 pixels, so that a larger
    image shows more cells of the same size, not larger ones."""
    g = torch.Generator().manual_seed(seed)
    half = N / 256
    y, x = torch.meshgrid(*[torch.linspace(-half, half, N, device=device)] * 2, indexing="ij")
    img = torch.zeros(N, N, device=device)
    for _ in range(round(12 * half * half)):
        cy, cx, ry, rx, a, h = torch.rand(6, generator=g).tolist()
        cy, cx = (2 * cy - 1) * 0.7 * half, (2 * cx - 1) * 0.7 * half
        ry, rx, a = 0.05 + 0.15 * ry, 0.05 + 0.15 * rx, math.pi * a
        u = ((x - cx) * math.cos(a) + (y - cy) * math.sin(a)) / rx
        v = (-(x - cx) * math.sin(a) + (y - cy) * math.cos(a)) / ry
        img += (0.4 + 0.6 * h) * torch.exp(-(u * u + v * v) ** 2)  # flat-topped
    return img / img.max()


def transfer_functions(N: int, pixel: float, wavelength: float, na: float, defocus: torch.Tensor, coma: float,
                       device) -> tuple[torch.Tensor, torch.Tensor]:
    """``H [Z, N, N]`` (pupil x defocus x coma) and the weak-object transfer functions ``M [2, Z, N, N]``."""
    f = torch.fft.fftfreq(N, d=pixel, device=device)
    fy, fx = torch.meshgrid(f, f, indexing="ij")
    f2, kc = fx * fx + fy * fy, na / wavelength
    pupil = (f2 <= kc * kc).float()

    def H(sx: int):  # the pupil at (sx fx, sx fy), sx = +-1
        chi = math.pi * wavelength * defocus.to(device)[:, None, None] * f2
        w = coma * sx * (fx ** 3 + fx * fy * fy) / kc ** 3  # odd: makes M complex
        return pupil * torch.polar(torch.ones_like(chi), chi + w)
    h, h_neg = H(1), H(-1)
    return h, torch.stack([-(h + h_neg.conj()), 1j * (h - h_neg.conj())])


def timed(fn, device, reps: int):
    """fn's last result and its median time in ms over ``reps`` calls after one warm-up call."""
    fn()
    runs = [timed_ms(fn, device) for _ in range(reps)]
    return runs[-1][0], statistics.median(t for _, t in runs)


def svd_filter(M: torch.Tensor, lam: float) -> torch.Tensor:
    U, S, Vh = torch.linalg.svd(M, full_matrices=False)  # [..., 2, 2], [..., 2], [..., 2, Z]
    return U @ ((S / (S * S + lam)).to(M.dtype)[..., None] * Vh)


def pearson(a: torch.Tensor, b: torch.Tensor) -> float:
    a, b = a.double().flatten(), b.double().flatten()
    a, b = a - a.mean(), b - b.mean()
    return ((a @ b) / (a.norm() * b.norm())).item()


def main(argv=None) -> dict:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--size", type=int, default=256, help="images are size^2 pixels")
    p.add_argument("--planes", type=int, default=5, help="defocus planes, evenly over [-dz_max, dz_max]")
    p.add_argument("--dz-max", type=float, default=20.0, help="um")
    p.add_argument("--wavelength", type=float, default=0.5, help="um")
    p.add_argument("--pixel", type=float, default=0.2, help="um")
    p.add_argument("--na", type=float, default=0.4)
    p.add_argument("--coma", type=float, default=0.3, help="rad at the pupil's edge")
    p.add_argument("--phase", type=float, default=0.3, help="peak phase, rad")
    p.add_argument("--absorption", type=float, default=0.05, help="peak mu")
    p.add_argument("--noise", type=float, default=2e-3, help="Gaussian noise sigma on the intensities")
    p.add_argument("--lam", type=float, default=0.002, help="Tikhonov lambda")
    p.add_argument("--dtype", choices=("complex64", "complex128"), default="complex64")
    p.add_argument("--reps", type=int, default=10, help="timed repetitions (median)")
    p.add_argument("--benchmark", action="store_true", help="2048^2, 9 planes, for a GPU")
    add_io_args(p, "phase_2d.png")
    args = p.parse_args(argv)
    if args.benchmark:
        args.size, args.planes = 2048, 9
    device, dtype = torch.device(args.device), getattr(torch, args.dtype)
    N, Z = args.size, args.planes

    phi, mu = args.phase * cells(N, device, 1), args.absorption * cells(N, device, 2)
    defocus = torch.linspace(-args.dz_max, args.dz_max, Z, dtype=torch.float64)
    h, M_zyx = transfer_functions(N, args.pixel, args.wavelength, args.na, defocus, args.coma, device)
    field = torch.fft.ifft2(torch.fft.fft2(torch.polar(torch.exp(-mu), phi)) * h)   # [Z, N, N]
    gen = torch.Generator(device=device).manual_seed(0)
    stack = field.abs().square() + args.noise * torch.randn(field.shape, generator=gen, device=device)
    y = torch.fft.fft2(stack - 1).permute(1, 2, 0).to(dtype)                        # [Y, X, Z]
    M = M_zyx.to(dtype).permute(2, 3, 0, 1)                                          # [Y, X, 2, Z], a view

    tik = kernelhub.op("tikhonov_inverse_2xn")
    backend = kernelhub.explain("tikhonov_inverse_2xn", M, args.lam).chosen
    W, ms_hub = timed(lambda: tik(M, args.lam), device, args.reps)
    W_svd, ms_svd = timed(lambda: svd_filter(M, args.lam), device, args.reps)

    def reconstruct(W):
        x = torch.einsum("yxjz,yxz->jyx", W.conj(), y)
        return torch.fft.ifft2(x).real                                               # [2, N, N]: mu, phi
    (mu_hub, phi_hub), (mu_svd, phi_svd) = reconstruct(W), reconstruct(W_svd)
    _, ms_recon = timed(lambda: reconstruct(tik(M, args.lam)), device, args.reps)
    _, ms_recon_svd = timed(lambda: reconstruct(svd_filter(M, args.lam)), device, args.reps)

    moved = 2 * M.numel() * M.element_size()  # the least a filter bank must move: read M, write W
    r = {"phase": pearson(phi_hub, phi_svd), "absorption": pearson(mu_hub, mu_svd)}
    truth = {"phase_hub": pearson(phi_hub, phi), "absorption_hub": pearson(mu_hub, mu),
             "phase_svd": pearson(phi_svd, phi), "absorption_svd": pearson(mu_svd, mu)}
    ok = min(r.values()) >= 0.9999
    result = {"size": N, "planes": Z, "device": str(device), "dtype": args.dtype, "backend": backend,
              "filter_ms": ms_hub, "filter_ms_svd": ms_svd,
              "filter_GBps": moved / ms_hub / 1e6, "speedup": ms_svd / ms_hub, "recon_ms": ms_recon,
              "recon_ms_svd": ms_recon_svd, "pearson_hub_vs_svd": r, "pearson_vs_truth": truth, "ok": ok}
    print(f"{N}^2 pixels x {Z} planes on {device}, {args.dtype}: tikhonov_inverse_2xn -> {backend}")
    print(f"filter bank: hub {ms_hub:.3f} ms ({moved / ms_hub / 1e6:.0f} GB/s of M read and W written), "
          f"SVD {ms_svd:.3f} ms ({ms_svd / ms_hub:.1f}x); whole reconstruction "
          f"{ms_recon:.3f} ms against {ms_recon_svd:.3f} ms ({ms_recon_svd / ms_recon:.1f}x)")
    print(f"Pearson hub vs SVD: phase 1 - {max(1 - r['phase'], 0):.1e}, absorption 1 - "
          f"{max(1 - r['absorption'], 0):.1e} (gate >= 0.9999: {'OK' if ok else 'FAILED'}); against the truth: "
          f"phase {truth['phase_hub']:.4f} (SVD "
          f"{truth['phase_svd']:.4f}), absorption {truth['absorption_hub']:.4f} (SVD {truth['absorption_svd']:.4f})")

    def like_phase(a):  # absorption images on the phase truth's grey scale, by the absorption truth's range
        return phi.min() + (a - mu.min()) * (phi.max() - phi.min()) / (mu.max() - mu.min())
    write_png(Path(args.out), [phi, phi_hub, phi_svd, like_phase(mu), like_phase(mu_hub), like_phase(mu_svd)],
              ["phase: truth", "phase: hub", "phase: SVD", "absorption: truth", "absorption: hub", "absorption: SVD"])
    print(f"wrote {args.out}: phase truth | hub | SVD, absorption truth | hub | SVD")
    save_json(args.json, result)
    return result


if __name__ == "__main__":
    sys.exit(0 if main()["ok"] else 1)
