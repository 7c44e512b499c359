"""Timing: what a timing depends on (`device_model`), the median time of a call after warm-up (`time_ms`), with
its spread (`timed`), and several callables timed against each other in interleaved rounds (`rounds`, `paired`).

`timed` uses `triton.testing.do_bench` on CUDA (CUDA events when triton is missing) and
`torch.utils.benchmark.Timer.blocked_autorange` on the CPU; `kernelhub bench` times with it. `rounds` is what the
tuner (`kernelhub.tune`) and benchmarks/host_overhead.py compare candidates with: a drift of the machine's speed
hits every candidate of a round alike, so the per-round ratio of two candidates (`paired`) stays stable where each
one's own spread is wide.
"""

from __future__ import annotations

import functools
import platform
import random
import statistics
import time
from collections.abc import Callable, Sequence
from typing import Any, NamedTuple

import torch

__all__ = ["cpu_name", "device_model", "time_ms", "timed", "graphed", "dropping_grads", "Timing", "quartiles", "rounds",
           "paired"]


@functools.lru_cache(maxsize=None)
def cpu_name() -> str:
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def device_model(device: torch.device | str) -> str:
    """What timings depend on: the GPU's name, or the CPU's model and the threads torch uses."""
    device = torch.device(device)
    if device.type == "cuda":
        return torch.cuda.get_device_name(device)
    if device.type == "cpu":
        return f"cpu {cpu_name()} ({torch.get_num_threads()} threads)"
    return device.type


class Timing(NamedTuple):
    """A median time in milliseconds and its spread: the interquartile range of the repeats over the median."""

    ms: float
    spread: float


def quartiles(times: list[float]) -> Timing:
    """The median of ``times`` and their spread (`Timing`)."""
    q = torch.tensor(times, dtype=torch.float64).quantile(torch.tensor([0.25, 0.5, 0.75], dtype=torch.float64))
    return Timing(float(q[1]), float((q[2] - q[0]) / q[1]) if q[1] > 0 else 0.0)


def timed(fn: Callable[[], Any], device: torch.device, quick: bool = False,
          grad_to_none: Sequence[torch.Tensor] = ()) -> Timing:
    """Median time of ``fn()`` in milliseconds after warm-up, and its spread (`Timing`). ``grad_to_none``: tensors
    whose ``.grad`` is dropped before each call (a step's backward then writes it anew instead of adding to it);
    outside the timed span where `do_bench` times, inside it elsewhere (`dropping_grads`)."""
    if device.type == "cuda":
        try:
            from triton.testing import do_bench
        except ImportError:
            do_bench = None
        if do_bench is not None:
            return quartiles(list(do_bench(fn, warmup=5 if quick else 25, rep=20 if quick else 100,
                                            grad_to_none=list(grad_to_none) or None, return_mode="all")))
    if grad_to_none:
        fn = dropping_grads(fn, grad_to_none)
    if device.type == "cuda":
        for _ in range(3):
            fn()
        times = []
        for _ in range(10 if quick else 50):
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            fn()
            end.record()
            end.synchronize()
            times.append(start.elapsed_time(end))
        return quartiles(times)
    import torch.utils.benchmark as benchmark
    fn()
    timer = benchmark.Timer(stmt="fn()", globals={"fn": fn}, num_threads=torch.get_num_threads())
    m = timer.blocked_autorange(min_run_time=0.05 if quick else 0.3)
    return Timing(m.median * 1e3, m.iqr / m.median if m.median > 0 else 0.0)


def graphed(fn: Callable[[], Any], device: torch.device, quick: bool = False) -> Timing:
    """The device's time for ``fn()`` with no host time in it: ``fn`` (warmed up on a side stream) captured once as a
    CUDA graph and replayed, each replay after a 256 MiB write that flushes the L2 cache and timed between CUDA
    events around the replay alone; the median and spread (`Timing`) of 25 replays (10 with ``quick``). What the
    kernels of a call take back to back, where `timed` also counts the gaps a host slower than the device leaves
    between them. CUDA only; raises where ``fn`` cannot be captured (a host synchronisation in it, say)."""
    if device.type != "cuda":
        raise ValueError(f"timing.graphed: a CUDA device, not {device}")
    current = torch.cuda.current_stream(device)
    side = torch.cuda.Stream(device)
    side.wait_stream(current)
    with torch.cuda.stream(side):  # what capture needs first: allocations, lazy initialisation, autograd's threads
        for _ in range(3):
            fn()
    current.wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        fn()
    flush = torch.empty(2**26, dtype=torch.int32, device=device)
    pairs = []
    for _ in range(10 if quick else 25):
        flush.zero_()
        begin, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        begin.record()
        graph.replay()
        end.record()
        pairs.append((begin, end))
    torch.cuda.synchronize(device)
    times = [begin.elapsed_time(end) for begin, end in pairs]
    graph.reset()
    return quartiles(times)


def dropping_grads(fn: Callable[[], Any], tensors: Sequence[torch.Tensor]) -> Callable[[], Any]:
    """``fn`` with each of ``tensors``' ``.grad`` dropped before each call: a timed step whose backward writes the
    gradients anew instead of adding to the last call's (`timed`'s ``grad_to_none``; with `rounds`, wrap the
    callables in it)."""
    def run() -> Any:
        for t in tensors:
            t.grad = None
        return fn()
    return run


def time_ms(fn: Callable[[], Any], device: torch.device, quick: bool = False,
            grad_to_none: Sequence[torch.Tensor] = ()) -> float:
    """Median time of ``fn()`` in milliseconds, after warm-up (`timed`)."""
    return timed(fn, device, quick, grad_to_none).ms


def rounds(fns: dict[str, Callable[[], Any]], device: torch.device, repeat: int,
           budget_ms: float = 20.0) -> dict[str, list[float]]:
    """Milliseconds per call of each callable, one value per round: each callable is warmed up and calibrated (as
    many back-to-back calls as fit in ``budget_ms``, at least one), then ``repeat`` rounds go over every callable,
    each round in a new order (seeded, so no callable always comes first after a synchronisation). A round's time
    is its calls' span over their number: on CUDA between two CUDA events (the device's timeline: its kernels' time
    where the calls are device-bound, the host's enqueueing where they are host-bound), on the CPU by the clock."""
    cuda = device.type == "cuda"
    sync = (lambda: torch.cuda.synchronize(device)) if cuda else (lambda: None)
    number = {}
    for label, fn in fns.items():
        for _ in range(2):
            fn()
        sync()
        start = time.perf_counter()
        fn()
        sync()
        number[label] = max(1, min(1000, int(budget_ms / 1e3 / max(time.perf_counter() - start, 1e-7))))
    times: dict[str, list[float]] = {label: [] for label in fns}
    order, rng = list(fns), random.Random(0)
    for _ in range(repeat):
        rng.shuffle(order)
        for label in order:
            fn, n = fns[label], number[label]
            sync()
            if cuda:
                begin, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
                stream = torch.cuda.current_stream(device)
                begin.record(stream)
                for _ in range(n):
                    fn()
                end.record(stream)
                end.synchronize()
                times[label].append(begin.elapsed_time(end) / n)
            else:
                start = time.perf_counter()
                for _ in range(n):
                    fn()
                times[label].append((time.perf_counter() - start) * 1e3 / n)
    return times


def paired(times: dict[str, list[float]], label: str, base: str) -> tuple[float, int]:
    """``label`` against ``base`` over the rounds of `rounds`: the median of the per-round ratios (label's time /
    base's in the same round) and in how many rounds ``label`` was the slower."""
    ratios = [a / b for a, b in zip(times[label], times[base])]
    return statistics.median(ratios), sum(r > 1 for r in ratios)
