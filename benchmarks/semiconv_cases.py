"""triton against cuda_ext on semiconv's ``tropical_2d_depthwise`` case (kernelhub/ops/semiconv.py), the
measurement behind the case's shipped priority (kernelhub/kernelhub.toml), and on calls just outside it.

Forward + backward of each call with each backend forced, the two timed against each other in 15 interleaved
rounds (``kernelhub.timing.rounds``: CUDA events; after warm-up; random inputs, not zeros), median ms. The large
calls' images (128 MiB) are larger than L2; the small and medium ones are host-bound, as most calls of that size
are. Also prints which backend the hub picks for each call.

Usage (a GPU machine with both backends): python benchmarks/run.py cases [--json PATH]; recorded with where
and how it ran (versions, commit, command) by ``python scripts/bench_report.py record-cases``.
"""

from __future__ import annotations

import argparse
import json
import statistics

import torch

import kernelhub
from kernelhub import timing

# (name, image shape, kernel height, kernel width, semifield, groups: 0 for depthwise)
CALLS = [
    ("1x4x32² 3x3 max", (1, 4, 32, 32), 3, 3, "tropical_max", 0),
    ("8x16x128² 5x5 max", (8, 16, 128, 128), 5, 5, "tropical_max", 0),
    ("16x32x256² 3x3 max", (16, 32, 256, 256), 3, 3, "tropical_max", 0),
    ("16x32x256² 5x5 max", (16, 32, 256, 256), 5, 5, "tropical_max", 0),
    ("16x32x256² 5x5 min", (16, 32, 256, 256), 5, 5, "tropical_min", 0),
    ("16x32x256² 7x7 max", (16, 32, 256, 256), 7, 7, "tropical_max", 0),
    ("16x32x256² 11x5 max", (16, 32, 256, 256), 11, 5, "tropical_max", 0),
    ("16x32x256² 9x9 max", (16, 32, 256, 256), 9, 9, "tropical_max", 0),
    ("4x32x256² 3x3 max, dense", (4, 32, 256, 256), 3, 3, "tropical_max", 1),
]
BACKENDS = ("triton", "cuda_ext")


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--json")
    args = p.parse_args(argv)
    dev = torch.device("cuda")
    gen = torch.Generator(dev).manual_seed(0)
    rows = []
    print(f"{'call':44s} {'hub picks':10s} " + " ".join(f"{b:>10s}" for b in BACKENDS) + "   (fwd+bwd ms)")
    for name, shape, kh, kw, semifield, groups in CALLS:
        c = shape[1]
        groups = groups or c
        img = torch.randn(shape, device=dev, generator=gen).requires_grad_()
        kernel = torch.randn((c, c // groups, kh, kw), device=dev, generator=gen).requires_grad_()
        grad = torch.randn(shape, device=dev, generator=gen)
        call = (img, kernel, semifield, 1, "same", 1, groups)
        picked = kernelhub.explain("semiconv", *call).chosen
        spec = kernelhub.get_hub().registry.spec("semiconv")
        case = spec.case_of(spec.canonical(*call))
        ops = {backend: kernelhub.op("semiconv", backend=backend) for backend in BACKENDS}
        steps = {backend: timing.dropping_grads(lambda op=op: op(*call).backward(grad), [img, kernel])
                 for backend, op in ops.items()}
        times = {backend: statistics.median(t) for backend, t in timing.rounds(steps, dev, 15).items()}
        rows.append({"call": name, "case": case, "hub": picked, "ms": times})
        print(f"{name:44s} {picked:10s} " + " ".join(f"{times[b]:10.3f}" for b in BACKENDS), flush=True)
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"device": torch.cuda.get_device_name(), "rows": rows}, f, indent=1)


if __name__ == "__main__":
    main()
