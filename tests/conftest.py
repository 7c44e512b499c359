"""Shared set-up of the suite, and its two tiers.

The fast tier (the default, what CI and the README's test command run) covers every op x backend, with at
least one parity case in float32 and one in float64 where declared, and every other kind of check; the full
tier (``KERNELHUB_TEST_TIER=full``) adds the rest of the matrix: inductor on every sample, the Triton
interpreter on every case, the property tests' full example count, the real ahead-of-time build. A test or
case that only the full tier runs carries the ``full`` marker, with its reason; the fast tier deselects it
(the session's summary says so). docs/reliability.md lists which checks run in which tier.
"""

import os
import sys
import textwrap
from pathlib import Path

import pytest
import torch

# Without a GPU the Triton backend's kernels run under Triton's interpreter on CPU tensors
# (forced calls only), so the generated conformance matrix covers their logic in CI. Set before kernelhub is
# imported: that imports triton (through torch.library), which reads the variable once.
if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")

import kernelhub  # noqa: E402
from kernelhub import testing  # noqa: E402
from kernelhub.config import TuneConfig  # noqa: E402

DEFAULT_CACHE_PATH = TuneConfig.cache_path  # for the test of the default location itself

# The suite must not pick up a developer's own configuration.
for var in ("KERNELHUB_CONFIG", "KERNELHUB_KILL_SWITCH", "KERNELHUB_DISABLE"):
    os.environ.pop(var, None)


TIER = pytest.StashKey[str]()
DESELECTED = pytest.StashKey[list]()  # the items the fast tier left out, for the tiers' own test


def pytest_configure(config):
    config.addinivalue_line("markers", "full(reason): runs in the full tier only (KERNELHUB_TEST_TIER=full)")
    config.addinivalue_line("markers", "xdist_group(name): tests pytest-xdist runs in one worker (--dist loadgroup)")
    try:
        config.stash[TIER] = testing.tier()
    except ValueError as exc:
        raise pytest.UsageError(str(exc)) from None
    if config.stash[TIER] == "fast" and os.environ.get("TRITON_INTERPRET") == "1":
        _interpret_without_overflow_checks()


def _interpret_without_overflow_checks() -> None:
    """The fast tier runs Triton's interpreter without its integer-overflow checks (``sanitize_overflow``: each
    32-bit add, subtract and multiply of a kernel's index arithmetic recomputed in 64 bits and asserted in range),
    which were most of the interpreter's time on the semiconv cases (docs/lab/benchmarks-history.md, "Test
    tiers"). A compiled kernel on a GPU has no such check (Triton
    drops device asserts outside debug mode); the full tier keeps them."""
    import dataclasses

    try:
        from triton.runtime import interpreter
    except ImportError:
        return
    builder = getattr(interpreter, "interpreter_builder", None)
    options = getattr(builder, "options", None)
    if dataclasses.is_dataclass(options) and getattr(options, "sanitize_overflow", False):
        builder.options = dataclasses.replace(options, sanitize_overflow=False)


def pytest_collection_modifyitems(config, items):
    left_out = [] if config.stash[TIER] == "full" else [i for i in items if i.get_closest_marker("full")]
    config.stash[DESELECTED] = left_out
    if left_out:
        config.hook.pytest_deselected(items=left_out)
        keep = set(map(id, left_out))
        items[:] = [i for i in items if id(i) not in keep]


def pytest_terminal_summary(terminalreporter, config):
    """One line on the tier (under pytest-xdist the controller collects nothing, so no count there)."""
    if config.stash[TIER] == "full":
        terminalreporter.write_line("kernelhub test tier: full")
        return
    left_out = config.stash.get(DESELECTED, None)
    count = f"{len(left_out)} tests" if left_out is not None else "the tests"
    terminalreporter.write_line(f"kernelhub test tier: fast; {count} marked `full` left out "
                                "(KERNELHUB_TEST_TIER=full runs them)")


@pytest.fixture(autouse=True)
def fresh_hub(monkeypatch, tmp_path):
    """Each test starts from the shipped defaults, in an empty working directory, with no tuned winners
    (the default winners file moves to the test's directory; the cuda_ext build cache stays shared)."""
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("XDG_CONFIG_HOME", str(tmp_path / "xdg"))
    monkeypatch.setattr(TuneConfig, "cache_path",
                        lambda self: Path(self.cache).expanduser() if self.cache else tmp_path / "tuning.json")
    with kernelhub.scoped():  # the hub before the test comes back after it (none, where none was built)
        yield
    monkeypatch.undo()


@pytest.fixture(scope="session")
def seed_cuda_ext_cache():
    """A function that puts the cuda_ext library this session loaded where a first use under another cache
    home (``XDG_CACHE_HOME``) looks for it, so a subprocess with its own cache loads it instead of compiling
    again: one build per test session, none with the ahead-of-time library. A no-op where cuda_ext did not load."""
    import shutil

    def seed(cache_home: Path) -> Path | None:
        try:
            from kernelhub_cuda_ext import _build, _lib
        except ImportError:
            return None
        if _lib.load() is not None:
            return None
        directory = _lib.first_use_dir(_build.cache_root_under(cache_home))
        directory.mkdir(mode=0o700, parents=True, exist_ok=True)
        for d in (directory, *list(directory.parents)[:2]):  # .../kernelhub/cuda_ext/<name>-<key>: private
            d.chmod(0o700)
        shutil.copyfile(_lib.loaded_from(), directory / f"{_lib.NAME}.so")
        (directory / "built").write_text("ok\n")
        return directory
    return seed


@pytest.fixture
def tier_selection(request):
    """(tier, the items this session runs, the items the fast tier left out)."""
    config = request.config
    return config.stash[TIER], list(request.session.items), config.stash.get(DESELECTED, [])


@pytest.fixture
def install(tmp_path, monkeypatch):
    """Install a plugin distribution (module + dist-info with an entry point) on sys.path."""
    site = tmp_path / "site"
    site.mkdir()
    monkeypatch.syspath_prepend(str(site))

    def _install(name, source, **fmt):
        mod = f"khtest_{name}"
        text = source.replace("{name}", name)
        for key, value in fmt.items():
            text = text.replace("{%s!r}" % key, repr(value))
        (site / f"{mod}.py").write_text(textwrap.dedent(text))
        dist = site / f"{mod}-0.1.dist-info"
        dist.mkdir(exist_ok=True)  # installing again (a property test's examples) replaces it
        (dist / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {mod}\nVersion: 0.1\n")
        (dist / "entry_points.txt").write_text(f"[kernelhub.backends]\n{name} = {mod}\n")
        sys.modules.pop(mod, None)
        return mod
    yield _install
    for m in [m for m in sys.modules if m.startswith("khtest_")]:
        del sys.modules[m]
