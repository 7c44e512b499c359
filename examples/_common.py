"""What the examples share: their device / output arguments, timing with the device synchronised, the JSON
report, and a PNG writer: titled grayscale panels (matplotlib, the plot extra), or without matplotlib the bare
panels side by side."""

from __future__ import annotations

import argparse
import json
import struct
import time
import zlib
from pathlib import Path
from typing import Any, Callable

import torch


def add_io_args(p: argparse.ArgumentParser, png: str) -> None:
    """--device (cuda where there is one), --out (the PNG) and --json (the results)."""
    p.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    p.add_argument("--out", default=png)
    p.add_argument("--json", help="also write the results here")


def save_json(path: str | None, result: dict) -> None:
    if path:
        Path(path).write_text(json.dumps(result, indent=1))


def timed_ms(fn: Callable[[], Any], device: torch.device) -> tuple[Any, float]:
    """``fn()`` and its wall time in ms, the device synchronised before and after (CUDA runs asynchronously)."""
    sync = torch.cuda.synchronize if device.type == "cuda" else (lambda: None)
    sync()
    t0 = time.perf_counter()
    out = fn()
    sync()
    return out, 1e3 * (time.perf_counter() - t0)


def write_png(path: Path, images: list[torch.Tensor], titles: list[str], title: str = "") -> None:
    """The images side by side as grayscale panels, each scaled by the first's range, each under its title (and
    ``title`` over them all), drawn with matplotlib; without matplotlib, the bare panels (and a note saying so)."""
    assert len(titles) == len(images)
    lo, hi = images[0].min().item(), images[0].max().item()
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        print(f"{path}: no matplotlib (pip install 'kernelhub[plot]'), so the panels carry no titles: "
              + " | ".join(titles))
    else:
        fig, axes = plt.subplots(1, len(images), figsize=(2.6 * len(images), 2.9), squeeze=False)
        for ax, im, name in zip(axes[0], images, titles):
            ax.imshow(im.detach().float().cpu().numpy(), cmap="gray", vmin=lo, vmax=hi)
            ax.set_title(name, fontsize=9)
            ax.axis("off")
        if title:
            fig.suptitle(title, fontsize=10)
        fig.tight_layout()
        fig.savefig(path, dpi=100)
        plt.close(fig)
        return
    row = torch.cat([((im.float().cpu() - lo) / max(hi - lo, 1e-12)).clamp(0, 1) for im in images], dim=1)
    pix = (row * 255).round().to(torch.uint8)
    h, w = pix.shape
    raw = b"".join(b"\x00" + bytes(pix[i].tolist()) for i in range(h))

    def chunk(kind: bytes, data: bytes) -> bytes:
        return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data) & 0xFFFFFFFF)

    path.write_bytes(b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", struct.pack(">IIBBBBB", w, h, 8, 0, 0, 0, 0))
                     + chunk(b"IDAT", zlib.compress(raw, 9)) + chunk(b"IEND", b""))
