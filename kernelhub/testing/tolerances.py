"""Measure each spec's parity tolerances from eager torch, and write kernelhub/ops/tolerances.py.

Method (the same for every op and dtype):

1. For seeds 0-4 and the spec's "small", "medium" and "edge" samples in dtype ``d``,
   run the reference backend (eager torch) *in d* and in float64 on the same
   (d-rounded) inputs, forward and backward with a random upstream gradient.
2. For float64 and complex128, where step 1 compares float64 with itself and measures
   zero, also run the float64 reference on the inputs with each element multiplied by
   ``1 + u * eps`` (``u`` uniform in [-1, 1]) and compare its forward with the unperturbed
   one: the op's own sensitivity to one rounding of its inputs (condition number x eps).
   The float64 reference is itself only that close to the exact answer where it is not
   exact arithmetic (the SVD in ``tikhonov_inverse_2xn``), so a kernel with another
   correct formula lands anywhere within it. Lower precisions skip this step: their
   eager error in step 1 is a real measurement, and adding the sensitivity would loosen
   ops whose kernels compute differences exactly (TV). Gradients are left out: those of
   L1 and max ops jump where a perturbation flips a sign or an argmax.
3. Take the largest error ``max|out - ref| / max|ref|`` seen (forward and backward
   separately).
4. tolerance = max(4 x that error, 16 x eps(compute dtype)), rounded up to two
   significant digits; the compute dtype is float32 for half and single inputs,
   float64 for double ones (the floor keeps a float64 or exactly-computed tolerance
   from being zero, which would forbid any other summation order).

Run ``python -m kernelhub.testing.tolerances`` to print the measurement, ``--write`` to
regenerate the table. The test suite re-measures and fails if a recorded tolerance
is below what eager torch needs.
"""

from __future__ import annotations

import argparse
import datetime
import math
import sys
from pathlib import Path

import torch

import kernelhub
from kernelhub import testing
from kernelhub.ops._checks import accumulation_dtype
from kernelhub.spec import Tolerance

SEEDS = range(5)
SIZES = ("small", "medium", "edge")
FACTOR = 4.0
FLOOR_ULPS = 16.0
PERTURBATIONS = 4  # random roundings of a call's inputs that `call_tolerance` tries in float64


def _round_up(x: float) -> float:
    if x <= 0:
        return 0.0
    exp = math.floor(math.log10(x)) - 1
    return math.ceil(x / 10 ** exp) * 10 ** exp


def perturbed(args, dtype: torch.dtype, gen: torch.Generator) -> tuple:
    """Floating-point tensors of ``args`` times (1 + u eps), u uniform in [-1, 1]."""
    eps = torch.finfo(accumulation_dtype(dtype).to_real()).eps

    def perturb(t):
        if not (t.is_floating_point() or t.is_complex()):
            return t
        u = torch.rand(t.shape, generator=gen, dtype=torch.float64, device=t.device) * 2 - 1
        return t * (1 + eps * u).to(t.dtype)

    return testing.map_tensors(args, perturb)


def sensitivity(op: str, args, dtype: torch.dtype, gen: torch.Generator) -> float:
    """Forward change of the float64 reference when its inputs move by one rounding (step 2)."""
    wide = testing.to_dtype(args, torch.float64)
    out, _ = testing.reference(op, wide)
    moved, _ = testing.reference(op, perturbed(wide, dtype, gen))
    return testing.parity_error(moved, out)


def call_tolerance(op: str, args, seed: int = 1, reference=None) -> Tolerance:
    """The tolerance for one call's inputs, by this module's method applied to them: 4 x eager torch's error in the
    args' dtype against float64 (forward and backward, upstream gradient from ``seed``); in float64, where that
    compares the reference with itself, 4 x how far the reference's forward and gradients move when its inputs
    move by one rounding (the most over ``PERTURBATIONS`` random roundings: the error another correct order of
    operations may have). Never below the spec's tolerance.

    The spec's tolerances are measured on its small samples; error grows with size (a K-Planes coordinate is
    rounded relative to the plane's resolution), so the tuner and the property tests judge a call of another
    size by this. ``reference``: `testing.reference_with_upstream(op, args, seed)`, where the caller has it."""
    spec = kernelhub.get_hub().registry.spec(op)
    first = next(a if isinstance(a, torch.Tensor) else a[0] for a in args
                 if isinstance(a, torch.Tensor) or (isinstance(a, list) and a))
    dtype = first.dtype
    reference = reference if reference is not None else testing.reference_with_upstream(op, args, seed)
    fwd, bwd = testing.measure(op, spec.reference_backend, args, seed=seed, reference=reference)
    if accumulation_dtype(dtype).to_real() == torch.float64:
        wide = testing.to_dtype(args, torch.float64)
        out, grad, grads = reference
        gen = torch.Generator(device=first.device).manual_seed(seed)
        for _ in range(PERTURBATIONS):  # one random direction can miss most of the sensitivity (seen: 10x)
            moved, moved_grads = testing.reference(op, perturbed(wide, torch.float64, gen), grad)
            fwd = max(fwd, testing.parity_error(moved, out))
            bwd = max([bwd] + [testing.parity_error(m, g) for m, g in zip(moved_grads, grads)])
    tol = spec.tolerances[dtype]
    return Tolerance(max(tol.forward, tolerance_for(dtype, fwd)), max(tol.backward, tolerance_for(dtype, bwd)))


def measured_error(op: str, dtype: torch.dtype) -> tuple[float, float]:
    """Largest (forward, backward) error over the seeds and sample sizes: eager torch in ``dtype``
    against float64 (step 1) and, for float64 forwards, the reference's own sensitivity (step 2)."""
    spec = kernelhub.get_hub().registry.spec(op)
    fwd = bwd = 0.0
    for seed in SEEDS:
        gen = torch.Generator().manual_seed(seed)
        for size in SIZES:
            for sample in testing.samples(op, size, dtype, "cpu", seed):
                f, b = testing.measure(op, spec.reference_backend, sample.args, seed=seed + 1)
                if accumulation_dtype(dtype).to_real() == torch.float64:
                    f = max(f, sensitivity(op, sample.args, dtype, gen))
                fwd, bwd = max(fwd, f), max(bwd, b)
    return fwd, bwd


def tolerance_for(dtype: torch.dtype, error: float) -> float:
    eps = torch.finfo(accumulation_dtype(dtype).to_real() if dtype.is_complex else accumulation_dtype(dtype)).eps
    return _round_up(max(FACTOR * error, FLOOR_ULPS * eps))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--write", action="store_true", help="rewrite kernelhub/ops/tolerances.py")
    args = parser.parse_args(argv)
    hub = kernelhub.get_hub()
    rows = []
    for op, spec in sorted(hub.registry.specs.items()):
        for dtype in spec.dtypes:
            f, b = measured_error(op, dtype)
            rows.append((op, dtype, f, b, tolerance_for(dtype, f), tolerance_for(dtype, b)))
            print(f"{op:28s} {str(dtype):16s} fwd err {f:9.3g} -> {rows[-1][4]:8.2g}   "
                  f"bwd err {b:9.3g} -> {rows[-1][5]:8.2g}", flush=True)
    if args.write:
        lines = [
            '"""Parity tolerances per op and dtype, GENERATED by `python -m kernelhub.testing.tolerances --write`.',
            "",
            "Each value is max(4 x measured error of eager torch in that dtype against float64, 16 x eps of the",
            "compute dtype), rounded up to two significant digits; the measured errors are in the comments.",
            "The method is in kernelhub/testing/tolerances.py.",
            f"Measured {datetime.date.today()} with torch {torch.__version__} on the CPU.",
            '"""',
            "",
            "import torch",
            "",
            "from kernelhub.spec import Tolerance",
            "",
            "TOLERANCES = {",
        ]
        current = None
        for op, dtype, f, b, tf, tb in rows:
            if op != current:
                if current is not None:
                    lines.append("    },")
                lines.append(f'    "{op}": {{')
                current = op
            lines.append(f"        {dtype}: Tolerance({tf!r}, {tb!r}),  # measured fwd {f:.3g}, bwd {b:.3g}")
        lines += ["    },", "}", ""]
        Path(__file__).resolve().parents[1].joinpath("ops", "tolerances.py").write_text("\n".join(lines))
        print("wrote kernelhub/ops/tolerances.py")
    return 0


if __name__ == "__main__":
    sys.exit(main())
