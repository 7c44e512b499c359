"""The registry: op specs, backends and impls, filled by pluggy plugins.

Plugins are found through the entry-point group ``kernelhub.backends`` and loaded
one at a time; a failure is recorded in ``plugin_errors`` and the plugin skipped
(``strict=True`` raises instead). See ``kernelhub/hookspecs.py`` for the contract.
"""

from __future__ import annotations

import dataclasses
import difflib
import hashlib
import importlib
import importlib.metadata
import inspect
import traceback
import types
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

import pluggy

from kernelhub import hookspecs
from kernelhub.config import BackendNames
from kernelhub.errors import PluginValidationError
from kernelhub.spec import CAPABILITIES, Backend, Impl, OpSpec

__all__ = ["Registry", "PluginError", "ENTRY_POINT_GROUP", "declared_backend_names", "FIRST_PARTY_BACKENDS",
           "CONTAINED"]

ENTRY_POINT_GROUP = "kernelhub.backends"

# Names of the project's own backend distributions. A configuration may name them
# even where they are not installed (one config file serves laptop and GPU box);
# any other name must belong to an installed plugin.
FIRST_PARTY_BACKENDS = ("torch_ref", "inductor", "triton", "cuda_ext")
# the distribution whose entry point each first-party backend is (inductor comes with torch_ref's)
FIRST_PARTY_DISTRIBUTIONS = {"torch_ref": "kernelhub-torch-ref", "inductor": "kernelhub-torch-ref",
                             "triton": "kernelhub-triton", "cuda_ext": "kernelhub-cuda-ext"}
OPS_PLUGIN = "kernelhub.ops"  # the plugin that registers kernelhub's own op specs
HOOKS = tuple(n for n in hookspecs.__all__ if n.startswith("kernelhub_"))  # the hooks, in the order they run
CONTAINED = (Exception, SystemExit)  # what a plugin may raise without ending the host program
_SOURCE_SUFFIXES = (".py", ".c", ".cc", ".cpp", ".cu", ".cuh", ".h", ".hpp")


@dataclasses.dataclass(frozen=True)
class PluginError:
    plugin: str
    stage: str  # "import", "register_specs", "register_impls"
    error: str
    traceback: str


def _entry_points() -> list[importlib.metadata.EntryPoint]:
    return sorted(importlib.metadata.entry_points(group=ENTRY_POINT_GROUP), key=lambda ep: ep.name)


def declared_backend_names() -> frozenset[str]:
    """Backend names a configuration may use: installed plugins plus the first-party ones."""
    return frozenset(FIRST_PARTY_BACKENDS) | {ep.name for ep in _entry_points()}


class Registry:
    """Specs, backends and impls. Read through the mapping views; write only from hooks."""

    def __init__(self) -> None:
        self._pm = pluggy.PluginManager("kernelhub")
        self._pm.add_hookspecs(hookspecs)
        self._specs: dict[str, OpSpec] = {}
        self._backends: dict[str, Backend] = {}
        self._backend_plugin: dict[str, str] = {}
        self._impls: dict[str, dict[str, Impl]] = {}
        self._availability: dict[str, str | None] = {}
        self._fingerprints: dict[str, str] = {}
        self._errors: list[PluginError] = []
        self._current_plugin: str | None = None
        self._first_party: set[str] = {OPS_PLUGIN}
        self.specs: Mapping[str, OpSpec] = types.MappingProxyType(self._specs)
        self.backends: Mapping[str, Backend] = types.MappingProxyType(self._backends)
        self.plugin_errors: list[PluginError] = self._errors

    # -- loading -----------------------------------------------------------
    def load(self, extra_plugins: Iterable[tuple[str, object]] = (), strict: bool = False) -> Registry:
        """Register kernelhub's own specs, every installed plugin, and ``extra_plugins`` (name, module).

        kernelhub's own ops and first-party backends load first and keep their names: a third-party entry point
        named like a first-party backend, a plugin name used twice and a third-party backend taking a
        first-party backend's name are the ones skipped, with an error naming them (`plugin_errors`). A plugin
        failure of any kind (``SystemExit`` included, ``KeyboardInterrupt`` not) is contained the same way."""
        plugins: list[tuple[str, object]] = [(OPS_PLUGIN, importlib.import_module(OPS_PLUGIN))]
        first: list[importlib.metadata.EntryPoint] = []
        third: list[importlib.metadata.EntryPoint] = []
        for ep in _entry_points():
            dist = ep.dist.name if ep.dist is not None else "?"
            if ep.name in FIRST_PARTY_BACKENDS and dist != FIRST_PARTY_DISTRIBUTIONS[ep.name]:
                self._record(f"{ep.name} (entry point of {dist})", "import", PluginValidationError(
                    ep.name, f"the entry point of distribution {dist!r} takes the name of kernelhub's own backend "
                             f"(from {FIRST_PARTY_DISTRIBUTIONS[ep.name]!r}); skipped"), strict)
                continue
            (first if ep.name in FIRST_PARTY_BACKENDS else third).append(ep)
        for ep in sorted(first, key=lambda e: FIRST_PARTY_BACKENDS.index(e.name)) + third:
            try:
                plugins.append((ep.name, ep.load()))
            except CONTAINED as exc:  # a broken plugin must never break the host program
                self._record(ep.name, "import", exc, strict)
        plugins.extend(extra_plugins)
        registered = []
        for name, module in plugins:
            if self._pm.has_plugin(name) or self._pm.is_registered(module):
                self._record(f"{name} (a second plugin of that name)", "import", PluginValidationError(
                    name, f"plugin name {name!r} (or its module) is already taken; this one is skipped"), strict)
                continue
            try:
                self._pm.register(module, name=name)
                unknown = _unknown_hooks(self._pm, module)
                if unknown:
                    self._pm.unregister(module)
                    raise PluginValidationError(name, unknown)
                registered.append(name)
            except CONTAINED as exc:
                self._record(name, "import", exc, strict)
        self._first_party = {OPS_PLUGIN, *(e.name for e in first if e.name in registered)}
        failed: set[str] = set()
        for stage in HOOKS:
            for name in registered:
                if name not in failed and not self._call_plugin(name, stage, strict):
                    failed.add(name)
        return self

    def _call_plugin(self, name: str, hook_name: str, strict: bool) -> bool:
        """Run one plugin's hook; False (rolled back, recorded) if it failed."""
        plugin = self._pm.get_plugin(name)
        hook = getattr(self._pm.hook, hook_name)
        impls = [h for h in hook.get_hookimpls() if h.plugin is plugin]
        if not impls:
            return True
        snapshot: tuple[dict[str, Any], ...] = (dict(self._specs), dict(self._backends), dict(self._backend_plugin),
                                      {k: dict(v) for k, v in self._impls.items()})
        self._current_plugin = name
        try:
            for h in impls:
                h.function(registry=self)
        except CONTAINED as exc:
            # roll back whatever this plugin added before failing
            tables: tuple[dict[str, Any], ...] = (self._specs, self._backends, self._backend_plugin, self._impls)
            for table, before in zip(tables, snapshot):
                table.clear()
                table.update(before)
            self._record(name, hook_name.removeprefix("kernelhub_"), exc, strict)
            return False
        finally:
            self._current_plugin = None
        return True

    def _record(self, plugin: str, stage: str, exc: BaseException, strict: bool) -> None:
        if strict:
            raise PluginValidationError(plugin, f"failed at {stage}: {exc}") from exc
        self._errors.append(PluginError(plugin, stage, f"{type(exc).__name__}: {exc}", traceback.format_exc()))

    # -- called from hooks -------------------------------------------------
    def _plugin(self) -> str:
        if self._current_plugin is None:
            raise RuntimeError("registry.add_* may only be called from a kernelhub_* hook")
        return self._current_plugin

    def add_spec(self, spec: OpSpec) -> None:
        plugin = self._plugin()
        if not isinstance(spec, OpSpec):
            raise PluginValidationError(plugin, f"add_spec expects an OpSpec, got {type(spec).__name__}")
        if spec.name in self._specs:
            raise PluginValidationError(plugin, f"op {spec.name!r} is already registered")
        self._specs[spec.name] = spec

    def add_backend(self, backend: Backend) -> None:
        plugin = self._plugin()
        if not isinstance(backend, Backend):
            raise PluginValidationError(plugin, f"add_backend expects a Backend, got {type(backend).__name__}")
        if backend.name in FIRST_PARTY_BACKENDS and plugin not in self._first_party:
            raise PluginValidationError(plugin, f"backend name {backend.name!r} belongs to kernelhub's own backends")
        if backend.name in self._backends:
            raise PluginValidationError(
                plugin, f"backend {backend.name!r} is already registered by {self._backend_plugin[backend.name]!r}")
        self._backends[backend.name] = backend
        self._backend_plugin[backend.name] = plugin

    def add_impl(self, impl: Impl) -> None:
        plugin = self._plugin()
        where = f"impl of op {impl.op!r} by backend {impl.backend!r}"
        if not isinstance(impl, Impl):
            raise PluginValidationError(plugin, f"add_impl expects an Impl, got {type(impl).__name__}")
        spec = self._specs.get(impl.op)
        if spec is None:
            raise PluginValidationError(plugin, f"{where}: unknown op (known: {sorted(self._specs)})")
        if self._backend_plugin.get(impl.backend) != plugin:
            raise PluginValidationError(
                plugin, f"{where}: backend {impl.backend!r} was not declared by this plugin; "
                        "call registry.add_backend(Backend(...)) first")
        bad = [str(d) for d in impl.dtypes if d not in spec.dtypes]
        if bad or not impl.dtypes:
            raise PluginValidationError(
                plugin,
                f"{where}: dtypes {bad or '[]'} not allowed by the spec (allowed: {[str(d) for d in spec.dtypes]})")
        for field in ("forward", "backward", "not_supported_reasons"):
            if not callable(getattr(impl, field)):
                raise PluginValidationError(plugin, f"{where}: {field} is not callable")
        if impl.backend in self._impls.get(impl.op, {}):
            raise PluginValidationError(plugin, f"{where}: registered twice")
        self._impls.setdefault(impl.op, {})[impl.backend] = at_version(spec, impl, plugin)

    # -- queries -----------------------------------------------------------
    def spec(self, op: str) -> OpSpec:
        try:
            return self._specs[op]
        except KeyError:
            raise KeyError(f"kernelhub: unknown op {op!r}; known ops: {sorted(self._specs)}") from None

    def impls(self, op: str) -> Mapping[str, Impl]:
        return types.MappingProxyType(self._impls.get(op, {}))

    def config_names(self) -> frozenset[str]:
        """The backend names settings may use (`kernelhub.config.BackendNames`): every backend registered here, the
        first-party ones (installed or not), and the name of a plugin that failed to load (its backends are unknown);
        with each plugin's backends, for the hint where a setting names a plugin."""
        plugins: dict[str, tuple[str, ...]] = {}
        for backend, plugin in self._backend_plugin.items():
            plugins[plugin] = (*plugins.get(plugin, ()), backend)
        failed = {e.plugin for e in self._errors}
        return BackendNames.of({*self._backends, *FIRST_PARTY_BACKENDS, *failed}, plugins)

    def plugin_of(self, backend: str) -> str | None:
        return self._backend_plugin.get(backend)

    def fingerprint(self, backend: str) -> str:
        """The backend's version plus a digest of its plugin's sources (the files of the package that
        registered it: .py, .cpp, .cu, .h...): what a tuned timing depends on besides torch and the device."""
        if backend not in self._fingerprints:
            module = self._pm.get_plugin(self._backend_plugin[backend])
            file = getattr(module, "__file__", None)
            files: list[Path] = []
            if file:  # a package's module: the whole package; a top-level module: that file
                root = Path(file).parent
                files = sorted(f for f in root.rglob("*") if f.suffix in _SOURCE_SUFFIXES
                               and "__pycache__" not in f.parts) if "." in getattr(module, "__name__", "") \
                    else [Path(file)]
            h = hashlib.sha256()
            for f in files:
                h.update(f.name.encode() + b"\0" + f.read_bytes())
            version = self._backends[backend].version
            self._fingerprints[backend] = f"{version}+{h.hexdigest()[:12]}" if files else version
        return self._fingerprints[backend]

    def unavailable_reason(self, backend: str) -> str | None:
        """None if the backend can run here, else why not (cached; never raises)."""
        if backend not in self._availability:
            b = self._backends.get(backend)
            reason: str | None
            if b is None:
                reason = "not installed" if not any(e.plugin == backend for e in self._errors) else \
                    "plugin failed to load: " + next(e.error for e in self._errors if e.plugin == backend)
            else:
                try:
                    reason = b.unavailable_reason()
                except CONTAINED as exc:
                    reason = f"availability check raised {type(exc).__name__}: {exc}"
            self._availability[backend] = reason
        return self._availability[backend]



def _unknown_hooks(pm: pluggy.PluginManager, module: object) -> str:
    """What is wrong with a plugin's hooks, or '': a hook kernelhub does not define (a misspelling, which pluggy
    would register and never call) or a function named like a hook but not marked ``@kernelhub.hookimpl``."""
    problems = []
    marked = {c.name for c in pm.get_hookcallers(module) or ()}
    for name in sorted(marked - set(HOOKS)):
        near = difflib.get_close_matches(name, HOOKS, n=1)
        problems.append(f"hook {name!r} is not a kernelhub hook" +
                        (f" (did you mean {near[0]!r}?)" if near else f" (the hooks: {', '.join(HOOKS)})"))
    for name in HOOKS:
        if name not in marked and callable(getattr(module, name, None)):
            problems.append(f"{name} is not marked with @kernelhub.hookimpl, so it would never run")
    return "; ".join(problems)


# the keywords the hub passes besides the op's arguments: ``needs``, and the declared capabilities' own
_OWN = frozenset({"needs", *(k for c in CAPABILITIES.values() for k in (*c.forward_kwargs, *c.backward_kwargs))})


def _signature(fn) -> inspect.Signature | None:
    """``fn``'s signature, or None where it takes ``*args`` (it adapts to any call: `kernelhub.spec.lazy`'s
    wrappers, a backend's generic dispatcher) or cannot be read (a builtin)."""
    try:
        sig = inspect.signature(fn)
    except (TypeError, ValueError):
        return None
    if any(p.kind is p.VAR_POSITIONAL for p in sig.parameters.values()):
        return None
    return sig


def inferred_version(spec: OpSpec, impl: Impl) -> int | None:
    """The contract version whose argument count ``impl.forward``'s positional parameters (not counting the
    hub's own keywords, `_OWN`) match; the current version where the signature says nothing (`_signature`);
    None where no version has that many arguments."""
    sig = _signature(impl.forward)
    if sig is None:
        return spec.version
    count = sum(1 for p in sig.parameters.values()
                if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD) and p.name not in _OWN)
    return next((v for v in range(spec.version, 0, -1) if spec.arity(v) == count), None)


def _mismatches(spec: OpSpec, impl: Impl, version: int) -> list[str]:
    """Each of the impl's functions that cannot take contract ``version``'s call as the hub makes it."""
    n = spec.arity(version)
    calls = {"forward": ((None,) * n, {}), "backward": ((None,) * (n + 1), {"needs": None}),
             "not_supported_reasons": ((None,), {})}
    for capability in sorted(impl.can):  # the keywords the hub passes for what the impl declares it can do
        calls["forward"][1].update(dict.fromkeys(CAPABILITIES[capability].forward_kwargs))
        calls["backward"][1].update(dict.fromkeys(CAPABILITIES[capability].backward_kwargs))
    out = []
    for field, (args, kwargs) in calls.items():
        fn = getattr(impl, field)
        sig = _signature(fn)
        if sig is None:
            continue
        try:
            sig.bind(*args, **kwargs)
        except TypeError as exc:
            takes = {"forward": f"the {n} arguments of {spec.name} v{version}",
                     "backward": f"grad, the {n} arguments of {spec.name} v{version} and needs=",
                     "not_supported_reasons": "one argument (the call's arguments)"}[field]
            extra = f" and {', '.join(f'{k}=' for k in kwargs if k != 'needs')}" if set(kwargs) - {"needs"} else ""
            out.append(f"{field}{sig} must take {takes}{extra} ({exc})")
    return out


def at_version(spec: OpSpec, impl: Impl, plugin: str) -> Impl:
    """``impl`` with its contract version resolved (`Impl.version`; `inferred_version` where not given) and its
    functions checked against that version's call; an impl of an older version adapted to today's calls: its
    functions get the arguments of its version, and a call using a later version's arguments is declined with
    a reason naming the version (`OpSpec.beyond`). Raises PluginValidationError naming the plugin, the op, the
    function and the mismatch."""
    where = f"impl of op {spec.name!r} by backend {impl.backend!r}"
    version = impl.version
    if version is None:
        version = inferred_version(spec, impl)
        if version is None:
            counts = ", ".join(f"v{v} has {spec.arity(v)}" for v in range(1, spec.version + 1))
            raise PluginValidationError(plugin, f"{where}: forward{_signature(impl.forward)} takes no version's "
                                                f"arguments ({counts}); declare Impl(version=...)")
    if type(version) is not int or version < 1:
        raise PluginValidationError(plugin, f"{where}: version must be an int from 1, got {version!r}")
    if version > spec.version:
        raise PluginValidationError(plugin, f"{where}: implements {spec.name} v{version}, and this kernelhub knows "
                                            f"{spec.name} up to v{spec.version}; upgrade kernelhub")
    late = [str(d) for d in impl.dtypes if d not in spec.dtypes_at(version)]
    if late:
        raise PluginValidationError(plugin, f"{where}: dtypes {late} came after {spec.name} v{version}")
    wrong = _mismatches(spec, impl, version)
    if wrong:
        raise PluginValidationError(plugin, f"{where}: " + "; ".join(wrong))
    if version == spec.version:
        return dataclasses.replace(impl, version=version)
    n = spec.arity(version)
    forward, backward, why = impl.forward, impl.backward, impl.not_supported_reasons

    def forward_old(*args, **kwargs):
        return forward(*args[:n], **kwargs)

    def backward_old(grad, *args, **kwargs):
        return backward(grad, *args[:n], **kwargs)

    def reasons_old(args):
        return spec.beyond(version, args) or why(tuple(args[:n]))

    return dataclasses.replace(impl, version=version, forward=forward_old, backward=backward_old,
                               not_supported_reasons=reasons_old)
