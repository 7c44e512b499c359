"""A small training step through the hub, eager against one CUDA graph replay of it.

The step: ``torch.autograd.grad((op(volume) * w).sum(), volume)`` with ``op = kernelhub.op("tv_loss_l1_3d")``,
the hub's own choice, at 1x16³ (``--shape``). At such sizes the host decides the time (the kernels take a few
µs); capturing the step with ``torch.cuda.graph`` once (after warm-up on a side stream, as torch's docs say) and
replaying it leaves only the launches' GPU work. The replay's gradient is checked equal to an eager step's. µs per
step, back to back between CUDA events (`kernelhub.timing.rounds`: the two interleaved, one synchronisation per
round), best of 9 rounds, twice.

Usage: python benchmarks/run.py host-graph [--shape 1 16 16 16] [--round-ms 10]
"""

from __future__ import annotations

import argparse

import torch

import kernelhub
from kernelhub import timing


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--shape", type=int, nargs="+", default=[1, 16, 16, 16])
    p.add_argument("--round-ms", type=float, default=10.0, help="how long each row's steps in a round last")
    args = p.parse_args(argv)
    op = kernelhub.op("tv_loss_l1_3d")
    volume = torch.randn(args.shape, device="cuda", requires_grad=True)
    w = torch.randn(3, device="cuda")

    def step():
        return torch.autograd.grad((op(volume) * w).sum(), volume)[0]

    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        for _ in range(5):
            step()
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        captured = step()
    expected = step()
    graph.replay()
    torch.cuda.synchronize()
    assert torch.equal(captured, expected), "the replay's gradient differs from an eager step's"
    print(f"tv_loss_l1_3d {args.shape} (hub picks {kernelhub.explain('tv_loss_l1_3d', volume).chosen}), forward + "
          "backward, us per step:")
    for _ in range(2):
        best = {label: min(t) * 1e3 for label, t in timing.rounds(
            {"eager": step, "replay": graph.replay}, volume.device, 9, args.round_ms).items()}
        print(f"  eager hub step {best['eager']:8.1f}   CUDA graph replay {best['replay']:8.1f}")


if __name__ == "__main__":
    main()
