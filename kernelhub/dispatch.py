"""One torch.library operator per op, with selection inside it at run time.

For each spec two operators are defined:

- ``kernelhub::<op>(<args>, str backend) -> Tensor``: the forward. ``backend`` is ''
  to let the selector choose, or the backend forced by ``kernelhub.op(op, backend=...)``.
- ``kernelhub::<op>_backward(Tensor grad, <args>, bool[] needs, str backend) -> Tensor[]``:
  one gradient per differentiable argument (a "tensors" argument contributes one per
  element); an argument whose ``needs`` is False gets an empty placeholder.

The forward's autograd formula calls the backward operator, which selects again with
the same key and so reaches the backend that ran the forward. Both have fake
implementations from the spec, so ``torch.compile(fullgraph=True)`` sees two opaque
nodes and never breaks the graph.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import torch

from kernelhub.spec import OpSpec

__all__ = ["define_ops", "OpHandle", "NAMESPACE"]

NAMESPACE = "kernelhub"
_DEFINED: dict[str, tuple[Any, Any]] = {}


def _placeholders(spec: OpSpec, args: Sequence[Any], needs: Sequence[bool]) -> list[torch.Tensor]:
    """Fake gradients: the shape of each needed differentiable input, else an empty tensor."""
    out = []
    for i, need in zip(spec.differentiable, needs):
        arg = args[i]
        tensors = arg if isinstance(arg, (list, tuple)) else [arg]
        for t in tensors:
            out.append(torch.empty_like(t, memory_format=torch.contiguous_format) if need else t.new_empty((0,)))
    return out


def flatten_grads(spec: OpSpec, args: Sequence[Any], needs: Sequence[bool], grads: Sequence[Any]) -> list[torch.Tensor]:
    """An impl's per-argument gradients -> the backward operator's flat Tensor[] output."""
    flat = []
    for i, need, g in zip(spec.differentiable, needs, grads):
        arg = args[i]
        if isinstance(arg, (list, tuple)):
            flat += [x.contiguous() if need else t.new_empty((0,)) for x, t in zip(g if need else arg, arg)]
        else:
            flat.append(g.contiguous() if need else arg.new_empty((0,)))
    return flat


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
        return run_forward(name, args[:n], args[n])

    def backward_kernel(grad, *rest):
        args, needs, backend = rest[:n], rest[n], rest[n + 1]
        return run_backward(name, grad, args, needs, backend)

    fwd = torch.library.custom_op(f"{NAMESPACE}::{name}", forward, mutates_args=(), schema=spec.schema())
    bwd = torch.library.custom_op(f"{NAMESPACE}::{name}_backward", backward_kernel, mutates_args=(),
                                  schema=spec.backward_schema())
    fwd.register_fake(lambda *args: spec.output(*args[:n]))
    bwd.register_fake(lambda grad, *rest: _placeholders(spec, rest[:n], rest[n]))

    tensor_pos = [i for i, a in enumerate(spec.args) if a.is_tensor]

    def setup_context(ctx, inputs, output):
        args = inputs[:n]
        ctx.backend = inputs[n]
        ctx.needs = [any(t.requires_grad for t in (args[i] if isinstance(args[i], (list, tuple)) else [args[i]]))
                     for i in spec.differentiable]
        flat, ctx.layout = [], []
        for i in tensor_pos:
            group = list(args[i]) if isinstance(args[i], (list, tuple)) else [args[i]]
            ctx.layout.append((i, len(group), isinstance(args[i], (list, tuple))))
            flat += group
        ctx.save_for_backward(*flat)
        ctx.others = {i: a for i, a in enumerate(args) if i not in tensor_pos}

    def autograd_backward(ctx, grad):
        saved = list(ctx.saved_tensors)
        args: list[Any] = [None] * n
        for i, a in ctx.others.items():
            args[i] = a
        pos = 0
        for i, count, is_list in ctx.layout:
            args[i] = saved[pos:pos + count] if is_list else saved[pos]
            pos += count
        flat = bwd(grad, *args, ctx.needs, ctx.backend)
        result: list[Any] = [None] * (n + 1)
        pos = 0
        for i, need in zip(spec.differentiable, ctx.needs):
            count = len(args[i]) if isinstance(args[i], list) else 1
            if need:
                result[i] = list(flat[pos:pos + count]) if isinstance(args[i], list) else flat[pos]
            pos += count
        return tuple(result)

    fwd.register_autograd(autograd_backward, setup_context=setup_context)
    overload = getattr(getattr(torch.ops, NAMESPACE), name).default
    _DEFINED[name] = (overload, getattr(getattr(torch.ops, NAMESPACE), f"{name}_backward").default)
    return overload


class OpHandle:
    """The callable returned by ``kernelhub.op(name)``: normalises arguments, calls the operator."""

    __slots__ = ("spec", "backend", "_overload")

    def __init__(self, spec: OpSpec, overload: Any, backend: str = "") -> None:
        self.spec = spec
        self.backend = backend
        self._overload = overload

    def __call__(self, *args: Any, **kwargs: Any) -> torch.Tensor:
        return self._overload(*self.spec.normalize(*args, **kwargs), self.backend)

    @property
    def doc(self) -> str:
        return self.spec.doc

    def __repr__(self) -> str:
        forced = f", backend={self.backend!r}" if self.backend else ""
        return f"kernelhub.op({self.spec.name!r}{forced})"
