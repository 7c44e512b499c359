"""What the tests import from the suite itself: the CUDA tier's marks, and a child process with a deadline.

The CUDA tier (``KERNELHUB_TEST_TIER=cuda``, what ``scripts/gpu_check.sh tests`` runs on a GPU host) runs the fast
tier's tests marked ``cuda``: those whose outcome a GPU can change (CUDA devices, Triton's compiled kernels,
cuda_ext's CUDA kernels, CUDA graphs, the compile and export toolchain on CUDA). Mark a test with ``cuda`` when it
uses a CUDA device where there is one; ``on_cuda`` also skips it where there is none; a parameter that names a CUDA
device takes ``cuda_param``. tests/conftest.py fails the collection of a test whose parameters name a CUDA device
without the mark, and, on a GPU host, a test without it that allocates CUDA memory.

``run`` / ``wait`` give every child process a deadline: a child that outlives it gets SIGABRT, which Python's
faulthandler (enabled in the child through ``PYTHONFAULTHANDLER``) answers by printing every thread's stack, and the
test fails with that stack, in seconds or minutes rather than at the device call's limit.
"""

from __future__ import annotations

import os
import signal
import subprocess
from collections.abc import Sequence

import pytest
import torch

CUDA = torch.cuda.is_available()
cuda = pytest.mark.cuda


def on_cuda(reason: str = "needs a GPU"):
    """A decorator: the test is the CUDA tier's, and skipped where there is no GPU (a module: ``pytestmark =
    [harness.cuda, harness.needs_gpu(reason)]``)."""
    return lambda test: cuda(needs_gpu(reason)(test))


def needs_gpu(reason: str = "needs a GPU"):
    return pytest.mark.skipif(not CUDA, reason=reason)


def cuda_param(*values, marks=(), id=None):  # noqa: A002 (pytest.param's own keyword)
    """A parameter set that runs on a CUDA device: the CUDA tier's."""
    return pytest.param(*values, marks=[cuda, *marks], id=id)


def devices() -> list:
    """"cpu", and "cuda" (marked) where there is a GPU: the usual ``device`` parameter."""
    return ["cpu"] + ([cuda_param("cuda")] if CUDA else [])


def child_env(env: dict[str, str] | None = None) -> dict[str, str]:
    """``env`` (default: this process's) with faulthandler on, so that the SIGABRT of a missed deadline prints the
    child's stacks."""
    return dict(os.environ if env is None else env, PYTHONFAULTHANDLER="1")


def wait(proc: subprocess.Popen, timeout: float, what: str = "") -> tuple[str, str]:
    """``proc.communicate()`` with a deadline: past ``timeout`` seconds the child gets SIGABRT (its stacks, where
    it is Python with faulthandler on), then SIGKILL, and the test fails with the end of what it printed."""
    try:
        return proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        proc.send_signal(signal.SIGABRT)
        try:
            out, err = proc.communicate(timeout=20)
        except subprocess.TimeoutExpired:
            proc.kill()
            out, err = proc.communicate()
        pytest.fail(f"child process {what or proc.args!r:.300} did not finish in {timeout:g} s; its stacks "
                    f"(SIGABRT, faulthandler):\n{(err or '')[-6000:]}\n-- its stdout's end:\n{(out or '')[-1500:]}",
                    pytrace=False)


def run(args: Sequence[str], timeout: float, *, env: dict[str, str] | None = None, check: bool = False,
        **kwargs) -> subprocess.CompletedProcess:
    """``subprocess.run(args, capture_output=True, text=True, ...)`` with a deadline (``wait``); ``check=True``
    fails the test, with the child's stderr, on a non-zero exit."""
    proc = subprocess.Popen(args, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=child_env(env),
                            **kwargs)
    out, err = wait(proc, timeout, " ".join(map(str, args))[:300])
    done = subprocess.CompletedProcess(args, proc.returncode, out, err)
    if check and done.returncode != 0:
        pytest.fail(f"{' '.join(map(str, args))[:300]} exited {done.returncode}:\n{err[-4000:]}", pytrace=False)
    return done


def write_config(tmp_path, text: str):
    """``text`` (dedented) as the kernelhub.toml of ``tmp_path`` (the tests' working directory: `fresh_hub`), and
    the hub reloaded to read it."""
    import textwrap

    import kernelhub

    (tmp_path / "kernelhub.toml").write_text(textwrap.dedent(text))
    return kernelhub.reload()
