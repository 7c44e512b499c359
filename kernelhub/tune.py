"""Auto-tuning: time every eligible impl of an op on one call's shapes, check its parity, keep the winner.

Winners live in one JSON file (``[tune].cache``; default ``~/.cache/kernelhub/tuning.json``)::

    {"format": "kernelhub-tuning/1", "entries": {"<op>|<device model>|<dtype>|<bucket>": {...}}}

An entry records torch's version and, per backend timed, its fingerprint (version plus a digest of its
sources, `Registry.fingerprint`), its median forward and forward+backward times, and its parity outcome.
It serves a call only while torch is the same and every backend now eligible for the call was timed
with its current fingerprint, so a new or changed backend invalidates only the entries of the ops it
implements. Among the eligible backends that passed parity the fastest forward+backward wins: the
backward always runs on the backend that ran the forward, so one winner serves both passes. A backend
that failed parity on the bucket (and fails it in this process too) is never chosen for it; one that raised
while tuned is only never its winner.

The shape bucket rounds every dimension of every tensor up to a power of two and keeps the integer,
boolean and string arguments (they select kernel paths); float arguments do not enter it.

Parity is judged with `kernelhub.parity.call_tolerance` on the tuned call's own inputs (the spec's
tolerances, measured on small samples, widened where eager torch's own error at this size is larger); the
spec's reference backend is the judge and is never rejected for parity.

Timing: the first call (a backend that compiles, such as inductor, compiles then) is timed on its own
and recorded as ``first_call_s``, never mixed into the median after warm-up, which goes through the
hub's operator with the backend forced (each pays the same dispatch cost): `triton.testing.do_bench` on CUDA (CUDA events when triton is missing),
`torch.utils.benchmark.Timer.blocked_autorange` on the CPU. Parity: forward and backward against the
float64 reference on the same fresh random inputs, within the call's tolerance (above).

The file is data and is checked as such: an entry that is not of the expected form is ignored with a warning,
entries naming an op or backend this process does not have are ignored with a warning, and a winner read from
the file runs only after it passed parity in this process (`Tuning.verify`, once per process and entry: a copied
or hand-edited file can reorder the registered impls that pass here, never add one that does not).

Writes are atomic (a temporary file renamed over the old one, keeping the old file's mode) under a file lock,
merged with whatever other processes wrote meanwhile. Online tuning (`Tuning.tune_shared`) holds the lock while
it tunes, and a process that then finds the entry written by another uses it: the ranks of one distributed job
that share the file tune each shape bucket once.

Only our own file is ever replaced: a path that holds anything but a winners file (JSON with our ``format``
marker; a malformed one of ours is rewritten) is left untouched, no lock file is put beside it, and tuning
results stay in this process's memory, with one warning. So are results that cannot be written (a directory at
the path, a read-only place): calls keep being served, and `kernelhub tune` reports the path and exits 1.

A file can reorder the backends that pass parity here, never remove one: a backend recorded as failing parity is
set aside for that bucket (a file may be copied from elsewhere: it is set aside only after failing here too, see
`Tuning.verify`), the spec's reference backend never, and a backend recorded as having raised while tuned (an
out-of-memory, a transient fault) only loses its place as a winner.
"""

from __future__ import annotations

import datetime
import functools
import json
import math
import os
import platform
import stat
import tempfile
import time
import warnings
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import torch

from kernelhub.config import make_private_dirs
from kernelhub.parity import (call_tolerance, describe_args, first_tensor, map_tensors, parity_error,
                              reference_with_upstream, run)

__all__ = ["FORMAT", "WinnerCache", "Tuning", "bucket", "device_model", "entry_key", "first_tensor", "may_tune_now",
           "time_ms"]

FORMAT = "kernelhub-tuning/1"
FAILED_PARITY = "failed parity"  # how a candidate's error starts when it ran but disagreed with the reference
SHARED_TUNE_WAIT_S = 900.0  # how long online tuning waits for another process tuning under the file's lock


@functools.lru_cache(maxsize=None)
def _cpu_name() -> str:
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def device_model(device: torch.device | str) -> str:
    """What timings depend on: the GPU's name, or the CPU's model and the threads torch uses."""
    device = torch.device(device)
    if device.type == "cuda":
        return torch.cuda.get_device_name(device)
    if device.type == "cpu":
        return f"cpu {_cpu_name()} ({torch.get_num_threads()} threads)"
    return device.type


def _pow2(n: int) -> int:
    return 1 << (n - 1).bit_length() if n > 1 else n


def _shape(t: torch.Tensor) -> str:
    return "x".join(str(_pow2(s)) for s in t.shape) or "scalar"


def bucket(args: Sequence[Any]) -> str:
    """The shape bucket of a call's (canonical) arguments."""
    parts = []
    for a in args:
        if isinstance(a, torch.Tensor):
            parts.append(_shape(a))
        elif isinstance(a, (list, tuple)) and a and all(isinstance(t, torch.Tensor) for t in a):
            parts.append("[" + ",".join(_shape(t) for t in a) + "]")
        elif isinstance(a, (bool, int, str)) or (isinstance(a, (list, tuple))
                                                 and all(isinstance(x, (bool, int, str)) for x in a)):
            parts.append(repr(a))
    return " ".join(parts)


def entry_key(op: str, args: Sequence[Any]) -> str:
    t = first_tensor(args)
    return f"{op}|{device_model(t.device)}|{str(t.dtype).removeprefix('torch.')}|{bucket(args)}"


def may_tune_now(args: Sequence[Any]) -> bool:
    """False while torch.compile traces or a CUDA graph is being captured (timing would break either)."""
    if torch.compiler.is_compiling():
        return False
    t = first_tensor(args)
    if isinstance(t, torch._subclasses.fake_tensor.FakeTensor) or t.device.type == "meta":
        return False
    return not (t.device.type == "cuda" and torch.cuda.is_current_stream_capturing())


def time_ms(fn: Callable[[], Any], device: torch.device, quick: bool = False) -> float:
    """Median time of ``fn()`` in milliseconds, after warm-up."""
    if device.type == "cuda":
        try:
            from triton.testing import do_bench
        except ImportError:
            do_bench = None
        if do_bench is not None:
            return float(do_bench(fn, warmup=5 if quick else 25, rep=20 if quick else 100, return_mode="median"))
        for _ in range(3):
            fn()
        times = []
        for _ in range(10 if quick else 50):
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            fn()
            end.record()
            end.synchronize()
            times.append(start.elapsed_time(end))
        return float(sorted(times)[len(times) // 2])
    import torch.utils.benchmark as benchmark
    fn()
    timer = benchmark.Timer(stmt="fn()", globals={"fn": fn}, num_threads=torch.get_num_threads())
    return timer.blocked_autorange(min_run_time=0.05 if quick else 0.3).median * 1e3


def _fresh(args: Sequence[Any], seed: int = 0) -> tuple:
    """Random tensors with the shapes, strides, dtypes and devices of ``args``; other arguments as given."""
    gen: dict[torch.device, torch.Generator] = {}

    def fresh(t):
        if not (t.is_floating_point() or t.is_complex()):
            return t
        g = gen.setdefault(t.device, torch.Generator(device=t.device).manual_seed(seed))
        return torch.empty_strided(t.size(), t.stride(), dtype=t.dtype, device=t.device).normal_(generator=g)

    return map_tensors(args, fresh)


def _well_formed(entry: Any) -> bool:
    """Whether a cache entry has the shape the selector reads: candidates of backend name -> {"error": None or a
    message, and with no error a finite "step_ms" > 0}, and text where messages quote it. Anything else in the file
    (a hand edit, a truncated write from another tool) is ignored, never trusted or executed."""
    if not (isinstance(entry, dict) and isinstance(entry.get("candidates"), dict)):
        return False
    if not all(isinstance(entry.get(k, ""), str) for k in ("torch", "call", "tuned", "bucket")):
        return False
    for cand in entry["candidates"].values():
        if not isinstance(cand, dict) or not (cand.get("error") is None or isinstance(cand["error"], str)):
            return False
        step = cand.get("step_ms")
        if cand.get("error") is None and not (isinstance(step, (int, float)) and not isinstance(step, bool)
                                              and math.isfinite(step) and step > 0):
            return False
    return True


class WinnerCache:
    """The winners file: read once, written atomically under a lock (see the module docstring)."""

    def __init__(self, path: Path) -> None:
        self.path = Path(path)
        self._entries: dict[str, dict] | None = None
        self._warned = False
        self._lock = None
        self.not_ours: str | None = None  # why the path is left alone (it holds something that is not ours)
        self.write_error: str | None = None  # why the last write failed, if it did
        self._unsaved: dict[str, dict] = {}  # entries of this process that the file could not take
        self._write_warned: set[str] = set()

    def lock(self, timeout: float = 120):
        """The file's lock, acquired (a context manager). One lock object per cache, so it is re-entrant in this
        process; other processes wait for it (a `filelock.Timeout` after ``timeout`` seconds)."""
        if self._lock is None:
            from filelock import FileLock

            make_private_dirs(self.path.parent)
            self._lock = FileLock(str(self.path) + ".lock")
        return self._lock.acquire(timeout=timeout)

    def refresh(self) -> None:
        """Read the file again at the next lookup (another process may have written it)."""
        self._entries = None

    def _read(self) -> dict[str, dict]:
        self.not_ours = None
        try:
            text = self.path.read_bytes()
        except FileNotFoundError:
            return {}
        except OSError as exc:  # a directory at the path, no permission
            self.not_ours = f"{type(exc).__name__}: {exc}"
            self._warn(f"tuning cache {self.path} cannot be read ({self.not_ours}); tuning results stay in memory")
            return {}
        try:
            data = json.loads(text)
        except (ValueError, RecursionError) as exc:  # JSONDecodeError and UnicodeDecodeError are ValueErrors
            data, error = None, f"{type(exc).__name__}: {str(exc)[:200]}"
        else:
            error = None
        fmt = data.get("format") if isinstance(data, dict) else None
        if not (isinstance(fmt, str) and fmt.startswith(FORMAT.split("/")[0] + "/")):
            self.not_ours = f"not a {FORMAT} file" + (f" ({error})" if error else "")
            self._warn(f"tuning cache {self.path} is {self.not_ours}: left untouched, tuning results stay in memory "
                       "(set [tune].cache to another path)")
            return {}
        if fmt != FORMAT or not isinstance(data.get("entries"), dict):
            self._warn(f"tuning cache {self.path} ignored (format {fmt!r}, this kernelhub reads {FORMAT!r}); it will "
                       "be rewritten by the next tuning")
            return {}
        entries = {k: v for k, v in data["entries"].items() if _well_formed(v)}
        bad = sorted(set(data["entries"]) - set(entries))
        if bad:
            self._warn(f"tuning cache {self.path}: {len(bad)} malformed entries ignored ({bad[0]!r}"
                       + (", ..." if len(bad) > 1 else "") + "); they will be rewritten by the next tuning")
        return entries

    def _warn(self, message: str) -> None:
        if not self._warned:
            self._warned = True
            warnings.warn(f"kernelhub: {message}", RuntimeWarning, stacklevel=4)

    def entries(self) -> dict[str, dict]:
        if self._entries is None:
            self._entries = {**self._read(), **self._unsaved}
        return self._entries

    def get(self, key: str) -> dict | None:
        return self.entries().get(key)

    def put(self, new: dict[str, dict], to_disk: bool = True) -> None:
        """Record ``new`` in memory, and in the file where asked, the file is ours and it can be written (else it
        stays in memory for the process, with one warning per reason, and `write_error` says why)."""
        import filelock

        self.entries()
        if to_disk and self.not_ours is None:
            try:
                with self.lock():
                    merged = self._read()
                    if self.not_ours is None:
                        merged.update(new)
                        self._write(merged)
                        self._entries, self.write_error = {**merged, **self._unsaved}, None
                        return
            except (OSError, filelock.Timeout) as exc:
                self.write_error = f"{type(exc).__name__}: {exc}"
        self._unsaved.update(new)
        self._entries = {**self.entries(), **new}
        if to_disk:
            self.write_error = self.write_error or self.not_ours
            if self.write_error not in self._write_warned and self.write_error != self.not_ours:  # warned at read
                self._write_warned.add(self.write_error)
                warnings.warn(f"kernelhub: tuning cache {self.path} not written ({self.write_error}); tuning results "
                              "stay in memory", RuntimeWarning, stacklevel=3)

    def _write(self, entries: dict[str, dict]) -> None:
        try:
            mode = stat.S_IMODE(self.path.stat().st_mode)
        except FileNotFoundError:
            mode = 0o644
        fd, tmp = tempfile.mkstemp(dir=self.path.parent, prefix=".tuning-", suffix=".tmp")
        try:
            with os.fdopen(fd, "w") as f:
                os.fchmod(f.fileno(), mode)
                json.dump({"format": FORMAT, "entries": entries}, f, indent=1, sort_keys=True)
                f.flush()
                os.fsync(f.fileno())
            os.replace(tmp, self.path)
        except BaseException:
            Path(tmp).unlink(missing_ok=True)
            raise


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
                        cand["forward_ms"] = time_ms(lambda: overload(*fresh, name, 0), first.device, quick)
                        cand["step_ms"] = time_ms(lambda: run(spec, name, fresh, grad), first.device, quick)
                        self._verified[(entry_key(op, args), name)] = None
                    except Exception as exc:
                        cand["error"] = f"raised {type(exc).__name__}: {exc}"
                cands[name] = cand
                if progress is not None:
                    progress(name)
        ok = {n: c["step_ms"] for n, c in cands.items() if c["error"] is None}
        entry = {"op": op, "device": device_model(first.device), "dtype": str(first.dtype).removeprefix("torch."),
                 "bucket": bucket(args), "call": describe_args(args), "torch": torch.__version__,
                 "tuned": datetime.datetime.now().isoformat(timespec="seconds"), "candidates": cands,
                 "winner": min(ok, key=ok.get) if ok else None}
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
             args: Sequence[Any]) -> tuple[list[str], dict[str, str], dict[str, str]]:
        """(eligible backends that passed, fastest first; why each of them is placed; why each backend recorded as
        failing parity is set aside). Never the spec's reference backend; a backend recorded as having raised
        (out of memory, a transient fault) is in neither list, and neither is one recorded as failing parity
        that passes it here (`verify`, where a check can run now)."""
        cands = entry["candidates"]
        reference = self.registry.spec(op).reference_backend
        timed = [n for n in eligible if n in cands]
        passed = sorted((n for n in timed if cands[n]["error"] is None), key=lambda n: cands[n]["step_ms"])
        failed = {}
        for n in timed:
            error = cands[n]["error"]
            if error is None or n == reference or not error.startswith(FAILED_PARITY):
                continue
            if may_tune_now(args) and self.verify(op, args, n, recorded_passing=False) is None:
                continue  # the file says it failed; here it passes
            failed[n] = f"{error} (when tuned on {entry.get('call', '?')}, {entry.get('tuned', '?')})"
        why = {}
        if passed:
            best = cands[passed[0]]["step_ms"]
            why[passed[0]] = (f"tuned winner for bucket {entry.get('bucket', '?')}: {best:.4g} ms forward+backward "
                              f"({entry.get('tuned', '?')})")
            for n in passed[1:]:
                t = cands[n]["step_ms"]
                why[n] = f"lost on time: {t:.4g} ms vs {best:.4g} ms forward+backward ({t / best:.2f}x slower)"
        return passed, why, failed


