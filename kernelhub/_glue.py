"""How kernelhub's autograd glue takes a call apart and puts it back (private: the eager fast path's
`torch.autograd.Function` and the operators' autograd formula in `kernelhub.dispatch` use it; a backend author
needs none of it)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, NamedTuple

import torch

from kernelhub.spec import OpSpec


class CallPlan(NamedTuple):
    """What `plan_call` keeps of a call, the same for every call of one layout."""
    others: tuple  # the arguments, each tensor None and each list of tensors its length, other lists as tuples
    positions: tuple  # (argument index, count: None for one tensor) of each tensor argument, in order
    slots: tuple  # (first slot among the glue's inputs, count) of each differentiable argument
    lists: tuple  # the indices of the other list arguments (given back as new lists)
    simple: int | None  # where every argument is one differentiable tensor: the offset of their slots, else None


def plan_call(spec: OpSpec, args: Sequence[Any], offset: int) -> CallPlan:
    """What autograd glue keeps of a call besides its saved tensors, the same for every call of one layout (the
    eager fast path keeps it with the layout's decision): the arguments with each tensor replaced by None and each
    list of tensors by its length; each tensor argument's position and count (None: one tensor); and each
    differentiable argument's first slot among the glue's inputs (its tensors' position in the call, a list's one
    by one, plus ``offset``: the glue's inputs before them) and count; and the positions of the other arguments
    that are lists (kept as tuples: the plan outlives the call, and no call's change to its lists reaches another);
    and, where every argument is one differentiable tensor (trilinear's call, say), ``offset`` (else None): then the
    saved tensors are the call and the slots follow in order, which `put_back` and `to_slots` take as they are
    (a few µs of a small step: docs/lab/benchmarks-history.md#measurements-behind-the-code). `put_back` puts the
    call back, `to_slots` puts its gradients in their slots. The one way every autograd.Function of kernelhub (the
    eager fast path's, the operators' autograd formula) takes a call apart."""
    others = list(args)
    positions, slots, k = [], [], offset
    for i in spec.tensor_args:
        count = None if isinstance(args[i], torch.Tensor) else len(args[i])
        others[i] = count
        positions.append((i, count))
        if i in spec.differentiable:
            slots.append((k, count))
        k += 1 if count is None else count
    lists = tuple(i for i, a in enumerate(others) if type(a) is list)
    for i in lists:
        others[i] = tuple(others[i])
    simple = offset if list(spec.tensor_args) == list(spec.differentiable) == list(range(len(args))) and all(
        count is None for _, count in positions) else None
    return CallPlan(tuple(others), tuple(positions), tuple(slots), lists, simple)


def put_back(plan: CallPlan, saved: Sequence[torch.Tensor], needs_input: Sequence[bool]) -> tuple[list, list[bool]]:
    """The call `plan_call` took apart, from its saved tensors (every tensor of the tensor arguments in order, a
    list's one by one) and new lists where the call had lists, and whether each differentiable argument needs a
    gradient (any of its tensors, by the glue's ``needs_input``; empty: none asked). On every backward's path: one
    loop over the tensor arguments."""
    others, positions, slots, lists, simple = plan
    if simple is not None:  # the saved tensors are the call
        return list(saved), list(needs_input[simple:]) if needs_input else []
    args, k = list(others), 0
    for i in lists:
        args[i] = list(others[i])
    for i, count in positions:
        if count is None:
            args[i] = saved[k]
            k += 1
        else:
            args[i] = list(saved[k:k + count])
            k += count
    if not needs_input:
        return args, []
    return args, [needs_input[s] if c is None else any(needs_input[s:s + c]) for s, c in slots]


def to_slots(plan: CallPlan, needs: Sequence[bool], grads: Sequence[Any], needs_input: Sequence[bool]) -> tuple:
    """A backward's result for autograd: each differentiable argument's gradient (a tensor, or a list for a
    "tensors" argument) in its tensors' slots of the glue's inputs (`plan_call`), None elsewhere and where the
    input asked for none."""
    simple = plan.simple
    if simple is not None:  # the slots follow the call's arguments in order
        if False not in needs:
            return (None,) * simple + tuple(grads)
        return (None,) * simple + tuple([g if need else None for need, g in zip(needs, grads)])
    out: list[Any] = [None] * len(needs_input)
    for (slot, count), need, g in zip(plan.slots, needs, grads):
        if need:
            if count is None:
                out[slot] = g
            else:
                for k, gk in enumerate(g, slot):
                    out[k] = gk if needs_input[k] else None
    return tuple(out)
