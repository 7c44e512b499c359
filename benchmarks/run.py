"""kernelhub's benchmarks, one entry point: ``python benchmarks/run.py SUITE [the suite's arguments]``.

Each suite is one script of this folder (its ``main(argv)``; ``python benchmarks/run.py SUITE --help`` gives its
arguments); ``python benchmarks/run.py`` lists them. scripts/gpu_check.sh runs them on the GPU machine, and
scripts/bench_report.py records the ones whose results docs/benchmarks.md shows. A new benchmark is a new suite here
(tests/test_structure.py checks that every script of this folder is one).
"""

from __future__ import annotations

import importlib
import sys
import textwrap

# suite -> (its script in this folder, what it measures)
SUITES = {
    "kernels": ("kernels", "every kernel backend against eager and compiled torch_ref at each op's benchmark samples, "
                           "as a multiple of the op's floor (CUDA)"),
    "kernels-cpu": ("cpu", "the CPU kernel backends (cuda_ext's C++) against eager and compiled torch_ref"),
    "defaults": ("defaults", "the untuned hub's choice against each backend forced, at the benchmark samples, the "
                             "host sizes and around the shipped size ranges"),
    "cases": ("semiconv_cases", "semiconv's kinds of call, triton against cuda_ext (CUDA)"),
    "host": ("host_overhead", "per-call wall time of the hub against minimal glue around the same kernels, eager "
                              "(and compiled steps: --compiled-steps)"),
    "host-ladder": ("host_ladder", "where the hub's per-call host cost goes, its layers added one at a time"),
    "host-dispatch": ("dispatch_overhead", "the hub against a plain torch.library custom_op and the bare function, "
                                           "on a tiny CPU tensor"),
    "host-graph": ("cuda_graph_step", "a small hub step eager against its CUDA graph replay (CUDA)"),
    "host-semiconv": ("semiconv_host", "semiconv's host time per step and a profiler table of it (CUDA)"),
    "nn": ("tvloss3d", "what kernelhub.nn.TVLoss3d costs over the bare op, and where"),
    "peers": ("nd_semiconv", "kernelhub.nn.SemiConv against pytorch_nd_semiconv's paths (CUDA)"),
    "compile": ("toolchain", "compile time of a two-op step; the K-Planes tomography step eager, compiled and under "
                             "CUDA graphs"),
    "probe-inductor-root": ("inductor_semiconv_root", "not a timing: whether torch.compile's CUDA code for "
                                                      "semiconv's root semifield is still wrong"),
}


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if not argv or argv[0] in ("-h", "--help", "--list"):
        print(__doc__.split("\n\n")[0] + "\n\nSuites:")
        for name, (script, what) in SUITES.items():
            print(textwrap.fill(f"benchmarks/{script}.py: {what}", 100, initial_indent=f"  {name:20s} ",
                                subsequent_indent=" " * 23))
        return 0
    if argv[0] not in SUITES:
        print(f"benchmarks/run.py: no suite {argv[0]!r}; the suites: {', '.join(SUITES)}", file=sys.stderr)
        return 2
    script = importlib.import_module(SUITES[argv[0]][0])  # this folder is on sys.path: the scripts import each other
    return script.main(argv[1:]) or 0


if __name__ == "__main__":
    sys.exit(main())
