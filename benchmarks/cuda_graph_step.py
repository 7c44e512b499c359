"""A small training step through the hub, eager against one CUDA graph replay of it.

The step: ``torch.autograd.grad((op(volume) * w).sum(), volume)`` with ``op = kernelhub.op("tv_loss_l1_3d")``,
the hub's own choice, at 1x16³ (``--shape``). At such sizes the host decides the time (the kernels take a few
µs); capturing the step with ``torch.cuda.graph`` once (after warm-up on a side stream, as torch's docs say) and
replaying it leaves only the launches' GPU work. The replay's gradient is checked equal to an eager step's. Wall µs
per step, back to back, one synchronisation per round, best of 9 rounds, twice.

Usage: python benchmarks/cuda_graph_step.py [--shape 1 16 16 16] [--n 200]
"""

from __future__ import annotations

import argparse
import time

import torch

import kernelhub


def best_us(f, n: int) -> float:
    best = float("inf")
    for _ in range(9):
        torch.cuda.synchronize()
        start = time.perf_counter()
        for _ in range(n):
            f()
        torch.cuda.synchronize()
        best = min(best, (time.perf_counter() - start) / n * 1e6)
    return best


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--shape", type=int, nargs="+", default=[1, 16, 16, 16])
    p.add_argument("--n", type=int, default=200)
    args = p.parse_args()
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
          "backward, wall us per step:")
    for _ in range(2):
        print(f"  eager hub step {best_us(step, args.n):8.1f}   CUDA graph replay {best_us(graph.replay, args.n):8.1f}")


if __name__ == "__main__":
    main()
