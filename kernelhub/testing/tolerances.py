"""Measure ops' parity tolerances from eager torch, and write the errors where told (a JSON file).

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
   the recorded errors when the op's spec is built (`kernelhub.ops.tolerances.tolerances_from`).

5. Hosts round differently (vector width, LAPACK paths: the SVD's float64 error was 1.6e-15 on
   the CI host of 2026-11-22 and 1.71e-15 on that of 2026-11-23), and the table must hold on each
   host that checks it. So the table records, per entry, the largest error measured on any host
   it was written on (the file's ``errors``, with the hosts in ``hosts``), and takes the tolerance
   from that;
   a recorded error whose tolerance would be over ``LOOSEST`` x this host's is dropped as too loose.

Run ``python -m kernelhub.testing.tolerances`` to print the measurement of every registered op (``--ops``
to choose), ``--out FILE`` to merge it into FILE (a host whose measurement is not in it yet; with ``--fresh``
after a change to an op's reference or samples, which makes the recorded errors stale). kernelhub's own
file is kernelhub/ops/measured_errors.json; a third party measures its own ops into its own file and builds
its spec's tolerances from it (docs/backend-guide.md shows how). `check_recorded` is the test: it fails for a
dtype with no recorded tolerance, one below what eager torch needs on the host running it, or one over
``LOOSEST`` x that.
"""

from __future__ import annotations

import argparse
import datetime
import json
import sys
from pathlib import Path

import torch

from kernelhub import parity, testing
from kernelhub.hub import get_hub
from kernelhub.ops._checks import accumulation_dtype
from kernelhub.ops.tolerances import FORMAT, _round_up, read_errors, tolerance_for
from kernelhub.spec import OpSpec, Tolerance
from kernelhub.timing import cpu_name

SEEDS = range(5)
SIZES = ("small", "medium", "edge")
LOOSEST = 2.0  # a recorded tolerance over this x what the method gives here is too loose (the test fails)


def call_tolerance(op: str, args, seed: int = 1, reference=None) -> Tolerance:
    """`kernelhub.parity.call_tolerance` for ``op``: this module's method applied to one call's inputs."""
    return parity.call_tolerance(get_hub().registry.spec(op), args, seed, reference)


def measured_error(op: str, dtype: torch.dtype) -> tuple[float, float]:
    """Largest (forward, backward) error over the seeds and sample sizes: eager torch in ``dtype``
    against float64 (step 1) and, for float64 forwards, the reference's own sensitivity (step 2)."""
    spec = get_hub().registry.spec(op)
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
    return f"torch {torch.__version__}, {cpu_name()}, {torch.backends.cpu.get_cpu_capability()}"


def check_recorded(spec: OpSpec) -> list[str]:
    """What is wrong with ``spec``'s tolerances on this host, per dtype: none recorded (unmeasured), below what
    the method gives here (too tight: a correct kernel could fail), or over ``LOOSEST`` x that (too loose)."""
    problems = []
    for dtype in spec.dtypes:
        if dtype in spec.unmeasured:
            problems.append(f"{spec.name} {dtype}: unmeasured (python -m kernelhub.testing.tolerances --ops "
                            f"{spec.name} --out FILE)")
            continue
        fwd, bwd = measured_error(spec.name, dtype)
        tol = spec.tolerances[dtype]
        for what, err, recorded in (("forward", fwd, tol.forward), ("backward", bwd, tol.backward)):
            need = tolerance_for(dtype, err)
            if recorded < need:
                problems.append(f"{spec.name} {dtype}: {what} tolerance {recorded:.2g} below {need:.2g} (error "
                                f"{err:.3g} here)")
            elif recorded > LOOSEST * need:
                problems.append(f"{spec.name} {dtype}: {what} tolerance {recorded:.2g} over {LOOSEST:g} x {need:.2g}"
                                " (too loose)")
    return problems


def write_errors(path: Path, hosts: list[str], errors: dict[str, dict[torch.dtype, tuple[float, float]]]) -> None:
    """The measured-errors file (`kernelhub.ops.tolerances.read_errors` reads it): one line per op."""
    lines = ["{", f' "format": "{FORMAT}",', ' "hosts": [',
             ",\n".join(f"  {json.dumps(h)}" for h in hosts), " ],", ' "errors": {']
    ops = sorted(errors)
    for k, op in enumerate(ops):
        entries = {str(d).removeprefix("torch."): list(fb) for d, fb in sorted(errors[op].items(), key=str)}
        lines.append(f"  {json.dumps(op)}: {json.dumps(entries)}" + ("," if k < len(ops) - 1 else ""))
    lines += [" }", "}", ""]
    Path(path).write_text("\n".join(lines))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--ops", nargs="+", metavar="OP", help="the ops to measure (default: every registered op)")
    parser.add_argument("--out", type=Path, metavar="FILE",
                        help="merge the measurement into FILE (created if missing), keeping larger errors recorded "
                        "there on other hosts and the entries of the ops not measured now")
    parser.add_argument("--fresh", action="store_true",
                        help="with --out: forget FILE's recorded errors and hosts (after a change to an op's "
                        "reference or samples, which makes the earlier measurements stale)")
    args = parser.parse_args(argv)
    hub = get_hub()
    ops = args.ops or sorted(hub.registry.specs)
    unknown = [op for op in ops if op not in hub.registry.specs]
    if unknown:
        parser.error(f"unknown ops {unknown}; registered: {sorted(hub.registry.specs)}")
    recorded_hosts, recorded_errors = ((), {}) if args.fresh or args.out is None else read_errors(args.out)
    errors = {op: dict(e) for op, e in recorded_errors.items()}
    for op in ops:
        spec = hub.registry.spec(op)
        errors[op] = {}
        for dtype in spec.dtypes:
            now = measured_error(op, dtype)
            recorded = recorded_errors.get(op, {}).get(dtype, (None, None))
            f, b = (_round_up(merged_error(dtype, r, n), 4) for r, n in zip(recorded, now))
            errors[op][dtype] = (f, b)
            here = tolerance_for(dtype, now[0]), tolerance_for(dtype, now[1])
            table_tol = tolerance_for(dtype, f), tolerance_for(dtype, b)
            kept = "" if table_tol == here else f"   (file: {table_tol[0]:.2g}, {table_tol[1]:.2g} from earlier hosts)"
            print(f"{op:28s} {str(dtype):16s} fwd err {now[0]:9.3g} -> {here[0]:8.2g}   "
                  f"bwd err {now[1]:9.3g} -> {here[1]:8.2g}{kept}", flush=True)
    if args.out is not None:
        this = f"{datetime.date.today()}: {host()}"
        hosts = [h for h in recorded_hosts if h.split(": ", 1)[1] != host()] + [this]
        write_errors(args.out, hosts, errors)
        print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
