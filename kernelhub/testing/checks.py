"""The checks: parity, non-contiguous inputs, opcheck, gradcheck, bad inputs, weighted handles and saved
forwards, each against the float64 reference (kernelhub.testing re-exports them)."""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Any

import torch
from torch.autograd.gradcheck import GradcheckError

from kernelhub import parity
from kernelhub.args import tensors_of
from kernelhub.hub import get_hub
from kernelhub.parity import parity_error, to_dtype, upstream_grad
from kernelhub.spec import OpSpec
from kernelhub.testing._core import ParityCase, _spec, leaves, measure, noncontiguous, run, samples, with_grad
from kernelhub.testing.coverage import Reached, _covered, reach, supported


def check_parity(case: ParityCase, seed: int = 0, allow: Iterable[str] = ()) -> Reached:
    """Forward and backward of every call `reach` finds for ``case`` within the spec's tolerance (the drawn calls
    are no larger than its samples; not the per-call `kernelhub.parity.call_tolerance`, which in float64 a tie
    widens to anything: one rounding moves the winner), or in a dtype the spec has not measured yet
    (`OpSpec.unmeasured`) the call's own. The calls the impl declines are refused when forced (`supported`); a
    required tag it reached no call of is `NotCovered` unless ``allow`` names it."""
    spec = _spec(case.op)
    reached = reach(case.op, case.backend, case.size, case.dtype, case.device, seed, case.sample)
    for sample in reached.samples:
        tol = spec.tolerances.get(case.dtype) or parity.call_tolerance(spec, sample.args)
        fwd, bwd = measure(case.op, case.backend, sample.args)
        assert fwd <= tol.forward, f"{case} [{sample.name}]: forward error {fwd:.3g} > {tol.forward:.3g}"
        assert bwd <= tol.backward, f"{case} [{sample.name}]: backward error {bwd:.3g} > {tol.backward:.3g}"
        reached.run += 1
    return _covered(reached, f"parity of {case}", allow)


def check_noncontiguous(case: ParityCase, seed: int = 0, allow: Iterable[str] = ()) -> Reached:
    """Non-contiguous inputs give the result of their contiguous copies, within the dtype's tolerance
    (forward and gradients), on every call `reach` finds."""
    spec = _spec(case.op)
    tol = parity.spec_tolerance(spec, case.dtype)
    reached = reach(case.op, case.backend, case.size, case.dtype, case.device, seed, case.sample)
    for sample in reached.samples:
        ref_out, _ = run(case.op, case.backend, sample.args)
        grad = upstream_grad(ref_out)
        want, want_g = run(case.op, case.backend, sample.args, grad)
        got, got_g = run(case.op, case.backend, noncontiguous(sample.args), grad)
        assert parity_error(got, want) <= tol.forward, f"{case} [{sample.name}]: non-contiguous forward differs"
        for g, w in zip(got_g, want_g):
            assert parity_error(g, w) <= tol.backward, f"{case} [{sample.name}]: non-contiguous backward differs"
        reached.run += 1
    return _covered(reached, f"non-contiguous {case}", allow)


def check_opcheck(op: str, backend: str = "", size: str = "small", device: str = "cpu",
                  allow: Iterable[str] = ()) -> Reached:
    """torch.library.opcheck (schema, autograd registration, fake tensor, AOT dispatch) on the float64 calls
    `reach` finds (``backend`` "": the operator as a call reaches it, the hub selecting)."""
    overload = getattr(torch.ops.kernelhub, op).default
    reached = reach(op, backend, size, torch.float64, device)
    for sample in reached.samples:
        args = with_grad(op, sample.args)
        result = torch.library.opcheck(overload, (*args, backend, 0), raise_exception=False)
        bad = {k: v for k, v in result.items() if v != "SUCCESS"}
        assert not bad, f"opcheck of {op} on {backend or 'the selected backend'} [{sample.name}] failed: {bad}"
        reached.run += 1
    return _covered(reached, f"opcheck of {op} on {backend or 'the selected backend'}", allow)


def check_gradcheck(op: str, backend: str, device: str = "cpu", fast_mode: bool = False,
                    sample: str | None = None, allow: Iterable[str] = ()) -> Reached:
    """torch.autograd.gradcheck in float64 on the small calls `reach` finds (``fast_mode``: against one random
    projection of the Jacobian instead of all of it, for slow kernels such as interpreted ones; ``sample``:
    only the small sample of that name)."""
    spec = _spec(op)
    overload = getattr(torch.ops.kernelhub, op).default
    fn = lambda *a: overload(*a, backend, 0)  # noqa: E731
    # an impl that adds with atomics gives backwards that differ in the last bits from run to run
    nondet_tol = 0.0 if get_hub().registry.impls(op)[backend].deterministic_on(torch.device(device).type) else 1e-12
    reached = reach(op, backend, "small", torch.float64, str(device), sample=sample)
    for checked in reached.samples:
        args = list(checked.args)
        diff = spec.differentiable

        def f(*inputs, args=args):
            full, pos = list(args), 0
            for i in diff:
                a = args[i]
                if isinstance(a, list):
                    full[i] = list(inputs[pos:pos + len(a)])
                    pos += len(a)
                else:
                    full[i] = inputs[pos]
                    pos += 1
            return fn(*full)

        inputs = leaves(op, with_grad(op, args))
        try:
            torch.autograd.gradcheck(f, tuple(inputs), eps=1e-6, atol=1e-5, rtol=1e-4, fast_mode=fast_mode,
                                     nondet_tol=nondet_tol)
        except GradcheckError as exc:
            raise CheckFailed(f"gradcheck of {op} on {backend} [{checked.name}] failed: "
                              f"{_worst_jacobian_entry(f, inputs, _input_names(spec, args))}",
                              full=str(exc)) from None
        reached.run += 1
    return _covered(reached, f"gradcheck of {op} on {backend}", allow)


def _input_names(spec: OpSpec, args: Sequence[Any]) -> list[str]:
    """A name per differentiable input tensor, in `leaves` order: the argument's, indexed within a list argument."""
    return [f"{spec.args[i].name}{f'[{j}]' if isinstance(args[i], list) else ''}" for i in spec.differentiable
            for j in range(len(args[i]) if isinstance(args[i], list) else 1)]


class CheckFailed(AssertionError):
    """A check's failure: its message one line (what failed, and where most), ``full`` all of it (a gradcheck's
    whole numerical and analytical Jacobians), which `kernelhub check --verbose` and its JSON show."""

    def __init__(self, message: str, full: str = ""):
        super().__init__(message)
        self.full = full or message


def _worst_jacobian_entry(f, inputs: Sequence[torch.Tensor], names: Sequence[str], eps: float = 1e-6,
                          most: int = 4096) -> str:
    """Where the analytical Jacobian of ``f`` (autograd: the impl's backward) is farthest from the numerical one
    (central differences of ``eps``), as one line: the output and input elements and both values. Left out (it
    says so) past ``most`` elements of inputs or outputs."""
    with torch.enable_grad():
        xs = [x.detach().clone().requires_grad_() for x in inputs]
        out = f(*xs)
        flat = torch.view_as_real(out).reshape(-1) if out.is_complex() else out.reshape(-1)
        n_in = sum(x.numel() for x in xs)
        if flat.numel() > most or n_in > most:
            return f"({flat.numel()} outputs x {n_in} input elements: too many to locate the worst; --verbose)"
        analytical = torch.stack([torch.cat([(g if g is not None else torch.zeros_like(x)).reshape(-1)
                                             for g, x in zip(torch.autograd.grad(o, xs, retain_graph=True,
                                                                                 allow_unused=True), xs)])
                                  for o in flat]) if flat.numel() else torch.zeros(0, n_in)
    columns = []
    with torch.no_grad():
        for i, x in enumerate(xs):  # by position: `xs.index(x)` would compare tensors elementwise
            for k in range(x.numel()):
                cols = []
                for sign in (1, -1):
                    moved = [y.detach().clone() for y in xs]
                    moved[i].view(-1)[k] += sign * eps
                    o = f(*moved)
                    cols.append(torch.view_as_real(o).reshape(-1) if o.is_complex() else o.reshape(-1))
                columns.append((cols[0] - cols[1]) / (2 * eps))
    numerical = torch.stack(columns, dim=1) if columns else torch.zeros(flat.numel(), 0)
    gap = (analytical - numerical).abs()
    if gap.numel() == 0:
        return "(an empty Jacobian)"
    row, col = divmod(int(gap.argmax()), gap.shape[1])
    i, k = 0, col
    while k >= xs[i].numel():
        k, i = k - xs[i].numel(), i + 1
    index = list(torch.unravel_index(torch.tensor(k), xs[i].shape)) if xs[i].dim() else []
    return (f"d output[{row}] / d {names[i] if i < len(names) else f'input {i}'}{[int(j) for j in index]}: "
            f"analytical {analytical[row, col].item():.6g}, numerical {numerical[row, col].item():.6g} (the largest "
            f"of {int((gap > 1e-5 + 1e-4 * numerical.abs()).sum())} entries out of tolerance; --verbose: both "
            "Jacobians)")


def check_bad_inputs(op: str, backend: str | None = None) -> None:
    """Each of the spec's bad inputs raises the declared error, naming the op and the argument."""
    fn = get_hub().handle(op, backend)
    for args, kwargs, exc_type, fragment in _spec(op).bad_inputs():
        try:
            fn(*args, **kwargs)
        except exc_type as exc:
            msg = str(exc)
            assert op in msg and fragment in msg, f"{op}: error {msg!r} should name the op and {fragment!r}"
        else:
            raise AssertionError(f"{op}: bad input {args!r} {kwargs!r} did not raise {exc_type.__name__}")



def _assert_grads_close(got: Sequence[Any], want: Sequence[Any], tol: float, what: str) -> None:
    """Each gradient of ``got`` (a tensor, a list of them, or None) within ``tol`` (`parity_error`) of ``want``'s;
    ``what`` opens the message, the error closes it."""
    for g, w in zip(got, want, strict=True):
        for a, b in zip(tensors_of(g) or (), tensors_of(w) or (), strict=True):
            err = parity_error(a, b)
            assert err <= tol, f"{what}: {err:.3g}"


def check_weighted(op: str, backend: str, device: str = "cpu") -> None:
    """For an impl that fuses a weighted handle's weights (`Impl.can` "weighted"), on every small sample it accepts
    in each dtype it takes: ``forward(*args, weights=w)`` is the 0-d ``(forward(*args) * w).sum()`` (weighed in
    float64) and ``backward(grad, *args, needs=..., weights=w)`` its ``backward(conj(w) * grad, *args,
    needs=...)``, within the op's tolerances (its plain functions are checked against the reference by the parity
    checks); the weights positive, so no cancellation makes a small sum's relative error meaningless."""
    spec = _spec(op)
    registry = get_hub().registry
    impl = registry.impls(op)[backend]
    reason = registry.unavailable_reason(backend)  # loads the backend (a library, a build) where it can
    assert reason is None, f"{op} on {backend}: the backend is unavailable: {reason}"
    ran = 0
    for dtype in [d for d in spec.dtypes if d in impl.dtypes]:
        for sample in supported(op, backend, samples(op, "small", dtype, device)):
            args = sample.args
            tol = spec.tolerances.get(dtype) or parity.call_tolerance(spec, args)
            out = impl.forward(*args)
            gen = torch.Generator().manual_seed(7)
            w = (torch.rand(out.shape, generator=gen, dtype=out.real.dtype) + 0.5).to(out.dtype).to(out.device)
            grad = torch.tensor(0.75, dtype=out.dtype, device=out.device)
            needs = [True] * len(spec.differentiable)
            got = impl.forward(*args, weights=w)
            meta = (got.shape, got.dtype, got.device) if isinstance(got, torch.Tensor) else type(got).__name__
            assert meta == ((), out.dtype, out.device), \
                f"{op} on {backend} [{sample.name}]: weighted forward returned {meta}, not a 0-d {out.dtype}"
            wide_out, wide_w = to_dtype((out, w), torch.float64)
            err = parity_error(got, (wide_out * wide_w).sum())
            assert err <= tol.forward, f"{op} on {backend} [{sample.name}]: weighted forward error {err:.3g}"
            _assert_grads_close(impl.backward(grad, *args, needs=needs, weights=w),
                                impl.backward(w.conj() * grad, *args, needs=needs), tol.backward,
                                f"{op} on {backend} [{sample.name}]: weighted backward error")
            ran += 1
    assert ran, f"{op} on {backend}: no small sample to check its weights on {device}"


def check_saved(op: str, backend: str, device: str = "cpu") -> None:
    """For an impl that saves for its backward (`Impl.can` "saves"), on every small, medium and edge sample it
    accepts in each dtype it takes: ``forward(*args, saving=True)`` gives ``forward(*args)``'s output (bitwise,
    NaN where it has NaN), and where it saved something, ``backward(..., saved=saved)`` gives ``backward(...)``'s
    gradients within the op's tolerances (the parity checks run the plain functions, through the operators, against the
    reference). Skipped (pytest's skip) where the impl saved nothing for any of them on this device."""
    spec = _spec(op)
    registry = get_hub().registry
    impl = registry.impls(op)[backend]
    reason = registry.unavailable_reason(backend)
    assert reason is None, f"{op} on {backend}: the backend is unavailable: {reason}"
    saved_any = 0
    for dtype in [d for d in spec.dtypes if d in impl.dtypes]:
        tol = parity.spec_tolerance(spec, dtype)
        for size in ("small", "medium", "edge"):
            for sample in supported(op, backend, samples(op, size, dtype, device)):
                args = sample.args
                want = impl.forward(*args)
                got, saved = impl.forward(*args, saving=True)
                assert torch.equal(got.isnan(), want.isnan()) and torch.equal(got.nan_to_num(), want.nan_to_num()), \
                    f"{op} on {backend} [{sample.name}]: the saving forward's output differs from the forward's"
                if saved is None:
                    continue
                grad = upstream_grad(want)
                needs = [True] * len(spec.differentiable)
                _assert_grads_close(impl.backward(grad, *args, needs=needs, saved=saved),
                                    impl.backward(grad, *args, needs=needs), tol.backward,
                                    f"{op} on {backend} [{sample.name}]: backward from the saved tensor differs")
                saved_any += 1
    if not saved_any:
        import pytest
        pytest.skip(f"{op} on {backend}: saves nothing for any sample on {device}")
