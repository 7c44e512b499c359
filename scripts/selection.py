"""What the hub picks, for every op's samples: one line per call, to compare two trees (a refactor that promises
no change of behaviour runs this before and after, on the same machine, and diffs the outputs).

For each op, each sample size the spec declares, each dtype some backend serves on the device, and each sample of
that size (the eager decision serves forward and backward): the eager order, chosen first, then the fallbacks
(`kernelhub.explain`), and what a torch.compile graph traces for the call (`Selector.traced`).

    python scripts/selection.py [--device cuda] [--out FILE]
"""

from __future__ import annotations

import argparse
import sys
import warnings

import kernelhub
from kernelhub import testing


def lines(device: str) -> list[str]:
    hub = kernelhub.get_hub()
    out = []
    for op in kernelhub.op_names():
        spec = hub.registry.spec(op)
        dtypes = sorted({d for impl in hub.registry.impls(op).values() for d in impl.dtypes}, key=str)
        for size in spec.SAMPLE_SIZES:
            for dtype in dtypes:
                try:
                    samples = testing.samples(op, size, dtype, device)
                except Exception as exc:  # a size the op does not generate for this dtype
                    out.append(f"{op} {size} {dtype}: no samples ({type(exc).__name__})")
                    continue
                for i, sample in enumerate(samples):
                    args = spec.normalize(*sample.args)
                    try:
                        ex = kernelhub.explain(op, *args)
                        eager = ",".join(impl.backend for impl in ex.eligible) or "-"
                    except Exception as exc:
                        eager = f"raises {type(exc).__name__}"
                    traced = hub.selector.traced(op, args)
                    out.append(f"{op} {size} {str(dtype).removeprefix('torch.')} #{i}: eager {eager}; "
                               f"traced {traced.backend if traced is not None else '-'}")
    return out


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--device", default="cpu")
    p.add_argument("--out", help="write the lines here too")
    args = p.parse_args(argv)
    warnings.simplefilter("ignore")
    text = "\n".join(lines(args.device)) + "\n"
    sys.stdout.write(text)
    if args.out:
        with open(args.out, "w") as f:
            f.write(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
