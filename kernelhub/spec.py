"""The declarations: what an op is (`OpSpec`), who implements it (`Impl`) and who ships it (`Backend`).

Specs live in `kernelhub/ops/`; backends construct `Impl`s and hand them to the
registry from their `kernelhub_register_impls` hook. This module is what a backend author imports; the
autograd glue that takes a call apart lives in `kernelhub._glue`. Everything here is a frozen
dataclass checked in `__post_init__`, so a malformed declaration fails where it is
written, not at the first call.
"""

from __future__ import annotations

import dataclasses
import functools
import importlib
import re
from collections.abc import Callable, Sequence
from typing import Any

import torch

from kernelhub.args import first_tensor

__all__ = ["Arg", "Tolerance", "SampleInput", "SampleSpace", "Case", "Change", "Work", "OpSpec", "Backend",
           "Impl", "ARG_KINDS", "Capability", "CAPABILITIES", "lazy", "layout_cache"]

# Argument kinds and their torch.library schema types. "tensors" is a list of tensors.
ARG_KINDS = {
    "tensor": "Tensor",
    "tensors": "Tensor[]",
    "float": "float",
    "int": "int",
    "ints": "int[]",
    "str": "str",
    "bool": "bool",
}


@dataclasses.dataclass(frozen=True)
class Arg:
    """One argument of an op, in its canonical (already normalised) form."""

    name: str
    kind: str
    differentiable: bool = False
    doc: str = ""

    def __post_init__(self) -> None:
        if self.kind not in ARG_KINDS:
            raise ValueError(f"Arg {self.name!r}: kind must be one of {sorted(ARG_KINDS)}, got {self.kind!r}")
        if self.differentiable and self.kind not in ("tensor", "tensors"):
            raise ValueError(f"Arg {self.name!r}: only tensor arguments can be differentiable")

    @property
    def is_tensor(self) -> bool:
        return self.kind in ("tensor", "tensors")


@dataclasses.dataclass(frozen=True)
class Tolerance:
    """Parity tolerance: max|out - ref| <= tol * max|ref| (non-finite entries must match exactly)."""

    forward: float
    backward: float


@dataclasses.dataclass(frozen=True)
class SampleInput:
    """Canonical arguments for one call, with a name for test ids."""

    name: str
    args: tuple


@dataclasses.dataclass(frozen=True)
class SampleSpace:
    """Where the conformance kit finds calls an impl accepts (`kernelhub.testing.reach`).

    ``tags(args)`` names the parts of the op's parameter space a canonical call exercises ("semifield=log",
    "stride>1", "ties=tropical_max/corr", ...). ``required[size]`` lists the tags a check of that sample size must
    reach, each in at least one call the impl accepts. ``draw(size, tag, i, dtype, device, generator)`` returns the
    ``i``-th of a sequence of random calls carrying ``tag``, whose other parameters (dims, groups, stride,
    dilation, padding, kind, ...) walk the op's space, so that a partial impl meets the calls it accepts within
    ``DRAWS`` of them."""

    tags: Callable[[tuple], frozenset[str]]
    required: dict[str, tuple[str, ...]]
    draw: Callable[[str, str, int, torch.dtype, torch.device, torch.Generator], SampleInput]

    DRAWS = 200


@dataclasses.dataclass(frozen=True)
class Case:
    """A named class of an op's calls, for the configuration to give its own priority (``[ops.<op>.cases.<name>]
    priority``, docs/backends.md): where backends trade places within one op (a kernel that wins on one kind of
    call and loses on the others), a per-op priority cannot say so. ``applies(*canonical)`` says whether a
    canonical call belongs to the case; it is asked once per call layout (decisions are cached), only for ops
    whose configuration names a case."""

    name: str
    doc: str
    applies: Callable[..., bool]

    def __post_init__(self) -> None:
        if not self.name.isidentifier():
            raise ValueError(f"Case name must be an identifier, got {self.name!r}")


@dataclasses.dataclass(frozen=True)
class Change:
    """One change of an op's contract (docs/backend-guide.md, "When an op's contract changes"): version
    ``version`` appended the arguments ``added`` (name, default: what a call that does not use them passes) and,
    where given, took the ``dtypes``. A call whose added arguments are at their defaults is a call of the version
    before; an impl written for that version serves it with the arguments it knows (`OpSpec.arity`), and
    declines the rest (`OpSpec.beyond`). ``tags``: the `SampleSpace` tags only calls using the change carry,
    which `kernelhub check` reports as "not in vN" for an impl of an older version."""

    version: int
    added: tuple[tuple[str, Any], ...]
    doc: str
    dtypes: tuple[torch.dtype, ...] = ()
    tags: tuple[str, ...] = ()


@dataclasses.dataclass(frozen=True)
class Work:
    """The least one pass of an op must do, by the resource it uses (`kernelhub.bench.floor` divides each by the
    rate measured on the device and takes the largest: the resource that binds):

    - ``dram_bytes``: bytes to and from device memory: each input read and each output and gradient written once,
      the upstream gradient read, and what a backward must read again;
    - ``gather_bytes``: bytes read by data-dependent gathers from a table that stays in cache (K-Planes' texel taps
      from planes that fit in L2), each tap's every channel;
    - ``atomics``: scatter-adds to addresses that collide across threads (K-Planes' planes gradient: one per tap
      and channel);
    - ``flops``: float arithmetic, one per add or multiply (a multiply-add two);
    - ``minmax``: float maxima and minima, each with the add that comes with it in a max-plus tap (the tropical
      semifields' sum; a max or min runs at a lower rate than an add on a GPU);
    - ``special``: exponentials and logarithms (the log and root semifields; a GPU's special-function unit).

    The last three are approximate counts: where one binds, it says how far from that unit's rate a kernel is.
    """

    dram_bytes: int
    gather_bytes: int = 0
    atomics: int = 0
    flops: int = 0
    minmax: int = 0
    special: int = 0


@dataclasses.dataclass(frozen=True)
class OpSpec:
    """The contract of one op. Backends implement it; the selector and testing kit read it.

    ``normalize(*args, **kwargs)`` validates user arguments and returns the canonical
    argument tuple matching ``args`` (raising ValueError/TypeError that name the op and
    argument). ``output(*canonical)`` returns an empty tensor of the output's shape,
    dtype and device; it also serves as the fake implementation for torch.compile.
    ``samples(size, dtype, device, generator)`` returns `SampleInput`s for size in
    ``SAMPLE_SIZES``. ``bad_inputs()`` yields ``(args, kwargs, exception type, text
    the message must contain)`` for the conformance kit. ``tolerances`` maps dtype to
    `Tolerance`, measured as documented in kernelhub/testing/tolerances.py; a dtype left out is
    `unmeasured`. ``space``, where given, is the op's `SampleSpace`: the kit draws calls from it until a partial
    impl's checks have reached each tag it requires; without one, the kit's calls are the samples. ``cases``:
    the `Case`s the configuration may give their own priority. ``changes``: the contract's `Change`s after its
    first version, in order (version 2, 3, ...); the op's current version is `version`. ``work(args, out,
    grads_of)``: the `Work` of the forward (``grads_of`` None) or of forward + backward into the arguments at
    ``grads_of``, what `kernelhub bench` measures each backend against (`kernelhub.bench.least_work`; without it,
    `kernelhub.bench.plain_work`). ``size(args)``: the number a canonical call is placed in the configuration's
    size ranges by (``min_elements``, kernelhub/kernelhub.toml); without it, the call's first tensor's elements.
    """

    name: str
    args: tuple[Arg, ...]
    doc: str
    dtypes: tuple[torch.dtype, ...]
    tolerances: dict[torch.dtype, Tolerance]
    normalize: Callable[..., tuple]
    output: Callable[..., torch.Tensor]
    samples: Callable[[str, torch.dtype, torch.device, torch.Generator], list[SampleInput]]
    bad_inputs: Callable[[], list[tuple[tuple, dict, type[Exception], str]]]
    reference_backend: str = "torch_ref"
    space: SampleSpace | None = None
    cases: tuple[Case, ...] = ()
    changes: tuple[Change, ...] = ()
    work: Callable[[Sequence[Any], torch.Tensor, Sequence[int] | None], Work] | None = None
    size: Callable[[Sequence[Any]], int] | None = None

    SAMPLE_SIZES = ("small", "medium", "edge", "benchmark")

    def __post_init__(self) -> None:
        if not self.name.isidentifier():
            raise ValueError(f"OpSpec name must be an identifier, got {self.name!r}")
        names = [a.name for a in self.args]
        if len(set(names)) != len(names) or "backend" in names:
            raise ValueError(f"OpSpec {self.name!r}: argument names must be unique and not 'backend'")
        extra = [d for d in self.tolerances if d not in self.dtypes]
        if extra:
            raise ValueError(f"OpSpec {self.name!r}: tolerances for dtypes it does not take: {extra}")
        if not any(a.differentiable for a in self.args):
            raise ValueError(f"OpSpec {self.name!r}: at least one argument must be differentiable")
        cases = [c.name for c in self.cases]
        if len(set(cases)) != len(cases):
            raise ValueError(f"OpSpec {self.name!r}: case names must be unique, got {cases}")
        added = [name for c in self.changes for name, _ in c.added]
        if [c.version for c in self.changes] != list(range(2, 2 + len(self.changes))) or \
                added != names[len(names) - len(added):] or \
                any(a.is_tensor for a in self.args[len(names) - len(added):]) or \
                any(d not in self.dtypes for c in self.changes for d in c.dtypes):
            raise ValueError(f"OpSpec {self.name!r}: changes must be versions 2, 3, ... in order, each appending "
                             "non-tensor arguments (the spec's last ones, in order) and taking dtypes of the spec")

    @property
    def version(self) -> int:
        """The contract's current version: 1, plus one per `Change`."""
        return 1 + len(self.changes)

    def arity(self, version: int) -> int:
        """How many arguments a call of contract ``version`` has (an impl of that version takes them)."""
        return len(self.args) - sum(len(c.added) for c in self.changes if c.version > version)

    def dtypes_at(self, version: int) -> tuple[torch.dtype, ...]:
        """The dtypes contract ``version`` takes."""
        later = {d for c in self.changes if c.version > version for d in c.dtypes}
        return tuple(d for d in self.dtypes if d not in later)

    def beyond(self, version: int, args: Sequence[Any]) -> list[str]:
        """Why a canonical call is not a call of contract ``version`` (an impl of it cannot serve the call): each
        argument a later version added that is not at its default, naming the version it needs; [] where none."""
        reasons = []
        for change in self.changes:
            if change.version > version:
                for name, default in change.added:
                    value = args[next(i for i, a in enumerate(self.args) if a.name == name)]
                    if type(value) is not type(default) or value != default:
                        reasons.append(f"implements {self.name} v{version}; {name}={value!r} needs "
                                       f"v{change.version}")
        return reasons

    def size_of(self, args: Sequence[Any]) -> int:
        """What the configuration's size ranges compare for a canonical call: ``size(args)``, else its first
        tensor's elements (docs/ops.md, "Size ranges"). Under torch.compile's symbolic shapes both are symbolic
        integers, compared as such (no int() that would specialize them)."""
        return self.size(args) if self.size is not None else first_tensor(args).numel()

    def case_of(self, args: Sequence[Any]) -> str:
        """The name of the first of ``cases`` that a canonical call belongs to, or ''."""
        return next((c.name for c in self.cases if c.applies(*args)), "")

    def canonical(self, *args: Any, **kwargs: Any) -> tuple:
        """``normalize(*args, **kwargs)``, where a call that does not fit the signature (an unknown keyword, a
        missing or extra argument) raises TypeError naming the op and its arguments."""
        try:
            return self.normalize(*args, **kwargs)
        except TypeError as exc:
            message = str(exc)
            if message.startswith(self.name):  # the spec's own check, which names the op and the argument
                raise
            message = re.sub(r"^[\w.<>]+\(\) ", "", message)  # "normalize() got ..." -> "got ..."
            raise TypeError(f"{self.name}: {message}; its arguments: "
                            f"({', '.join(a.name for a in self.args)})") from None

    @property
    def unmeasured(self) -> tuple[torch.dtype, ...]:
        """The dtypes with no measured tolerance yet: the op loads and runs, parity in them is judged per call
        (`kernelhub.parity.call_tolerance` over the floor tolerance), and the tolerance test fails until they are
        measured (``python -m kernelhub.testing.tolerances``)."""
        return tuple(d for d in self.dtypes if d not in self.tolerances)

    @property
    def default_dtype(self) -> torch.dtype:
        """The dtype `kernelhub tune` and `kernelhub bench` use unless told: float32 where the op takes it,
        else complex64, else its first dtype."""
        return next(d for d in (torch.float32, torch.complex64, *self.dtypes) if d in self.dtypes)

    @functools.cached_property
    def tensor_args(self) -> tuple[int, ...]:
        """Positions of the tensor arguments ("tensor" and "tensors"; computed once: every call reads it)."""
        return tuple(i for i, a in enumerate(self.args) if a.is_tensor)

    @functools.cached_property
    def differentiable(self) -> tuple[int, ...]:
        """Positions of the differentiable arguments (computed once: every call's backward reads it)."""
        return tuple(i for i, a in enumerate(self.args) if a.differentiable)

    def schema(self) -> str:
        """The torch.library schema of the forward operator; ``backend`` '' means 'select', ``hub`` 0 the global
        hub (`kernelhub.get_hub`), another number a `kernelhub.Hub` built directly (its `Hub.key`)."""
        params = ", ".join(f"{ARG_KINDS[a.kind]} {a.name}" for a in self.args)
        return f"({params}, str backend, int hub) -> Tensor"

    def backward_schema(self) -> str:
        params = ", ".join(f"{ARG_KINDS[a.kind]} {a.name}" for a in self.args)
        return f"(Tensor grad, {params}, bool[] needs, str backend, int hub) -> Tensor[]"


@dataclasses.dataclass(frozen=True)
class Backend:
    """A backend distribution: a name, a version, and a lazy availability check.

    ``unavailable_reason()`` returns None when the backend can run here, or a short
    reason ("triton is not installed", "nvcc failed: ..."). It is called at most once
    per process and must not raise; if it does, the exception text becomes the reason.
    """

    name: str
    version: str
    description: str = ""
    unavailable_reason: Callable[[], str | None] = lambda: None

    def __post_init__(self) -> None:
        if not self.name.isidentifier():
            raise ValueError(f"Backend name must be an identifier, got {self.name!r}")


def _any_reasons(args: Sequence[Any]) -> list[str]:
    return []


@dataclasses.dataclass(frozen=True)
class Capability:
    """Something an impl may declare it does (`Impl.can`): its name, what declaring it promises (one line), and the
    keyword arguments the hub then passes the impl's functions, which the registry checks their signatures take.
    The hub, the test kit (`kernelhub.testing.suite`) and the registry read capabilities from `CAPABILITIES`
    only: a new one is an entry there plus the code that honours it (docs/backend-guide.md)."""

    name: str
    promise: str
    forward_kwargs: tuple[str, ...] = ()
    backward_kwargs: tuple[str, ...] = ()


CAPABILITIES: dict[str, Capability] = {c.name: c for c in (
    Capability("weighted", "forward(*args, weights=w) returns the 0-d (op(*args) * w).sum() of a weighted handle "
               "(w: the output's shape, dtype, device; no grad); backward(grad, *args, needs=..., weights=w) the "
               "gradients for the upstream gradient conj(w) * grad", ("weights",), ("weights",)),
    Capability("saves", "forward(*args, saving=True) returns (output, saved) where a backward follows; "
               "backward(grad, *args, needs=..., saved=saved) then reads saved (None, or a tensor of its own) "
               "instead of recomputing it", ("saving",), ("saved",)),
    Capability("traceable", "forward and backward call torch operators and torch.library.wrap_triton launches only "
               "(no data pointers, no tensor values read on the host, nothing kept between calls): torch.compile "
               "may trace them into its graph, on functional tensors, without weights or saving"),
)}


@dataclasses.dataclass(frozen=True)
class Impl:
    """One backend's implementation of one op (docs/backend-guide.md). The fields, one line each:

    - ``op``, ``backend``: the op's and the backend's names.
    - ``forward(*canonical_args)``: the output.
    - ``backward(grad, *canonical_args, needs=...)``: one entry per differentiable argument, in order (a tensor, a
      list of tensors for a "tensors" argument, or None where ``needs`` is False).
    - ``dtypes``: the dtypes it serves.
    - ``devices``: the device types it serves ("cpu", "cuda"); None: every one.
    - ``not_supported_reasons(args)``: why it cannot serve the call, or []; it may read each tensor's shape,
      strides, dtype and device and the non-float non-tensor arguments only (decisions are cached by those:
      `kernelhub.select.call_key`).
    - ``deterministic``: False where results may vary run to run (atomics), or the device types where they do not.
    - ``forced_only``: why it serves only calls that force its backend, never picked by selection ('' if not).
    - ``tuned_only``: why priority alone never picks it: it serves the buckets it won in tuning, forced or pinned.
    - ``can``: the capabilities it declares, names of `CAPABILITIES` (each with what declaring it promises).
    - ``version``: the op contract version (`OpSpec.version`, `Change`) its functions take; None: the version
      whose argument count ``forward``'s positional parameters match, or the current one (resolved by the
      registry when the impl is added).

    ``weighted=True``, ``saves=True`` and ``traceable=True`` are accepted as the older spelling of ``can``.
    """

    op: str
    backend: str
    forward: Callable[..., torch.Tensor]
    backward: Callable[..., Sequence[Any]]
    dtypes: tuple[torch.dtype, ...]
    devices: tuple[str, ...] | None = None
    not_supported_reasons: Callable[[Sequence[Any]], list[str]] = _any_reasons
    deterministic: bool | tuple[str, ...] = True
    forced_only: str = ""
    tuned_only: str = ""
    can: frozenset[str] = frozenset()
    version: int | None = None
    weighted: dataclasses.InitVar[bool] = False
    saves: dataclasses.InitVar[bool] = False
    traceable: dataclasses.InitVar[bool] = False

    def __post_init__(self, weighted: bool, saves: bool, traceable: bool) -> None:
        can = frozenset(self.can) | {name for name, on in (("weighted", weighted), ("saves", saves),
                                                            ("traceable", traceable)) if on}
        unknown = sorted(can - CAPABILITIES.keys())
        if unknown:
            raise ValueError(f"Impl {self.op!r} of {self.backend!r}: unknown capabilities {unknown} "
                             f"(known: {sorted(CAPABILITIES)})")
        object.__setattr__(self, "can", can)

    def deterministic_on(self, device_type: str) -> bool:
        """Whether results repeat run to run on ``device_type`` (`deterministic`)."""
        d = self.deterministic
        return d if isinstance(d, bool) else device_type in d

    def static_reasons(self, device_type: str, dtype: torch.dtype) -> list[str]:
        """Reasons that follow from the declared devices and dtypes alone."""
        reasons = []
        if self.devices is not None and device_type not in self.devices:
            reasons.append(f"device {device_type!r} not in {list(self.devices)}")
        if dtype not in self.dtypes:
            reasons.append(f"dtype {dtype} not in {[str(d) for d in self.dtypes]}")
        return reasons


def lazy(module: str, name: str) -> Callable:
    """``module.name``, imported at the first call: a backend registers its impls without importing its
    kernels (or their dependencies, such as triton) until one is used."""
    target: list[Callable] = []

    def call(*args, **kwargs):
        if not target:
            target.append(getattr(importlib.import_module(module), name))
        return target[0](*args, **kwargs)

    call.__name__ = call.__qualname__ = f"{module}.{name}"
    return call


def layout_cache(maxsize: int | None = 1024) -> Callable[[Callable], Callable]:
    """``functools.lru_cache(maxsize)`` for a launcher's host-side plan of a call (layouts, grids, device
    properties): the one name the backends use for it, with lru_cache's ``cache_clear``."""
    return functools.lru_cache(maxsize=maxsize)


# the older spellings read as views of `can` (the InitVars' defaults stay in __init__'s signature; as class
# attributes they would read False whatever `can` holds, and dataclasses.replace passes what they read on)
def _can(name: str) -> property:
    return property(lambda self: name in self.can)


for _name in ("weighted", "saves", "traceable"):
    setattr(Impl, _name, _can(_name))
del _name
