"""Parity at run time: a backend's result on a call against the float64 reference, and the tolerance for that call.

The tuner (`kernelhub.tune`) judges candidates with this, inside the calls it serves, so it is part of the
runtime: it takes the op's `OpSpec` and runs calls through the ops' operators (hub 0, the global hub). The test
kit (`kernelhub.testing`) builds its checks on it. It walks a call's arguments with `kernelhub.args`.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Any

import torch

from kernelhub.args import first_tensor, map_tensors, tensors_of
from kernelhub.ops._checks import accumulation_dtype
from kernelhub.ops.tolerances import tolerance_for
from kernelhub.spec import OpSpec, Tolerance

__all__ = ["spec_tolerance", "to_dtype", "fresh_leaves", "leaves", "with_grad", "upstream_grad", "run",
           "float64_reference", "reference_with_upstream", "parity_error", "measure", "perturbed", "sensitivity",
           "call_tolerance", "PERTURBATIONS"]

PERTURBATIONS = 4  # random roundings of a call's inputs that `call_tolerance` tries in float64


def spec_tolerance(spec: OpSpec, dtype: torch.dtype) -> Tolerance:
    """The spec's measured tolerance for ``dtype``; for an unmeasured dtype (`OpSpec.unmeasured`) the method's floor
    (16 eps of the compute dtype), which `call_tolerance` widens by eager torch's error on the call."""
    tol = spec.tolerances.get(dtype)
    return tol if tol is not None else Tolerance(tolerance_for(dtype, 0.0), tolerance_for(dtype, 0.0))


def to_dtype(args: Sequence[Any], dtype: torch.dtype) -> tuple:
    """Tensors cast to ``dtype`` (complex tensors to the matching complex dtype)."""
    def cast(t):
        if t.is_complex():
            return t.to(torch.complex128 if dtype == torch.float64 else t.dtype)
        return t.to(dtype)
    return map_tensors(args, cast)


def fresh_leaves(args: Sequence[Any], indices: Iterable[int]) -> tuple[tuple, list[torch.Tensor]]:
    """``args`` with detached copies that require grad of the tensors at ``indices`` (a list argument: each of
    its tensors), and those new autograd leaves in order."""
    out: list[Any] = list(args)
    new: list[torch.Tensor] = []
    for i in indices:
        a = args[i]
        out[i] = [t.detach().requires_grad_() for t in a] if isinstance(a, list) else a.detach().requires_grad_()
        new += out[i] if isinstance(out[i], list) else [out[i]]
    return tuple(out), new


def leaves(spec: OpSpec, args: Sequence[Any]) -> list[torch.Tensor]:
    """The tensors of the op's differentiable arguments in order (a list argument gives each element)."""
    return [t for i in spec.differentiable for t in tensors_of(args[i]) or ()]


def with_grad(spec: OpSpec, args: Sequence[Any]) -> tuple:
    """``args`` with detached copies of the differentiable tensors that require grad (fresh autograd leaves)."""
    return fresh_leaves(args, spec.differentiable)[0]


def upstream_grad(out: torch.Tensor, seed: int = 1) -> torch.Tensor:
    gen = torch.Generator(device=out.device).manual_seed(seed)
    return torch.randn(out.shape, generator=gen, device=out.device, dtype=torch.float64).to(out.dtype) \
        if not out.is_complex() else torch.randn(out.shape, generator=gen, device=out.device, dtype=out.dtype)


def run(spec: OpSpec, backend: str, args: Sequence[Any], grad: torch.Tensor | None = None, hub: int = 0,
        ) -> tuple[torch.Tensor, list[torch.Tensor]]:
    """Forward (and backward with ``grad``) of the op on ``backend`` through its operator (canonical args), on the
    hub whose key is ``hub`` (`kernelhub.hub.Hub.key`; 0, the global hub's: the tuner passes its own hub's)."""
    args = with_grad(spec, args) if grad is not None else args
    out = getattr(torch.ops.kernelhub, spec.name).default(*args, backend, hub)
    if grad is None:
        return out, []
    out.backward(grad.to(out.dtype))
    return out, [t.grad if t.grad is not None else torch.zeros_like(t) for t in leaves(spec, args)]


def float64_reference(spec: OpSpec, args: Sequence[Any], grad: torch.Tensor | None = None, hub: int = 0,
                      ) -> tuple[torch.Tensor, list[torch.Tensor]]:
    """The float64 (complex128) reference: the spec's reference backend on upcast inputs."""
    return run(spec, spec.reference_backend, to_dtype(args, torch.float64),
               None if grad is None else grad.to(torch.complex128 if grad.is_complex() else torch.float64), hub)


def reference_with_upstream(spec: OpSpec, args: Sequence[Any], seed: int = 1, hub: int = 0,
                            ) -> tuple[torch.Tensor, torch.Tensor, list[torch.Tensor]]:
    """The float64 reference's output, a random upstream gradient drawn for it (`upstream_grad`), and the
    inputs' gradients under that upstream gradient: forward once, then backward."""
    wide = with_grad(spec, to_dtype(args, torch.float64))
    out = getattr(torch.ops.kernelhub, spec.name).default(*wide, spec.reference_backend, hub)
    grad = upstream_grad(out, seed)
    out.backward(grad)
    return out.detach(), grad, [t.grad if t.grad is not None else torch.zeros_like(t) for t in leaves(spec, wide)]


def parity_error(out: torch.Tensor, ref: torch.Tensor) -> float:
    """max|out - ref| / max|ref| over finite entries; inf if the non-finite entries differ."""
    if out.shape != ref.shape:
        return float("inf")
    out, ref = out.to(ref.dtype), ref
    nonfinite = ~torch.isfinite(ref)
    if not torch.equal(nonfinite, ~torch.isfinite(out)):
        return float("inf")
    if nonfinite.any():
        a, b = out[nonfinite], ref[nonfinite]
        if not torch.equal(torch.isnan(a), torch.isnan(b)) or not torch.equal(a[~torch.isnan(a)], b[~torch.isnan(b)]):
            return float("inf")
    finite = ~nonfinite
    if not finite.any():
        return 0.0
    diff = (out[finite] - ref[finite]).abs().max().item()
    scale = ref[finite].abs().max().item()
    return diff / scale if scale > 0 else diff


def measure(spec: OpSpec, backend: str, args: Sequence[Any], seed: int = 1,
            reference: tuple[torch.Tensor, torch.Tensor, list[torch.Tensor]] | None = None,
            hub: int = 0) -> tuple[float, float]:
    """(forward error, backward error) of ``backend`` in the args' dtype against the float64 reference
    (``reference``: `reference_with_upstream(spec, args, seed)` where the caller has it already)."""
    ref_out, grad, ref_grads = reference if reference is not None else reference_with_upstream(spec, args, seed, hub)
    out, grads = run(spec, backend, args, grad, hub)  # through the hub, which raises WrongOutputError on a wrong output
    bwd = max([parity_error(g, r) for g, r in zip(grads, ref_grads)], default=0.0)
    return parity_error(out, ref_out), bwd


def perturbed(args: Sequence[Any], dtype: torch.dtype, gen: torch.Generator) -> tuple:
    """Floating-point tensors of ``args`` times (1 + u eps), u uniform in [-1, 1]."""
    eps = torch.finfo(accumulation_dtype(dtype).to_real()).eps

    def perturb(t):
        if not (t.is_floating_point() or t.is_complex()):
            return t
        u = torch.rand(t.shape, generator=gen, dtype=torch.float64, device=t.device) * 2 - 1
        return t * (1 + eps * u).to(t.dtype)

    return map_tensors(args, perturb)


def sensitivity(spec: OpSpec, args: Sequence[Any], gen: torch.Generator, reference=None,
                times: int = 1, hub: int = 0) -> tuple[float, float]:
    """How far the float64 reference moves when its inputs move by one rounding (step 2): the most over
    ``times`` random roundings, forward and, given ``reference`` = (out, upstream grad, grads), backward
    (else 0). The rounding is float64's: the step applies to float64 and complex128 calls."""
    wide = to_dtype(args, torch.float64)
    out, grad, grads = reference if reference is not None else (float64_reference(spec, wide, hub=hub)[0], None, [])
    fwd = bwd = 0.0
    for _ in range(times):
        moved, moved_grads = float64_reference(spec, perturbed(wide, torch.float64, gen), grad, hub)
        fwd = max(fwd, parity_error(moved, out))
        bwd = max([bwd] + [parity_error(m, g) for m, g in zip(moved_grads, grads)])
    return fwd, bwd


def call_tolerance(spec: OpSpec, args: Sequence[Any], seed: int = 1, reference=None, hub: int = 0) -> Tolerance:
    """The tolerance for one call's inputs (docs/reliability.md's method applied to them): 4 x eager torch's
    error in the args' dtype against float64 (forward and backward, upstream gradient from ``seed``); in float64,
    where that compares the reference with itself, 4 x how far the reference's forward and gradients move when its
    inputs move by one rounding (the most over ``PERTURBATIONS`` random roundings: the error another correct order
    of operations may have). Never below the spec's tolerance.

    The spec's tolerances are measured on its small samples; error grows with size (a K-Planes coordinate is
    rounded relative to the plane's resolution), so the tuner and the property tests judge a call of another
    size by this. ``reference``: `reference_with_upstream(spec, args, seed)`, where the caller has it; ``hub``: the
    key of the hub whose reference backend runs (`run`)."""
    first = first_tensor(args)
    dtype = first.dtype
    reference = reference if reference is not None else reference_with_upstream(spec, args, seed, hub)
    fwd, bwd = measure(spec, spec.reference_backend, args, seed=seed, reference=reference, hub=hub)
    if accumulation_dtype(dtype).to_real() == torch.float64:
        gen = torch.Generator(device=first.device).manual_seed(seed)
        # one random direction can miss most of the sensitivity (seen: 10x)
        moved = sensitivity(spec, args, gen, reference, times=PERTURBATIONS, hub=hub)
        fwd, bwd = max(fwd, moved[0]), max(bwd, moved[1])
    tol = spec_tolerance(spec, dtype)
    return Tolerance(max(tol.forward, tolerance_for(dtype, fwd)), max(tol.backward, tolerance_for(dtype, bwd)))
