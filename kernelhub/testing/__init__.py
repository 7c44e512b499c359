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

import collections
import dataclasses
import fnmatch
import os
from collections.abc import Iterable, Sequence
from typing import Any

import torch
from torch.autograd.gradcheck import GradcheckError

from kernelhub import parity
from kernelhub.args import map_tensors, tensors_of  # noqa: F401 (kit API)
from kernelhub.errors import NoImplementationError
from kernelhub.hub import get_hub
from kernelhub.parity import fresh_leaves, parity_error, to_dtype, upstream_grad  # noqa: F401 (kit API)
from kernelhub.spec import OpSpec, SampleInput

__all__ = [
    "ParityCase", "cases", "samples", "parity_error", "reference", "run", "check_parity", "check_opcheck",
    "check_gradcheck", "check_noncontiguous", "check_bad_inputs", "noncontiguous", "to_dtype", "leaves",
    "with_grad", "fresh_leaves", "supported", "reach", "Reached", "NotCovered", "MINIMUM", "is_skip", "cuda_args",
    "copy_into",
    "check_no_host_sync", "check_cuda_graph_replay", "check_weighted", "check_saved", "CheckFailed", "tier", "Check",
    "CHECK_KINDS", "suite",
]

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


def _refused(op: str, backend: str, impl, sample: SampleInput, confirm: bool = True) -> list[str]:
    """The impl's reasons to decline ``sample`` ([] where it accepts it); with ``confirm``, a declined call forced on
    the backend must be refused, naming the first reason (an unforced call falls back: the selector's tests)."""
    reasons = impl.not_supported_reasons(sample.args)
    if reasons and confirm:
        try:
            run(op, backend, sample.args)
        except NoImplementationError as exc:
            assert reasons[0] in str(exc), f"{op} on {backend} [{sample.name}]: the refusal does not name {reasons}"
        else:
            raise AssertionError(f"{op} on {backend} [{sample.name}]: rejected ({reasons}) but a forced call ran")
    return reasons


def supported(op: str, backend: str, sample_list: Iterable[SampleInput]) -> list[SampleInput]:
    """The samples the impl accepts (``not_supported_reasons``: a part of the parameter space it does not cover, or
    a call it is known to get wrong); each one it declines is checked to be refused when forced, naming the
    reason."""
    impl = get_hub().registry.impls(op)[backend]
    return [sample for sample in sample_list if not _refused(op, backend, impl, sample)]


CONFIRM = 8  # declined calls per check that are forced, to see the refusal name its reason
MINIMUM = 1  # accepted calls a check needs of each tag its size requires (`SampleSpace.required`), and in all


@dataclasses.dataclass
class Reached:
    """The calls a check reached: ``samples`` the impl accepted (the check runs each; ``run`` counts those it ran),
    ``declined`` how many it declined (``reasons``: how often each first reason), ``drawn`` how many of all came
    from the op's `SampleSpace` beyond its samples, and ``tags``: for each tag the check requires, how many
    accepted calls carry it; ``not_in``: for an impl of an older contract version (`kernelhub.spec.Change`), the
    tags only later versions' calls carry, required of none of its checks ("not in v1: group_broadcasting")."""

    samples: list[SampleInput]
    declined: int = 0
    drawn: int = 0
    run: int = 0
    tags: dict[str, int] = dataclasses.field(default_factory=dict)
    reasons: collections.Counter = dataclasses.field(default_factory=collections.Counter)
    not_in: str = ""

    def missing(self, allow: Iterable[str] = ()) -> list[str]:
        """The required tags below `MINIMUM` (``allow``: fnmatch patterns of tags a partial impl may leave out)
        and, where the impl accepted no call at all, "any call"."""
        allow = list(allow)
        short = [t for t, n in self.tags.items() if n < MINIMUM] + ([] if self.samples else ["any call"])
        return [t for t in short if not any(fnmatch.fnmatchcase(t, p) for p in allow)]

    @property
    def counts(self) -> str:
        text = f"{len(self.samples)} accepted, {self.declined} declined, {self.run} run"
        return text + (f" ({self.drawn} drawn from the op's sample space)" if self.drawn else "")

    def declines(self) -> str:
        """The impl's reasons to decline, most frequent first, with how often each ("" where it declined none)."""
        why = "; ".join(f"{n}x {r!r}" for r, n in self.reasons.most_common())
        return f"declined for {why}" if why else ""

    def summary(self) -> str:
        """The counts, why the impl declined, and what is not in its contract version."""
        return "; ".join(filter(None, (self.counts, self.declines(), self.not_in)))


class NotCovered(AssertionError):
    """A check reached fewer accepted calls of a required tag than `MINIMUM` (or none at all): what was not
    compared is not a pass. ``reached`` says what was."""

    def __init__(self, message: str, reached: Reached) -> None:
        super().__init__(message)
        self.reached = reached


def reach(op: str, backend: str, size: str, dtype: torch.dtype, device: str = "cpu", seed: int = 0,
          sample: str | None = None) -> Reached:
    """The calls a check of ``op`` on ``backend`` runs: the spec's samples of ``size`` the impl accepts, then,
    for each tag the op's `SampleSpace` requires of that size and the accepted ones lack, calls drawn from the space
    until `MINIMUM` carry it or `SampleSpace.DRAWS` were declined. ``sample`` names the one sample to run (no
    drawing, no tag required); ``backend`` "" (the hub selects) declines nothing."""
    spec = _spec(op)
    impl = get_hub().registry.impls(op)[backend] if backend else None
    out = Reached([])

    def offer(candidate: SampleInput) -> bool:
        # the first declines are forced too, to see them refused; the rest (hundreds where a partial impl declines
        # most of a space) only asked
        reasons = _refused(op, backend, impl, candidate, out.declined < CONFIRM) if impl is not None else []
        if reasons:
            out.declined += 1
            out.reasons[reasons[0]] += 1
            return False
        out.samples.append(candidate)
        for tag in space.tags(candidate.args) & out.tags.keys() if space else ():
            out.tags[tag] += 1
        return True

    space = spec.space if sample is None else None
    later = {t: c.version for c in spec.changes
             if impl is not None and impl.version is not None and c.version > impl.version for t in c.tags}
    required = space.required.get(size, ()) if space else ()
    out.tags = {t: 0 for t in required if t not in later}
    if impl is not None and any(t in later for t in required):
        out.not_in = f"not in v{impl.version}: " + ", ".join(f"{t} (v{later[t]})" for t in required if t in later)
    for candidate in ParityCase(op, backend, dtype, str(device), size, sample).samples(seed):
        offer(candidate)
    if space is not None:
        gen = torch.Generator(device=device).manual_seed(seed + 1)
        for tag in list(out.tags):
            for i in range(space.DRAWS):
                if out.tags[tag] >= MINIMUM:
                    break
                out.drawn += 1
                offer(space.draw(size, tag, i, dtype, torch.device(device), gen))
    return out


def _covered(reached: Reached, what: str, allow: Iterable[str]) -> Reached:
    """``reached``, after its samples ran; a `NotCovered` where a required tag (not allowed) was not reached."""
    missing = reached.missing(allow)
    if missing:
        raise NotCovered(f"{what}: not covered: {', '.join(missing)} (minimum {MINIMUM} accepted call each; "
                         f"{reached.summary()})", reached)
    return reached


def is_skip(exc: BaseException) -> bool:
    """Whether ``exc`` is pytest's skip (a check that does not apply here)."""
    try:
        import pytest
    except ImportError:
        return False
    return isinstance(exc, pytest.skip.Exception)


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


# -- the suite: which checks a backend must pass ----------------------------------------------------------------
@dataclasses.dataclass(frozen=True)
class Check:
    """One conformance check of one backend's impl of one op on one device (``case``: the parity case, for the
    parity and non-contiguous checks; ``fast_mode``: a gradcheck against one random projection of the Jacobian,
    `check_gradcheck`). `suite` lists them; ``run()`` runs it."""

    kind: str  # one of CHECK_KINDS
    op: str
    backend: str
    device: str
    case: ParityCase | None = None
    fast_mode: bool = False

    def __str__(self) -> str:
        return f"{self.kind.replace(' ', '-')}-{self.case}" if self.case else \
            f"{self.kind.replace(' ', '-')}-{self.op}-{self.backend}-{self.device}"

    @property
    def label(self) -> str:
        """What `kernelhub check` shows in its "check" column."""
        if self.case is not None and self.kind == "parity":
            return f"parity {str(self.case.dtype).removeprefix('torch.')} {self.case.size}"
        if self.case is not None and self.kind == "non-contiguous":
            return f"non-contiguous {str(self.case.dtype).removeprefix('torch.')}"
        return f"{self.kind} float64" if self.kind in ("opcheck", "gradcheck") else self.kind

    def run(self, allow: Iterable[str] = ()) -> Reached | None:
        """Run the check: an AssertionError on a failure, `NotCovered` where a tag its size requires (and
        ``allow``'s fnmatch patterns do not name) was reached by no call the impl accepts; returns what it
        reached (None for the checks that run one fixed call: bad inputs and the CUDA ones)."""
        if self.kind in ("parity", "non-contiguous"):
            assert self.case is not None, f"a {self.kind} check without its case"
            check = check_parity if self.kind == "parity" else check_noncontiguous
            return check(self.case, allow=allow)
        if self.kind == "opcheck":
            return check_opcheck(self.op, self.backend, "small", self.device, allow=allow)
        if self.kind == "gradcheck":
            return check_gradcheck(self.op, self.backend, self.device, fast_mode=self.fast_mode, allow=allow)
        if self.kind == "bad inputs":
            check_bad_inputs(self.op, self.backend)
        elif self.kind == "weighted":
            check_weighted(self.op, self.backend, self.device)
        elif self.kind == "saved":
            check_saved(self.op, self.backend, self.device)
        elif self.kind == "no host sync":
            check_no_host_sync(self.op, self.backend)
        else:
            check_cuda_graph_replay(self.op, self.backend)
        return None


CHECK_KINDS = ("parity", "non-contiguous", "opcheck", "gradcheck", "bad inputs", "weighted", "saved",
               "no host sync", "CUDA graph replay")
# the check of each capability (`kernelhub.spec.CAPABILITIES`) that has one: an impl declaring it gets it
CAPABILITY_CHECKS = {"weighted": "weighted", "saves": "saved"}


def suite(backend: str, device: str = "cpu", ops: Iterable[str] | None = None) -> list[Check]:
    """Every check ``backend`` must pass on ``device``, for each op it serves there (``ops``: only those): parity
    of every case (`cases`), non-contiguous inputs on the small ones, opcheck and gradcheck in float64 where it
    takes float64, the spec's bad inputs, its fused weights where it declares them (`check_weighted`), and on
    CUDA, for every backend but the op's reference, no host synchronisation and CUDA-graph replay. The one
    definition that `kernelhub check`, kernelhub's conformance tests and a plugin's own tests run."""
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
        out += [Check(CAPABILITY_CHECKS[c], op, backend, device) for c in sorted(impl.can) if c in CAPABILITY_CHECKS]
        # the CUDA promises are the kernel backends': a reference may synchronise (torch_ref's Tikhonov is an SVD)
        if device == "cuda" and backend != hub.registry.spec(op).reference_backend:
            out += [Check("no host sync", op, backend, device), Check("CUDA graph replay", op, backend, device)]
    return out


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


def __getattr__(name: str) -> Any:
    if name == "Case":  # the name of ParityCase before 2026-11-29
        import warnings

        warnings.warn("kernelhub.testing.Case is now kernelhub.testing.ParityCase (kernelhub.Case is an op's kind of "
                      "call)", DeprecationWarning, stacklevel=2)
        return ParityCase
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
