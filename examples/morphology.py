"""Learned morphology with `semiconv` and `kernelhub.nn`: a structuring element fitted by gradient descent, and a
tiny network that pools with a learned dilation (`kernelhub.nn.SemiConv`) instead of max-pooling.

1. A generated image (discs of several sizes and brightnesses, plus salt noise) is dilated (tropical_max)
   and eroded (tropical_min) with a hidden 5x5 disc structuring element. A learnable 5x5 kernel, started
   flat (a square), is fitted to reproduce both results; the gradient reaches the kernel only through
   each window's winner. The learned element then gives a morphological gradient (dilation - erosion)
   and an opening (`kernelhub.nn.Opening`: the erosion, then its adjoint dilation), which removes the salt noise;
   a closing (`kernelhub.nn.Closing`) with an isotropic quadratic element lifts the image, never lowers it.
2. A tiny classifier (discs against rings, 24x24) whose two pooling steps are semiconv dilations with
   learned 3x3 depthwise kernels (stride 2) instead of F.max_pool2d, trained for a few steps.

The script prints the backend the hub picks for semiconv, the fit's error before and after, the
classifier's loss and accuracy, and writes a PNG: noisy image | gradient | opening | opening with the
hidden element.

    python examples/morphology.py                      # CPU: a few seconds
    python examples/morphology.py --device cuda
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import torch

import kernelhub
from kernelhub import nn as khnn

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import write_png  # noqa: E402

semiconv = kernelhub.op("semiconv")
OUTSIDE = -2.0  # the hidden element's value off the disc: below any image difference (the image is in [0, 1])


def image(n: int, gen: torch.Generator) -> torch.Tensor:
    """[1, 1, n, n]: discs of radius 3-9 and brightness 0.4-1 on a dark background, plus 1-pixel salt noise."""
    yy, xx = torch.meshgrid(torch.arange(n, dtype=torch.float32), torch.arange(n, dtype=torch.float32),
                            indexing="ij")
    img = torch.full((n, n), 0.1)
    for _ in range(14):
        cy, cx = (torch.rand(2, generator=gen) * n).tolist()
        r = 3 + 6 * torch.rand(1, generator=gen).item()
        img = torch.where((yy - cy) ** 2 + (xx - cx) ** 2 <= r * r, 0.4 + 0.6 * torch.rand(1, generator=gen).item(),
                          img)
    salt = torch.rand((n, n), generator=gen) < 0.02
    return torch.where(salt, torch.ones(()), img)[None, None]


def disc_element(size: int) -> torch.Tensor:
    """[1, 1, size, size]: 0 on the disc inscribed in the square, OUTSIDE elsewhere (a flat disc)."""
    c = (size - 1) / 2
    yy, xx = torch.meshgrid(torch.arange(size) - c, torch.arange(size) - c, indexing="ij")
    return torch.where(yy ** 2 + xx ** 2 <= c * c + 0.5, 0.0, OUTSIDE)[None, None]


def dilate(x, k):
    return semiconv(x, k, "tropical_max", padding="same")


def erode(x, k):
    return semiconv(x, k, "tropical_min", padding="same")


def fit_element(img: torch.Tensor, hidden: torch.Tensor, steps: int) -> tuple[torch.Tensor, float, float]:
    """A 5x5 element fitted to reproduce the hidden one's dilation and erosion; (element, error before, after)."""
    target_d, target_e = dilate(img, hidden), erode(img, hidden)
    k = torch.zeros_like(hidden, requires_grad=True)  # flat: a 5x5 square
    opt = torch.optim.Adam([k], lr=0.05)

    def error():
        return (dilate(img, k) - target_d).square().mean() + (erode(img, k) - target_e).square().mean()

    with torch.no_grad():
        before = error().item()
    for _ in range(steps):
        loss = error()
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
    with torch.no_grad():
        return k.detach(), before, error().item()


def dilation_pool(channels: int) -> khnn.SemiConv:
    """Pooling by a learned 3x3 depthwise dilation (max-plus), stride 2: F.max_pool2d where the kernel is 0 (its
    start: `LearnedKernel` is initialised flat)."""
    return khnn.SemiConv(khnn.LearnedKernel(1, channels, 3), "tropical_max", stride=2, padding=1, groups=channels)


def shapes(batch: int, gen: torch.Generator, n: int = 24) -> tuple[torch.Tensor, torch.Tensor]:
    """[batch, 1, n, n] discs (label 0) and rings (label 1) at random places and sizes, with noise."""
    yy, xx = torch.meshgrid(torch.arange(n, dtype=torch.float32), torch.arange(n, dtype=torch.float32),
                            indexing="ij")
    labels = torch.randint(0, 2, (batch,), generator=gen)
    cy, cx = (6 + torch.rand(2, batch, 1, 1, generator=gen) * (n - 12)).unbind(0)
    r = 4 + 3 * torch.rand(batch, 1, 1, generator=gen)
    d = ((yy - cy) ** 2 + (xx - cx) ** 2).sqrt()
    ring = (d <= r) & (d >= r - 1.5)
    x = torch.where(labels[:, None, None] == 1, ring, d <= r).float()
    return (x + 0.1 * torch.randn(x.shape, generator=gen))[:, None], labels


def train_classifier(steps: int, device) -> tuple[float, float, float]:
    """(first loss, last loss, held-out accuracy) of a tiny net pooling with dilation_pool."""
    torch.manual_seed(0)
    net = torch.nn.Sequential(
        torch.nn.Conv2d(1, 8, 3, padding=1), torch.nn.ReLU(), dilation_pool(8),
        torch.nn.Conv2d(8, 8, 3, padding=1), torch.nn.ReLU(), dilation_pool(8),
        torch.nn.Flatten(2), torch.nn.Linear(36, 1), torch.nn.Flatten(1), torch.nn.Linear(8, 2)).to(device)
    opt = torch.optim.Adam(net.parameters(), lr=1e-2)
    gen = torch.Generator().manual_seed(2)
    losses = []
    for _ in range(steps):
        x, y = shapes(64, gen)
        loss = torch.nn.functional.cross_entropy(net(x.to(device)), y.to(device))
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
        losses.append(loss.item())
    x, y = shapes(512, gen)
    with torch.no_grad():
        acc = (net(x.to(device)).argmax(1).cpu() == y).float().mean().item()
    return sum(losses[:5]) / 5, sum(losses[-5:]) / 5, acc


def main(argv=None) -> dict:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--steps", type=int, default=150, help="steps of the element's fit")
    p.add_argument("--net-steps", type=int, default=60, help="steps of the classifier's training")
    p.add_argument("--out", default="morphology.png")
    p.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    args = p.parse_args(argv)
    device = torch.device(args.device)
    gen = torch.Generator().manual_seed(0)
    img = image(96, gen).to(device)
    hidden = disc_element(5).to(device)
    backend = kernelhub.explain("semiconv", img, hidden, "tropical_max", padding="same").chosen
    print(f"device {device}: semiconv served by {backend}")

    k, before, after = fit_element(img, hidden, args.steps)
    print(f"structuring element fit: error {before:.2e} (flat square) -> {after:.2e} after {args.steps} steps")
    print("learned element (0 = in, below -1 = out):\n" + "\n".join(
        " ".join(f"{v:5.1f}" for v in row) for row in k[0, 0].cpu().tolist()))
    with torch.no_grad():
        gradient = dilate(img, k) - erode(img, k)
        opening = khnn.Opening(k, padding="same")(img)  # erosion, then the dilation adjoint to it
        target_opening = khnn.Opening(hidden, padding="same")(img)
    opening_err = (opening - target_opening).abs().max().item()
    print(f"opening with the learned element vs the hidden one: max difference {opening_err:.3f}")
    closing = khnn.Closing(khnn.QuadraticKernelIso2D(1, 1, 5, {"var": 2.0}), padding="same").to(device)
    with torch.no_grad():
        closed = closing(img)  # fills the dark gaps narrower than the quadratic element
    closing_gap = (closed - img).min().item()
    print(f"closing with a quadratic element: never below the image (min difference {closing_gap:.2e}), "
          f"mean lift {(closed - img).mean().item():.3f}")

    first, last, acc = train_classifier(args.net_steps, device)
    print(f"classifier (discs vs rings, pooling by learned dilation): loss {first:.3f} -> {last:.3f} in "
          f"{args.net_steps} steps, held-out accuracy {acc:.1%}")

    write_png(Path(args.out), [img[0, 0], gradient[0, 0], opening[0, 0], target_opening[0, 0]],
              ["noisy image", "morphological gradient", "opening", "opening, learned element"])
    print(f"wrote {args.out} (noisy image | morphological gradient | opening | opening with the hidden element)")
    return {"backend": backend, "fit_before": before, "fit_after": after, "opening_err": opening_err,
            "closing_gap": closing_gap,
            "loss_first": first, "loss_last": last, "accuracy": acc}


if __name__ == "__main__":
    main()
