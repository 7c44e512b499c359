"""CUDA safety: what a real program does with a GPU kernel, no host sync and a CUDA graph's replay
(kernelhub.testing re-exports it)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch

from kernelhub.args import tensors_of
from kernelhub.parity import upstream_grad
from kernelhub.testing._core import _spec, run, samples


# -- CUDA safety: what a real program does with a GPU kernel ---------------------------------------------------
def cuda_args(op: str, device: str = "cuda", seed: int = 0) -> tuple:
    """The first medium sample of ``op`` on ``device`` in float32 (the spec's first dtype where it has none)."""
    spec = _spec(op)
    dtype = torch.float32 if torch.float32 in spec.dtypes else spec.dtypes[0]
    return samples(op, "medium", dtype, device, seed)[0].args


def copy_into(args: Sequence[Any], fresh: Sequence[Any]) -> None:
    """New values into captured inputs (lists of tensors, the multiscale planes, included)."""
    with torch.no_grad():
        for a, b in zip(args, fresh):
            for x, y in zip(tensors_of(a) or (), tensors_of(b) or ()):
                x.copy_(y)


def check_no_host_sync(op: str, backend: str) -> None:
    """A forward and backward after warm-up make no host synchronisation (torch's sync debug mode raises)."""
    args = cuda_args(op)
    out, _ = run(op, backend, args)
    grad = upstream_grad(out)
    run(op, backend, args, grad)  # warm-up: compilation and first-use allocations
    torch.cuda.synchronize()
    torch.cuda.set_sync_debug_mode("error")
    try:
        run(op, backend, args, grad)
    finally:
        torch.cuda.set_sync_debug_mode("default")


def check_cuda_graph_replay(op: str, backend: str) -> None:
    """The forward captured in a CUDA graph and replayed on new input values gives what an eager call gives."""
    args = cuda_args(op)
    fn = getattr(torch.ops.kernelhub, op).default
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        fn(*args, backend, 0)  # warm-up outside capture
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        static_out = fn(*args, backend, 0)
    copy_into(args, cuda_args(op, seed=1))
    graph.replay()
    torch.cuda.synchronize()
    torch.testing.assert_close(static_out, fn(*args, backend, 0), rtol=0, atol=0)
