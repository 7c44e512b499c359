"""Timing: what a timing depends on (`device_model`) and the median time of a call after warm-up (`time_ms`).

`time_ms` uses `triton.testing.do_bench` on CUDA (CUDA events when triton is missing) and
`torch.utils.benchmark.Timer.blocked_autorange` on the CPU. The tuner (`kernelhub.tune`) and `kernelhub bench`
time with it.
"""

from __future__ import annotations

import functools
import platform
from collections.abc import Callable
from typing import Any

import torch

__all__ = ["cpu_name", "device_model", "time_ms"]


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


def time_ms(fn: Callable[[], Any], device: torch.device, quick: bool = False) -> float:
    """Median time of ``fn()`` in milliseconds, after warm-up."""
    if device.type == "cuda":
        try:
            from triton.testing import do_bench
        except ImportError:
            do_bench = None
        if do_bench is not None:
            return float(do_bench(fn, warmup=5 if quick else 25, rep=20 if quick else 100, return_mode="median"))
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
        return float(sorted(times)[len(times) // 2])
    import torch.utils.benchmark as benchmark
    fn()
    timer = benchmark.Timer(stmt="fn()", globals={"fn": fn}, num_threads=torch.get_num_threads())
    return timer.blocked_autorange(min_run_time=0.05 if quick else 0.3).median * 1e3
