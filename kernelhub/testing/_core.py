"""The kit's cases and samples: the test tiers, `ParityCase`, the generated matrix, running a backend and the
reference on a sample (kernelhub.testing re-exports all of it)."""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Iterable, Sequence
from typing import Any

import torch

from kernelhub import parity
from kernelhub.args import map_tensors
from kernelhub.hub import get_hub
from kernelhub.spec import OpSpec, SampleInput

TIERS = ("fast", "full", "cuda")


def tier() -> str:
    """The test tier asked for by ``KERNELHUB_TEST_TIER``: "fast" (the default: every op x backend in float32
    and float64 on a few samples, what CI runs), "full" (every case of the matrix) or "cuda" (the fast tier's
    tests that a GPU can change, on a GPU host; its cases are the fast tier's)."""
    value = os.environ.get("KERNELHUB_TEST_TIER", "") or "fast"
    if value not in TIERS:
        raise ValueError(f"KERNELHUB_TEST_TIER={value!r}; allowed: {list(TIERS)}")
    return value


@dataclasses.dataclass(frozen=True)
class ParityCase:
    """One parity case: an op, a backend, a dtype, a device and a sample size (``sample``: only the sample of
    that size with this name, e.g. one shape bucket where each costs a compile; None: every sample). Named
    ``Case`` before 2026-11-29 (kernelhub.Case is an op's kind of call); the old name still imports, with a
    DeprecationWarning."""

    op: str
    backend: str
    dtype: torch.dtype
    device: str
    size: str
    sample: str | None = None

    def __str__(self) -> str:
        name = f"{self.op}-{self.backend}-{str(self.dtype).removeprefix('torch.')}-{self.device}-{self.size}"
        return name if self.sample is None else f"{name}-{self.sample}"

    def samples(self, seed: int = 0) -> list[SampleInput]:
        """The case's samples (all of its size, or the one named)."""
        every = samples(self.op, self.size, self.dtype, self.device, seed)
        if self.sample is None:
            return every
        chosen = [s for s in every if s.name == self.sample]
        if not chosen:
            raise ValueError(f"{self.op} has no {self.size} sample named {self.sample!r}; it has "
                             f"{[s.name for s in every]}")
        return chosen


def _spec(op: str) -> OpSpec:
    return get_hub().registry.spec(op)


def cases(backend: str | None = None, device: str = "cpu", sizes: Sequence[str] = ("small", "edge", "medium"),
          ops: Iterable[str] | None = None) -> list[ParityCase]:
    """Every (op, backend, dtype, size) the registry declares for ``device``: the generated test matrix."""
    hub = get_hub()
    out = []
    for name in sorted(ops or hub.registry.specs):
        for bname, impl in sorted(hub.registry.impls(name).items()):
            if backend is not None and bname != backend:
                continue
            if impl.devices is not None and device not in impl.devices:
                continue
            for dtype in impl.dtypes:
                for size in sizes:
                    out.append(ParityCase(name, bname, dtype, device, size))
    return out


def samples(op: str, size: str, dtype: torch.dtype, device: str | torch.device = "cpu",
            seed: int = 0) -> list[SampleInput]:
    device = torch.device(device)
    gen = torch.Generator(device=device).manual_seed(seed)
    return _spec(op).samples(size, dtype, device, gen)


def noncontiguous(args: Sequence[Any]) -> tuple:
    """The same values in non-contiguous views (every other element of a twice-as-wide buffer)."""
    def spread(t):
        if t.numel() <= 1:  # torch calls any layout of one element contiguous
            return t
        buf = torch.zeros((*t.shape[:-1], 2 * t.shape[-1]), dtype=t.dtype, device=t.device)
        view = buf[..., ::2]
        view.copy_(t)
        assert not view.is_contiguous()
        return view
    return map_tensors(args, spread)


def leaves(op: str, args: Sequence[Any]) -> list[torch.Tensor]:
    """The tensors of ``op``'s differentiable arguments in order (a list argument gives each element)."""
    return parity.leaves(_spec(op), args)


def with_grad(op: str, args: Sequence[Any]) -> tuple:
    """``args`` with detached copies of the differentiable tensors that require grad (fresh autograd leaves)."""
    return parity.with_grad(_spec(op), args)


def run(op: str, backend: str, args: Sequence[Any], grad: torch.Tensor | None = None,
        ) -> tuple[torch.Tensor, list[torch.Tensor]]:
    """Forward (and backward with ``grad``) of ``op`` on ``backend`` through the hub's operator."""
    return parity.run(_spec(op), backend, args, grad)


def reference(op: str, args: Sequence[Any], grad: torch.Tensor | None = None,
              ) -> tuple[torch.Tensor, list[torch.Tensor]]:
    """The float64 (complex128) reference: the spec's reference backend on upcast inputs."""
    return parity.float64_reference(_spec(op), args, grad)


def reference_with_upstream(op: str, args: Sequence[Any], seed: int = 1,
                            ) -> tuple[torch.Tensor, torch.Tensor, list[torch.Tensor]]:
    """`kernelhub.parity.reference_with_upstream` for ``op``."""
    return parity.reference_with_upstream(_spec(op), args, seed)


def measure(op: str, backend: str, args: Sequence[Any], seed: int = 1,
            reference: tuple[torch.Tensor, torch.Tensor, list[torch.Tensor]] | None = None) -> tuple[float, float]:
    """(forward error, backward error) of ``backend`` in the args' dtype against the float64 reference
    (`kernelhub.parity.measure`)."""
    return parity.measure(_spec(op), backend, args, seed, reference)
