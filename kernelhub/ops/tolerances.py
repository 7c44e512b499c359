"""Parity tolerances per op and dtype: the method's last step applied to the errors in `_measured.py`.

tolerance = max(FACTOR x error, FLOOR_ULPS x eps of the compute dtype), rounded up to two significant digits;
the compute dtype is float32 for half and single inputs, float64 for double ones (the floor keeps a float64
or exactly-computed tolerance from being zero, which would forbid any other summation order). The whole
method, and how the errors are measured: kernelhub/testing/tolerances.py.
"""

from __future__ import annotations

import math

import torch

from kernelhub.ops._checks import accumulation_dtype
from kernelhub.ops._measured import MEASURED
from kernelhub.spec import Tolerance

FACTOR = 4.0
FLOOR_ULPS = 16.0


def _round_up(x: float, digits: int = 2) -> float:
    if x <= 0:
        return 0.0
    exp = math.floor(math.log10(x)) - digits + 1
    return float(f"{math.ceil(round(x / 10 ** exp, 6))}e{exp}")  # round(): 4 x 7.25e-15 / 1e-15 is 29.000000000000004


def tolerance_for(dtype: torch.dtype, error: float) -> float:
    eps = torch.finfo(accumulation_dtype(dtype).to_real() if dtype.is_complex else accumulation_dtype(dtype)).eps
    return _round_up(max(FACTOR * error, FLOOR_ULPS * eps))


TOLERANCES = {op: {dtype: Tolerance(tolerance_for(dtype, fwd), tolerance_for(dtype, bwd))
                   for dtype, (fwd, bwd) in entries.items()}
              for op, entries in MEASURED.items()}
