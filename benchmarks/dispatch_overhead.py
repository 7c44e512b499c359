"""Dispatch overhead of the hub on a tiny CPU tensor (issue: Core hub, item 9).

Times, in one run, per call (median of interleaved rounds, `kernelhub.timing.rounds`):
  direct    - the chosen impl's forward called as a Python function;
  custom_op - a plain torch.library.custom_op wrapping that same forward (fake + autograd registered);
  hub       - kernelhub.op(name)(x): the eager fast path (a remembered layout's decision, the hub's glue).
and the same for forward+backward (direct: the impl's forward, then its backward, called as functions; custom_op
and hub: the impl's backward through their autograd glue). Overheads are reported relative to `direct`; the goal is
hub - custom_op <= 0.5 * (custom_op - direct) for the forward.

    python benchmarks/run.py host-dispatch [--op tv_loss_l1_3d] [--json]
"""

from __future__ import annotations

import argparse
import json
import statistics

import torch

import kernelhub
from kernelhub import timing


def per_call_us(fns: dict, repeat: int, round_ms: float) -> dict:
    """Microseconds per call of each callable: the median of its interleaved rounds (`kernelhub.timing.rounds`)."""
    return {label: statistics.median(t) * 1e3
            for label, t in timing.rounds(fns, torch.device("cpu"), repeat, round_ms).items()}


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--op", default="tv_loss_l1_3d")
    parser.add_argument("--round-ms", type=float, default=20.0, help="how long each callable's calls in a round last")
    parser.add_argument("--repeat", type=int, default=15)
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args(argv)
    torch.set_num_threads(1)

    hub = kernelhub.get_hub()
    x = torch.randn(4, 4, 4)
    decision = kernelhub.explain(args.op, x)
    impl = decision.eligible[0]

    plain = torch.library.custom_op(f"khbench::{args.op}", lambda v: impl.forward(v), mutates_args=(),
                                    schema="(Tensor volume) -> Tensor")
    plain.register_fake(lambda v: hub.registry.spec(args.op).output(v))
    plain_bwd = torch.library.custom_op(f"khbench::{args.op}_bwd", lambda g, v: impl.backward(g, v, needs=[True])[0],
                                        mutates_args=(), schema="(Tensor g, Tensor volume) -> Tensor")
    plain_bwd.register_fake(lambda g, v: torch.empty_like(v))

    def setup(ctx, inputs, output):
        ctx.save_for_backward(inputs[0])

    plain.register_autograd(lambda ctx, g: plain_bwd(g, ctx.saved_tensors[0]), setup_context=setup)
    hub_op = kernelhub.op(args.op)
    xg = x.clone().requires_grad_()
    gout = torch.ones(3)

    def fb(f):
        def run():
            f(xg).backward(gout)
        return run

    def direct_fb():  # no autograd: an impl's forward need not be differentiable by it (cuda_ext's is not)
        impl.forward(x)
        impl.backward(gout, x, needs=[True])

    results = {
        "forward": per_call_us({"direct": lambda: impl.forward(x), "custom_op": lambda: plain(x),
                                "hub": lambda: hub_op(x)}, args.repeat, args.round_ms),
        "forward+backward": per_call_us({"direct": direct_fb, "custom_op": fb(plain), "hub": fb(hub_op)},
                                        args.repeat, args.round_ms),
    }
    for r in results.values():
        r["custom_op_overhead"] = r["custom_op"] - r["direct"]
        r["hub_overhead"] = r["hub"] - r["direct"]
        r["hub_minus_custom_op"] = r["hub"] - r["custom_op"]
        r["ratio_hub_extra_to_custom_op_overhead"] = r["hub_minus_custom_op"] / r["custom_op_overhead"]
    results["meta"] = {"op": args.op, "backend": impl.backend, "torch": torch.__version__, "shape": [4, 4, 4],
                       "threads": 1}
    if args.json:
        print(json.dumps(results, indent=2))
        return
    print(f"op {args.op} on {impl.backend}, x float32[4,4,4] on CPU, torch {torch.__version__}, 1 thread "
          "(microseconds per call, median)")
    print(f"{'':18s}{'direct':>9s}{'custom_op':>11s}{'hub':>9s}{'custom_op ovh':>15s}{'hub ovh':>10s}"
          f"{'hub extra / custom_op ovh':>28s}")
    for k in ("forward", "forward+backward"):
        r = results[k]
        print(f"{k:18s}{r['direct']:9.1f}{r['custom_op']:11.1f}{r['hub']:9.1f}{r['custom_op_overhead']:15.1f}"
              f"{r['hub_overhead']:10.1f}{r['ratio_hub_extra_to_custom_op_overhead']:28.2f}")


if __name__ == "__main__":
    main()
