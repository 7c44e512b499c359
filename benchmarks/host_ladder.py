"""Where the hub's per-call host cost goes: the minimal autograd.Function around the backend the hub picks, then
the hub's pieces added one at a time, forward + backward of one call, microseconds, best of the rounds.

  min                 benchmarks/host_overhead.py's minimal Function (torch.autograd.Function.apply)
  min, raw apply      the same Function through the raw apply the hub's glue uses (no Python wrapper)
  glue                the hub's layout lookup (dispatch._layout, Selector.remembered) and a one-input Function
                      calling the impl directly: no output or gradient checks
  glue + checks       the same with the hub's output and gradient checks (hub._check_output, hub._check_grads)
  hub                 kernelhub.op(name), the eager fast path
  hub, no checks      the hub with those two checks replaced by no-ops (a diagnostic: the hub checks a layout's
                      first call only, so past it the two rows run the same code)

Each round times every row in turn, in a new order each round (`kernelhub.timing.rounds`, the tuner's timing:
back-to-back calls filling ``--round-ms``, one synchronisation per row, CUDA events on CUDA), so a drift of the
machine's speed hits them alike; the best round is the least disturbed one. Tensor arguments only (TV, trilinear,
K-Planes).

    python benchmarks/run.py host-ladder [--device cuda] [--families tv trilinear] [--sizes tiny medium] [--rounds 41]
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import torch

import kernelhub
from kernelhub import dispatch, testing, timing
from kernelhub import hub as hub_module

sys.path.insert(0, str(Path(__file__).parent))
import host_overhead  # noqa: E402


def rows(op: str, args: tuple) -> dict:
    """Each row's callable: one forward + backward of ``args``."""
    hub = kernelhub.get_hub()
    spec = hub.registry.spec(op)
    args = spec.normalize(*args)
    leaves_args = testing.with_grad(op, args)
    leaves = [leaves_args[i] for i in spec.differentiable]
    grad = testing.upstream_grad(kernelhub.op(op)(*args))
    handle = kernelhub.op(op)
    handle(*leaves_args)  # remembered from here on
    decision = hub.selector.decide(op, leaves_args, "")
    impl = decision.eligible[0]
    assert all(isinstance(leaves_args[i], torch.Tensor) for i in spec.tensor_args), "tensor arguments only"
    slots = [1 + spec.tensor_args.index(i) for i in spec.differentiable]  # each gradient's input slot
    minimal = host_overhead.minimal(impl, spec)
    raw_minimal = super(torch.autograd.Function, minimal.__self__).apply

    def glue_function(checks: bool):
        class Glue(torch.autograd.Function):
            @staticmethod
            def forward(ctx, call, *tensors):
                decision, args = call
                ctx.save_for_backward(*tensors)
                out = decision.eligible[0].forward(*args)
                if checks:
                    hub_module._check_output(spec, impl.backend, out, decision.output, args)
                ctx.call = call
                return out.contiguous()

            @staticmethod
            def backward(ctx, g):
                decision, args = ctx.call
                ctx.saved_tensors  # noqa: B018  (unpacked as the hub's glue does: the version check)
                needs_input = ctx.needs_input_grad
                needs = [needs_input[s] for s in slots]
                grads = decision.eligible[0].backward(g, *args, needs=needs)
                if checks:
                    hub_module._check_grads(spec, impl.backend, grads, args, needs, g)
                out = [None] * len(needs_input)
                for s, need, gr in zip(slots, needs, grads):
                    if need:
                        out[s] = gr
                return tuple(out)

        apply = super(torch.autograd.Function, Glue).apply
        remembered, deterministic = hub.selector.remembered, torch.are_deterministic_algorithms_enabled

        def call(*a):
            if dispatch._fwad._current_level < 0 and not dispatch._tracing():
                key, tensors = dispatch._layout(a)
                known = remembered[(op, "", deterministic(), key)]
                return apply((known[0], a), *tensors)
        return call

    def step(f):
        return lambda: torch.autograd.grad(f(*leaves_args), leaves, grad)

    checks = hub_module._check_output, hub_module._check_grads

    def unchecked():
        hub_module._check_output = hub_module._check_grads = lambda *a, **k: None
        try:
            return torch.autograd.grad(handle(*leaves_args), leaves, grad)
        finally:
            hub_module._check_output, hub_module._check_grads = checks

    return {"min": step(minimal), "min, raw apply": step(raw_minimal), "glue": step(glue_function(False)),
            "glue + checks": step(glue_function(True)), "hub": step(handle), "hub, no checks": unchecked}, impl.backend


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--device", default="cpu")
    p.add_argument("--families", nargs="+", default=["tv", "trilinear", "kplanes"], choices=["tv", "trilinear",
                                                                                             "kplanes"])
    p.add_argument("--sizes", nargs="+", default=["tiny"], choices=["tiny", "medium", "large"])
    p.add_argument("--rounds", type=int, default=41)
    p.add_argument("--round-ms", type=float, default=15.0, help="how long each row's calls in a round last")
    args = p.parse_args(argv)
    device = torch.device(args.device)
    for fam in args.families:
        op, sizes = host_overhead.FAMILIES[fam]
        for size in args.sizes:
            fns, backend = rows(op, sizes[size](device, torch.Generator().manual_seed(0)))
            for f in fns.values():
                for _ in range(20):
                    f()
            best = {label: min(t) * 1e3 for label, t in timing.rounds(fns, device, args.rounds, args.round_ms).items()}
            print(f"{host_overhead.CALLS[fam][size]} ({op}, {backend}, {args.device}): forward + backward, us, best "
                  f"of {args.rounds} rounds")
            for label, us in best.items():
                print(f"  {label:16s} {us:8.1f}  {us / best['min']:5.2f}x min")
    return 0


if __name__ == "__main__":
    sys.exit(main())
