"""Auto-tuning: time every eligible impl of an op on one call's shapes, check its parity, keep the winner.

The winners are kept in a file (`kernelhub.winners`: its format, and how it is read and written).

An entry records torch's version and, per backend timed, its fingerprint (version plus a digest of its
sources, `Registry.fingerprint`), its median forward and forward+backward times, and its parity outcome.
It serves a call only while torch is the same and every backend now eligible for the call was timed
with its current fingerprint, so a new or changed backend invalidates only the entries of the ops it
implements. Among the eligible backends that passed parity the fastest forward+backward wins (the
backward always runs on the backend that ran the forward, so one winner serves both passes), but only by more
than the noise (`within_noise`: each time's spread, at least `NOISE_FLOOR`); where the fastest are within noise
of each other no winner is recorded, the priority order stands among them (a tuned-only backend among them,
inductor, is set aside: it serves a call only as the winner), and `explain` says so. Tuning a bucket
again warns when the winner changed. A backend
that failed parity on the bucket (and fails it in this process too) is never chosen for it; one that raised
while tuned is only never its winner.

Parity is judged with `kernelhub.parity.call_tolerance` on the tuned call's own inputs (the spec's
tolerances, measured on small samples, widened where eager torch's own error at this size is larger); the
spec's reference backend is the judge and is never rejected for parity.

Timing: the first call (a backend that compiles, such as inductor, compiles then) is timed on its own
and recorded as ``first_call_s``, never mixed into the median after warm-up, which goes through the
hub's operator with the backend forced (each pays the same dispatch cost), by `kernelhub.timing.timed`.
Parity: forward and backward against the float64 reference on the same fresh random inputs, within the call's
tolerance (above).

A file can reorder the backends that pass parity here, never remove one: a backend recorded as failing parity is
set aside for that bucket (a file may be copied from elsewhere: it is set aside only after failing here too, see
`Tuning.verify`), the spec's reference backend never, and a backend recorded as having raised while tuned (an
out-of-memory, a transient fault) only loses its place as a winner.
"""

from __future__ import annotations

import datetime
import time
import warnings
from collections.abc import Callable, Sequence
from typing import Any

import torch

from kernelhub.args import bucket, describe_args, first_tensor, map_tensors
from kernelhub.parity import call_tolerance, parity_error, reference_with_upstream, run
from kernelhub.timing import device_model, timed
from kernelhub.winners import WinnerCache, entry_key

__all__ = ["Tuning", "may_tune_now", "within_noise", "NOISE_FLOOR"]

NOISE_FLOOR = 0.05  # the least relative noise a timing is taken to have: runs move more than one run's repeats
FAILED_PARITY = "failed parity"  # how a candidate's error starts when it ran but disagreed with the reference
SHARED_TUNE_WAIT_S = 900.0  # how long online tuning waits for another process tuning under the file's lock


def may_tune_now(args: Sequence[Any]) -> bool:
    """False while torch.compile traces or a CUDA graph is being captured (timing would break either)."""
    if torch.compiler.is_compiling():
        return False
    t = first_tensor(args)
    if isinstance(t, torch._subclasses.fake_tensor.FakeTensor) or t.device.type == "meta":
        return False
    return not (t.device.type == "cuda" and torch.cuda.is_current_stream_capturing())


def _fresh(args: Sequence[Any], seed: int = 0) -> tuple:
    """Random tensors with the shapes, strides, dtypes and devices of ``args``; other arguments as given. A layout
    whose elements share memory (a stride-0, expanded dim) is kept: a random buffer of the memory it spans, viewed
    with its strides (writing random values into such a layout itself would raise)."""
    gen: dict[torch.device, torch.Generator] = {}

    def fresh(t):
        if not (t.is_floating_point() or t.is_complex()):
            return t
        g = gen.setdefault(t.device, torch.Generator(device=t.device).manual_seed(seed))
        span = 1 + sum((n - 1) * st for n, st in zip(t.shape, t.stride())) if t.numel() else 0
        return torch.empty(span, dtype=t.dtype, device=t.device).normal_(generator=g).as_strided(t.size(),
                                                                                                 t.stride())

    return map_tensors(args, fresh)


def within_noise(cands: dict[str, dict]) -> list[str]:
    """The candidates that passed whose forward+backward time is within noise of the fastest's, fastest first: the
    relative gap at most the larger spread of the two (`kernelhub.timing.Timing`), and at least `NOISE_FLOOR`. One
    name: a clear winner; several: none, the priority order stands among them; none: nothing passed."""
    ok = sorted((n for n, c in cands.items() if c["error"] is None), key=lambda n: cands[n]["step_ms"])
    if not ok:
        return []
    noise = lambda n: max(cands[n].get("step_spread", 0.0), NOISE_FLOOR)  # noqa: E731
    best = cands[ok[0]]["step_ms"]
    return [n for n in ok if cands[n]["step_ms"] <= best * (1 + max(noise(ok[0]), noise(n)))]


class Tuning:
    """The selector's view of the winners: look a call up, tune a call, rank its eligible backends."""

    def __init__(self, registry, config) -> None:
        self.registry = registry
        self.config = config
        self.cache = WinnerCache(config.tune.cache_path())  # read once per process (and at kernelhub.reload())
        self._audited = False
        self.tuned_here: list[str] = []  # the entries this process timed (a distributed job's ranks share the rest)
        self._verified: dict[tuple[str, str], str | None] = {}  # (entry key, backend) -> why it fails parity here

    def valid(self, entry: dict, op: str, eligible: Sequence[str]) -> bool:
        """Same torch, and every eligible backend timed with its current fingerprint. A ``tuned_only``
        backend left out of the entry (`kernelhub tune --quick` does not compile) is simply not a winner."""
        cands = entry.get("candidates", {})
        impls = self.registry.impls(op)
        needed = [n for n in eligible if n in cands or not impls[n].tuned_only]
        return entry.get("torch") == torch.__version__ and all(
            name in cands and cands[name].get("fingerprint") == self.registry.fingerprint(name) for name in needed)

    def _audit(self) -> None:
        """Warn once about entries naming an op or a backend this process does not have: they are ignored (an
        entry serves only the registered impls eligible for a call, `rank`)."""
        self._audited = True
        ops, backends = set(), set()
        for key, entry in self.cache.entries().items():
            op = key.split("|", 1)[0]
            if op not in self.registry.specs:
                ops.add(op)
            else:
                backends |= {n for n in entry["candidates"] if n not in self.registry.impls(op)}
        if ops or backends:
            names = [f"op {n!r}" for n in sorted(ops)] + [f"backend {n!r}" for n in sorted(backends)]
            warnings.warn(f"kernelhub: tuning cache {self.cache.path} names {', '.join(names)}, unknown here: "
                          "ignored", RuntimeWarning, stacklevel=5)

    def lookup(self, op: str, args: Sequence[Any], eligible: Sequence[str]) -> dict | None:
        """The valid entry for this call, if any (never tunes)."""
        if self.config.tune.mode == "off" or len(eligible) < 2:
            return None
        if not self._audited:
            self._audit()
        entry = self.cache.get(entry_key(op, args))
        return entry if entry is not None and self.valid(entry, op, eligible) else None

    def tune_shared(self, op: str, args: Sequence[Any], eligible: Sequence[str]) -> dict:
        """Online tuning that processes sharing the winners file do once: under the file's lock, a process that
        finds a valid entry another one wrote meanwhile (the ranks of a distributed job reach a new shape bucket
        together) uses it instead of tuning. After ``SHARED_TUNE_WAIT_S`` of waiting it tunes without saving."""
        import filelock

        self.cache.entries()
        if self.cache.not_ours is None and self.cache.write_error is None:
            try:
                with self.cache.lock(timeout=SHARED_TUNE_WAIT_S):
                    self.cache.refresh()
                    entry = self.lookup(op, args, eligible)
                    return entry if entry is not None else self.tune(op, args, eligible)
            except filelock.Timeout:
                return self.tune(op, args, eligible, save=False)
            except OSError:  # no lock there: put() says why the results stay in memory
                pass
        return self.tune(op, args, eligible)

    def tune(self, op: str, args: Sequence[Any], eligible: Sequence[str], quick: bool = False,
             progress: Callable[[str], None] | None = None, save: bool = True) -> dict:
        """Time and check every backend in ``eligible`` on fresh inputs shaped like ``args``; record the entry."""
        first = first_tensor(args)
        with torch.inference_mode(False), torch.enable_grad():
            fresh = _fresh(args)
            spec = self.registry.spec(op)
            ref_out, grad, ref_grads = reference = reference_with_upstream(spec, fresh)
            tol = call_tolerance(spec, fresh, reference=reference)
            cands = {}
            for name in eligible:
                cand: dict[str, Any] = {"fingerprint": self.registry.fingerprint(name), "error": None}
                start = time.perf_counter()
                cand["error"] = self._parity(op, name, fresh, ref_out, grad, ref_grads, tol)  # compiles, if it must
                cand["first_call_s"] = time.perf_counter() - start
                if cand["error"] is not None:  # checked here: `rank` need not check it again in this process
                    self._verified[(entry_key(op, args), name)] = cand["error"]
                if cand["error"] is None:
                    try:
                        overload = getattr(torch.ops.kernelhub, op).default
                        cand["forward_ms"], cand["forward_spread"] = timed(lambda: overload(*fresh, name, 0),
                                                                           first.device, quick)
                        cand["step_ms"], cand["step_spread"] = timed(lambda: run(spec, name, fresh, grad),
                                                                     first.device, quick)
                        self._verified[(entry_key(op, args), name)] = None
                    except Exception as exc:
                        cand["error"] = f"raised {type(exc).__name__}: {exc}"
                cands[name] = cand
                if progress is not None:
                    progress(name)
        close = within_noise(cands)
        entry = {"op": op, "device": device_model(first.device), "dtype": str(first.dtype).removeprefix("torch."),
                 "bucket": bucket(args), "call": describe_args(args), "torch": torch.__version__,
                 "tuned": datetime.datetime.now().isoformat(timespec="seconds"), "candidates": cands,
                 "winner": close[0] if len(close) == 1 else None}
        if len(close) > 1:
            entry["within_noise"] = close
        before = self.cache.get(entry_key(op, args))
        if before is not None and before.get("winner") and before["winner"] != entry["winner"]:
            now = entry["winner"] or f"none (within noise: {', '.join(close)})"
            warnings.warn(f"kernelhub tune: {entry_key(op, args)}: the winner is {now} now, {before['winner']} when "
                          f"tuned on {before.get('tuned', '?')}: the timings move between runs more than within one "
                          "(a loaded machine?)", RuntimeWarning, stacklevel=2)
        self.tuned_here.append(entry_key(op, args))
        self.cache.put({entry_key(op, args): entry}, to_disk=save)
        return entry

    def _parity(self, op: str, name: str, fresh: Sequence[Any], ref_out: torch.Tensor, grad: torch.Tensor,
                ref_grads: Sequence[torch.Tensor], tol) -> str | None:
        """Why ``name`` fails parity on ``fresh`` (forward and backward against the float64 reference, within
        ``tol``: `call_tolerance`), or None. The spec's reference backend is the judge: it only has to run."""
        first = first_tensor(fresh)
        try:
            out, grads = run(self.registry.spec(op), name, fresh, grad)
            if first.is_cuda:
                torch.cuda.synchronize(first.device)
        except Exception as exc:
            return f"raised {type(exc).__name__}: {exc}"
        if name == self.registry.spec(op).reference_backend:
            return None
        fwd = parity_error(out, ref_out)
        bwd = max([parity_error(g, r) for g, r in zip(grads, ref_grads)], default=0.0)
        if fwd <= tol.forward and bwd <= tol.backward:
            return None
        return (f"{FAILED_PARITY}: forward error {fwd:.3g} (tolerance {tol.forward:.3g}), backward {bwd:.3g} "
                f"({tol.backward:.3g})")

    def is_verified(self, op: str, args: Sequence[Any], name: str) -> bool:
        return name == self.registry.spec(op).reference_backend or (entry_key(op, args), name) in self._verified

    def verify(self, op: str, args: Sequence[Any], name: str, recorded_passing: bool = True) -> str | None:
        """Why ``name``, which the winners file records as passing parity for this call's entry, fails it in this
        process, or None. Checked once per process and entry on fresh inputs shaped like ``args``, so a winners
        file (copied from another machine, edited by hand) can only choose among impls that pass here. The
        spec's reference backend is the reference and is not checked."""
        key = (entry_key(op, args), name)
        if not self.is_verified(op, args, name):
            with torch.inference_mode(False), torch.enable_grad():
                try:
                    fresh = _fresh(args)
                    spec = self.registry.spec(op)
                    ref_out, grad, ref_grads = reference = reference_with_upstream(spec, fresh)
                    self._verified[key] = self._parity(op, name, fresh, ref_out, grad, ref_grads,
                                                       call_tolerance(spec, fresh, reference=reference))
                except Exception as exc:  # the check itself could not run (the reference out of memory): not used
                    self._verified[key] = f"could not be checked: {type(exc).__name__}: {exc}"
            if self._verified[key] is not None and recorded_passing:
                warnings.warn(f"kernelhub: tuning cache {self.cache.path}: {key[0]}: backend {name!r} is recorded as "
                              f"passing parity, but here it {self._verified[key]}; not used for this entry", RuntimeWarning, stacklevel=5)
        return self._verified.get(key)

    def rank(self, entry: dict, eligible: Sequence[str], op: str,
             args: Sequence[Any]) -> tuple[list[str], dict[str, str], dict[str, str], str | None]:
        """(eligible backends that passed, fastest first; why each of them is placed; why each backend recorded as
        failing parity is set aside; the winner: the first placed, or None where several passed within noise of
        each other, placed in priority order). Never the spec's reference backend; a backend recorded as having raised
        (out of memory, a transient fault) is in neither list, and neither is one recorded as failing parity
        that passes it here (`verify`, where a check can run now)."""
        cands = entry["candidates"]
        reference = self.registry.spec(op).reference_backend
        timed = [n for n in eligible if n in cands]
        passed = sorted((n for n in timed if cands[n]["error"] is None), key=lambda n: cands[n]["step_ms"])
        close = [n for n in eligible if n in entry.get("within_noise", ()) and n in passed]  # in priority order
        passed = close + [n for n in passed if n not in close]
        failed = {}
        for n in timed:
            error = cands[n]["error"]
            if error is None or n == reference or not error.startswith(FAILED_PARITY):
                continue
            if may_tune_now(args) and self.verify(op, args, n, recorded_passing=False) is None:
                continue  # the file says it failed; here it passes
            failed[n] = f"{error} (when tuned on {entry.get('call', '?')}, {entry.get('tuned', '?')})"
        why = {}
        head = close if len(close) > 1 else passed[:1]  # the backends placed first: within noise, or the winner
        if len(close) > 1:
            fastest = min(cands[n]["step_ms"] for n in close)
            for n in close:
                why[n] = (f"within noise of the fastest for bucket {entry.get('bucket', '?')}: {cands[n]['step_ms']:.4g} ms "
                          f"vs {fastest:.4g} ms forward+backward (spread {cands[n].get('step_spread', 0):.0%}, at least "
                          f"{NOISE_FLOOR:.0%}): priority order among {', '.join(close)} ({entry.get('tuned', '?')})")
        elif passed:
            why[passed[0]] = (f"tuned winner for bucket {entry.get('bucket', '?')}: {cands[passed[0]]['step_ms']:.4g} ms "
                              f"forward+backward ({entry.get('tuned', '?')})")
        for n in passed[len(head):]:  # against the one that runs: the first placed
            t, best = cands[n]["step_ms"], cands[passed[0]]["step_ms"]
            why[n] = f"lost on time: {t:.4g} ms vs {best:.4g} ms forward+backward ({t / best:.2f}x slower)"
        return passed, why, failed, (passed[0] if len(head) == 1 else None)
