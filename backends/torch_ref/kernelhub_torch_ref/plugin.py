"""Registers the torch_ref backend (one Impl per op, backward derived with torch.func.vjp) and the inductor
backend (the same forward and backward through torch.compile: inductor.py). inductor's impl is traceable
(`Impl.can` "traceable"): traced into a torch.compile graph it is torch_ref's code, which the graph's compile compiles.
torch_ref's is not: it is the reference as written, run eagerly (a compiled graph that forces or pins it calls
the operator), SVD included."""

from __future__ import annotations

from collections.abc import Callable, Sequence

import torch

from kernelhub import hookimpl
from kernelhub.ops.kplanes import KPLANES_OPS
from kernelhub.spec import Backend, Impl
from kernelhub_torch_ref import __version__, inductor, kplanes, semiconv, tikhonov, trilinear, tv

FORWARDS: dict[str, Callable[..., torch.Tensor]] = {
    "tv_loss_l1_3d": tv.tv_loss_l1_3d,
    "tv_loss_sq_3d": tv.tv_loss_sq_3d,
    "tv_loss_iso_3d": tv.tv_loss_iso_3d,
    "kplanes_interp_tilted": kplanes.kplanes_interp_tilted,
    "kplanes_interp_tilted_ms": kplanes.kplanes_interp_tilted_ms,
    "kplanes_interp_tilted_taps": kplanes.kplanes_interp_tilted_taps,
    "trilinear_interp": trilinear.trilinear_interp,
    "semiconv": semiconv.semiconv,
    "tikhonov_inverse_2xn": tikhonov.tikhonov_inverse_2xn,
}
# Where the reference's gradient is not the autograd of its forward (docs/ops.md: Tikhonov's
# gradient is the closed form's, not the SVD's), the function to differentiate instead.
DIFFERENTIATE: dict[str, Callable[..., torch.Tensor]] = {
    "tikhonov_inverse_2xn": tikhonov.closed_form_float64,
}
# Ops whose backward scatters into gathered positions (grid_sample's, the unfolded products'): on a GPU
# the compiled backward adds with atomics, so its sums may differ in the last bits from run to run.
SCATTERING_BACKWARD = {*KPLANES_OPS, "semiconv"}


def vjp_backward(forward: Callable[..., torch.Tensor], diff: Sequence[int]) -> Callable:
    """A backward(grad, *args, needs) computed by torch.func.vjp of ``forward``.

    torch.func works inside a torch.library kernel, where plain autograd is switched off.
    """

    def backward(grad: torch.Tensor, *args, needs: Sequence[bool]):
        def f(*primals):
            full = list(args)
            for i, p in zip(diff, primals):
                full[i] = p
            return forward(*full)

        if grad.numel() == 0:  # an empty output: no input reaches the loss, and no graph need be built (inductor's
            # lowering of an empty complex tensor's real view raised, traced into a compiled step)
            grads = [[torch.zeros_like(t) for t in args[i]] if isinstance(args[i], list) else torch.zeros_like(args[i])
                     for i in diff]
        elif type(grad) is torch.Tensor or type(grad) is torch.nn.Parameter:
            out, pullback = torch.func.vjp(f, *(args[i] for i in diff))
            grads = pullback(grad.to(out.dtype))
        else:  # traced into a torch.compile graph (inductor's impl): torch.func cannot run on its functional
            # tensors, and autograd is off below the operator's autograd formula; it is switched on again here
            exclude = torch._C._dispatch_tls_local_exclude_set()
            for key in (torch._C.DispatchKey.AutogradFunctionality, torch._C.DispatchKey.AutogradOther,
                        torch._C.DispatchKey.ADInplaceOrView):
                exclude = exclude.remove(key)
            with torch._C._ForceDispatchKeyGuard(torch._C._dispatch_tls_local_include_set(), exclude), \
                    torch.enable_grad():
                primals = [[t.detach().requires_grad_() for t in args[i]] if isinstance(args[i], list)
                           else args[i].detach().requires_grad_() for i in diff]
                out = f(*primals)
                flat = [t for p in primals for t in (p if isinstance(p, list) else [p])]
                got = iter(torch.autograd.grad(out, flat, grad.to(out.dtype), allow_unused=True,
                                               materialize_grads=True))
                grads = [[next(got) for _ in p] if isinstance(p, list) else next(got) for p in primals]
        result = []
        for g, arg, need in zip(grads, (args[i] for i in diff), needs):
            if not need:
                result.append(None)
            elif isinstance(g, (list, tuple)):
                result.append([x.to(a.dtype) for x, a in zip(g, arg)])
            else:
                result.append(g.to(arg.dtype))
        return result

    return backward


@hookimpl
def kernelhub_register_impls(registry) -> None:
    registry.add_backend(Backend("torch_ref", __version__, "plain PyTorch, written from docs/ops.md"))
    registry.add_backend(Backend("inductor", __version__, "torch_ref compiled by torch.compile",
                                 inductor.unavailable_reason))
    for op, forward in FORWARDS.items():
        spec = registry.spec(op)
        backward = vjp_backward(DIFFERENTIATE.get(op, forward), spec.differentiable)
        registry.add_impl(Impl(op=op, backend="torch_ref", forward=forward, backward=backward, dtypes=spec.dtypes,
                               devices=None, deterministic=("cpu",) if op in KPLANES_OPS else True))
        # inductor compiles the function the reference differentiates: for Tikhonov the closed form, since
        # the SVD is a cuSOLVER/LAPACK call inductor cannot generate code for, and on CUDA it synchronises
        registry.add_impl(Impl(op=op, backend="inductor",
                               forward=inductor.compiled_pass(op, "forward", DIFFERENTIATE.get(op, forward)),
                               backward=inductor.compiled_pass(op, "backward", backward), dtypes=spec.dtypes,
                               devices=("cpu", "cuda"), not_supported_reasons=inductor.reasons(op),
                               deterministic=("cpu",) if op in SCATTERING_BACKWARD else True,
                               tuned_only=inductor.TUNED_ONLY, can={"traceable"}))
