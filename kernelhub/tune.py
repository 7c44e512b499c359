"""Auto-tuning: time every eligible impl of an op on one call's shapes, check its parity, keep the winner.

The winners are kept in a file (`kernelhub.winners`: its format, and how it is read and written).

An entry records torch's version and, per backend timed, its fingerprint (version plus a digest of its
sources, `Registry.fingerprint`), its median forward and forward+backward times, and its parity outcome.
It serves a call only while torch is the same and every backend now eligible for the call was timed
with its current fingerprint, so a new or changed backend invalidates only the entries of the ops it
implements. Among the eligible backends that passed parity the fastest forward+backward wins (the
backward always runs on the backend that ran the forward, so one winner serves both passes), but only where it
is faster by more than the noise (`within_noise`, a paired-rounds test: below); where the fastest are within noise
of each other no winner is recorded, the priority order stands among them (a tuned-only backend among them,
inductor, is set aside: it serves a call only as the winner), and `explain` says so. Tuning a bucket
again warns when the winner changed. A backend
that failed parity on the bucket (and fails it in this process too) is never chosen for it; one that raised
while tuned is only never its winner.

Parity is judged with `kernelhub.parity.call_tolerance` on the tuned call's own inputs (the spec's
tolerances, measured on small samples, widened where eager torch's own error at this size is larger); the
spec's reference backend is the judge and is never rejected for parity.

Timing: the first call (a backend that compiles, such as inductor, compiles then) is timed on its own
and recorded as ``first_call_s``, never mixed into the times after warm-up. Those call the hub's handle with the
backend forced (``kernelhub.op(op, backend)``'s eager path, as a training step calls it: the forward, then a step that
drops the leaves' gradients and runs forward and backward, so each candidate pays the glue a user's call pays and no
more; the operators' dispatch, several times that glue on a small call, would dilute the gap between candidates),
every candidate in each of `ROUNDS` interleaved rounds
(`kernelhub.timing.rounds`: CUDA events on CUDA). A candidate is slower than the fastest (the least median) where
its per-round ratio to the fastest has a median of at least 1 + `NOISE_FLOOR` and either of two one-sided tests,
each at 2.5% (so a tie passes one of them with probability at most 5%), finds it slower: the sign test, it was the
slower in so many rounds (`rounds_needed`: 39 of 60 with ``--quick``, 55 of 90 without; a few rounds a
machine's hiccup turns do not make a tie), or Student's t-test on the rounds' log ratios (`log_ratio_t`: a large
gap wins although a few rounds a busy host disturbed went the other way, which the sign test alone would call a
tie). So a stable ordering wins even where each candidate's own spread is wide, and a pair whose order flips
between rounds with no clear gap, or whose gap is under `NOISE_FLOOR`, is a tie. The entry records each
candidate's round times and its comparison with the fastest (``vs_fastest``: the median ratio, the rounds it was
the slower in, the t statistic), which `explain` and ``kernelhub tune`` print.
Parity: forward and backward against the float64 reference on the same fresh random inputs, within the call's
tolerance (above).

A file can reorder the backends that pass parity here, never remove one: a backend recorded as failing parity is
set aside for that bucket (a file may be copied from elsewhere: it is set aside only after failing here too, see
`Tuning.verify`), the spec's reference backend never, and a backend recorded as having raised while tuned (an
out-of-memory, a transient fault) only loses its place as a winner.
"""

from __future__ import annotations

import datetime
import functools
import math
import statistics
import time
import warnings
from collections.abc import Callable, Sequence
from typing import Any

import torch

from kernelhub.args import bucket, describe_args, first_tensor, map_tensors
from kernelhub.parity import call_tolerance, fresh_leaves, parity_error, reference_with_upstream, run
from kernelhub.timing import device_model, dropping_grads, paired, quartiles, rounds
from kernelhub.winners import Candidate, Entry, WinnerCache, entry_key

__all__ = ["Tuning", "may_tune_now", "within_noise", "NOISE_FLOOR", "ROUNDS", "rounds_needed", "log_ratio_t",
           "t_critical"]

NOISE_FLOOR = 0.05  # the least gap (median per-round ratio - 1) called a difference: runs move more than that
# interleaved rounds, with --quick and without, and how long one candidate's calls in one round last (at least one
# call). Many short rounds: on a GPU host the speed of host-bound calls wanders between rounds of several ms, so
# fewer, longer rounds called large gaps "within noise"; candidates timed close together in time see the same speed
# (docs/benchmarks.md, "Tuning, run three times"; docs/lab/benchmarks-history.md#measurements-behind-the-code)
ROUNDS = {True: 60, False: 90}
ROUND_MS = {True: 2.5, False: 4.0}
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


def _step(handle: Callable, args: Sequence[Any], grad: torch.Tensor) -> None:
    """One forward+backward as an eager training step runs it (the handle's fast path)."""
    handle(*args).backward(grad)


LEVEL = 0.025  # each of the two one-sided tests' level: a tie passes either with probability at most 5%


def rounds_needed(n: int) -> int:
    """The least number of rounds out of ``n`` in which a candidate must be the slower to be called slower: where
    the two tie (each round a coin flip), that many or more happen with probability at most `LEVEL`."""
    return next(k for k in range(n + 2) if sum(math.comb(n, i) for i in range(k, n + 1)) <= LEVEL * 2 ** n)


T_CAP = 999.0  # |t| recorded at most this (rounds of one and the same ratio have no spread: t is infinite)


def log_ratio_t(ratios: Sequence[float]) -> float:
    """Student's t statistic of the mean of the rounds' log ratios, within +-`T_CAP` (0 for one round)."""
    logs = [math.log(r) for r in ratios]
    if len(logs) < 2:
        return 0.0
    mean, spread = statistics.fmean(logs), statistics.stdev(logs)
    t = mean / (spread / math.sqrt(len(logs))) if spread > 0 else math.copysign(math.inf, mean) if mean else 0.0
    return max(-T_CAP, min(T_CAP, t))


@functools.lru_cache(maxsize=64)
def t_critical(df: int, level: float = LEVEL) -> float:
    """The one-sided critical value of Student's t with ``df`` degrees of freedom at ``level``: its upper tail's
    probability, the density integrated (Simpson's rule) from the value out, is ``level`` (bisection)."""
    log_c = math.lgamma((df + 1) / 2) - math.lgamma(df / 2) - 0.5 * math.log(df * math.pi)

    def density(x: float) -> float:
        return math.exp(log_c - (df + 1) / 2 * math.log1p(x * x / df))

    def tail(x: float) -> float:  # 1/2 - the integral from 0 to x
        n = 2000
        h = x / n
        s = density(0) + density(x) + sum((4 if i % 2 else 2) * density(i * h) for i in range(1, n))
        return 0.5 - s * h / 3

    lo, hi = 0.0, 100.0
    for _ in range(60):
        mid = (lo + hi) / 2
        lo, hi = (mid, hi) if tail(mid) > level else (lo, mid)
    return (lo + hi) / 2


def within_noise(cands: dict[str, Candidate]) -> list[str]:
    """The candidates that passed whose forward+backward is not slower than the fastest's (the least median of its
    ``step_rounds``), fastest first, by the paired-rounds rule (the module's docstring). Each other candidate that
    passed gets ``vs_fastest``: {"ratio": median per-round ratio, "slower_in": rounds, "rounds": rounds timed}. One
    name: a clear winner; several: none, the priority order stands among them; none: nothing passed."""
    ok = sorted((n for n, c in cands.items() if c["error"] is None), key=lambda n: cands[n]["step_ms"])
    if not ok:
        return []
    close = [ok[0]]
    steps = {n: cands[n]["step_rounds"] for n in ok}
    for n in ok[1:]:
        ratio, slower = paired(steps, n, ok[0])
        t = log_ratio_t([a / b for a, b in zip(steps[n], steps[ok[0]])])
        rounds_timed = len(steps[n])
        cands[n]["vs_fastest"] = {"ratio": round(ratio, 4), "slower_in": slower, "rounds": rounds_timed,
                                  "t": round(t, 2)}
        clear = slower >= rounds_needed(rounds_timed) or (rounds_timed > 1 and t >= t_critical(rounds_timed - 1))
        if ratio < 1 + NOISE_FLOOR or not clear:
            close.append(n)
    return close


# What `versus`'s figures are, for the footnote under every table that prints them (`kernelhub tune`, `explain`).
VERSUS_KEY = ("1.59x, slower in 9/9 rounds, t 4.1: the median over the timed rounds of this backend's forward+backward "
              "time over the fastest's in the same round (the rounds interleave the backends), how many rounds it "
              "was the slower in, and Student's t of the rounds' log ratios (2 or more: a gap the rounds agree on; "
              "a gap they do not is within noise)")


def versus(cand: Candidate) -> str:
    """How a candidate compared with the fastest, in words ("1.59x, slower in 9/9 rounds, t 4.1"), or '' (an entry
    tuned before the paired rounds)."""
    vs = cand.get("vs_fastest")
    if not vs:
        return ""
    t = f", t {vs['t']:.1f}" if isinstance(vs.get("t"), (int, float)) else ""
    return f"{vs['ratio']:.2f}x, slower in {vs['slower_in']}/{vs['rounds']} rounds{t}"


class Tuning:
    """The selector's view of the winners: look a call up, tune a call, rank its eligible backends."""

    def __init__(self, registry, config, handle: Callable[[str, str], Callable],
                 hub_key: Callable[[], int] = lambda: 0) -> None:
        self.registry = registry
        self.config = config
        self.handle = handle  # (op, backend) -> the hub's handle with that backend forced: what is timed
        # the hub's key (`kernelhub.hub.Hub.key`, which changes when the hub becomes the global one): parity is
        # checked through that hub's operators, the hub whose handles are timed
        self.hub_key = hub_key
        self.cache = WinnerCache(config.tune.cache_path())  # read once per process (and at kernelhub.reload())
        self._audited = False
        self.tuned_here: list[str] = []  # the entries this process timed (a distributed job's ranks share the rest)
        self._verified: dict[tuple[str, str], str | None] = {}  # (entry key, backend) -> why it fails parity here

    def valid(self, entry: Entry, op: str, eligible: Sequence[str]) -> bool:
        """Same torch, and every eligible backend timed with its current fingerprint (`set_aside`)."""
        return self.set_aside(entry, op, eligible) is None

    def set_aside(self, entry: Entry, op: str, eligible: Sequence[str]) -> str | None:
        """Why ``entry`` no longer orders the calls of its bucket (None: it does): tuned under another torch, an
        eligible backend not timed then (installed since), or one whose kernels changed since (its fingerprint). A
        ``tuned_only`` backend left out of the entry (`kernelhub tune --quick` does not compile) is simply not a
        winner."""
        if entry.get("torch") != torch.__version__:
            return f"tuned under torch {entry.get('torch')}, this is {torch.__version__}"
        cands = entry.get("candidates", {})
        impls = self.registry.impls(op)
        new = [n for n in eligible if n not in cands and not impls[n].tuned_only]
        changed = [n for n in eligible if n in cands and cands[n].get("fingerprint") != self.registry.fingerprint(n)]
        why = ([f"{', '.join(new)} not timed then (installed since?)"] if new else []) + (
            [f"{', '.join(changed)} changed since (the fingerprint of its kernels' sources)"] if changed else [])
        return "; ".join(why) or None

    def set_aside_entry(self, op: str, args: Sequence[Any], eligible: Sequence[str]) -> tuple[Entry, str] | None:
        """(this call's entry, why it is set aside) where its bucket has an entry that `lookup` does not use."""
        entry = self.cache.get(entry_key(op, args))
        why = self.set_aside(entry, op, eligible) if entry is not None else None
        return (entry, why) if entry is not None and why else None

    def stale(self, entries: dict[str, Entry] | None = None) -> tuple[set[str], set[str]]:
        """(ops, backends) the winners file names that this process does not have (a plugin removed, say)."""
        ops, backends = set(), set()
        for key, entry in (self.cache.entries() if entries is None else entries).items():
            op = key.split("|", 1)[0]
            if op not in self.registry.specs:
                ops.add(op)
            else:
                backends |= {n for n in entry["candidates"] if n not in self.registry.impls(op)}
        return ops, backends

    def prune(self, dry_run: bool = False) -> list[str]:
        """Remove from the winners file the entries of ops and the candidates of backends this process does not have
        (an entry whose winner goes loses its winner; one left with no candidate goes); what was (or, with
        ``dry_run``, would be) removed, a line each."""
        said: list[str] = []

        def change(entries: dict[str, Entry]) -> dict[str, Entry]:
            ops, backends = self.stale(entries)
            kept = {}
            for key, entry in entries.items():
                if key.split("|", 1)[0] in ops:
                    said.append(f"entry {key} (op unknown here)")
                    continue
                gone = sorted(n for n in entry["candidates"] if n in backends)
                if gone:
                    said.append(f"entry {key}: candidates {', '.join(gone)} (backends unknown here)")
                    entry = {**entry, "candidates": {n: c for n, c in entry["candidates"].items() if n not in gone},
                             "within_noise": [n for n in entry.get("within_noise", []) if n not in gone]}
                    if entry.get("winner") in gone:
                        entry["winner"] = None
                if entry["candidates"]:
                    kept[key] = entry
            return entries if dry_run else kept

        if dry_run:
            change(self.cache.entries())
        else:
            self.cache.rewrite(change)
        return said

    def audit(self) -> None:
        """Warn once about entries naming an op or a backend this process does not have: they are ignored (an
        entry serves only the registered impls eligible for a call, `rank`). Once per process: later calls return."""
        if self._audited:
            return
        self._audited = True
        ops, backends = self.stale()
        if ops or backends:
            names = [f"op {n!r}" for n in sorted(ops)] + [f"backend {n!r}" for n in sorted(backends)]
            warnings.warn(f"kernelhub: tuning cache {self.cache.path} names {', '.join(names)}, unknown here: "
                          "ignored (a plugin removed? `kernelhub tune --prune` removes them; `kernelhub tune --prune "
                          "--dry-run` lists them)", RuntimeWarning, stacklevel=5)

    def lookup(self, op: str, args: Sequence[Any], eligible: Sequence[str]) -> Entry | None:
        """The valid entry for this call, if any (never tunes)."""
        if self.config.tune.mode == "off" or len(eligible) < 2:
            return None
        if not self._audited:
            self.audit()
        entry = self.cache.get(entry_key(op, args))
        return entry if entry is not None and self.valid(entry, op, eligible) else None

    def tune_shared(self, op: str, args: Sequence[Any], eligible: Sequence[str]) -> Entry:
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
             progress: Callable[[str], None] | None = None, save: bool = True) -> Entry:
        """Time and check every backend in ``eligible`` on fresh inputs shaped like ``args``; record the entry."""
        first = first_tensor(args)
        with torch.inference_mode(False), torch.enable_grad():
            fresh = _fresh(args)
            spec = self.registry.spec(op)
            hub = self.hub_key()
            ref_out, grad, ref_grads = reference = reference_with_upstream(spec, fresh, hub=hub)
            try:
                tol, unjudged = call_tolerance(spec, fresh, reference=reference, hub=hub), None
            except Exception as exc:  # inputs the op's dtype cannot carry (float32 overflowing): no candidate can
                # be judged, so none wins; the calls are served by the priority order
                tol, unjudged = None, f"could not be judged: {type(exc).__name__}: {exc}"
            cands: dict[str, Candidate] = {}
            forwards: dict[str, Callable] = {}
            steps: dict[str, Callable] = {}
            timed_args, timed_leaves = fresh_leaves(fresh, spec.differentiable)
            step_grad = None  # the upstream gradient in the output's dtype (the reference's is float64)
            for name in eligible:
                cand: Candidate = {"fingerprint": self.registry.fingerprint(name), "error": None}
                start = time.perf_counter()
                cand["error"] = (unjudged if unjudged and name != spec.reference_backend else
                                 self._parity(op, name, fresh, ref_out, grad, ref_grads, tol))  # compiles, if it must
                self._verified[(entry_key(op, args), name)] = cand["error"]  # `rank` need not check it again here
                if cand["error"] is None:
                    handle = self.handle(op, name)
                    forwards[name] = functools.partial(handle, *fresh)
                    try:  # the eager path's first calls: what they compile (leaves that require grad) counts here too
                        out = forwards[name]()
                        step_grad = grad.to(out.dtype) if step_grad is None else step_grad
                        steps[name] = dropping_grads(functools.partial(_step, handle, timed_args, step_grad),
                                                     timed_leaves)
                        steps[name]()
                    except Exception as exc:
                        cand["error"] = f"raised {type(exc).__name__}: {exc}"
                        self._verified.pop((entry_key(op, args), name), None)
                cand["first_call_s"] = time.perf_counter() - start
                cands[name] = cand
                if progress is not None:
                    progress(name)
            for key, every in (("forward", forwards), ("step", steps)):
                fns = {n: f for n, f in every.items() if cands[n]["error"] is None}  # not one whose forward raised
                try:
                    times = rounds(fns, first.device, ROUNDS[quick], ROUND_MS[quick])
                except Exception:  # which one raised: each alone
                    times = {}
                    for name, fn in fns.items():
                        try:
                            times[name] = rounds({name: fn}, first.device, ROUNDS[quick], ROUND_MS[quick])[name]
                        except Exception as exc:
                            cands[name]["error"] = f"raised {type(exc).__name__}: {exc}"
                            self._verified.pop((entry_key(op, args), name), None)
                for name, ms in times.items():
                    if cands[name]["error"] is None:
                        median, spread = quartiles(ms)
                        if key == "forward":
                            cands[name]["forward_ms"], cands[name]["forward_spread"] = median, spread
                        else:
                            cands[name]["step_ms"], cands[name]["step_spread"] = median, spread
                            cands[name]["step_rounds"] = [float(f"{t:.4g}") for t in ms]
        close = within_noise(cands)
        entry: Entry = {
            "op": op, "device": device_model(first.device), "dtype": str(first.dtype).removeprefix("torch."),
            "bucket": bucket(args), "call": describe_args(args), "torch": torch.__version__,
            "tuned": datetime.datetime.now().isoformat(timespec="seconds"), "candidates": cands,
            "registered": sorted(self.registry.impls(op)),
            "winner": close[0] if len(close) == 1 and not unjudged else None}
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
            out, grads = run(self.registry.spec(op), name, fresh, grad, self.hub_key())
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
                    hub = self.hub_key()
                    ref_out, grad, ref_grads = reference = reference_with_upstream(spec, fresh, hub=hub)
                    self._verified[key] = self._parity(op, name, fresh, ref_out, grad, ref_grads,
                                                       call_tolerance(spec, fresh, reference=reference, hub=hub))
                except Exception as exc:  # the check itself could not run (the reference out of memory): not used
                    self._verified[key] = f"could not be checked: {type(exc).__name__}: {exc}"
            if self._verified[key] is not None and recorded_passing:
                warnings.warn(f"kernelhub: tuning cache {self.cache.path}: {key[0]}: backend {name!r} is recorded as "
                              f"passing parity, but here it {self._verified[key]}; not used for this entry",
                              RuntimeWarning, stacklevel=5)
        return self._verified.get(key)

    def rank(self, entry: Entry, eligible: Sequence[str], op: str,
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
                how = versus(cands[n]) or f"spread {cands[n].get('step_spread', 0):.0%}"
                why[n] = (f"within noise of the fastest for bucket {entry.get('bucket', '?')}: "
                          f"{cands[n]['step_ms']:.4g} ms "
                          f"vs {fastest:.4g} ms forward+backward"
                          + (f" ({how})" if cands[n]["step_ms"] != fastest else "")
                          + f": priority order among {', '.join(close)} ({entry.get('tuned', '?')})")
        elif passed:
            why[passed[0]] = (f"tuned winner for bucket {entry.get('bucket', '?')}: "
                              f"{cands[passed[0]]['step_ms']:.4g} ms "
                              f"forward+backward ({entry.get('tuned', '?')})")
        for n in passed[len(head):]:  # against the one that runs: the first placed
            t, best = cands[n]["step_ms"], cands[passed[0]]["step_ms"]
            why[n] = (f"lost on time: {t:.4g} ms vs {best:.4g} ms forward+backward ("
                      + (versus(cands[n]) or f"{t / best:.2f}x slower") + ")")
        return passed, why, failed, (passed[0] if len(head) == 1 else None)
