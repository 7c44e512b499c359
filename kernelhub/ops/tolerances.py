"""Parity tolerances per op and dtype, from measured errors: the method's last step.

tolerance = max(FACTOR x error, FLOOR_ULPS x eps of the compute dtype), rounded up to two significant digits;
the compute dtype is float32 for half and single inputs, float64 for double ones (the floor keeps a float64
or exactly-computed tolerance from being zero, which would forbid any other summation order).

The errors are data: a JSON file written by the measurement tool (``python -m kernelhub.testing.tolerances
--out FILE``; the method is in that module), kernelhub's own in ``measured_errors.json`` next to this module.
`tolerances_from` reads such a file for one op; a third party's spec reads its own file the same way. An op or
dtype with no recorded error gets no tolerance: its spec still loads, marked unmeasured
(`kernelhub.spec.OpSpec.unmeasured`), and its tolerance test fails until it is measured.
"""

from __future__ import annotations

import functools
import json
import math
from pathlib import Path

import torch

from kernelhub.ops._checks import accumulation_dtype
from kernelhub.spec import Tolerance

__all__ = ["FACTOR", "FLOOR_ULPS", "FORMAT", "MEASURED_ERRORS", "tolerance_for", "read_errors", "tolerances_from"]

FACTOR = 4.0
FLOOR_ULPS = 16.0
FORMAT = "kernelhub-measured-errors/1"
MEASURED_ERRORS = Path(__file__).with_name("measured_errors.json")  # kernelhub's own ops


def _round_up(x: float, digits: int = 2) -> float:
    if x <= 0:
        return 0.0
    exp = math.floor(math.log10(x)) - digits + 1
    return float(f"{math.ceil(round(x / 10 ** exp, 6))}e{exp}")  # round(): 4 x 7.25e-15 / 1e-15 is 29.000000000000004


def tolerance_for(dtype: torch.dtype, error: float) -> float:
    if not math.isfinite(error):  # eager torch itself overflowed (or met a NaN) on these inputs in this dtype
        raise ValueError(f"eager torch's own error against float64 is {error} in {str(dtype).removeprefix('torch.')} "
                         "on these inputs (they overflow there): no tolerance can judge them")
    eps = torch.finfo(accumulation_dtype(dtype).to_real() if dtype.is_complex else accumulation_dtype(dtype)).eps
    return _round_up(max(FACTOR * error, FLOOR_ULPS * eps))


def read_errors(path: Path) -> tuple[tuple[str, ...], dict[str, dict[torch.dtype, tuple[float, float]]]]:
    """(hosts, errors[op][dtype] = (forward, backward)) of a measured-errors file; a missing file has none. Read
    once per version of the file (every spec of kernelhub's own reads the same file when kernelhub is imported)."""
    try:
        st = Path(path).stat()
    except FileNotFoundError:
        return (), {}
    return _read_errors(Path(path), st.st_mtime_ns, st.st_size)


@functools.lru_cache(maxsize=16)
def _read_errors(path: Path, mtime_ns: int, size: int) -> tuple[tuple[str, ...], dict]:
    data = json.loads(path.read_text(encoding="utf-8"))
    if not isinstance(data, dict) or data.get("format") != FORMAT:
        raise ValueError(f"{path}: not a {FORMAT} file")
    errors = {op: {getattr(torch, name): (float(f), float(b)) for name, (f, b) in entries.items()}
              for op, entries in data["errors"].items()}
    return tuple(data.get("hosts", ())), errors


def tolerances_from(path: Path | str, op: str) -> dict[torch.dtype, Tolerance]:
    """The tolerances of ``op`` from the errors recorded in ``path`` (only the dtypes measured there)."""
    return {dtype: Tolerance(tolerance_for(dtype, f), tolerance_for(dtype, b))
            for dtype, (f, b) in read_errors(Path(path))[1].get(op, {}).items()}
