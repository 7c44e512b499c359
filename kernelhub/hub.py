"""The hub: one registry, one config, one selector per process, and the run loop with fallback."""

from __future__ import annotations

import contextlib
import dataclasses
import hashlib
import json
import re
import sys
import threading
from collections.abc import Iterable, Iterator, Sequence
from typing import Any

import torch

from kernelhub import _state
from kernelhub._state import GENERATION
from kernelhub.config import ANY_BACKEND, Config, check_config, load_config
from kernelhub.dispatch import OpHandle, define_ops, flatten_grads, weighted_sum
from kernelhub.errors import ConfigError, NoImplementationError, WrongOutputError
from kernelhub.registry import CONTAINED, Registry
from kernelhub.select import Decision, Selector
from kernelhub.spec import OpSpec

__all__ = ["Hub", "get_hub", "reload", "scoped"]


class Hub:
    """Plugins, configuration and selector, and the ops' handles. `get_hub` holds the process's global hub (its
    handles, from `kernelhub.op`, follow `reload`: they run on whichever hub is global at call time); a `Hub`
    built directly runs its own handles, eagerly and through the operators (its `key`, their ``hub`` argument)."""

    def __init__(self, extra_plugins: Iterable[tuple[str, object]] = (), config: Config | None = None) -> None:
        if _state.ENVIRONMENT_ERROR:
            raise ConfigError(_state.ENVIRONMENT_ERROR)
        self.key = next(_state.keys)
        _state.hubs[self.key] = self
        extra_plugins = list(extra_plugins)
        # settings name backends, which are known once the plugins load (one plugin may register several): the
        # configuration is read for its `strict` switch first, and checked against the loaded backends' names after
        first = check_config(config, ANY_BACKEND) if config is not None else load_config(ANY_BACKEND)
        self.registry = Registry().load(extra_plugins, strict=first.strict)
        known = self.registry.config_names()
        self.config = check_config(config, known) if config is not None else load_config(known)
        self.config.check_ops(self.registry.specs)
        self.selector = Selector(self.registry, self.config, self.handle, lambda: self.key)
        self._handles: dict[tuple[str, str], OpHandle] = {}
        for spec in self.registry.specs.values():
            define_ops(spec, _run_forward, _run_backward, _trace)
        self.fingerprint = hashlib.sha1(json.dumps([
            self.config.as_dict(), sorted((b.name, b.version) for b in self.registry.backends.values()),
            sorted((op, name, sorted(impl.can)) for op in self.registry.specs
                   for name, impl in self.registry.impls(op).items())], default=str).encode()).hexdigest()[:16]
        _state.fingerprints[self.key] = self.fingerprint
        _tag_compile_caches()

    def handle(self, name: str, backend: str | None = None) -> OpHandle:
        key = (name, backend or "")
        h = self._handles.get(key)
        if h is None:
            spec = self.registry.spec(name)
            if backend and backend not in self.registry.backends:
                raise NoImplementationError(
                    f"kernelhub.op({name!r}, backend={backend!r}): backend not available: "
                    f"{self.registry.unavailable_reason(backend)} (registered: {sorted(self.registry.backends)})")
            overload = define_ops(spec, _run_forward, _run_backward, _trace)
            if self.key == GLOBAL:
                h = OpHandle(spec, overload, backend or "", get_hub)
            else:
                h = OpHandle(spec, overload, backend or "", lambda: self, hub=self.key)
            self._handles[key] = h
        return h

    def explain(self, name: str, *args: Any, **kwargs: Any) -> Decision:
        call = self.registry.spec(name).canonical(*args, **kwargs)
        return dataclasses.replace(self.selector.decide(name, call), compiled=self.selector.compiled(name, call))

    def _next(self, op: str, args: Sequence[Any], forced: str, decision: Decision, impl: Any,
              exc: BaseException) -> Decision:
        """After ``impl`` (the decision's first) raised ``exc`` or returned a wrong result: re-raise where nothing
        may take over (a forced backend, the only eligible one; sys.exit as a RuntimeError), else mark it failed for
        the call's key (strict mode raises instead) and return the decision that falls back to the next."""
        if forced or len(decision.eligible) == 1:
            if isinstance(exc, SystemExit):
                raise RuntimeError(f"kernelhub: {op}: backend {impl.backend!r} called sys.exit({exc.code!r})") from exc
            raise exc
        self.selector.strict_check(f"{op}: backend {impl.backend!r} raised {type(exc).__name__}: {exc} (would fall "
                                   f"back to {decision.eligible[1].backend!r})")
        self.selector.mark_failed(op, args, forced, impl.backend, exc)
        return self.selector.decide(op, args, forced)

    def run_forward(self, op: str, args: Sequence[Any], forced: str) -> torch.Tensor:
        return self.forward(op, args, forced)[1]

    def forward(self, op: str, args: Sequence[Any], forced: str, *, decision: Decision | None = None,
                weights: torch.Tensor | None = None, keep: list | None = None,
                trusted: set | None = None) -> tuple[Decision, torch.Tensor]:
        """The decision that served the call, and the checked output: the first eligible impl's of ``decision``
        (the selector's for the call where not given), falling back past each that raises or returns a wrong
        output (`_next`). Every eager call runs this loop; it is written out (no closure, no wrapper per call)
        because its cost is the hub's per-call cost. ``weights`` (a weighted handle's, checked against the
        output by the caller): the output's 0-d weighted sum instead, the impl's own where it fuses them
        (`Impl.can` "weighted"), else the checked output weighed in torch ops. ``keep`` (a list, for a call whose
        backward follows): an impl that saves for its backward (`Impl.can` "saves") is called so, and (impl, saved)
        appended once its output passed the check, for `backward_grads`. ``trusted`` (the eager fast path's, one
        set per remembered layout: `kernelhub.dispatch`): the (backend, way of calling) whose output passed the
        check for this layout; such an output is not checked again (None: every output is checked)."""
        if _autocast_on():  # docs/ops.md, "Autocast": an op computes in its inputs' dtype
            with _no_autocast():
                return self.forward(op, args, forced, decision=decision, weights=weights, keep=keep, trusted=trusted)
        if decision is None:
            decision = self.selector.decide(op, args, forced)
        while True:
            impl = _first(decision)
            try:
                saved = None
                fused = weights is not None and "weighted" in impl.can
                if fused:
                    out = impl.forward(*args, weights=weights)
                    way = (impl.backend, "weighted")
                elif keep is not None and "saves" in impl.can:
                    out, saved = impl.forward(*args, saving=True)
                    way = (impl.backend, "saving")
                else:
                    out = impl.forward(*args)
                    way = impl.backend
                if trusted is None or way not in trusted:
                    _check_output(self.registry.spec(op), impl.backend, out,
                                  (_SCALAR, *decision.output[1:]) if fused else decision.output, args)
                    _trust(trusted, way)
                if saved is not None:  # set only where keep is a list
                    keep.append((impl, saved))  # type: ignore[union-attr]
                if weights is not None and not fused:
                    return decision, weighted_sum(out, weights)
                # outputs are contiguous, as the fake implementations promise torch.compile
                return decision, out.contiguous()
            except CONTAINED as exc:
                decision = self._next(op, args, forced, decision, impl, exc)

    def run_backward(self, op: str, grad: torch.Tensor, args: Sequence[Any], needs: Sequence[bool],
                     forced: str) -> list[torch.Tensor]:
        """The backward operator's flat gradients (`backward_grads`, flattened)."""
        return flatten_grads(self.registry.spec(op), args, needs, self.backward_grads(op, grad, args, needs, forced))

    def backward_grads(self, op: str, grad: torch.Tensor, args: Sequence[Any], needs: Sequence[bool],
                       forced: str, *, decision: Decision | None = None,
                       weights: torch.Tensor | None = None, saved: tuple | None = None,
                       trusted: set | None = None) -> list[Any]:
        """One entry per differentiable argument (a tensor, a list for a "tensors" one, None where not needed),
        checked against the arguments, from the backend that ran the forward: ``decision``'s first eligible where
        the forward's decision is given (the eager fast path), else the one the selector picks for the call.
        ``weights`` (a weighted handle's; ``grad`` then the weighted sum's, 0-d): an impl that fuses them takes
        them as they are, the others the op's upstream gradient ``conj(weights) * grad``. ``saved``: the
        forward's (impl, saved) (`forward`'s ``keep``), given to that impl's backward only. ``trusted``: as
        `forward`'s, for the gradients (keyed by the backend, the way it was called, the upstream gradient's strides
        and ``needs``)."""
        if _autocast_on():
            with _no_autocast():
                return self.backward_grads(op, grad, args, needs, forced, decision=decision, weights=weights,
                                           saved=saved, trusted=trusted)
        if decision is None:
            decision = self.selector.decide(op, args, forced)
        while True:
            impl = _first(decision)
            try:
                if weights is not None and "weighted" in impl.can:  # such a forward saved nothing
                    grads = impl.backward(grad, *args, needs=needs, weights=weights)
                    way = (impl.backend, "weighted", grad.stride(), *needs)
                else:
                    g = grad if weights is None else weights.conj() * grad
                    if saved is not None and saved[0] is impl:
                        grads = impl.backward(g, *args, needs=needs, saved=saved[1])
                        way = (impl.backend, "saved", grad.stride(), *needs)
                    else:
                        grads = impl.backward(g, *args, needs=needs)
                        way = (impl.backend, "backward", grad.stride(), *needs)
                if trusted is None or way not in trusted:
                    _check_grads(self.registry.spec(op), impl.backend, grads, args, needs, grad)
                    _trust(trusted, way)
                return grads
            except CONTAINED as exc:
                decision = self._next(op, args, forced, decision, impl, exc)


_SCALAR = torch.Size([])  # a fused weighted sum's shape (`Hub.forward`)


def _trust(trusted: set | None, way: Any) -> None:
    """Note in ``trusted`` (a remembered layout's, `Hub.forward`; None: none kept) that ``way`` (a backend and how
    it was called) returned what the checks want for this layout. What they check (shape, dtype, device, no
    memory shared with the call) is the impl's for a layout as a whole, as the spec's checks of the arguments are,
    which a remembered call skips too; a wrong result on a layout's first call is never trusted."""
    if trusted is not None:
        trusted.add(way)


_any_autocast = getattr(torch._C, "_is_any_autocast_enabled", lambda: True)  # one C call on every hub call
_AUTOCAST_DEVICES = ("cpu", "cuda")  # the devices kernelhub's backends serve


def _autocast_on() -> bool:
    """Whether autocast is on for a device kernelhub serves (false once `_no_autocast` is entered)."""
    return _any_autocast() and any(torch.is_autocast_enabled(d) for d in _AUTOCAST_DEVICES)


def _no_autocast() -> contextlib.ExitStack:
    """A context in which autocast is off on the devices kernelhub serves: impls compute in their inputs' dtype
    under ``torch.autocast`` as outside it, the reference too (docs/ops.md, "Autocast")."""
    stack = contextlib.ExitStack()
    for device in _AUTOCAST_DEVICES:
        if torch.is_autocast_enabled(device):
            stack.enter_context(torch.autocast(device, enabled=False))
    return stack


def _first(decision: Decision) -> Any:
    """The impl that runs a decision: its first eligible."""
    if decision.chosen is None:
        raise NoImplementationError(f"kernelhub: no implementation can serve this call:\n{decision}")
    return decision.eligible[0]


def _check_output(spec: OpSpec, backend: str, out: Any, expected: tuple, args: Sequence[Any]) -> None:
    """`_check_result` for a forward's output, its common case written out: a plain tensor of the expected
    (shape, dtype, device) whose storage is none of the tensor arguments' (`_storage`) passes with a few attribute
    reads; anything else gets `_check_result`'s verdict."""
    shape, dtype, device = expected
    if type(out) is torch.Tensor and out.shape == shape and out.dtype == dtype and out.device == device:
        try:
            mine = _storage(out)
            for i in spec.tensor_args:
                a = args[i]
                if mine in map(_storage, a) if type(a) is list else mine == _storage(a):
                    break
            else:
                return
        except _NO_STORAGE:
            pass
    _check_result(spec, backend, "an output", out, expected, args)


def _check_grads(spec: OpSpec, backend: str, grads: Sequence[Any], args: Sequence[Any], needs: Sequence[bool],
                 grad: torch.Tensor) -> None:
    """Raise WrongOutputError unless ``grads`` holds one entry per differentiable argument, each needed one a new
    tensor (or list of them) of its argument's shape, dtype and device (`_check_result`). The common case written
    out, as in `_check_output`: a plain tensor of its argument's shape, dtype and device whose storage is none of
    the call's tensors' or the upstream gradient's (`_storages`, read once per backward) passes without
    `_check_result`. The checks were most of the hub's cost over a minimal autograd.Function's
    (docs/lab/benchmarks-history.md#measurements-behind-the-code)."""
    if len(grads) != len(spec.differentiable):
        raise WrongOutputError(f"kernelhub: {spec.name}: backend {backend!r} returned {len(grads)} gradients, "
                               f"the op has {len(spec.differentiable)} differentiable arguments")
    taken: set[int] | None = None
    for i, need, g in zip(spec.differentiable, needs, grads):
        if not need:
            continue
        arg = args[i]
        if type(arg) is list:  # a "tensors" argument: a list of gradients
            if not isinstance(g, (list, tuple)) or len(g) != len(arg):
                raise WrongOutputError(f"kernelhub: {spec.name}: backend {backend!r} returned "
                                       f"{len(g) if isinstance(g, (list, tuple)) else type(g).__name__} gradients "
                                       f"for {spec.args[i].name!r}, which holds {len(arg)} tensors")
            pairs: Iterable[tuple[Any, Any, int | None]] = zip(arg, g, range(len(arg)))
        else:
            pairs = ((arg, g, None),)
        for t, gt, j in pairs:
            if type(gt) is torch.Tensor and gt.shape == t.shape and gt.dtype == t.dtype and gt.device == t.device:
                try:
                    if taken is None:
                        taken = _storages(spec, args, grad)
                    if _storage(gt) not in taken:
                        continue
                except _NO_STORAGE:
                    pass
            _check_result(spec, backend, (spec.args[i].name, j), gt, (t.shape, t.dtype, t.device), args, grad)


def _storages(spec: OpSpec, args: Sequence[Any], grad: torch.Tensor) -> set[int]:
    """`_storage` of the call's tensors and of the upstream gradient (raises what `_storage` raises)."""
    taken = {_storage(grad)}
    for i in spec.tensor_args:
        a = args[i]
        if type(a) is list:
            taken.update(map(_storage, a))
        else:
            taken.add(_storage(a))
    return taken


def _storage_of(t: torch.Tensor) -> int:
    return t.untyped_storage()._cdata


# which storage a tensor's memory is (a view shares its base's); raises for a tensor without one (sparse, say):
# then `_check_result` decides. torch._C._storage_address reads it without making a Python storage object (with
# the rest of `_check_output` and `_check_grads`, cheaper than one `_is_alias_of` per pair:
# docs/lab/benchmarks-history.md#measurements-behind-the-code); its fallback reads the same.
_storage = getattr(torch._C, "_storage_address", _storage_of)
_NO_STORAGE = (RuntimeError, NotImplementedError, TypeError)


def _check_result(spec: OpSpec, backend: str, what: str | tuple, out: Any, expected: tuple, args: Sequence[Any],
                  grad: torch.Tensor | None = None) -> None:
    """Raise WrongOutputError unless ``out`` is a tensor of the expected (shape, dtype, device) that shares no
    memory with a tensor argument (or the upstream gradient): the operators promise torch.compile new tensors, and
    a caller's input must never come back as a result. ``what``: "an output", or (argument name, index in its list
    or None) for a gradient (`_words`). A call checks its output and gradients (an eager fast path's layout once
    per way of calling: `Hub.forward`'s ``trusted``), the common case in
    `_check_output` and `_check_grads` (an output or gradient whose storage is none of the call's tensors'); this
    gives the verdict on the rest, with one `torch._C._is_alias_of` per tensor argument."""
    if not (isinstance(out, torch.Tensor) and (out.shape, out.dtype, out.device) == expected):
        got = (f"{str(out.dtype).removeprefix('torch.')}{list(out.shape)}@{out.device}"
               if isinstance(out, torch.Tensor) else type(out).__name__)
        shape, dtype, device = expected
        raise WrongOutputError(f"kernelhub: {spec.name}: backend {backend!r} returned {_words(what)} {got}; the spec "
                               f"says {str(dtype).removeprefix('torch.')}{list(shape)}@{device}")
    for i in spec.tensor_args:
        a = args[i]
        if any(_is_alias_of(out, t) for t in a) if type(a) is list else _is_alias_of(out, a):
            raise WrongOutputError(f"kernelhub: {spec.name}: backend {backend!r} returned {_words(what)} sharing "
                                   f"memory with argument {spec.args[i].name!r}; an op returns new tensors")
    if grad is not None and _is_alias_of(out, grad):
        raise WrongOutputError(f"kernelhub: {spec.name}: backend {backend!r} returned {_words(what)} sharing memory "
                               "with the upstream gradient; an op returns new tensors")


_is_alias_of = torch._C._is_alias_of  # type: ignore[attr-defined]  # whether two tensors share a storage


def _words(what: str | tuple) -> str:
    """What the checks name in an error: ``what`` itself, or for a gradient's (argument name, index in its list or
    None) "a gradient of 'name'[j]" (built only for the error: the checks run on many calls)."""
    if isinstance(what, str):
        return what
    name, j = what
    return f"a gradient of {name!r}" + ("" if j is None else f"[{j}]")


GLOBAL = 0  # the operators' ``hub`` argument for the global hub (`kernelhub._state` holds the hubs)


def _global(hub: Hub | None, fingerprint: str | None = None) -> Hub | None:
    """Make ``hub`` the global one (None: none, built again at its next use): its handles then follow `get_hub`
    (key `GLOBAL`). A hub built for this takes the key; one put back (`scoped`) has it and its ``fingerprint``."""
    if hub is not None and hub.key != GLOBAL:
        del _state.hubs[hub.key]
        fingerprint = _state.fingerprints.pop(hub.key)
        hub.key = GLOBAL
    if _state.fingerprints.get(GLOBAL) != fingerprint:  # compiled graphs recompile (a hub built directly is in none)
        GENERATION.bump()
    if fingerprint is None:
        _state.fingerprints.pop(GLOBAL, None)
    else:
        _state.fingerprints[GLOBAL] = fingerprint
    _state.hub = hub
    _tag_compile_caches()
    return hub


_TAG = re.compile(r"kernelhub-[0-9a-f]{16};")


def _tag_compile_caches() -> None:
    """Put the hubs' state into ``torch.compiler.config.cache_key_tag`` (after the user's own tag), which keys
    torch.compile's caches on disk: a graph whose operators were traced into impls (`_trace`) is reused only by a
    process whose hubs would trace the same (the same config, plugins and versions); dynamo's guards
    (`kernelhub._state.GENERATION`) do the same within a process. Torch without the tag: no change."""
    config = getattr(torch.compiler, "config", None)
    if config is None or not isinstance(getattr(config, "cache_key_tag", None), str):
        return
    for key in [k for k in _state.fingerprints if k != GLOBAL and k not in _state.hubs]:  # hubs gone
        del _state.fingerprints[key]
    state = hashlib.sha1(json.dumps(sorted(_state.fingerprints.items())).encode()).hexdigest()[:16]
    config.cache_key_tag = _TAG.sub("", config.cache_key_tag) + f"kernelhub-{state};"


def get_hub() -> Hub:
    hub = _state.hub
    if hub is not None:
        return hub
    if torch.compiler.is_compiling():  # dynamo cannot trace the lock or the plugins' loading
        raise RuntimeError("kernelhub: the hub is built at its first use outside torch.compile: call "
                           "kernelhub.get_hub() (or kernelhub.op(...)) once before the compiled function runs")
    _build_global()
    return _state.hub


def _build_global() -> None:
    """Build the global hub, not compiled either where dynamo, without fullgraph, resumes eagerly past the raise
    above (`torch.compiler.disable`; only where dynamo is imported: a process that never compiled has no dynamo to
    disable, and its import is a large part of an eager program's start)."""
    if "torch._dynamo" in sys.modules:
        torch.compiler.disable(_build_global_now)()
    else:
        _build_global_now()


def _build_global_now() -> None:
    with _state.lock:
        if _state.hub is None:
            _global(Hub())


def reload(extra_plugins: Iterable[tuple[str, object]] = (), config: Config | None = None) -> Hub:
    """Rebuild the hub: re-read the config, reload plugins, drop cached decisions."""
    with _state.lock:
        hub = Hub(extra_plugins, config)
        _global(hub)
        return hub


@contextlib.contextmanager
def scoped(extra_plugins: Iterable[tuple[str, object]] = (), config: Config | None = None) -> Iterator[Hub]:
    """A global hub of its own for the block (the config and plugins as `reload` reads them, or those given), and
    afterwards the global hub of before it back, as it was (or none, built at its next use): for tests, and for a
    program that runs a part under another config. Handles of `kernelhub.op` follow it, as they follow `reload`;
    a `reload` inside the block lasts until the block ends. Compiled graphs recompile on entry and exit where the
    hubs' configs or plugins differ. The global hub is the process's: blocks nest within one thread, and a block
    entered while another thread's is open raises (their exits would restore each other's hubs out of order, and
    the last one's override would outlive both); a thread of its own takes a `Hub` and its handles."""
    me = threading.get_ident()
    with _state.lock:
        if _state.scopes and _state.scopes[-1] != me:
            raise RuntimeError(
                "kernelhub.scoped: another thread has a scoped block open, and the global hub is the process's: "
                "blocks in two threads would overlap (each exit restoring the hub of before its own entry). Use "
                "kernelhub.hub.Hub(extra_plugins, config) in a thread that needs its own config, and its "
                "handle(op) for the calls (docs/user-guide.md, section 4)")
        before, fingerprint = _state.hub, _state.fingerprints.get(GLOBAL)
        hub = Hub(extra_plugins, config)
        _global(hub)
        _state.scopes.append(me)
    try:
        yield hub
    finally:
        with _state.lock:
            _state.scopes.pop()
            _global(before, fingerprint)


def _hub(key: int) -> Hub:
    """The hub an operator call names (`GLOBAL`: the global one)."""
    if key == GLOBAL:
        return get_hub()
    hub = _state.hubs.get(key)
    if hub is None:
        raise RuntimeError(f"kernelhub: an operator call names hub {key}, which no longer exists (a kernelhub.Hub "
                           "built directly must outlive the graphs and handles that use it)")
    return hub


def _run_forward(op, args, backend, hub):
    return _hub(hub).run_forward(op, args, backend)


def _run_backward(op, grad, args, needs, backend, hub):
    return _hub(hub).run_backward(op, grad, args, needs, backend)


def _trace(op, args, backend, hub, grad, needs):
    """On a torch.compile graph's tensors, for the impl the hub traces into the graph for this call
    (`kernelhub.select.Selector.traced`): its output (``grad`` None), or the backward operator's flat gradients
    (`kernelhub.dispatch.flatten_grads`) for ``grad`` and ``needs``, with autocast off and the output or gradients
    checked as a call's are (`_check_output`, `_check_grads`). None where there is no such impl, or where it
    raised or gave a wrong result (`Selector.not_traceable`: the graph holds the operator)."""
    selector = _hub(hub).selector
    impl = selector.traced(op, args, backend)
    if impl is None:
        return None
    spec = selector.registry.spec(op)
    try:
        with _no_autocast():
            if grad is None:
                out = impl.forward(*args)
                promised = spec.output(*args)
                _check_output(spec, impl.backend, out, (promised.shape, promised.dtype, promised.device), args)
                return out.contiguous()
            grads = impl.backward(grad, *args, needs=needs)
            _check_grads(spec, impl.backend, grads, args, needs, grad)
            return flatten_grads(spec, args, needs, grads)
    except CONTAINED as exc:
        selector.not_traceable(op, args, backend, exc)
        return None
