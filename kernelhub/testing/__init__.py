"""The conformance kit: the checks kernelhub's own tests and third-party backends run.

Every check takes an op name, a backend name and a `SampleInput` (or generates them
from the spec), runs the impl *through the hub* with that backend forced, and
compares with the float64 reference (the spec's ``reference_backend``) using the
spec's tolerances. A backend's test file can be as short as::

    import pytest
    from kernelhub import testing

    @pytest.mark.parametrize("case", testing.cases(backend="my_backend"), ids=str)
    def test_parity(case):
        testing.check_parity(case)

Error metric: non-finite entries (NaN, +-inf) must sit at the same places with the same
values; on the rest, ``max|out - ref| / max|ref|`` must not exceed the tolerance.
"""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Iterable, Sequence
from typing import Any

import torch

from kernelhub.hub import get_hub
from kernelhub.errors import NoImplementationError
from kernelhub import parity
from kernelhub.args import map_tensors, tensors_of  # noqa: F401 (kit API)
from kernelhub.parity import fresh_leaves, parity_error, to_dtype, upstream_grad  # noqa: F401 (kit API)
from kernelhub.spec import OpSpec, SampleInput

__all__ = [
    "Case", "cases", "samples", "parity_error", "reference", "run", "check_parity", "check_opcheck",
    "check_gradcheck", "check_noncontiguous", "check_bad_inputs", "noncontiguous", "to_dtype", "leaves",
    "with_grad", "fresh_leaves", "supported", "NothingChecked", "is_skip", "cuda_args", "copy_into",
    "check_no_host_sync", "check_cuda_graph_replay", "tier", "Check", "CHECK_KINDS", "suite",
]

TIERS = ("fast", "full")


def tier() -> str:
    """The test tier asked for by ``KERNELHUB_TEST_TIER``: "fast" (the default: every op x backend in float32
    and float64 on a few samples, what CI runs) or "full" (every case of the matrix)."""
    value = os.environ.get("KERNELHUB_TEST_TIER", "") or "fast"
    if value not in TIERS:
        raise ValueError(f"KERNELHUB_TEST_TIER={value!r}; allowed: {list(TIERS)}")
    return value


@dataclasses.dataclass(frozen=True)
class Case:
    """One parity case: an op, a backend, a dtype, a device and a sample size (``sample``: only the sample of
    that size with this name, e.g. one shape bucket where each costs a compile; None: every sample)."""

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
          ops: Iterable[str] | None = None) -> list[Case]:
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
                    out.append(Case(name, bname, dtype, device, size))
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


def supported(op: str, backend: str, sample_list: Iterable[SampleInput]) -> list[SampleInput]:
    """The samples the impl accepts. One it rejects (``not_supported_reasons``: a part of the parameter space it
    does not cover, or a call it is known to get wrong) must be refused by a forced call, naming the reason;
    an unforced call falls back (the selector's tests)."""
    impl = get_hub().registry.impls(op)[backend]
    out = []
    for sample in sample_list:
        reasons = impl.not_supported_reasons(sample.args)
        if not reasons:
            out.append(sample)
            continue
        try:
            run(op, backend, sample.args)
        except NoImplementationError as exc:
            assert reasons[0] in str(exc), f"{op} on {backend} [{sample.name}]: the refusal does not name {reasons}"
        else:
            raise AssertionError(f"{op} on {backend} [{sample.name}]: rejected ({reasons}) but a forced call ran")
    return out


class NothingChecked(Exception):
    """The impl rejects every sample of a check (with its reasons): nothing was compared, which is not a pass.
    Under pytest the check skips instead (pytest's own skip exception)."""


def is_skip(exc: BaseException) -> bool:
    """Whether ``exc`` is a check's "nothing to compare" (NothingChecked, or pytest's skip)."""
    if isinstance(exc, NothingChecked):
        return True
    try:
        import pytest
    except ImportError:
        return False
    return isinstance(exc, pytest.skip.Exception)


def _to_check(op: str, backend: str, every: list[SampleInput], what: str) -> list[SampleInput]:
    """`supported` samples; where the impl rejects all of them, a skip: nothing compared is not a pass."""
    checked = supported(op, backend, every)
    if every and not checked:
        msg = f"{what}: the impl rejects every sample of this size"
        try:
            import pytest
        except ImportError:
            raise NothingChecked(msg) from None
        pytest.skip(msg)
    return checked


def check_parity(case: Case, seed: int = 0) -> None:
    """Forward and backward of every sample of ``case`` within the spec's tolerance (the samples the impl
    rejects with a reason: refused when forced, see `supported`). In a dtype the spec has not measured yet
    (`OpSpec.unmeasured`), within `kernelhub.parity.call_tolerance` of each sample."""
    spec = _spec(case.op)
    for sample in _to_check(case.op, case.backend, case.samples(seed), str(case)):
        tol = spec.tolerances.get(case.dtype) or parity.call_tolerance(spec, sample.args)
        fwd, bwd = measure(case.op, case.backend, sample.args)
        assert fwd <= tol.forward, f"{case} [{sample.name}]: forward error {fwd:.3g} > {tol.forward:.3g}"
        assert bwd <= tol.backward, f"{case} [{sample.name}]: backward error {bwd:.3g} > {tol.backward:.3g}"


def check_noncontiguous(case: Case, seed: int = 0) -> None:
    """Non-contiguous inputs give the result of their contiguous copies, within the dtype's tolerance
    (forward and gradients)."""
    spec = _spec(case.op)
    for sample in _to_check(case.op, case.backend, case.samples(seed), str(case)):
        ref_out, _ = run(case.op, case.backend, sample.args)
        grad = upstream_grad(ref_out)
        want, want_g = run(case.op, case.backend, sample.args, grad)
        got, got_g = run(case.op, case.backend, noncontiguous(sample.args), grad)
        tol = parity.spec_tolerance(spec, case.dtype)
        assert parity_error(got, want) <= tol.forward, f"{case} [{sample.name}]: non-contiguous forward differs"
        for g, w in zip(got_g, want_g):
            assert parity_error(g, w) <= tol.backward, f"{case} [{sample.name}]: non-contiguous backward differs"


def check_opcheck(op: str, backend: str = "", size: str = "small", device: str = "cpu") -> None:
    """torch.library.opcheck (schema, autograd registration, fake tensor, AOT dispatch) on float64 samples."""
    overload = getattr(torch.ops.kernelhub, op).default
    for sample in samples(op, size, torch.float64, device):
        args = with_grad(op, sample.args)
        result = torch.library.opcheck(overload, (*args, backend, 0), raise_exception=False)
        bad = {k: v for k, v in result.items() if v != "SUCCESS"}
        assert not bad, f"opcheck of {op} [{sample.name}] failed: {bad}"


def check_gradcheck(op: str, backend: str, device: str = "cpu", fast_mode: bool = False,
                    sample: str | None = None) -> None:
    """torch.autograd.gradcheck in float64 on the small samples (``fast_mode``: against one random
    projection of the Jacobian instead of all of it, for slow kernels such as interpreted ones; ``sample``:
    only the small sample of that name)."""
    spec = _spec(op)
    overload = getattr(torch.ops.kernelhub, op).default
    fn = lambda *a: overload(*a, backend, 0)  # noqa: E731
    # an impl that adds with atomics gives backwards that differ in the last bits from run to run
    nondet_tol = 0.0 if get_hub().registry.impls(op)[backend].deterministic else 1e-12
    case = Case(op, backend, torch.float64, str(device), "small", sample)
    for checked in _to_check(op, backend, case.samples(), f"gradcheck of {op} on {backend}"):
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
        assert torch.autograd.gradcheck(f, tuple(inputs), eps=1e-6, atol=1e-5, rtol=1e-4, fast_mode=fast_mode,
                                        nondet_tol=nondet_tol), \
            f"gradcheck of {op} on {backend} [{checked.name}] failed"


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


# -- the suite: which checks a backend must pass ----------------------------------------------------------------
@dataclasses.dataclass(frozen=True)
class Check:
    """One conformance check of one backend's impl of one op on one device (``case``: the parity case, for the
    parity and non-contiguous checks). `suite` lists them; ``run()`` runs it (an AssertionError on a failure,
    a skip where the impl rejects every sample)."""

    kind: str  # one of CHECK_KINDS
    op: str
    backend: str
    device: str
    case: Case | None = None

    def __str__(self) -> str:
        return f"{self.kind.replace(' ', '-')}-{self.case}" if self.case else \
            f"{self.kind.replace(' ', '-')}-{self.op}-{self.backend}-{self.device}"

    @property
    def label(self) -> str:
        """What `kernelhub check` shows in its "check" column."""
        if self.kind == "parity":
            return f"parity {str(self.case.dtype).removeprefix('torch.')} {self.case.size}"
        if self.kind == "non-contiguous":
            return f"non-contiguous {str(self.case.dtype).removeprefix('torch.')}"
        return f"{self.kind} float64" if self.kind in ("opcheck", "gradcheck") else self.kind

    def run(self) -> None:
        if self.kind == "parity":
            check_parity(self.case)
        elif self.kind == "non-contiguous":
            check_noncontiguous(self.case)
        elif self.kind == "opcheck":
            check_opcheck(self.op, self.backend, "small", self.device)
        elif self.kind == "gradcheck":
            check_gradcheck(self.op, self.backend, self.device)
        elif self.kind == "bad inputs":
            check_bad_inputs(self.op, self.backend)
        elif self.kind == "no host sync":
            check_no_host_sync(self.op, self.backend)
        else:
            check_cuda_graph_replay(self.op, self.backend)


CHECK_KINDS = ("parity", "non-contiguous", "opcheck", "gradcheck", "bad inputs", "no host sync", "CUDA graph replay")


def suite(backend: str, device: str = "cpu", ops: Iterable[str] | None = None) -> list[Check]:
    """Every check ``backend`` must pass on ``device``, for each op it serves there (``ops``: only those): parity
    of every case (`cases`), non-contiguous inputs on the small ones, opcheck and gradcheck in float64 where it
    takes float64, the spec's bad inputs, and on CUDA, for every backend but the op's reference, no host
    synchronisation and CUDA-graph replay. The one definition that `kernelhub check`, kernelhub's conformance tests and a plugin's own tests run."""
    hub = get_hub()
    out = []
    for op in sorted(ops or hub.registry.specs):
        impl = hub.registry.impls(op).get(backend)
        if impl is None or (impl.devices is not None and device not in impl.devices):
            continue
        every = cases(backend, device, ops=[op])
        out += [Check("parity", op, backend, device, c) for c in every]
        out += [Check("non-contiguous", op, backend, device, c) for c in every if c.size == "small"]
        if torch.float64 in impl.dtypes:
            out += [Check("opcheck", op, backend, device), Check("gradcheck", op, backend, device)]
        out.append(Check("bad inputs", op, backend, device))
        # the CUDA promises are the kernel backends': a reference may synchronise (torch_ref's Tikhonov is an SVD)
        if device == "cuda" and backend != hub.registry.spec(op).reference_backend:
            out += [Check("no host sync", op, backend, device), Check("CUDA graph replay", op, backend, device)]
    return out


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
