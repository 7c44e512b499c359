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
from kernelhub import parity, testing
from kernelhub.ops._checks import accumulation_dtype
from kernelhub.ops.tolerances import _round_up, tolerance_for
from kernelhub.spec import Tolerance
from kernelhub.tune import _cpu_name

SEEDS = range(5)
SIZES = ("small", "medium", "edge")
LOOSEST = 2.0  # a recorded tolerance over this x what the method gives here is too loose (the test fails)


def call_tolerance(op: str, args, seed: int = 1, reference=None) -> Tolerance:
    """`kernelhub.parity.call_tolerance` for ``op``: this module's method applied to one call's inputs."""
    return parity.call_tolerance(kernelhub.get_hub().registry.spec(op), args, seed, reference)


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
                    f = max(f, parity.sensitivity(spec, sample.args, gen)[0])
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
