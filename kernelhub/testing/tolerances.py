"""Measure each spec's parity tolerances from eager torch, and write the errors to kernelhub/ops/_measured.py.

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
   from being zero, which would forbid any other summation order). This step is
   `kernelhub.ops.tolerances.tolerance_for`, which derives the spec's tolerances from
   the recorded errors when kernelhub is imported.

5. Hosts round differently (vector width, LAPACK paths: the SVD's float64 error was 1.6e-15 on
   the CI host of 2026-11-22 and 1.71e-15 on that of 2026-11-23), and the table must hold on each
   host that checks it. So the table records, per entry, the largest error measured on any host
   it was written on (``MEASURED`` in kernelhub/ops/_measured.py, with the hosts in ``HOSTS``), and
   takes the tolerance from that;
   a recorded error whose tolerance would be over ``LOOSEST`` x this host's is dropped as too loose.

Run ``python -m kernelhub.testing.tolerances`` to print the measurement, ``--write`` to
regenerate the table (on a host whose measurement is not in it yet; with ``--fresh`` after a change
to an op's reference or samples, which makes the recorded errors stale).
The test suite re-measures and fails if a recorded tolerance is below what eager torch needs
on the host running it, or over ``LOOSEST`` x that.
"""

from __future__ import annotations

import argparse
import datetime
import sys
from pathlib import Path

import torch

import kernelhub
from kernelhub import testing
from kernelhub.ops._checks import accumulation_dtype
from kernelhub.ops.tolerances import _round_up, tolerance_for
from kernelhub.spec import Tolerance

SEEDS = range(5)
SIZES = ("small", "medium", "edge")
LOOSEST = 2.0  # a recorded tolerance over this x what the method gives here is too loose (the test fails)
PERTURBATIONS = 4  # random roundings of a call's inputs that `call_tolerance` tries in float64


def perturbed(args, dtype: torch.dtype, gen: torch.Generator) -> tuple:
    """Floating-point tensors of ``args`` times (1 + u eps), u uniform in [-1, 1]."""
    eps = torch.finfo(accumulation_dtype(dtype).to_real()).eps

    def perturb(t):
        if not (t.is_floating_point() or t.is_complex()):
            return t
        u = torch.rand(t.shape, generator=gen, dtype=torch.float64, device=t.device) * 2 - 1
        return t * (1 + eps * u).to(t.dtype)

    return testing.map_tensors(args, perturb)


def sensitivity(op: str, args, gen: torch.Generator, reference=None, times: int = 1) -> tuple[float, float]:
    """How far the float64 reference moves when its inputs move by one rounding (step 2): the most over
    ``times`` random roundings, forward and, given ``reference`` = (out, upstream grad, grads), backward
    (else 0). The rounding is float64's: the step applies to float64 and complex128 calls."""
    wide = testing.to_dtype(args, torch.float64)
    out, grad, grads = reference if reference is not None else (testing.reference(op, wide)[0], None, [])
    fwd = bwd = 0.0
    for _ in range(times):
        moved, moved_grads = testing.reference(op, perturbed(wide, torch.float64, gen), grad)
        fwd = max(fwd, testing.parity_error(moved, out))
        bwd = max([bwd] + [testing.parity_error(m, g) for m, g in zip(moved_grads, grads)])
    return fwd, bwd


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
        gen = torch.Generator(device=first.device).manual_seed(seed)
        # one random direction can miss most of the sensitivity (seen: 10x)
        moved = sensitivity(op, args, gen, reference, times=PERTURBATIONS)
        fwd, bwd = max(fwd, moved[0]), max(bwd, moved[1])
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
                    f = max(f, sensitivity(op, sample.args, gen)[0])
                fwd, bwd = max(fwd, f), max(bwd, b)
    return fwd, bwd


def merged_error(dtype: torch.dtype, recorded: float | None, now: float) -> float:
    """The error to record: the larger of this host's and the one recorded from earlier hosts (CPUs differ in
    vector width and LAPACK paths, so the same method rounds differently on each, and the table must hold on
    every host that measured it), unless the recorded one would make the tolerance over LOOSEST x this host's
    (too loose): then this host's alone."""
    if recorded is None or tolerance_for(dtype, recorded) > LOOSEST * tolerance_for(dtype, now):
        return now
    return max(recorded, now)


def host() -> str:
    """What the measurement depends on besides the code: torch, the CPU and the vector ISA torch uses on it."""
    from kernelhub.tune import _cpu_name  # kernelhub.tune imports this module

    return f"torch {torch.__version__}, {_cpu_name()}, {torch.backends.cpu.get_cpu_capability()}"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--write", action="store_true",
                        help="rewrite kernelhub/ops/_measured.py, keeping larger errors recorded on other hosts")
    parser.add_argument("--fresh", action="store_true",
                        help="with --write: forget the recorded errors and hosts (after a change to an op's "
                        "reference or samples, which makes the earlier measurements stale)")
    args = parser.parse_args(argv)
    from kernelhub.ops import _measured as table

    recorded_hosts, recorded_errors = ((), {}) if args.fresh else (table.HOSTS, table.MEASURED)

    hub = kernelhub.get_hub()
    rows = []
    for op, spec in sorted(hub.registry.specs.items()):
        for dtype in spec.dtypes:
            now = measured_error(op, dtype)
            recorded = recorded_errors.get(op, {}).get(dtype, (None, None))
            f, b = (_round_up(merged_error(dtype, r, n), 4) for r, n in zip(recorded, now))
            here = tolerance_for(dtype, now[0]), tolerance_for(dtype, now[1])
            rows.append((op, dtype, f, b))
            table_tol = tolerance_for(dtype, f), tolerance_for(dtype, b)
            kept = "" if table_tol == here else f"   (table: {table_tol[0]:.2g}, {table_tol[1]:.2g} from earlier hosts)"
            print(f"{op:28s} {str(dtype):16s} fwd err {now[0]:9.3g} -> {here[0]:8.2g}   "
                  f"bwd err {now[1]:9.3g} -> {here[1]:8.2g}{kept}", flush=True)
    if args.write:
        this = f"{datetime.date.today()}: {host()}"
        hosts = [h for h in recorded_hosts if h.split(": ", 1)[1] != host()] + [this]
        lines = [
            '"""Measured errors behind the parity tolerances, GENERATED by `python -m kernelhub.testing.tolerances --write`.',
            "",
            "MEASURED[op][dtype] is (forward, backward): the largest error of eager torch in that dtype against float64",
            "that the method (kernelhub/testing/tolerances.py) measured on any of HOSTS; hosts round differently (vector",
            "width, LAPACK paths). kernelhub/ops/tolerances.py turns each into a tolerance.",
            '"""',
            "",
            "import torch",
            "",
            "# The hosts the errors were measured on: date, torch, CPU, the vector ISA torch used.",
            "HOSTS = (",
            *(f"    {h!r}," for h in hosts),
            ")",
            "",
            "MEASURED = {",
        ]
        current = None
        for op, dtype, f, b in rows:
            if op != current:
                if current is not None:
                    lines.append("    },")
                lines.append(f'    "{op}": {{')
                current = op
            lines.append(f"        {dtype}: ({f!r}, {b!r}),")
        lines += ["    },", "}", ""]
        Path(__file__).resolve().parents[1].joinpath("ops", "_measured.py").write_text("\n".join(lines))
        print("wrote kernelhub/ops/_measured.py")
    return 0


if __name__ == "__main__":
    sys.exit(main())
