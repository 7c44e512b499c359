"""The selector: which impl serves a call, and why.

Eligible impls are those whose backend is available and not disabled, whose
declared devices and dtypes cover the call, whose ``not_supported_reasons`` is
empty, which are not ``forced_only`` (unless forced) nor ``tuned_only`` (unless
forced, pinned or the tuned winner), which are deterministic where
``torch.use_deterministic_algorithms(True)`` is on (a forced backend that is not
raises then), and which have not raised at call time for this key. Among eligible
impls the order is: a forced backend (``kernelhub.op(name, backend=...)``), else
the op's pin from the config, else the tuned winner for the call's shape bucket
(kernelhub/tune.py; a backend that failed parity there is rejected, and a winner read from the file is
checked against the reference once per process first), else the
priority order of the config (first the order of the call's case, where the op's spec has a `kernelhub.spec.Case`
the call belongs to and the config orders that case). With ``[tune].mode = "online"`` a bucket without a
valid winner is tuned at its first call, except while torch.compile traces or a
CUDA graph is captured: that call uses the priority order and its decision is not
cached, so a later call tunes.

In a torch.compile graph, `Selector.traced` says which impl is traced into the graph in the operator's place (a
forced or pinned backend, the op's own measured order for the call, the config's ``[compile] priority``; traceable
impls only), or none.

Decisions are cached by `call_key`: the op, the forced backend, the deterministic
switch, and for each argument its device, dtype, shape and strides (tensors), its type (floats) or its
value (others). The cache holds at most `MAX_CACHED_DECISIONS` and is dropped when the config or the registry
changes. The eager fast path looks a repeated call up before the spec's checks, by its layout as given
(`remembered`, filled by `remember`: kernelhub/dispatch.py says what it holds); both are dropped together.
"""

from __future__ import annotations

import dataclasses
import warnings
from collections.abc import Callable, Sequence
from typing import Any, NamedTuple

import torch

from kernelhub import lock
from kernelhub._glue import CallPlan
from kernelhub._state import GENERATION
from kernelhub.args import arg_key, describe_args, first_tensor
from kernelhub.config import Config
from kernelhub.errors import LockDriftError, NoImplementationError, StrictModeError
from kernelhub.registry import CONTAINED, Registry
from kernelhub.spec import Impl, OpSpec
from kernelhub.timing import device_model
from kernelhub.tune import Tuning, may_tune_now
from kernelhub.winners import entry_key

__all__ = ["Candidate", "Decision", "Selector", "call_key", "MAX_CACHED_DECISIONS", "GENERATION"]

# a full cache is dropped whole: re-deciding is cheap beside the memory a cache without a bound could take
# (docs/lab/benchmarks-history.md#measurements-behind-the-code)
MAX_CACHED_DECISIONS = 4096


@dataclasses.dataclass(frozen=True)
class Candidate:
    """One backend's fate in a decision: "accepted" (it runs), "lost" or "rejected"."""

    backend: str
    status: str
    reasons: tuple[str, ...] = ()
    lost_to: str | None = None

    def as_dict(self) -> dict:
        return {"backend": self.backend, "status": self.status, "reasons": list(self.reasons), "lost_to": self.lost_to}


@dataclasses.dataclass(frozen=True)
class Decision:
    """The outcome of selection: the chosen backend, the eligible order, and every candidate."""

    op: str
    chosen: str | None
    eligible: tuple[Impl, ...]
    candidates: tuple[Candidate, ...]
    call: str = ""
    output: tuple = ()  # the (shape, dtype, device) the spec promises for this call's forward output
    compiled: str = ""  # what a torch.compile graph runs for the call (`Selector.compiled`), where asked

    def as_dict(self) -> dict:
        return {"op": self.op, "call": self.call, "chosen": self.chosen,
                "candidates": [c.as_dict() for c in self.candidates]} | (
                    {"compiled": self.compiled} if self.compiled else {})

    def __str__(self) -> str:
        lines = [f"{self.op}({self.call}) -> {self.chosen or 'no implementation'}"]
        for c in self.candidates:
            why = "; ".join(c.reasons)
            lines.append(f"  {c.backend:12s} {c.status:8s} {why}")
        if self.compiled:
            lines.append(f"in a torch.compile graph ([compile] priority): {self.compiled}")
        return "\n".join(lines)


def call_key(op: str, args: Sequence[Any], forced: str) -> tuple:
    """The decision-cache key: everything an impl's constraints may depend on (`Impl.not_supported_reasons`: each
    tensor's device, dtype, shape and strides, every argument but a float's value) and whether
    torch.use_deterministic_algorithms is on. No tensor values, no data pointers."""
    return (op, forced, torch.are_deterministic_algorithms_enabled(), *map(arg_key, args))


class Remembered(NamedTuple):
    """What the eager fast path keeps of a layout's calls (`Selector.remember`, read by `kernelhub.dispatch.OpHandle`
    on every eager call)."""
    decision: Decision
    rest: tuple  # the defaults that complete the canonical call (the arguments given are canonical as they are)
    plan: CallPlan  # what the autograd glue keeps of every call of the layout (`kernelhub._glue.plan_call`)
    trusted: set  # the ways of calling whose outputs passed the checks for the layout (`kernelhub.hub.Hub.forward`)


class Selector:
    def __init__(self, registry: Registry, config: Config, handle: Callable[[str, str], Any],
                 hub_key: Callable[[], int] = lambda: 0) -> None:
        self.registry = registry
        self.config = config
        # What a selector keeps (a hub's, so a new hub starts empty); each line: key -> value, who fills it, what
        # empties it. Every entry is dropped where its premise changes, so none serves a call it was not made for.
        # call_key -> decision: `decide`; `forget` (new winners), `mark_failed` (that key), full (all of it)
        self._cache: dict[tuple, Decision] = {}
        # (op, forced, deterministic switch, the call's layout as given) -> (decision, the defaults that complete
        # the canonical call, its `kernelhub._glue.plan_call`, the set of the ways of calling whose results passed
        # the output checks for it: `kernelhub.hub.Hub.forward`'s ``trusted``): `remember`, read by
        # dispatch.OpHandle on every eager call; dropped with `_cache` (`forget`, `mark_failed`, full)
        self.remembered: dict[tuple, Remembered] = {}
        # call_key -> backend -> why it may not serve that key again (it raised): `mark_failed`; never emptied
        self._failed: dict[tuple, dict[str, str]] = {}
        # what was warned about once (a failed backend, a case, a pin, a traced impl): the warnings; never emptied
        self._warned: set[tuple] = set()
        # call_key -> the impl torch.compile traces (None: the operator): `traced`; `not_traceable` (that key),
        # `mark_failed` (that key, where it named the failed backend), full (all of it)
        self._traced: dict[tuple, Impl | None] = {}
        self.tuning = Tuning(registry, config, handle, hub_key)  # hub_key: the hub's `key`, for parity checks
        # ``[lock] file``'s content, read at the first call (`_lock`); device model -> what drifted since the lock
        # there, computed (and warned about) once per device model; never emptied
        self._lock_data: dict | None = None
        self._lock_drift: dict[str, list[str]] = {}

    def decide(self, op: str, args: Sequence[Any], forced: str = "") -> Decision:
        key = call_key(op, args, forced)
        decision = self._cache.get(key)
        if decision is None:
            decision, cacheable = self._decide(op, args, forced, key, tuned=True)
            if cacheable:
                if len(self._cache) >= MAX_CACHED_DECISIONS:  # a program of ever-new shapes: start over
                    self.forget()
                self._cache[key] = decision
        return decision

    def remember(self, memo_key: tuple, args: Sequence[Any], decision: Decision, rest: tuple, plan: CallPlan,
                 trusted: set) -> None:
        """Let later calls of this ``memo_key`` (op, forced, deterministic switch, layout: dispatch.OpHandle's)
        skip the spec's checks and the decision key: ``args`` passed the checks, are canonical as given plus the
        defaults ``rest``, and were decided ``decision``, which is remembered only while it is the cached decision
        of ``args`` (one not cached, made while tuning was impossible, is decided again at the next call); ``plan``
        is what the caller's autograd glue keeps of every call of the layout (`kernelhub._glue.plan_call`);
        ``trusted`` the layout's set of what passed the output checks (`kernelhub.hub.Hub.forward`), filled as its
        calls run."""
        if self._cache.get(call_key(memo_key[0], args, memo_key[1])) is decision:
            if len(self.remembered) >= MAX_CACHED_DECISIONS:
                self.remembered.clear()
            self.remembered[memo_key] = Remembered(decision, rest, plan, trusted)

    def peek(self, op: str, args: Sequence[Any], forced: str = "") -> Decision:
        """The decision for a call without caching a new one: for fake tensors (`kernelhub explain` of a shape too
        large to allocate), which impls' ``not_supported_reasons`` may not see as they would see a real call."""
        key = call_key(op, args, forced)
        decision = self._cache.get(key)
        return decision if decision is not None else self._decide(op, args, forced, key, tuned=True)[0]

    def untuned(self, op: str, args: Sequence[Any]) -> Decision:
        """The decision without tuned winners (what a tuner must time: every eligible backend). Not cached."""
        return self._decide(op, args, "", call_key(op, args, ""), tuned=False)[0]

    def compiled(self, op: str, args: Sequence[Any]) -> str:
        """What a torch.compile graph runs for this call, in words (`traced`): `kernelhub.explain`'s last line."""
        traced = self.traced(op, args)
        return (f"traced into the graph: {traced.backend}" if traced is not None else
                "the operator, which selects when it runs, as above")

    def traced(self, op: str, args: Sequence[Any], forced: str = "") -> Impl | None:
        """The impl that torch.compile traces into its graph for this call (its functions run on the graph's
        functional tensors: `Impl.can` "traceable"), or None, where the graph holds the operator, which selects when it
        runs. The first that can serve the call (stage 1's rejections, `_rejected`: availability, config, devices,
        dtypes, determinism, the impl's own reasons, a raise at call time) of: the forced backend; the pinned one;
        the backends the op's own config orders for this call (its size range's, its case's, its priority: each
        measured fastest where it applies); the config's ``[compile] priority``. Traced where its impl is
        traceable, else None. The global priority and tuned winners (eager timings) order only the operator's
        choice. A call a lock names (``[lock] file``) traces the locked backend, or holds the operator (which serves
        it as locked) where that cannot be traced. The kill switch traces nothing. Cached per `call_key`;
        `GENERATION` changes where a choice may."""
        key = call_key(op, args, forced)
        if key in self._traced:
            return self._traced[key]
        impls, cfg = self.registry.impls(op), self.config.op(op)
        rejected = self._rejected(op, args, forced, key)
        eligible = [n for n in impls if n not in rejected]
        if self.config.lock.file and not forced and not (cfg.pin and cfg.pin in eligible):
            locked, _ = self._locked(op, args, eligible)  # the locked backend traced, else the operator (locked)
            if locked is not None:
                held = impls[locked]
                if len(self._traced) >= MAX_CACHED_DECISIONS:
                    self._traced.clear()
                self._traced[key] = chosen = held if "traceable" in held.can and not self.config.kill_switch \
                    else None
                return chosen
        case, _, size, _ = self._where(op, args)
        order = [forced] if forced else [cfg.pin, *(size[1] if size else ()), *cfg.cases.get(case, ()),
                                          *cfg.priority, *self.config.compile_priority]
        name = next((n for n in order if n in impls and n not in rejected), None)
        impl = impls[name] if name is not None and not self.config.kill_switch else None
        if len(self._traced) >= MAX_CACHED_DECISIONS:
            self._traced.clear()
        self._traced[key] = chosen = impl if impl is not None and "traceable" in impl.can else None
        return chosen

    def not_traceable(self, op: str, args: Sequence[Any], forced: str, exc: BaseException) -> None:
        """Record that tracing this call's impl raised ``exc``: the graph holds the operator for it from now on
        (forward and backward alike). Warns once per op and backend."""
        key = call_key(op, args, forced)
        impl = self._traced.get(key)
        self._traced[key] = None
        if impl is not None and (op, impl.backend, "traced") not in self._warned:
            self._warned.add((op, impl.backend, "traced"))
            warnings.warn(f"kernelhub: {op}: tracing backend {impl.backend!r} into a torch.compile graph raised "
                          f"{type(exc).__name__}: {exc}; the graph calls the operator instead", RuntimeWarning,
                          stacklevel=4)

    def forget(self) -> None:
        """Drop the cached decisions (after new winners were recorded)."""
        self._cache.clear()
        self.remembered.clear()

    def mark_failed(self, op: str, args: Sequence[Any], forced: str, backend: str, exc: BaseException) -> None:
        """Record that ``backend`` raised for this call key; later calls skip it. Warns once."""
        key = call_key(op, args, forced)
        self._failed.setdefault(key, {})[backend] = f"raised at call time: {type(exc).__name__}: {exc}"
        self._cache.pop(key, None)
        traced = self._traced.get(key)
        if traced is not None and traced.backend == backend:
            del self._traced[key]
            GENERATION.bump()  # the graphs that traced this backend for the key recompile, tracing another
        self.remembered.clear()  # keyed by layout, not by call_key: a few calls decide again
        if (op, backend) not in self._warned:
            self._warned.add((op, backend))
            warnings.warn(f"kernelhub: {op}: backend {backend!r} raised {type(exc).__name__}: {exc}; "
                          "falling back to the next eligible backend", RuntimeWarning, stacklevel=4)

    def strict_check(self, message: str) -> None:
        if self.config.strict:
            raise StrictModeError(f"kernelhub (strict mode): {message}")

    def _decide(self, op: str, args: Sequence[Any], forced: str, key: tuple, tuned: bool) -> tuple[Decision, bool]:
        """The decision, and whether it may be cached: five stages, each a method below."""
        impls, spec = self.registry.impls(op), self.registry.spec(op)
        rejected = self._rejected(op, args, forced, key)
        case, elements, size, device = self._where(op, args)
        ordered = self.config.priority_for(op, [n for n in impls if n not in rejected], spec.reference_backend, case,
                                           elements, device)
        pin = self.config.op(op).pin
        whys: dict[str, str] = {}
        note, cacheable, winner = "", True, None
        locked = None
        if self.config.lock.file and not forced and not (pin and pin in ordered):
            locked, reason = self._locked(op, args, ordered)
            note = f" ({reason})" if reason else ""
        if locked is not None:
            ordered, winner = [locked] + [n for n in ordered if n != locked], locked
            whys[locked] = reason
        elif tuned and not forced and not (pin and pin in ordered) and len(ordered) > 1 \
                and self.config.tune.mode != "off":
            ordered, whys, winner, note, cacheable = self._tuned_order(op, args, ordered, rejected)
        if tuned:
            self._drop_tuned_only(op, ordered, rejected, keep={forced, pin, winner})
        text = self.config.op(op).ranges_on(device)[0]
        on = f" on {text} ({device})" if text else ""
        where = ([f"case {case} of {op}"] if case else []) + (
            [(f"{op} calls of >= {size[0]:,} elements{on}, this one {elements:,}" if size[0] > 1 else
              f"{op} calls from the smallest size{on}, this one {elements:,} elements")] if size else [])
        order = ("priority order " + " > ".join(ordered) + (f" ({'; '.join(where)})" if where else "")
                 if ordered else "")
        ordered, why = self._forced_or_pinned(op, args, ordered, rejected, forced, pin, order + note)
        return self._decision(op, args, ordered, rejected, whys, why, forced), cacheable

    def _where(self, op: str, args: Sequence[Any]) -> tuple[str, int | None, tuple[int, tuple[str, ...]] | None, str]:
        """Which of the op's configured orders a call falls under: its case (`_case`, '' where the config orders
        none), its size (`kernelhub.spec.OpSpec.size_of`: its first tensor's elements unless the spec measures it
        otherwise) and its size range on its device (`kernelhub.config.OpConfig.size_range`; None where the op has no
        size ranges), and the device's name where the op has ranges for some devices."""
        cfg = self.config.op(op)
        spec = self.registry.spec(op)
        case = self._case(op, spec, args) if cfg.cases else ""
        device = device_model(first_tensor(args).device) if cfg.device_sizes else ""
        elements = spec.size_of(args) if cfg.sizes or cfg.device_sizes else None
        return case, elements, cfg.size_range(elements, device) if elements is not None else None, device

    def _case(self, op: str, spec: OpSpec, args: Sequence[Any]) -> str:
        """The call's case of the op where the config orders it, else ''. A spec's test that raises (a plugin's)
        leaves the call in no case, with one warning (an error in strict mode)."""
        try:
            case = spec.case_of(args)
        except CONTAINED as exc:
            message = f"{op}: the spec's case test raised {type(exc).__name__}: {exc}; the op's priority decides"
            self.strict_check(message)
            if (op, "case") not in self._warned:
                self._warned.add((op, "case"))
                warnings.warn(f"kernelhub: {message}", RuntimeWarning, stacklevel=6)
            return ""
        return case if case in self.config.op(op).cases else ""

    def _rejected(self, op: str, args: Sequence[Any], forced: str, key: tuple) -> dict[str, list[str]]:
        """Stage 1: why each impl that cannot serve this call cannot (availability, the kill switch, the config,
        declared devices and dtypes, determinism, ``forced_only``, the impl's own ``not_supported_reasons``, a
        raise at call time for this key)."""
        reg, cfg = self.registry, self.config
        first = first_tensor(args)
        device_type, dtype = first.device.type, first.dtype
        reference = reg.spec(op).reference_backend
        failed = self._failed.get(key, {})
        rejected: dict[str, list[str]] = {}
        for name, impl in reg.impls(op).items():
            reasons = []
            unavailable = reg.unavailable_reason(name)
            if unavailable:
                reasons.append(f"backend unavailable: {unavailable}")
            if cfg.kill_switch and name != reference:
                reasons.append(f"kill switch is on: every op runs its reference backend ({reference!r} for {op})")
            if name in cfg.disabled:
                reasons.append("disabled by config" + (f" ({', '.join(cfg.overrides)})" if cfg.overrides else ""))
            reasons += impl.static_reasons(device_type, dtype)
            if not impl.deterministic_on(device_type) and torch.are_deterministic_algorithms_enabled():
                reasons.append("not deterministic (it adds with atomics) and torch.use_deterministic_algorithms "
                               "is on")
            if impl.forced_only and name != forced:
                reasons.append(f"serves only calls that force it: {impl.forced_only}")
            if not reasons:
                try:
                    reasons += impl.not_supported_reasons(args)
                except CONTAINED as exc:
                    reasons.append(f"not_supported_reasons raised {type(exc).__name__}: {exc}")
            if name in failed:
                reasons.append(failed[name])
            if reasons:
                rejected[name] = reasons
        return rejected

    def lock(self) -> dict:
        """``[lock] file``'s content (`kernelhub.lock.read`, once: a malformed file raises its `LockError`)."""
        if self._lock_data is None:
            self._lock_data = lock.read(self.config.lock.file)
        return self._lock_data

    def lock_drift(self, device: torch.device | str) -> list[str]:
        """What drifted between the lock and this process on ``device`` (`kernelhub.lock.drift`); warned about
        once per device model, the first time a call there asks."""
        model = device_model(device)
        if model not in self._lock_drift:
            self._lock_drift[model] = drift = lock.drift_here(self.lock(), self.registry, self.config, device)
            if drift:
                warnings.warn(f"kernelhub: the lock {self.config.lock.file} drifted here: " + "; ".join(drift)
                              + " (`kernelhub lock` writes it again; `kernelhub lock --check` lists this)",
                              RuntimeWarning, stacklevel=6)
        return self._lock_drift[model]

    def _locked(self, op: str, args: Sequence[Any], ordered: list[str]) -> tuple[str | None, str]:
        """Stage 1b: the backend the lock names for this call's bucket, where it can serve it as locked, and the
        reason that says so (or why it was set aside; "" where the lock names none). None where the lock names none
        (another device's lock names none here), or where the environment, that backend or the op drifted since, or
        it cannot serve the call here (an error with ``[lock] strict = true``, else a warning once and the usual
        order)."""
        path = self.config.lock.file
        name = self.lock()["winners"].get(entry_key(op, args))
        drift = self.lock_drift(first_tensor(args).device)
        if name is None:
            return None, ""
        affecting = [d for d in drift
                     if d.startswith(("torch:", "triton:", "cuda:", f"backend {name!r}", f"op {op!r}"))]
        if name not in ordered:
            affecting.append(f"backend {name!r} cannot serve this call here (not installed, unavailable, disabled "
                             "or declining it)")
        if not affecting:
            return name, f"locked: {path} names {name} for this call's shape bucket"
        message = (f"{op}({describe_args(args)}): the lock {path} names backend {name!r} for this call, but "
                   + "; ".join(affecting) + ": run `kernelhub lock` again, or install the locked versions")
        if self.config.lock.strict:
            raise LockDriftError(f"kernelhub: {message}")
        if (op, "lock", name) not in self._warned:
            self._warned.add((op, "lock", name))
            warnings.warn(f"kernelhub: {message}; using the usual order", RuntimeWarning, stacklevel=6)
        return None, f"the lock's {name} set aside: it drifted"

    def _tuned_order(self, op: str, args: Sequence[Any], ordered: list[str], rejected: dict[str, list[str]],
                     ) -> tuple[list[str], dict[str, str], str | None, str, bool]:
        """Stage 2: the priority order ``ordered`` reordered by the tuned entry of this call's bucket (tuned now
        under ``[tune].mode = "online"``), its winner checked in this process; backends that fail parity here
        join ``rejected``. Returns (order, why each is placed, winner, a note for the decision, cacheable)."""
        entry = self.tuning.lookup(op, args, ordered)
        if entry is None and self.config.tune.mode == "online":
            if not may_tune_now(args):
                return ordered, {}, None, " (no winner for this shape bucket; not tuned while tracing or capturing)", \
                    False
            entry = self.tuning.tune_shared(op, args, ordered)
        if entry is None:
            aside = self.tuning.set_aside_entry(op, args, ordered)
            if aside is None:
                return ordered, {}, None, "", True
            entry, why = aside
            winner = entry.get("winner")
            return ordered, {}, None, (f" (the tuned {'winner ' + winner if winner else 'entry'}"
                                       f" of bucket {entry.get('bucket', '?')} set aside: {why}; `kernelhub tune` "
                                       "times every backend again)"), True
        passed, whys, failed_parity, winner = self.tuning.rank(entry, ordered, op, args)
        if passed and not self.tuning.is_verified(op, args, passed[0]) and not may_tune_now(args):
            return ordered, {}, None, (" (the tuned winner is checked in this process first; not while tracing or "
                                       "capturing)"), False
        unverified: dict[str, str] = {}  # recorded as passing parity, failing it in this process
        while passed and (problem := self.tuning.verify(op, args, passed[0])) is not None:
            unverified[passed[0]] = f"recorded as passing parity when tuned, but here it {problem}"
            passed, whys, failed_parity, winner = self.tuning.rank(
                entry, [n for n in ordered if n not in unverified], op, args)
        failed_parity.update(unverified)
        for name, reason in failed_parity.items():
            rejected[name] = [reason]
        ordered = passed + [n for n in ordered if n not in passed and n not in failed_parity]
        # within noise of another, the first placed is no winner: a tuned-only backend among them does not serve
        return ordered, whys, winner, "", True

    def _drop_tuned_only(self, op: str, ordered: list[str], rejected: dict[str, list[str]], keep: set) -> None:
        """Stage 3: a ``tuned_only`` impl serves a call only as the tuned winner, or forced, or pinned."""
        impls = self.registry.impls(op)
        for name in [n for n in ordered if impls[n].tuned_only and n not in keep]:
            ordered.remove(name)
            rejected[name] = [impls[name].tuned_only]

    def _forced_or_pinned(self, op: str, args: Sequence[Any], ordered: list[str], rejected: dict[str, list[str]],
                          forced: str, pin: str, why: str) -> tuple[list[str], str]:
        """Stage 4: a forced backend first (an error if it cannot serve the call), else the op's pin first (a
        warning, or an error in strict mode, if it cannot)."""
        impls = self.registry.impls(op)
        if forced:
            if forced not in impls or forced in rejected:
                reasons = rejected.get(forced, [f"backend {forced!r} has no impl of {op} (impls: {sorted(impls)})"])
                raise NoImplementationError(
                    f"kernelhub: {op}({describe_args(args)}): forced backend {forced!r} cannot serve this call: "
                    + "; ".join(reasons))
            return [forced] + [n for n in ordered if n != forced], \
                f"backend forced by kernelhub.op({op!r}, backend={forced!r})"
        if not pin:
            return ordered, why
        if pin in ordered:
            return [pin] + [n for n in ordered if n != pin], f"pinned by config ({self.config.source}: [ops.{op}].pin)"
        msg = (f"{op}({describe_args(args)}): pinned backend {pin!r} cannot serve this call: "
               + "; ".join(rejected.get(pin, ["it has no impl of this op"])))
        self.strict_check(msg)
        if (op, "pin", pin) not in self._warned:
            self._warned.add((op, "pin", pin))
            warnings.warn(f"kernelhub: {msg}; using priority order", RuntimeWarning, stacklevel=6)
        return ordered, why

    def _decision(self, op: str, args: Sequence[Any], ordered: list[str], rejected: dict[str, list[str]],
                  whys: dict[str, str], why: str, forced: str) -> Decision:
        """Stage 5: the `Decision`: the first of ``ordered`` accepted, the rest lost to it, every rejected impl
        with its reasons, every backend without an impl of the op; and the output the spec promises."""
        reg = self.registry
        impls = reg.impls(op)
        chosen = ordered[0] if ordered else None
        candidates = []
        for name in [*ordered, *sorted(rejected)]:
            if name == chosen:
                candidates.append(Candidate(name, "accepted", (whys.get(name, why),)))
            elif name in rejected:
                candidates.append(Candidate(name, "rejected", tuple(rejected[name])))
            else:
                candidates.append(Candidate(name, "lost", (whys.get(name, why),), lost_to=chosen))
        for name in sorted(reg.backends):
            if name not in impls:
                candidates.append(Candidate(name, "rejected", (f"backend has no impl of {op}",)))
        eligible = tuple(impls[n] for n in (ordered if not forced else [forced]))
        expected = reg.spec(op).output(*args)
        return Decision(op, chosen, eligible, tuple(candidates), describe_args(args),
                        (expected.shape, expected.dtype, expected.device))
