"""The winners file: where the tuner's results are kept between processes, and how a call finds its entry.

Winners live in one JSON file (``[tune].cache``; default ``~/.cache/kernelhub/tuning.json``)::

    {"format": "kernelhub-tuning/1", "entries": {"<op>|<device model>|<dtype>|<bucket>": {...}}}

An entry's key is the op, the device model (`kernelhub.timing.device_model`), the dtype and the call's shape
bucket (`kernelhub.args.bucket`: every dimension of every tensor rounded up to a power of two, the integer,
boolean and string arguments as they are; float arguments do not enter it).

The file is data and is checked as such: an entry that is not of the expected form is ignored with a warning,
entries naming an op or backend this process does not have are ignored with a warning, and a winner read from
the file runs only after it passed parity in this process (`Tuning.verify`, once per process and entry: a copied
or hand-edited file can reorder the registered impls that pass here, never add one that does not).

Writes are atomic (a temporary file renamed over the old one, keeping the old file's mode) under a file lock,
merged with whatever other processes wrote meanwhile. Online tuning (`Tuning.tune_shared`) holds the lock while
it tunes, and a process that then finds the entry written by another uses it: the ranks of one distributed job
that share the file tune each shape bucket once.

Only our own file is ever replaced, and only a regular file: a path that holds anything else (a FIFO, a device,
JSON without our ``format`` marker; a malformed one of ours is rewritten) is left untouched, never read past its
type, no lock file is put beside it, and tuning
results stay in this process's memory, with one warning. So are results that cannot be written (a directory at
the path, a read-only file or place): calls keep being served, and `kernelhub tune` reports the path and exits 1.
A symlink is followed: the file it names is the one read and replaced, its lock beside it.
"""

from __future__ import annotations

import json
import math
import os
import stat
import tempfile
import warnings
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any, TypedDict

from kernelhub.args import bucket, first_tensor
from kernelhub.config import make_private_dirs
from kernelhub.timing import device_model

__all__ = ["FORMAT", "WinnerCache", "entry_key"]

FORMAT = "kernelhub-tuning/1"


class VsFastest(TypedDict, total=False):
    """A candidate against the fastest that passed, over the paired rounds (`kernelhub.tune.within_noise`)."""
    ratio: float  # the median per-round ratio of its time to the fastest's
    slower_in: int  # the rounds it was slower in
    rounds: int  # the rounds timed
    t: float  # the t statistic of the log ratios


class Candidate(TypedDict, total=False):
    """One backend's outcome in an entry. "error" is always there; the times only where it passed (None)."""
    fingerprint: str  # `kernelhub.registry.Registry.fingerprint` when tuned: its version and sources
    error: str | None  # why it failed parity or raised; None: it passed
    first_call_s: float  # its first call's wall time (a compile, a build)
    forward_ms: float  # the forward's median over the rounds
    forward_spread: float
    step_ms: float  # forward+backward's median over the rounds: what ranks the candidates
    step_spread: float
    step_rounds: list[float]  # forward+backward's time in each round
    vs_fastest: VsFastest  # every candidate that passed but the fastest


class Entry(TypedDict, total=False):
    """One entry of the winners file (`entry_key` names it; `_well_formed` checks one read from the file)."""
    op: str
    device: str  # `kernelhub.timing.device_model`
    dtype: str
    bucket: str  # `kernelhub.args.bucket`
    call: str  # the tuned call, described (`kernelhub.args.describe_args`)
    torch: str  # torch's version when tuned
    tuned: str  # when, ISO 8601
    candidates: dict[str, Candidate]
    registered: list[str]  # the backends registered for the op when tuned
    winner: str | None  # the one clear winner, or None (none passed, or several within noise)
    within_noise: list[str]  # where several are: fastest first


def entry_key(op: str, args: Sequence[Any]) -> str:
    t = first_tensor(args)
    return f"{op}|{device_model(t.device)}|{str(t.dtype).removeprefix('torch.')}|{bucket(args)}"


def _well_formed(entry: Any) -> bool:
    """Whether a cache entry has the shape the selector and `kernelhub list` read: text where text belongs (op,
    device, dtype, bucket, ...), a "winner" that is None or one of its candidates, candidates of backend
    name -> {"error": None or a
    message, and with no error a finite "step_ms" > 0; any spread or forward time a finite number >= 0, a "vs_fastest"
    {"ratio": a number, "slower_in" and "rounds": ints, "t": a finite number where recorded}}, "within_noise" and
    "registered" lists of names, and text where messages quote it. Anything else in the file (a hand edit, a
    truncated write from another tool) is ignored, never trusted or executed."""
    if not (isinstance(entry, dict) and isinstance(entry.get("candidates"), dict)):
        return False
    if not all(isinstance(entry.get(k, ""), str) for k in ("torch", "call", "tuned", "bucket", "op", "device",
                                                           "dtype")):
        return False
    winner = entry.get("winner")  # None, or one of its candidates (a hand edit could name anything)
    if winner is not None and not (isinstance(winner, str) and winner in entry["candidates"]):
        return False
    for names in (entry.get("within_noise", []), entry.get("registered", [])):  # lists of backend names
        if not (isinstance(names, list) and all(isinstance(n, str) for n in names)):
            return False
    for cand in entry["candidates"].values():
        if not isinstance(cand, dict) or "error" not in cand or not (cand["error"] is None
                                                                     or isinstance(cand["error"], str)):
            return False
        if cand["error"] is None and not _number(cand.get("step_ms"), positive=True):
            return False
        if not all(_number(cand[k]) for k in ("step_spread", "forward_ms", "forward_spread") if k in cand):
            return False
        vs = cand.get("vs_fastest", {"ratio": 1, "slower_in": 0, "rounds": 0})
        if not (isinstance(vs, dict) and _number(vs.get("ratio")) and _finite(vs.get("t", 0)) and all(
                isinstance(vs.get(k), int) and not isinstance(vs.get(k), bool) for k in ("slower_in", "rounds"))):
            return False
    return True


def _finite(x: Any) -> bool:
    """A finite int or float (not a bool), of either sign."""
    return isinstance(x, (int, float)) and not isinstance(x, bool) and math.isfinite(x)


def _number(x: Any, positive: bool = False) -> bool:
    """A finite int or float (not a bool), > 0 where ``positive``, else >= 0."""
    return isinstance(x, (int, float)) and not isinstance(x, bool) and math.isfinite(x) and (x > 0 if positive
                                                                                             else x >= 0)


class WinnerCache:
    """The winners file: read once, written atomically under a lock (see the module docstring)."""

    def __init__(self, path: Path) -> None:
        self.path = Path(path)
        self._entries: dict[str, Entry] | None = None
        self._warned = False
        self._lock: Any = None  # a filelock.FileLock, made at the first `lock` (filelock is imported there)
        self.not_ours: str | None = None  # why the path is left alone (it holds something that is not ours)
        self.write_error: str | None = None  # why the last write failed, if it did
        self._unsaved: dict[str, Entry] = {}  # entries of this process that the file could not take
        self._write_warned: set[str] = set()

    def lock(self, timeout: float = 120):
        """The file's lock, acquired (a context manager). One lock object per cache, so it is re-entrant in this
        process; other processes wait for it (a `filelock.Timeout` after ``timeout`` seconds)."""
        if self._lock is None:
            from filelock import FileLock

            target = self._target()
            make_private_dirs(target.parent)
            self._lock = FileLock(str(target) + ".lock")  # beside the file itself: links to it share the lock
        return self._lock.acquire(timeout=timeout)

    def refresh(self) -> None:
        """Read the file again at the next lookup (another process may have written it)."""
        self._entries = None

    def _target(self) -> Path:
        """The file the path names: a symlink's target (a winners file shared through a link is written where it
        is, never replaced by a copy), even where it does not exist yet."""
        return Path(os.path.realpath(self.path))

    def _read(self) -> dict[str, Entry]:
        self.not_ours = None
        try:
            mode = os.stat(self.path).st_mode  # a FIFO would block the read, /dev/zero never end it: regular files only
            text = self.path.read_bytes() if stat.S_ISREG(mode) else b""
        except FileNotFoundError:
            return {}
        except (OSError, ValueError) as exc:  # no permission; a NUL byte in the path
            self.not_ours = f"{type(exc).__name__}: {exc}"
            self._warn(f"tuning cache {self.path} cannot be read ({self.not_ours}); tuning results stay in memory")
            return {}
        if not stat.S_ISREG(mode):
            kind = "a directory" if stat.S_ISDIR(mode) else "a FIFO" if stat.S_ISFIFO(mode) else \
                "a device" if stat.S_ISCHR(mode) or stat.S_ISBLK(mode) else "a socket"
            self.not_ours = f"not a regular file ({kind})"
            self._warn(f"tuning cache {self.path} is {self.not_ours}: left untouched, tuning results stay in memory "
                       "(set [tune].cache to another path)")
            return {}
        error: str | None = None
        try:
            data = json.loads(text)
        except (ValueError, RecursionError) as exc:  # JSONDecodeError and UnicodeDecodeError are ValueErrors
            data, error = None, f"{type(exc).__name__}: {str(exc)[:200]}"
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

    def entries(self) -> dict[str, Entry]:
        if self._entries is None:
            self._entries = {**self._read(), **self._unsaved}
        return self._entries

    def get(self, key: str) -> Entry | None:
        return self.entries().get(key)

    def put(self, new: dict[str, Entry], to_disk: bool = True) -> None:
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
            if self.write_error is not None and self.write_error not in self._write_warned \
                    and self.write_error != self.not_ours:  # warned at read
                self._write_warned.add(self.write_error)
                warnings.warn(f"kernelhub: tuning cache {self.path} not written ({self.write_error}); tuning results "
                              "stay in memory", RuntimeWarning, stacklevel=3)

    def rewrite(self, change: Callable[[dict[str, Entry]], dict[str, Entry]]) -> None:
        """Replace the file's entries with ``change(entries)``, read and written under the lock (another process's
        results of meanwhile kept); OSError or filelock.Timeout where it cannot be written."""
        with self.lock():
            entries = self._read()
            if self.not_ours is not None:
                raise OSError(f"tuning cache {self.path} is {self.not_ours}: left untouched")
            self._write(change(entries))
        self._entries = {**self._read(), **self._unsaved}

    def _write(self, entries: dict[str, Entry]) -> None:
        """Replace the file (a symlink's target: `_target`) atomically, keeping its mode; a read-only file (no
        write bit for anyone) is left as it is, whoever owns its directory (root included): PermissionError."""
        target = self._target()
        try:
            mode = stat.S_IMODE(target.stat().st_mode)
        except FileNotFoundError:
            mode = 0o644
        else:
            if not mode & 0o222:
                raise PermissionError(f"a read-only file (mode {mode:#o}): left untouched")
        fd, tmp = tempfile.mkstemp(dir=target.parent, prefix=".tuning-", suffix=".tmp")
        try:
            with os.fdopen(fd, "w") as f:
                os.fchmod(f.fileno(), mode)
                json.dump({"format": FORMAT, "entries": entries}, f, indent=1, sort_keys=True)
                f.flush()
                os.fsync(f.fileno())
            os.replace(tmp, target)
        except BaseException:
            Path(tmp).unlink(missing_ok=True)
            raise
