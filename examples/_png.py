"""A grayscale PNG writer for the examples (no imaging dependency)."""

from __future__ import annotations

import struct
import zlib
from pathlib import Path

import torch


def write_png(path: Path, images: list[torch.Tensor]) -> None:
    """Grayscale PNG of the images side by side, each scaled to [0, 255] by the first's range."""
    lo, hi = images[0].min().item(), images[0].max().item()
    row = torch.cat([((im.float().cpu() - lo) / max(hi - lo, 1e-12)).clamp(0, 1) for im in images], dim=1)
    pix = (row * 255).round().to(torch.uint8)
    h, w = pix.shape
    raw = b"".join(b"\x00" + bytes(pix[i].tolist()) for i in range(h))

    def chunk(kind: bytes, data: bytes) -> bytes:
        return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data) & 0xFFFFFFFF)

    path.write_bytes(b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", struct.pack(">IIBBBBB", w, h, 8, 0, 0, 0, 0))
                     + chunk(b"IDAT", zlib.compress(raw, 9)) + chunk(b"IEND", b""))
