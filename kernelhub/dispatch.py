"""How a call of ``kernelhub.op(name)`` reaches an impl: the eager fast path or the operators (traced into a
compiled graph where the hub says so), one selection.

**The operators** (`define_ops`, one pair per spec, defined once per process with ``torch.library.Library``):

- ``kernelhub::<op>(<args>, str backend, int hub) -> Tensor``: the forward. ``backend`` is '' to let the selector
  choose, or the backend forced by ``kernelhub.op(op, backend=...)``; ``hub`` the hub that runs it (0: the global
  one, else a `kernelhub.Hub` built directly: `Hub.key`).
- ``kernelhub::<op>_backward(Tensor grad, <args>, bool[] needs, str backend, int hub) -> Tensor[]``: one gradient
  per differentiable argument (a "tensors" argument contributes one per element); an argument whose ``needs`` is
  False gets an empty placeholder.

Invariants of the operators, which are what the PyTorch 2 toolchain sees:

- A trace (``torch.compile``'s dynamo, ``torch.export``, ``make_fx``, a functorch transform, fake tensors) records
  one node per call whose value the fake implementation (`kernelhub.spec.OpSpec.output`) describes. Where the
  node runs, selection happens inside the operator's kernel, when it runs: the kill switch, pins, forced
  backends, tuned winners and fallback act on it as on an eager call.
- **Traced into a graph** (`_traced_rule`): when torch.compile's AOTAutograd makes its graphs (functional
  tensors: the mechanism of ``torch.library.triton_op``), the hub may put an impl's own work in place of the
  node, forward and backward: the impl `kernelhub.select.Selector.traced` picks (a forced or pinned backend, the
  op's own order for the call, the config's ``[compile] priority``; traceable impls only, static shapes only,
  never for torch.export). The graph then holds its torch operators and Triton launches and no Python call per
  op. Dynamo guards on `kernelhub._state.GENERATION` (`OpHandle._via_operators` reads it), so a graph made before
  the hub changed (a reload of another config, a traced backend marked failed) recompiles; `kernelhub.hub` keys
  torch.compile's caches on disk on the hubs' state. An impl that raises while traced leaves the node in the
  graph.
- The forward's autograd formula calls the backward operator, which selects (or traces) again with the same key
  and so reaches the backend that ran the forward. The backward operator refuses double backward with an error
  naming the op.
- A call returns new tensors and keeps no tensor of the call after it returns (the backends' scratch buffers
  are the call's own), so a CUDA graph may capture it (``mode="reduce-overhead"``): a captured call replays the
  kernels of the impl chosen when it was captured.

**The eager fast path** (`OpHandle.__call__`, where `_tracing` is False and every tensor is a plain tensor off
the meta device): the same hub calls (`Hub.forward`, `Hub.backward_grads`: the same cached decision, fallback,
output and gradient checks, those once per layout and way of calling: their ``trusted``) without the operators'
dispatch, through one `torch.autograd.Function`
(`KernelhubFunction`) whose backward runs on the hub that ran the forward with the forward's decision; where no
input requires grad (or grad mode is off), the hub's forward alone. A repeated call of one layout (`_layout`:
each tensor's type, device, dtype, shape and strides, every other argument's type and value) whose arguments the
spec found canonical finds its decision by one dict lookup (`Selector.remembered`), skipping the spec's checks;
any other call runs the checks and `Selector.decide`. ``KERNELHUB_EAGER_FAST_PATH=0`` (or false, off, no; read at
import, `kernelhub._state.EAGER_FAST_PATH`) sends every call through the operators.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Sequence
from typing import Any, NamedTuple

import torch
import torch.autograd.forward_ad as _fwad
from torch._subclasses.fake_tensor import FakeTensor
from torch._subclasses.functional_tensor import FunctionalTensor, FunctionalTensorMode

from kernelhub import _state
from kernelhub._glue import CallPlan, plan_call, put_back, to_slots
from kernelhub._state import GENERATION
from kernelhub.args import tensors_of
from kernelhub.spec import OpSpec

__all__ = ["define_ops", "OpHandle", "NAMESPACE", "traced", "refuse_unsupported_autodiff"]

NAMESPACE = "kernelhub"
_PLAIN = (torch.Tensor, torch.nn.Parameter)
_functorch_active = getattr(torch._C, "_are_functorch_transforms_active",
                            lambda: torch._C._functorch.peek_interpreter_stack() is not None)
_wrapped = torch._C._functorch.is_functorch_wrapped_tensor
_legacy_batched = torch._C._functorch.is_legacy_batchedtensor  # torch.autograd.grad's is_grads_batched=True


def _tracing() -> bool:
    """Whether dynamo is tracing, a functorch transform (vmap, grad, jvp) or a dispatch mode (fake tensors, make_fx,
    FlopCounterMode) is active."""
    return torch.compiler.is_compiling() or _functorch_active() or bool(torch._C._len_torch_dispatch_stack())


def _plain_tensors(args: Sequence[Any], positions: Sequence[int]) -> list[torch.Tensor] | None:
    """Every tensor of the arguments at ``positions`` (tensors or lists of them) in order, or None where one is a
    tensor subclass, on the meta device or a functorch wrapper that outlived its transform (then the operators
    serve the call)."""
    flat: list[torch.Tensor] = []
    for i in positions:
        a = args[i]
        for t in a if isinstance(a, (list, tuple)) else (a,):
            if type(t) not in _PLAIN or t.is_meta or _wrapped(t):
                return None
            flat.append(t)
    return flat


_STRIDED = torch.strided


def _layout(args: Sequence[Any]) -> tuple[tuple, list[torch.Tensor]] | None:
    """A call's layout, the eager fast path's memo key (`OpHandle.__call__`): for each argument its type and,
    for a tensor, device, dtype, shape and strides (a list's tensors one by one), for anything else its value (a
    list's elements with their types); and the call's tensors in order. None where a tensor is a subclass or a
    functorch wrapper left from a finished transform (the operators serve those), or is not a dense strided tensor
    (a sparse COO one reads an expanded tensor's strides: the spec's checks refuse it). On every call's hot path:
    plain loops, no function call per argument."""
    key: list = []
    tensors: list[torch.Tensor] = []
    for a in args:
        kind = type(a)
        if kind is torch.Tensor or kind is torch.nn.Parameter:
            if _wrapped(a) or a.layout is not _STRIDED or a.is_nested:
                return None
            key.append((kind, a.device, a.dtype, a.shape, a.stride()))
            tensors.append(a)
        elif (kind is list or kind is tuple) and a and isinstance(a[0], torch.Tensor):
            parts: list = [kind]
            for t in a:
                part = type(t)
                if (part is not torch.Tensor and part is not torch.nn.Parameter) or _wrapped(t) \
                        or t.layout is not _STRIDED or t.is_nested:
                    return None
                parts.append((part, t.device, t.dtype, t.shape, t.stride()))
                tensors.append(t)
            key.append(tuple(parts))
        elif kind is list or kind is tuple:  # each element's type too: True == 1 for the dict, not for the spec
            key.append((kind, *[(type(x), x) for x in a]))
        elif isinstance(a, torch.Tensor):  # a subclass
            return None
        else:
            key.append((kind, a))
    return tuple(key), tensors


_CONSTANT = (int, float, bool, str, type(None))


def _canonical_as_given(given: Sequence[Any], canonical: Sequence[Any]) -> tuple | None:
    """Where the spec's canonical arguments are the ``given`` positional ones (the same tensors, equal values of
    the same types) followed by defaults of immutable types: those defaults (the rest of every call of this
    layout); else None (the call is not remembered)."""
    if len(canonical) < len(given):
        return None
    for g, c in zip(given, canonical):
        if g is c:
            continue
        kind = type(g)
        if kind is not type(c) or isinstance(g, torch.Tensor):
            return None
        if kind is list or kind is tuple:
            if len(g) != len(c) or any(x is not y and (type(x) is not type(y) or isinstance(x, torch.Tensor)
                                                       or x != y) for x, y in zip(g, c)):
                return None
        elif g != c:
            return None
    rest = tuple(canonical[len(given):])
    return rest if all(type(v) in _CONSTANT for v in rest) else None


def traced(args: Sequence[Any]) -> bool:
    """Whether a call must go through the torch.library operators: `_tracing`, or an argument is a tensor subclass,
    on the meta device or a functorch wrapper left from a finished transform. Otherwise the eager fast path
    serves it."""
    return _tracing() or _plain_tensors(args, [i for i, a in enumerate(args) if tensors_of(a) is not None]) is None


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


def _per_sample(op: Any, info: Any, in_dims: tuple, *args: Any) -> tuple[Any, Any]:
    """An operator under torch.vmap (``torch.func.vmap`` of an op, ``torch.autograd.grad(...,
    is_grads_batched=True)``): one call per sample, its output (or each of the backward's flat outputs)
    stacked. torch's own fallback does this for an operator with plain tensor arguments and one output; it makes
    none where a list of tensors goes in (K-Planes' planes) or comes out (every backward), and it warns on every
    call."""
    n = info.batch_size

    def sample(x: Any, d: Any, b: int) -> Any:
        if type(x) is list:
            return [sample(t, dt, b) for t, dt in zip(x, d or [None] * len(x))]
        if d is None:
            return x
        # an empty batch: one call on zeros, for the output's shape
        return x.select(d, b) if n else x.new_zeros(x.shape[:d] + x.shape[d + 1:])
    outs = [op(*[sample(x, d, b) for x, d in zip(args, in_dims)]) for b in range(max(n, 1))]
    if isinstance(outs[0], torch.Tensor):
        return torch.stack(outs)[:n], 0
    return [torch.stack(parts)[:n] for parts in zip(*outs)], [0] * len(outs[0])


def _per_grad_sample(grad: torch.Tensor, run: Callable[[torch.Tensor], list]) -> list:
    """``run(grad)`` (one entry per differentiable argument: a tensor, a list, or None) for an upstream gradient
    that ``torch.autograd.grad(..., is_grads_batched=True)`` batched with torch's legacy vmap, which no
    `torch.library.register_vmap` rule reaches: ``run`` once per sample on plain tensors (an impl's kernels take
    nothing else), each result stacked and batched again at the legacy vmap's level."""
    # the vmap's level: the one whose batch dim, moved out, leaves a plain tensor (the level counter is
    # thread-local, and a CUDA backward runs on autograd's device thread, which never entered the vmap)
    for level in range(1, 65):
        samples = torch._remove_batch_dim(grad, level, 1, 0)
        if not _legacy_batched(samples):
            break
    else:
        raise NotImplementedError("kernelhub: an upstream gradient batched by nested torch.autograd.grad(..., "
                                  "is_grads_batched=True) calls is not supported")
    results = [run(g) for g in samples]

    def batched(parts: list) -> Any:
        if parts[0] is None:
            return None
        if type(parts[0]) is list:
            return [batched(list(p)) for p in zip(*parts)]
        return torch._add_batch_dim(torch.stack(parts), 0, level)
    return [batched([r[i] for r in results]) for i in range(len(results[0]))]


def _placeholders(spec: OpSpec, args: Sequence[Any], needs: Sequence[bool]) -> list[torch.Tensor]:
    """Fake gradients: the shape of each needed differentiable input, else an empty tensor."""
    out = []
    for i, need in zip(spec.differentiable, needs):
        for t in tensors_of(args[i]) or ():
            out.append(torch.empty_like(t, memory_format=torch.contiguous_format) if need else t.new_empty((0,)))
    return out


def flatten_grads(spec: OpSpec, args: Sequence[Any], needs: Sequence[bool], grads: Sequence[Any]) -> list[torch.Tensor]:
    """An impl's per-argument gradients -> the backward operator's flat Tensor[] output."""
    flat = []
    for i, need, g in zip(spec.differentiable, needs, grads):
        ts = tensors_of(args[i]) or []
        gs = (tensors_of(g) or ()) if need else ts
        flat += [x.contiguous() if need else t.new_empty((0,)) for x, t in zip(gs, ts)]
    return flat


def unflatten_grads(spec: OpSpec, args: Sequence[Any], needs: Sequence[bool], flat: Sequence[torch.Tensor]) -> list:
    """`flatten_grads`' inverse: the backward operator's flat output -> one entry per differentiable argument (a
    tensor, a list for a "tensors" argument, None where not needed)."""
    grads: list[Any] = []
    pos = 0
    for i, need in zip(spec.differentiable, needs):
        count = len(args[i]) if type(args[i]) is list else 1
        grads.append((list(flat[pos:pos + count]) if type(args[i]) is list else flat[pos]) if need else None)
        pos += count
    return grads


def _static(args: Sequence[Any]) -> bool:
    """Whether every tensor of ``args`` (lists' too) has a shape of plain ints (no symbolic size)."""
    return all(type(s) is int for a in args for t in (tensors_of(a) or ()) for s in t.shape)


def _exporting() -> bool:
    """Whether torch.export traces (it keeps custom operators whole, as triton_op's do), or this torch cannot
    say (then nothing is traced into a graph)."""
    try:
        from torch.export._trace import custom_triton_ops_decomposition_disabled
    except ImportError:
        return True
    return custom_triton_ops_decomposition_disabled()


def _traced_rule(spec: OpSpec, backward: bool, trace: Callable) -> Callable:
    """The operators' rule under ``FunctionalTensorMode``, the mode in which torch.compile's AOTAutograd makes
    its graphs (the mechanism of ``torch.library.triton_op``): ``trace(op, args, backend, hub, grad, needs)``
    (``grad`` None for the forward), inside the mode, returns what the impl the hub traces into the graph for the
    call gives (the output, or the backward operator's flat gradients), or None where there is none; then, and for
    torch.export, symbolic sizes and tensor subclasses, the graph holds the operator."""
    n = len(spec.args)
    plain = {torch.Tensor, torch.nn.Parameter}

    def rule(mode, func, types, args, kwargs):
        if backward:
            grad, op_args, needs, backend, hub = args[0], args[1:n + 1], args[n + 1], args[n + 2], args[n + 3]
        else:
            grad, op_args, needs, backend, hub = None, args[:n], None, args[n], args[n + 1]
        if not kwargs and _static(op_args) and not _exporting() and all(
                t in plain or issubclass(t, (FunctionalTensor, FakeTensor)) for t in types):
            with mode:  # the graph's tensors work only inside it (the selection's too: a spec's output, say)
                out = trace(spec.name, op_args, backend, hub, grad, needs)
            if out is not None:
                return out
        return mode.__torch_dispatch__(func, types, args, kwargs)
    return rule


def define_ops(spec: OpSpec, run_forward: Callable, run_backward: Callable, trace: Callable) -> Any:
    """Define (once per process) the two operators of ``spec``; returns the forward OpOverload.

    ``run_forward(op, args, backend, hub)`` and ``run_backward(op, grad, args, needs, backend, hub)`` run the
    operators; each finds the hub by its key at call time, so reloading the hub does not redefine operators.
    ``trace`` (`_traced_rule`'s) runs the impl torch.compile traces into its graph in their place.
    """
    if spec.name in _state.operators:
        return _state.operators[spec.name][0]
    name = spec.name
    n = len(spec.args)

    def forward(*args):
        return run_forward(name, args[:n], args[n], args[n + 1])

    def backward_kernel(grad, *rest):
        args, needs, backend = rest[:n], rest[n], rest[n + 1]
        return run_backward(name, grad, args, needs, backend, rest[n + 2])

    # torch.library.define + impl, not custom_op: custom_op wraps each call in a dynamo-disable guard and an
    # aliasing check, several times the cost of a call (docs/lab/benchmarks-history.md#measurements-behind-the-code)
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
    for op in (overload, bwd):
        torch.library.register_vmap(op, functools.partial(_per_sample, op), lib=lib)

    def refuse_double_backward(ctx, *grads):
        raise RuntimeError(f"double backward is not supported by kernelhub.{name}")

    torch.library.register_autograd(bwd, refuse_double_backward, lib=lib)
    if hasattr(torch.library, "register_torch_dispatch"):  # torch >= 2.4; before it, graphs hold the operators
        for op, backward in ((overload, False), (bwd, True)):
            torch.library.register_torch_dispatch(op, FunctionalTensorMode, _traced_rule(spec, backward, trace),
                                                  lib=lib)

    def setup_context(ctx, inputs, output):
        args = inputs[:n]
        ctx.backend, ctx.hub = inputs[n], inputs[n + 1]
        flat = [t for i in spec.tensor_args for t in tensors_of(args[i])]
        ctx.plan, ctx.requires = plan_call(spec, args, 0), [t.requires_grad for t in flat]
        ctx.save_for_backward(*flat)

    def autograd_backward(ctx: Any, grad: torch.Tensor) -> tuple:
        args, needs = put_back(ctx.plan, ctx.saved_tensors, ctx.requires)

        def run(g):
            return unflatten_grads(spec, args, needs, bwd(g, *args, needs, ctx.backend, ctx.hub))
        grads = _per_grad_sample(grad, run) if _legacy_batched(grad) else run(grad)
        result: list[Any] = [None] * (n + 2)
        for i, g in zip(spec.differentiable, grads):
            result[i] = g
        return tuple(result)

    torch.library.register_autograd(overload, autograd_backward, setup_context=setup_context, lib=lib)
    _state.operators[name] = (overload, bwd)
    return overload


def _library() -> torch.library.Library:
    """The ``kernelhub`` namespace's library fragment, made once and kept for the process (dropping it would
    remove the operators)."""
    if not _state.library:
        _state.library.append(torch.library.Library(NAMESPACE, "FRAGMENT"))
    return _state.library[0]


class FastCall(NamedTuple):
    """One eager call `KernelhubFunction` runs: the handle called, the hub and its decision, the layout's plan
    (`kernelhub._glue.plan_call`) and trusted set (`kernelhub.hub.Hub.forward`), the canonical arguments, and the
    weights the hub applies (None: none, or autograd weighs them)."""
    handle: Any  # OpHandle
    hub: Any  # kernelhub.hub.Hub
    decision: Any  # kernelhub.select.Decision
    plan: CallPlan
    args: tuple
    weights: torch.Tensor | None
    trusted: set


class FastNode(NamedTuple):
    """What a `KernelhubFunction` node keeps for its backward: `FastCall`'s parts but the arguments (saved as
    tensors and put back by the plan), the decision that served the forward, and what its impl saved (`Impl.can`
    "saves"; else None)."""
    handle: Any
    hub: Any
    decision: Any
    plan: CallPlan
    weights: torch.Tensor | None
    kept: Any
    trusted: set


class KernelhubFunction(torch.autograd.Function):
    """The eager fast path's autograd glue: ``apply(call, *tensors)``, with ``call`` a `FastCall` (handle, hub,
    decision, plan, args, weights, trusted) in one input (each input costs the engine, forward and backward) and
    ``tensors`` every tensor of ``args`` (a "tensors" argument's elements one by one, so autograd sees them); ``plan``
    is what `kernelhub._glue.put_back` needs besides them (`plan_call`'s, kept with the layout's decision). The
    backward runs on the hub that ran the forward, with the backend of the forward's decision (no second selection).
    ``weights`` (a weighted handle's, `OpHandle.weighted`, checked against the output; else None): the node's
    output is the op's output weighted and summed, and its backward gives the op's backward ``conj(weights) *
    grad``: in the impl's own kernels where it fuses them (`Impl.can` "weighted"), else in torch ops (`Hub.forward`,
    `Hub.backward_grads`)."""

    @staticmethod
    def forward(ctx, call: FastCall, *tensors: torch.Tensor) -> torch.Tensor:
        handle, hub, decision, plan, args, weights, trusted = call
        ctx.save_for_backward(*tensors)
        keep: list = []  # what an impl that saves for its backward saved (`Impl.can` "saves"), held by this node
        decision, out = hub.forward(handle.spec.name, args, handle.backend, decision=decision, weights=weights,
                                    keep=keep, trusted=trusted)
        ctx.call = FastNode(handle, hub, decision, plan, weights, keep[0] if keep else None, trusted)
        ctx.weights_version = None if weights is None else weights._version
        return out

    @staticmethod
    def backward(ctx, grad: torch.Tensor):
        handle, hub, decision, plan, weights, kept, trusted = ctx.call
        if weights is not None and weights._version != ctx.weights_version:  # as autograd checks saved tensors
            raise RuntimeError(f"kernelhub.{handle.spec.name}: argument 'weights' was modified in place after the "
                               f"forward (version {ctx.weights_version}, now {weights._version}), so the backward "
                               "would differentiate another loss; weigh with a copy (weights.clone()) if it changes")
        needs_input = ctx.needs_input_grad
        saved = ctx.saved_tensors  # read once: each read unpacks them (a saved-tensor hook's copy back, say)
        args, needs = put_back(plan, saved, needs_input)
        create_graph = torch.is_grad_enabled()  # torch.autograd.grad / .backward() with create_graph=True
        legacy = _legacy_batched(grad)  # torch.autograd.grad(..., is_grads_batched=True)
        wrapped = not legacy and _wrapped(grad)  # torch.func.vmap over the upstream gradients
        if weights is not None and (legacy or wrapped):  # these take the op's upstream gradient: d(sum(out * w))/d out
            grad, weights = weights.conj() * grad, None
        if legacy:  # sample by sample
            with torch.no_grad():
                grads = _per_grad_sample(grad, lambda g: hub.backward_grads(handle.spec.name, g, args, needs,
                                                                            handle.backend, decision=decision))
        elif wrapped:  # the backward operator's vmap rule
            with torch.no_grad():
                grads = unflatten_grads(handle.spec, args, needs, _state.operators[handle.spec.name][1](
                    grad, *args, needs, handle.backend, handle.hub))
        elif create_graph:
            with torch.no_grad():
                grads = hub.backward_grads(handle.spec.name, grad, args, needs, handle.backend, decision=decision,
                                           weights=weights, saved=kept, trusted=trusted)
        else:
            grads = hub.backward_grads(handle.spec.name, grad, args, needs, handle.backend, decision=decision,
                                       weights=weights, saved=kept, trusted=trusted)
        out = to_slots(plan, needs, grads, needs_input)
        if not create_graph:
            return out
        # gradients that raise if differentiated, as the operators' backward does: one error node (what
        # once_differentiable makes, with a message) whose inputs are the gradients, the call's saved tensors, the
        # upstream gradient and the weights. These put the node on every path from the gradients back to whatever
        # they depend on (the call's inputs; through the upstream gradient, a coefficient c of c * op(x); the
        # weights), so torch.autograd.grad(f(g), that) reaches it and raises, where with the gradients alone (what
        # once_differentiable does) it would find no path: an error that names no op, or with allow_unused=True
        # a silent None (a gradient penalty's second-order term dropped)
        extra = (*saved, grad) if weights is None else (*saved, grad, weights)
        err = torch._C._functions.DelayedError(
            f"double backward is not supported by kernelhub.{handle.spec.name}".encode(), len(out) + len(extra))
        # a None (no gradient for that input) passes through DelayedError as it is
        return err(*[g if g is None else g.detach().requires_grad_() for g in out], *extra)[:len(out)]  # type: ignore[arg-type]


def _check_weights(op: str, weights: torch.Tensor, output: tuple) -> None:
    """Raise ValueError unless ``weights`` has the output's (shape, dtype, device) ``output``."""
    shape, dtype, device = output
    if weights.shape != shape or weights.dtype != dtype or weights.device != device:
        raise ValueError(f"kernelhub.{op}: argument 'weights' must have the output's shape, dtype and device, "
                         f"{str(dtype).removeprefix('torch.')}{list(shape)}@{device}, got "
                         f"{str(weights.dtype).removeprefix('torch.')}{list(weights.shape)}@{weights.device}")


def _weigh(op: str, out: torch.Tensor, weights: torch.Tensor) -> torch.Tensor:
    """``(out * weights).sum()`` in one kernel (`OpHandle.weighted`), after checking that ``weights`` has the
    output's shape, dtype and device."""
    _check_weights(op, weights, (out.shape, out.dtype, out.device))
    return weighted_sum(out, weights)


def weighted_sum(out: torch.Tensor, weights: torch.Tensor) -> torch.Tensor:
    """``(out * weights).sum()`` in one kernel, ``weights`` checked already."""
    dim = out.dim()
    if dim == 1:
        return torch.dot(out, weights)
    return out * weights if dim == 0 else torch.dot(out.reshape(-1), weights.reshape(-1))


# KernelhubFunction.apply without torch.autograd.Function.apply's Python wrapper (its setup_context check and a
# pytree pass over every argument that unwraps functorch wrappers left from a finished transform, which
# `_layout` sends to the operators instead), a measurable part of a small step
# (docs/lab/benchmarks-history.md#measurements-behind-the-code)
_apply = super(torch.autograd.Function, KernelhubFunction).apply


class OpHandle:
    """The callable returned by ``kernelhub.op(name)``: normalises arguments, then runs the eager fast path
    (`KernelhubFunction`) where nothing traces (`traced`), else calls the operator. ``weights`` (None, or a
    weighted handle's, `weighted`): each call returns ``(op(*args) * weights).sum()``."""

    __slots__ = ("spec", "backend", "hub", "_overload", "hub_of", "weights")

    def __init__(self, spec: OpSpec, overload: Any, backend: str = "", hub_of: Callable | None = None,
                 hub: int = 0, weights: torch.Tensor | None = None) -> None:
        self.spec = spec
        self.backend = backend
        self.hub = hub  # the operators' ``hub`` argument: which hub runs the call when it goes through them
        self._overload = overload
        self.hub_of = hub_of  # the hub that runs an eager call (`kernelhub.get_hub` for the global one); None: none
        self.weights = weights

    def weighted(self, weights: torch.Tensor) -> OpHandle:
        """A handle whose calls return ``(op(*args) * weights).sum()``, one scalar, with ``weights`` a tensor of
        the op's output shape, dtype and device (a loss's per-term coefficients: `kernelhub.nn.TVLoss3d` keeps
        one such handle per volume size). On the eager fast path the weighting is inside the op's autograd node:
        one node, no multiplication node and its backward around it (`KernelhubFunction`; measured:
        docs/lab/benchmarks-history.md#measurements-behind-the-code),
        and in the impl's own kernels where its backend fuses it (`Impl.can` "weighted": cuda_ext's and triton's TV
        ops), so no launch is added either way. Where ``weights`` requires grad, and where the operators serve the
        call, it is that product and sum in torch ops, which autograd differentiates. The same selection, checks
        and fallback as the plain handle."""
        if not isinstance(weights, torch.Tensor):
            raise TypeError(f"kernelhub.{self.spec.name}: argument 'weights' must be a tensor, got "
                            f"{type(weights).__name__}")
        if self.weights is not None:
            raise ValueError(f"kernelhub.{self.spec.name}: this handle is weighted already; weight the plain one")
        return OpHandle(self.spec, self._overload, self.backend, self.hub_of, self.hub, weights)

    def __call__(self, *args: Any, **kwargs: Any) -> torch.Tensor:
        if _state.EAGER_FAST_PATH and not kwargs and self.hub_of is not None and _fwad._current_level < 0 \
                and not _tracing():
            layout = _layout(args)
            if layout is not None:
                hub = self.hub_of()
                try:
                    known = hub.selector.remembered.get(
                        (self.spec.name, self.backend, torch.are_deterministic_algorithms_enabled(), layout[0]))
                except TypeError:  # an unhashable argument: the spec's checks say what is wrong with it
                    known = None
                if known is not None:  # a `kernelhub.select.Remembered`
                    decision, rest, plan, trusted = known
                    return self._run(hub, decision, args + rest if rest else args, layout[1], plan, trusted)
        return self._call(args, kwargs)

    def _call(self, given: tuple, kwargs: dict) -> torch.Tensor:
        """A call the memo does not know: the spec's checks, then the eager fast path (remembering the call's
        layout where its arguments are canonical as given) or the operators (a weighted handle's weighting then in
        torch ops)."""
        spec = self.spec
        args = spec.canonical(*given, **kwargs)
        if _fwad._current_level >= 0 or _functorch_active():
            refuse_unsupported_autodiff(spec.name, args)
        if _state.EAGER_FAST_PATH and self.hub_of is not None and not _tracing():
            tensors = _plain_tensors(args, spec.tensor_args)
            if tensors is not None:
                hub = self.hub_of()
                decision = hub.selector.decide(spec.name, args, self.backend)
                plan = plan_call(spec, args, 1)
                trusted: set = set()
                rest = None if kwargs else _canonical_as_given(given, args)
                if rest is not None:
                    layout = _layout(given)
                    if layout is not None:
                        hub.selector.remember((spec.name, self.backend, torch.are_deterministic_algorithms_enabled(),
                                               layout[0]), args, decision, rest, plan, trusted)
                return self._run(hub, decision, args, tensors, plan, trusted)
        out = self._via_operators(args)
        return out if self.weights is None else _weigh(spec.name, out, self.weights)

    def _via_operators(self, args: tuple) -> torch.Tensor:
        """The call through the op's operator: what a trace records (one node), selection at run time inside it,
        or, in a torch.compile graph, the impl traced in its place (`kernelhub.select.Selector.traced`). While
        dynamo traces, the comparison reads `GENERATION`'s token, so dynamo guards on it: a graph made before the
        hub changed (a reload of another config, a traced backend marked failed) recompiles at its next call."""
        if torch.compiler.is_compiling() and GENERATION.token == "":
            raise AssertionError("kernelhub: the generation token is never empty")
        return self._overload(*args, self.backend, self.hub)

    def _run(self, hub: Any, decision: Any, args: tuple, tensors: list[torch.Tensor], plan: CallPlan,
             trusted: set) -> torch.Tensor:
        """The eager fast path: ``decision`` run on ``hub`` through `KernelhubFunction` where an input requires
        grad, else the hub's forward alone (no autograd node); ``trusted``: the layout's (`Hub.forward`)."""
        weights = inner = self.weights  # inner: the weights the hub applies (in the impl's kernels where it can)
        if weights is not None:
            _check_weights(self.spec.name, weights, decision.output)
            if weights.requires_grad and torch.is_grad_enabled():  # autograd weighs: the weights' gradient
                inner = None
        if torch.is_grad_enabled():
            for t in tensors:
                if t.requires_grad:
                    out = _apply(FastCall(self, hub, decision, plan, args, inner, trusted), *tensors)
                    # inner is weights unless the weights are set and autograd weighs them
                    return out if inner is weights else weighted_sum(out, weights)  # type: ignore[arg-type]
        out = hub.forward(self.spec.name, args, self.backend, decision=decision, weights=inner, trusted=trusted)[1]
        return out if inner is weights else weighted_sum(out, weights)  # type: ignore[arg-type]

    def __reduce__(self) -> tuple:
        """Serialised (``torch.save`` of a model holding `kernelhub.nn` modules, ``copy.deepcopy``, multiprocessing)
        as its op's name, forced backend and weights: loaded, ``kernelhub.op(name, backend)`` of the receiving
        process's hub, weighted again where it was. A handle of a hub built directly (`kernelhub.hub.Hub`) names
        no hub another process has: refused."""
        if self.hub != 0:
            raise TypeError(f"kernelhub.{self.spec.name}: a handle of a hub built directly (kernelhub.hub.Hub) cannot "
                            "be serialised (another process has no such hub); serialise handles of kernelhub.op")
        return _handle_again, (self.hub_of, self.spec.name, self.backend, self.weights)

    def __repr__(self) -> str:
        forced = f", backend={self.backend!r}" if self.backend else ""
        weighted = "" if self.weights is None else \
            f".weighted({str(self.weights.dtype).removeprefix('torch.')}{list(self.weights.shape)})"
        return f"kernelhub.op({self.spec.name!r}{forced}){weighted}"


def _handle_again(hub_of: Callable, name: str, backend: str, weights: torch.Tensor | None) -> OpHandle:
    """`OpHandle.__reduce__`'s inverse: the handle of the hub ``hub_of`` gives (the global hub's
    `kernelhub.hub.get_hub`, serialised by name), weighted where ``weights`` is given."""
    handle = hub_of().handle(name, backend or None)
    return handle if weights is None else handle.weighted(weights)
