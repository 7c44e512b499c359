"""One torch.library operator per op, with selection inside it at run time.

For each spec two operators are defined:

- ``kernelhub::<op>(<args>, str backend, int hub) -> Tensor``: the forward. ``backend`` is ''
  to let the selector choose, or the backend forced by ``kernelhub.op(op, backend=...)``; ``hub`` the hub that
  runs it (0: the global one, else a `kernelhub.Hub` built directly: `Hub.key`).
- ``kernelhub::<op>_backward(Tensor grad, <args>, bool[] needs, str backend, int hub) -> Tensor[]``:
  one gradient per differentiable argument (a "tensors" argument contributes one per
  element); an argument whose ``needs`` is False gets an empty placeholder.

The forward's autograd formula calls the backward operator, which selects again with
the same key and so reaches the backend that ran the forward. Both have fake
implementations from the spec, so ``torch.compile(fullgraph=True)`` sees two opaque
nodes and never breaks the graph.

The eager fast path: where nothing traces (no dynamo, no functorch transform, no dispatch mode
such as fake tensors, only plain tensors off the meta device), `OpHandle` skips the
operators and runs the same hub calls (`Hub.forward` / `Hub.backward_grads`: the same
cached decision, fallback, output checks, kill switch, pins, tuned winners) through one
`torch.autograd.Function`, whose backward reuses the forward's decision. The Python custom-op dispatch (schema binding, the autograd
kernel, the operator's redispatch) costs more than such a Function: a 1x16^3 TV forward +
backward on cuda_ext took 304-332 us through the operators, 213-258 us on the fast path and
184 us in a minimal Function on the 2-core CPU (docs/lab/benchmarks-history.md, "Per-call host cost").
What is left per call is the argument checks,
the decision-cache key (a tuple of each tensor's device, dtype, shape and strides), one
dict lookup (in the forward only) and the Function's own bookkeeping; where no input requires grad (or grad mode is off), not
even the Function: the hub's forward is called directly. ``KERNELHUB_EAGER_FAST_PATH=0`` (read at
import) always takes the operators.

Under ``torch.compile``, where the hub would serve a traced call (of sizes known at compile time) with an
impl that has ``Impl.inline`` (the inductor backend: a tuned winner, a pin or a force), `OpHandle` puts that
function's torch ops into the graph instead of the operator (`_inline_choice`), so inductor fuses them with
the step's other ops instead of calling a separately compiled graph through an opaque node.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Sequence
from typing import Any

import torch
import torch.autograd.forward_ad as _fwad

from kernelhub.args import tensors_of
from kernelhub.spec import OpSpec

__all__ = ["define_ops", "OpHandle", "NAMESPACE", "traced", "EAGER_FAST_PATH", "refuse_unsupported_autodiff"]

NAMESPACE = "kernelhub"
_DEFINED: dict[str, tuple[Any, Any]] = {}
EAGER_FAST_PATH = os.environ.get("KERNELHUB_EAGER_FAST_PATH", "1") != "0"
_PLAIN = (torch.Tensor, torch.nn.Parameter)
_functorch_active = getattr(torch._C, "_are_functorch_transforms_active",
                            lambda: torch._C._functorch.peek_interpreter_stack() is not None)


def traced(args: Sequence[Any]) -> bool:
    """Whether a call must go through the torch.library operators: dynamo is tracing, a functorch transform
    (vmap, grad, jvp) or a dispatch mode (fake tensors, make_fx, FlopCounterMode) is active, or an argument is
    a tensor subclass or on the meta device. Otherwise the eager fast path serves it."""
    if torch.compiler.is_compiling() or _functorch_active() or torch._C._len_torch_dispatch_stack():
        return True
    for a in args:
        for t in (a if isinstance(a, list) else (a,)):
            if isinstance(t, torch.Tensor) and (type(t) not in _PLAIN or t.is_meta):
                return True
    return False


def refuse_unsupported_autodiff(op: str, args: Sequence[Any]) -> None:
    """Raise NotImplementedError, naming the op, for forward-mode AD (dual tensors of torch.autograd.forward_ad,
    torch.func.jvp / jacfwd / hessian) and torch.func's reverse-mode transforms (grad, vjp, jacrev): the ops have
    no JVP rule, and those transforms cannot run the hub's autograd glue (they gave zeros or torch's own
    message). vmap works; reverse mode through torch.autograd is what the ops support."""
    if _fwad._current_level >= 0 and any(_fwad.unpack_dual(t).tangent is not None for a in args
                                         for t in (a if isinstance(a, list) else (a,)) if isinstance(t, torch.Tensor)):
        raise NotImplementedError(f"kernelhub.{op}: forward-mode AD is not supported (no JVP rule); differentiate "
                                  "in reverse mode (loss.backward(), torch.autograd.grad)")
    if _functorch_active():
        from torch._C._functorch import TransformType
        from torch._functorch.pyfunctorch import retrieve_all_functorch_interpreters

        for interpreter in retrieve_all_functorch_interpreters():
            if interpreter.key() in (TransformType.Grad, TransformType.Jvp):
                raise NotImplementedError(
                    f"kernelhub.{op}: torch.func's grad, vjp, jacrev, jvp, jacfwd and hessian are not supported "
                    "(no JVP rule, and the op's backward runs outside those transforms); differentiate with "
                    "torch.autograd (loss.backward(), torch.autograd.grad); torch.func.vmap works")


def _placeholders(spec: OpSpec, args: Sequence[Any], needs: Sequence[bool]) -> list[torch.Tensor]:
    """Fake gradients: the shape of each needed differentiable input, else an empty tensor."""
    out = []
    for i, need in zip(spec.differentiable, needs):
        for t in tensors_of(args[i]):
            out.append(torch.empty_like(t, memory_format=torch.contiguous_format) if need else t.new_empty((0,)))
    return out


def flatten_grads(spec: OpSpec, args: Sequence[Any], needs: Sequence[bool], grads: Sequence[Any]) -> list[torch.Tensor]:
    """An impl's per-argument gradients -> the backward operator's flat Tensor[] output."""
    flat = []
    for i, need, g in zip(spec.differentiable, needs, grads):
        ts = tensors_of(args[i])
        gs = (tensors_of(g) or ()) if need else ts
        flat += [x.contiguous() if need else t.new_empty((0,)) for x, t in zip(gs, ts)]
    return flat


def _split(args: Sequence[Any], tensor_pos: Sequence[int]) -> tuple[list[torch.Tensor], tuple, list[Any]]:
    """What autograd saves of a call: every tensor of the tensor arguments in order (a "tensors" argument's
    elements one by one), each tensor argument's (position, count, is a list), and the other arguments (None
    at the tensor positions); `_join` puts them back together."""
    flat, layout, others = [], [], list(args)
    for i in tensor_pos:
        group = tensors_of(args[i])
        is_list = not isinstance(args[i], torch.Tensor)
        layout.append((i, len(group), is_list))
        flat += group
        others[i] = None
    return flat, tuple(layout), others


def _join(others: Sequence[Any], layout: tuple, flat: Sequence[torch.Tensor]) -> tuple[list[Any], dict]:
    """The arguments `_split` took apart, and each tensor argument's range in ``flat``."""
    args, spans, pos = list(others), {}, 0
    for i, count, is_list in layout:
        args[i] = list(flat[pos:pos + count]) if is_list else flat[pos]
        spans[i] = range(pos, pos + count)
        pos += count
    return args, spans


def _describe(args: Sequence[Any]) -> tuple | None:
    """A call's arguments as constants (a tensor's dtype, device, shape and strides), which dynamo can hand to
    `_inline_choice`; None where a size is symbolic. Traced by dynamo, so plain Python only."""
    # dynamo shows a symbolic size as an int to isinstance and type; this asks it (torch >= 2.6; dynamo has
    # imported the module, which costs an eager import 0.4 s)
    static = getattr(torch.fx.experimental.symbolic_shapes, "has_static_value", None)
    out = []
    for a in args:
        ts = tensors_of(a)
        if ts is None:
            out.append(a)
            continue
        if static is None or not all(static(d) for t in ts for d in (*t.shape, *t.stride())):
            return None
        parts = [("tensor", t.dtype, t.device, *[tuple(int(d) for d in x) for x in (t.shape, t.stride())]) for t in ts]
        out.append(parts[0] if isinstance(a, torch.Tensor) else parts)
    return tuple(out)


_INLINE_IMPL: dict[tuple[str, int], Callable] = {}  # (op, hub key) -> that hub's Hub.inline_impl (set by its OpHandles)
_INLINE_FUNCTIONS: dict[tuple[str, str], Callable] = {}  # (op, backend) -> its Impl.inline, as _inline_choice found


def _inline_choice(op: str, forced: str, hub: int, described: tuple) -> str:
    """The backend the hub would run for a call so described where its impl has ``inline`` (then in
    `_INLINE_FUNCTIONS`), else ''. Dynamo runs this while it traces (`torch.compiler.assume_constant_result`:
    a constant of the graph; its arguments must be constants), on fake tensors of the described layouts."""
    from torch._subclasses.fake_tensor import FakeTensorMode

    with FakeTensorMode():
        def fake(d):
            if isinstance(d, list):
                return [fake(x) for x in d]
            if isinstance(d, tuple) and d and d[0] == "tensor":
                return torch.empty_strided(d[3], d[4], dtype=d[1], device=d[2])
            return d
        args = [fake(d) for d in described]
    impl = _INLINE_IMPL[(op, hub)](op, args, forced)
    if impl is None:
        return ""
    _INLINE_FUNCTIONS[(impl.op, impl.backend)] = impl.inline
    return impl.backend


_inline_choice = torch.compiler.assume_constant_result(_inline_choice)


def define_ops(spec: OpSpec, run_forward: Callable, run_backward: Callable) -> Any:
    """Define (once per process) the two operators of ``spec``; returns the forward OpOverload.

    ``run_forward(op, args, backend)`` and ``run_backward(op, grad, args, needs, backend)`` are
    looked up at call time, so reloading the hub does not redefine operators.
    """
    if spec.name in _DEFINED:
        return _DEFINED[spec.name][0]
    name = spec.name
    n = len(spec.args)

    def forward(*args):
        return run_forward(name, args[:n], args[n], args[n + 1])

    def backward_kernel(grad, *rest):
        args, needs, backend = rest[:n], rest[n], rest[n + 1]
        return run_backward(name, grad, args, needs, backend, rest[n + 2])

    # torch.library.define + impl, not custom_op: custom_op wraps each call in a dynamo-disable guard and an
    # aliasing check, 16.8 against 4.3 us per call of a trivial op on the 2-core CPU (docs/lab/benchmarks-history.md)
    lib = _library()
    lib.define(f"{name}{spec.schema()}")
    lib.define(f"{name}_backward{spec.backward_schema()}")
    lib.impl(name, forward, "CompositeExplicitAutograd")
    lib.impl(f"{name}_backward", backward_kernel, "CompositeExplicitAutograd")
    torch.library.register_fake(f"{NAMESPACE}::{name}", lambda *args: spec.output(*args[:n]), lib=lib)
    torch.library.register_fake(f"{NAMESPACE}::{name}_backward",
                                lambda grad, *rest: _placeholders(spec, rest[:n], rest[n]), lib=lib)
    ops = getattr(torch.ops, NAMESPACE)
    overload, bwd = getattr(ops, name).default, getattr(ops, f"{name}_backward").default

    def refuse_double_backward(ctx, *grads):
        raise RuntimeError(f"double backward is not supported by kernelhub.{name}")

    torch.library.register_autograd(bwd, refuse_double_backward, lib=lib)

    def setup_context(ctx, inputs, output):
        args = inputs[:n]
        ctx.backend, ctx.hub = inputs[n], inputs[n + 1]
        ctx.needs = [any(t.requires_grad for t in tensors_of(args[i])) for i in spec.differentiable]
        flat, ctx.layout, ctx.others = _split(args, spec.tensor_args)
        ctx.save_for_backward(*flat)

    def autograd_backward(ctx, grad):
        args, _ = _join(ctx.others, ctx.layout, ctx.saved_tensors)
        flat = bwd(grad, *args, ctx.needs, ctx.backend, ctx.hub)
        result: list[Any] = [None] * (n + 2)
        pos = 0
        for i, need in zip(spec.differentiable, ctx.needs):
            count = len(args[i]) if isinstance(args[i], list) else 1
            if need:
                result[i] = list(flat[pos:pos + count]) if isinstance(args[i], list) else flat[pos]
            pos += count
        return tuple(result)

    torch.library.register_autograd(overload, autograd_backward, setup_context=setup_context, lib=lib)
    _DEFINED[name] = (overload, bwd)
    return overload


_LIBRARY: list = []


def _library() -> torch.library.Library:
    """The ``kernelhub`` namespace's library fragment, made once and kept for the process (dropping it would
    remove the operators)."""
    if not _LIBRARY:
        _LIBRARY.append(torch.library.Library(NAMESPACE, "FRAGMENT"))
    return _LIBRARY[0]


class KernelhubFunction(torch.autograd.Function):
    """The eager fast path's autograd glue: ``apply(handle, args, (layout, others), *tensors)``, the call taken
    apart by `_split` (``tensors``: every tensor of ``args``, a "tensors" argument's elements one by one, so
    autograd sees them). The backward runs the backend of the forward's decision (no second selection)."""

    @staticmethod
    def forward(ctx, handle: OpHandle, args: tuple, parts: tuple, *tensors: torch.Tensor) -> torch.Tensor:
        ctx.handle, (ctx.layout, ctx.others) = handle, parts
        ctx.save_for_backward(*tensors)
        ctx.decision, out = handle.forward(handle.spec.name, args, handle.backend)
        return out

    @staticmethod
    def backward(ctx, grad: torch.Tensor):
        if not torch.is_grad_enabled():  # torch.autograd.grad / .backward() without create_graph
            return KernelhubFunction._backward(ctx, grad)
        with torch.no_grad():
            grads = KernelhubFunction._backward(ctx, grad)
        # create_graph=True: gradients that raise if differentiated (what once_differentiable does, with a message)
        err = torch._C._functions.DelayedError(
            f"double backward is not supported by kernelhub.{ctx.handle.spec.name}".encode(), len(grads))
        return err(*[g if g is None else g.detach().requires_grad_() for g in grads])

    @staticmethod
    def _backward(ctx, grad: torch.Tensor) -> tuple:
        handle, needs_input = ctx.handle, ctx.needs_input_grad[3:]
        args, spans = _join(ctx.others, ctx.layout, ctx.saved_tensors)
        diff = handle.spec.differentiable
        needs = [any(needs_input[k] for k in spans[i]) for i in diff]
        grads = handle.backward_grads(handle.spec.name, grad, tuple(args), needs, handle.backend, ctx.decision)
        out: list[Any] = [None] * (3 + len(needs_input))
        for i, g in zip(diff, grads):  # each differentiable argument's gradient -> its tensors' slots
            if g is not None:
                for k, gk in zip(spans[i], g if isinstance(args[i], list) else (g,)):
                    out[3 + k] = gk if needs_input[k] else None
        return tuple(out)


class OpHandle:
    """The callable returned by ``kernelhub.op(name)``: normalises arguments, then runs the eager fast path
    (`KernelhubFunction`) where nothing traces (`traced`), else calls the operator."""

    __slots__ = ("spec", "backend", "hub", "_overload", "forward", "backward_grads", "inline_impl")

    def __init__(self, spec: OpSpec, overload: Any, backend: str = "", forward: Callable | None = None,
                 backward_grads: Callable | None = None, inline_impl: Callable | None = None, hub: int = 0) -> None:
        self.spec = spec
        self.backend = backend
        self.hub = hub  # the operators' ``hub`` argument: which hub runs the call when it goes through them
        self._overload = overload
        self.forward, self.backward_grads = forward, backward_grads  # the hub's Hub.forward and Hub.backward_grads
        self.inline_impl = inline_impl  # the hub's Hub.inline_impl: see _inline_choice
        if inline_impl is not None:
            _INLINE_IMPL[(spec.name, hub)] = inline_impl

    def __call__(self, *args: Any, **kwargs: Any) -> torch.Tensor:
        args = self.spec.canonical(*args, **kwargs)
        if _fwad._current_level >= 0 or _functorch_active():
            refuse_unsupported_autodiff(self.spec.name, args)
        if not EAGER_FAST_PATH or self.forward is None or traced(args):
            if self.inline_impl is not None and torch.compiler.is_compiling():
                described = _describe(args)
                backend = "" if described is None else _inline_choice(self.spec.name, self.backend, self.hub,
                                                                      described)
                if backend:
                    # the impl's own torch ops go into the graph: inductor fuses them, autograd differentiates them
                    return _INLINE_FUNCTIONS[(self.spec.name, backend)](*args)
            return self._overload(*args, self.backend, self.hub)
        tensors, layout, others = _split(args, self.spec.tensor_args)
        if not torch.is_grad_enabled() or not any(t.requires_grad for t in tensors):
            return self.forward(self.spec.name, args, self.backend)[1]  # nothing to differentiate: no graph node
        return KernelhubFunction.apply(self, args, (layout, others), *tensors)

    def __repr__(self) -> str:
        forced = f", backend={self.backend!r}" if self.backend else ""
        return f"kernelhub.op({self.spec.name!r}{forced})"
