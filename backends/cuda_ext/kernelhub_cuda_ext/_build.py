"""Build the C++ (and, with a CUDA toolkit, CUDA) library on first use, into a private per-user cache.

- **Where**: ``<user cache>/kernelhub/cuda_ext/<name>-<key>/``, the key hashing the sources, the
  compile flags, torch and CUDA versions, the GPU architectures, Python and the CPU; so a changed
  source or a new torch builds afresh and nothing stale is loaded.
- **Safe to load**: the cache directories are created owner-only (0700) and checked before every
  load: owned by this user, not writable by group or others, and every ancestor either not
  writable by others or sticky. A library is never loaded from a directory another user could
  write to (a planted shared object would run as this user).
- **Built once, never hangs**: an OS file lock (``filelock``, released by the kernel when its holder
  dies) serialises concurrent first uses; the others wait for it, then load what it built. The
  compiler runs in a subprocess with a time limit, so a hung or crashed compiler cannot hang or
  crash the host program; a build killed half way leaves no held lock (a stale baton file of
  torch's own builder is removed under our lock). Waiting or building past the limit, or a
  failing compiler, raises `BuildError` with the reason (the compiler's last lines), which the
  plugin shows as the backend's unavailability.
"""

from __future__ import annotations

import hashlib
import os
import platform
import re
import signal
import stat
import subprocess
import sys
import textwrap
from pathlib import Path

import torch

__all__ = ["BuildError", "build", "cache_root", "check_private", "library_key", "library_dir", "aot_name",
           "cache_root_under"]

BUILD_TIMEOUT_S = 900  # compiling the CPU and CUDA sources takes 1-4 minutes on 2 cores
CSRC = Path(__file__).parent / "csrc"


class BuildError(RuntimeError):
    """The library could not be built or loaded; the message says why."""


def cache_root() -> Path:
    return cache_root_under(os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache"))


def cache_root_under(cache_home: str | Path) -> Path:
    """The build cache's root under a user cache directory (``XDG_CACHE_HOME``)."""
    return Path(cache_home) / "kernelhub" / "cuda_ext"


def _cpu_id() -> str:
    try:
        with open("/proc/cpuinfo") as f:
            flags = next((line for line in f if line.startswith("flags")), "")
    except OSError:
        flags = ""
    return platform.machine() + hashlib.sha256(flags.encode()).hexdigest()[:8]  # -march=native code


def aot_name(torch_version: str) -> str:
    """The module name of the ahead-of-time library (setup.py): the torch it was built against (another
    torch never loads it: C++ ABI) and a digest of all the sources (an in-place build whose sources
    changed since is not found, so it is never loaded stale)."""
    h = hashlib.sha256()
    for p in sorted(f for f in CSRC.iterdir() if f.suffix in (".cpp", ".cu", ".h")):
        h.update(p.name.encode() + b"\0" + p.read_bytes())
    return "_C_" + re.sub(r"\W", "_", torch_version) + "_" + h.hexdigest()[:12]


def library_key(sources: list[Path], flags: dict, with_cuda: bool) -> str:
    h = hashlib.sha256()
    for p in sorted(sources):
        h.update(p.name.encode())
        h.update(p.read_bytes())
    for h_src in sorted(CSRC.glob("*.h")):
        h.update(h_src.read_bytes())
    h.update(repr(sorted(flags.items())).encode())
    h.update(f"{torch.__version__}|{torch.version.cuda}|{with_cuda}|{sys.version_info[:2]}|{_cpu_id()}".encode())
    if with_cuda:  # the architectures torch's builder targets: the list given, else the GPUs present
        caps = [torch.cuda.get_device_capability(i) for i in range(torch.cuda.device_count())]
        h.update(f"{os.environ.get('TORCH_CUDA_ARCH_LIST', '')}|{caps}".encode())
    return h.hexdigest()[:16]


def _flags(with_cuda: bool) -> dict:
    # -ffp-contract=off: no multiply-add fused by the compiler's choice, which differs between the instantiations of
    # one kernel (a strided and a contiguous read vectorise differently): the same sums in the same order give the
    # same bits whatever the layout, and the same as the ahead-of-time build (setup.py) on any CPU
    return {"cflags": ["-O3", "-march=native", "-fopenmp", "-fno-math-errno", "-ffp-contract=off"],
            "ldflags": ["-fopenmp"],
            "cuda_cflags": ["-O3"] if with_cuda else []}


def library_dir(name: str, sources: list[Path], with_cuda: bool, root: Path | None = None) -> Path:
    """The directory `build` builds ``name`` from ``sources`` into (and looks for it in) under ``root``."""
    root = cache_root() if root is None else root
    return root / f"{name}-{library_key(sources, _flags(with_cuda), with_cuda)}"




def check_private(path: Path, owners: tuple[int, ...] = ()) -> None:
    """Raise BuildError unless ``path`` and its ancestors are safe to load a library from: ``path``
    owned by this user (or one of ``owners``), writable by no one else, not a symlink."""
    uid = os.getuid()
    st = path.lstat()
    if stat.S_ISLNK(st.st_mode) or st.st_uid not in (uid, *owners) or st.st_mode & (stat.S_IWGRP | stat.S_IWOTH):
        raise BuildError(f"refusing to use {path}: it must be owned by this user, writable by no one else and "
                         f"not a symlink (owner uid {st.st_uid}, mode {stat.filemode(st.st_mode)})")
    for parent in path.resolve().parents:
        pst = parent.stat()
        shared = pst.st_mode & (stat.S_IWGRP | stat.S_IWOTH) and not pst.st_mode & stat.S_ISVTX
        if pst.st_uid not in (uid, 0) or shared:
            raise BuildError(f"refusing to use {path}: its ancestor {parent} could be changed by another user "
                             f"(owner uid {pst.st_uid}, mode {stat.filemode(pst.st_mode)})")


_COMPILE = textwrap.dedent("""
    import sys, json
    from torch.utils import cpp_extension
    a = json.loads(sys.argv[1])
    cpp_extension.load(name=a["name"], sources=a["sources"], build_directory=a["dir"], is_python_module=False,
                       extra_cflags=a["cflags"], extra_cuda_cflags=a["cuda_cflags"], extra_ldflags=a["ldflags"],
                       with_cuda=a["with_cuda"], verbose=True)
""")


def build(name: str, sources: list[Path], with_cuda: bool, root: Path | None = None,
          timeout: float | None = None, compile_script: str | None = None) -> Path:
    """The path of the built shared library (building it first if needed); raises BuildError."""
    import json

    from filelock import FileLock, Timeout

    from kernelhub.config import make_private_dirs  # here: setup.py loads this file without kernelhub

    timeout = BUILD_TIMEOUT_S if timeout is None else timeout
    root = cache_root() if root is None else root
    flags = _flags(with_cuda)
    directory = library_dir(name, sources, with_cuda, root)
    try:
        make_private_dirs(directory)  # and root, and what is missing above it: 0700 whatever the umask
    except OSError as exc:
        raise BuildError(f"cannot create the build directory {directory}: {exc}") from exc
    check_private(root)
    check_private(directory)
    library = directory / f"{name}.so"
    done = directory / "built"  # written last: a library without it is a half-finished build
    if done.exists() and library.exists():
        return library
    lock = FileLock(str(directory / "kernelhub.lock"))
    try:
        lock.acquire(timeout=timeout)
    except Timeout:
        raise BuildError(f"waited {timeout:.0f} s for another process building {directory}") from None
    try:
        if done.exists() and library.exists():  # another process built it while we waited
            return library
        (directory / "lock").unlink(missing_ok=True)  # torch's builder baton, stale if we hold our lock
        args = {"name": name, "sources": [str(s) for s in sources], "dir": str(directory), "with_cuda": with_cuda,
                **flags}
        log = directory / "build.log"
        # its own process group, so a timeout kills the compilers too, not just the Python driver
        proc = subprocess.Popen([sys.executable, "-c", compile_script or _COMPILE, json.dumps(args)],
                                stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True)
        try:
            out, err = proc.communicate(timeout=timeout)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            out, err = proc.communicate()
            log.write_text(f"timed out after {timeout} s\n{out}\n{err}")
            raise BuildError(f"building {name} timed out after {timeout:.0f} s (log: {log})") from None
        log.write_text(out + "\n" + err)
        if proc.returncode != 0 or not library.exists():
            tail = [ln for ln in (err + out).splitlines() if ln.strip()][-12:]
            raise BuildError(f"building {name} failed (exit {proc.returncode}; log: {log}):\n" + "\n".join(tail))
        done.write_text("ok\n")
        return library
    finally:
        lock.release()
