"""Shared set-up of the suite, and its three tiers.

The fast tier (the default, what CI and the README's test command run) covers every op x backend, with at
least one parity case in float32 and one in float64 where declared, and every other kind of check; the full
tier (``KERNELHUB_TEST_TIER=full``) adds the rest of the matrix: inductor on every sample, the Triton
interpreter on every case, the property tests' full example count, the real ahead-of-time build. A test or
case that only the full tier runs carries the ``full`` marker, with its reason; the fast tier deselects it
(the session's summary says so). The CUDA tier (``KERNELHUB_TEST_TIER=cuda``, for a GPU host) runs the fast
tier's tests marked ``cuda`` (tests/harness.py): those whose outcome a GPU can change. A test whose parameters
name a CUDA device without that mark fails the collection, and on a GPU host a test without it that allocates
CUDA memory fails, so the CUDA tier cannot silently lose a test. docs/reliability.md lists which checks run in
which tier.
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
    config.addinivalue_line("markers", "cuda: a GPU can change its outcome; the CUDA tier (KERNELHUB_TEST_TIER=cuda) "
                                       "runs these (tests/harness.py)")
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


def _names_cuda(value) -> bool:
    """Whether a test parameter names a CUDA device: "cuda", "cuda:N", a CUDA torch.device, an object whose
    ``device`` is one (the conformance kit's cases and checks), or a tuple or list holding one."""
    if isinstance(value, str):
        return value == "cuda" or value.startswith("cuda:")
    if isinstance(value, torch.device):
        return value.type == "cuda"
    if isinstance(value, (tuple, list)):
        return any(_names_cuda(v) for v in value)
    device = getattr(value, "device", None)
    return device is not value and device is not None and _names_cuda(device)


def unmarked_cuda(items) -> list[str]:
    """The ids of the tests among ``items`` whose parameters name a CUDA device but that lack the ``cuda`` mark."""
    return [i.nodeid for i in items if not i.get_closest_marker("cuda") and hasattr(i, "callspec")
            and any(_names_cuda(v) for v in i.callspec.params.values())]


def pytest_collection_modifyitems(config, items):
    unmarked = unmarked_cuda(items)
    if unmarked:
        raise pytest.UsageError(
            f"{len(unmarked)} tests use a CUDA device without the `cuda` mark, so the CUDA tier would leave them out "
            f"(mark them as tests/harness.py says): {unmarked[:5]}")
    tier = config.stash[TIER]
    left_out = [] if tier == "full" else [i for i in items if i.get_closest_marker("full")]
    if tier == "cuda":
        left_out += [i for i in items if not i.get_closest_marker("cuda") and not i.get_closest_marker("full")]
        # the tests that start a fresh process and compile there (the tier's longest, minutes on a loaded GPU host)
        # first, so that pytest-xdist starts them first rather than leaving one to run alone at the end, and so that
        # the shards below deal them out in turn
        items.sort(key=lambda i: "seed_cuda_ext_cache" not in getattr(i, "fixturenames", ()))
    shard = os.environ.get("KERNELHUB_TEST_SHARD", "")
    if shard:  # "k/n": the k-th of n interleaved shares of this tier's tests (scripts/gpu_check.sh, one per GPU)
        try:
            k, n = map(int, shard.split("/"))
            assert 0 <= k < n
        except (ValueError, AssertionError):
            raise pytest.UsageError(f"KERNELHUB_TEST_SHARD={shard!r}; expected k/n with 0 <= k < n") from None
        dropped = set(map(id, left_out))
        kept = [i for i in items if id(i) not in dropped]
        config.stash[DESELECTED] = list(left_out)  # the tier's; the shard's come on top
        left_out += [i for j, i in enumerate(kept) if j % n != k]
    else:
        config.stash[DESELECTED] = left_out
    if left_out:
        config.hook.pytest_deselected(items=left_out)
        keep = set(map(id, left_out))
        items[:] = [i for i in items if id(i) not in keep]


def pytest_terminal_summary(terminalreporter, config):
    """One line on the tier (under pytest-xdist the controller collects nothing, so no count there)."""
    tier = config.stash[TIER]
    if tier == "full":
        terminalreporter.write_line("kernelhub test tier: full")
        return
    left_out = config.stash.get(DESELECTED, None)
    count = f"{len(left_out)} tests" if left_out is not None else "the tests"
    what = "marked `full` or not marked `cuda`" if tier == "cuda" else "marked `full`"
    terminalreporter.write_line(f"kernelhub test tier: {tier}; {count} {what} left out "
                                "(KERNELHUB_TEST_TIER=full runs them)")


def _cuda_allocations() -> int:
    return torch.cuda.memory_stats().get("allocation.all.allocated", 0) if torch.cuda.is_initialized() else 0


@pytest.fixture(autouse=True)
def cuda_use_is_marked(request):
    """On a GPU host, a test without the ``cuda`` mark that allocates CUDA memory fails: the CUDA tier would leave
    it out (a test whose body picks "cuda" where there is one, say)."""
    if not torch.cuda.is_available() or request.node.get_closest_marker("cuda"):
        yield
        return
    before = _cuda_allocations()
    yield
    if _cuda_allocations() > before:
        pytest.fail(f"{request.node.nodeid} allocated CUDA memory without the `cuda` mark, so the CUDA tier "
                    "(KERNELHUB_TEST_TIER=cuda) leaves it out: mark it (tests/harness.py)", pytrace=False)


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


# -- test backends: plugin distributions the tests install (`plugin`) -------------------------------------------
# Each template is a plugin module: "{name}" becomes the backend's name where the template takes one, and
# "{key!r}" the repr of a value given to `plugin` (TEMPLATE_DEFAULTS: the values a template takes by default).

# A test backend: tv_loss_l1_3d on CPU in float32 for 3-D volumes only; counts its calls.
FAST = '''
import torch
from kernelhub import hookimpl
from kernelhub.spec import Backend, Impl
from kernelhub_torch_ref import tv

CALLS = {"forward": 0, "backward": 0}

def forward(volume):
    CALLS["forward"] += 1
    return tv.tv_loss_l1_3d(volume)

def backward(grad, volume, needs):
    CALLS["backward"] += 1
    d = volume.float()
    g = torch.zeros_like(d)
    for axis, w in zip((0, 1, 2), grad):
        s = torch.sign(d.diff(dim=axis)) * w
        g.narrow(axis, 1, d.shape[axis] - 1).add_(s)
        g.narrow(axis, 0, d.shape[axis] - 1).sub_(s)
    return [g.to(volume.dtype)]

@hookimpl
def kernelhub_register_impls(registry):
    registry.add_backend(Backend("{name}", "9.9", unavailable_reason=lambda: {unavailable!r}))
    registry.add_impl(Impl(op="tv_loss_l1_3d", backend="{name}", forward=forward, backward=backward,
                           dtypes=(torch.float32,), devices={devices!r},
                           not_supported_reasons=lambda a: ["needs a 3-D volume"] if a[0].ndim != 3 else []))
'''

FLAKY = '''
import torch
from kernelhub import hookimpl
from kernelhub.spec import Backend, Impl

def forward(volume):
    raise RuntimeError("kernel exploded")

def backward(grad, volume, needs):
    raise RuntimeError("kernel exploded")

@hookimpl
def kernelhub_register_impls(registry):
    registry.add_backend(Backend("flaky", "0.1"))
    registry.add_impl(Impl(op="tv_loss_l1_3d", backend="flaky", forward=forward, backward=backward,
                           dtypes=(torch.float32,)))
'''

ATOMIC = '''
import torch
from kernelhub import hookimpl
from kernelhub.spec import Backend, Impl
from kernelhub_torch_ref import plugin

@hookimpl
def kernelhub_register_impls(registry):
    registry.add_backend(Backend("atomic", "0.1"))
    backward = plugin.vjp_backward(plugin.FORWARDS["tv_loss_l1_3d"], (0,))
    registry.add_impl(Impl(op="tv_loss_l1_3d", backend="atomic", forward=plugin.FORWARDS["tv_loss_l1_3d"],
                           backward=backward, dtypes=(torch.float32,), deterministic=False))
'''

# Returns a float64 [3] for a float32 call (the spec says float32), with shape=True a float32 [4], with double=False
# the right output (its gradient has the wrong shape still).
BADSHAPE = '''
import torch
from kernelhub import hookimpl
from kernelhub.spec import Backend, Impl
from kernelhub_torch_ref import tv

def forward(volume):
    out = tv.tv_loss_l1_3d(volume)
    return torch.cat([out, out[:1]]) if {shape!r} else out.double() if {double!r} else out

def backward(grad, volume, needs):
    return [torch.zeros(volume.shape[:-1])]  # the wrong shape

@hookimpl
def kernelhub_register_impls(registry):
    registry.add_backend(Backend("{name}", "0.1"))
    registry.add_impl(Impl(op="tv_loss_l1_3d", backend="{name}", forward=forward, backward=backward,
                           dtypes=(torch.float32,)))
'''

INVALID = '''
import torch
from kernelhub import hookimpl
from kernelhub.spec import Backend, Impl

@hookimpl
def kernelhub_register_impls(registry):
    registry.add_backend(Backend("invalid", "0.1"))
    registry.add_impl(Impl(op="tv_loss_l1_3d", backend="invalid", forward=abs, backward=abs,
                           dtypes=(torch.int32,)))
'''

# A test backend for semiconv: torch_ref's functions, counting its calls.
MORPH = '''
import torch
from kernelhub import hookimpl
from kernelhub.spec import Backend, Impl
from kernelhub_torch_ref import plugin

CALLS = {"forward": 0, "backward": 0}
_backward = plugin.vjp_backward(plugin.FORWARDS["semiconv"], (0, 1))

def forward(*args):
    CALLS["forward"] += 1
    return plugin.FORWARDS["semiconv"](*args)

def backward(*args, **kwargs):
    CALLS["backward"] += 1
    return _backward(*args, **kwargs)

@hookimpl
def kernelhub_register_impls(registry):
    registry.add_backend(Backend("morph", "0.1"))
    registry.add_impl(Impl(op="semiconv", backend="morph", forward=forward, backward=backward,
                           dtypes=(torch.float32,)))
'''

WRONG = '''
import torch
from kernelhub import hookimpl
from kernelhub.spec import Backend, Impl
from kernelhub_torch_ref import plugin

def forward(volume):
    return plugin.FORWARDS["tv_loss_l1_3d"](volume) * 1.01  # 1% off: far outside float32's tolerance

@hookimpl
def kernelhub_register_impls(registry):
    registry.add_backend(Backend("wrong", "0.1"))
    registry.add_impl(Impl(op="tv_loss_l1_3d", backend="wrong", forward=forward,
                           backward=plugin.vjp_backward(plugin.FORWARDS["tv_loss_l1_3d"], (0,)),
                           dtypes=(torch.float32,)))
'''

WRONG_GRAD = """
import torch
from kernelhub import hookimpl
from kernelhub.spec import Backend, Impl
from kernelhub_torch_ref import tv
from kernelhub_torch_ref.plugin import vjp_backward

_backward = vjp_backward(tv.tv_loss_sq_3d, (0,))

def backward(grad, volume, needs):  # the planted bug: the gradient 10% too large at one voxel
    (g,) = _backward(grad, volume, needs=needs)
    g = g.clone()
    g.view(-1)[g.numel() // 2] *= 1.1
    return [g]

@hookimpl
def kernelhub_register_impls(registry):
    registry.add_backend(Backend("{name}", "0.1"))
    registry.add_impl(Impl(op="tv_loss_sq_3d", backend="{name}", forward=tv.tv_loss_sq_3d, backward=backward,
                           dtypes=(torch.float32, torch.float64), devices=("cpu",)))
"""


PLUGIN_TEMPLATES = {"fast": FAST, "flaky": FLAKY, "atomic": ATOMIC, "badshape": BADSHAPE, "invalid": INVALID,
                    "morph": MORPH, "wrong": WRONG, "wrong_grad": WRONG_GRAD}
TEMPLATE_DEFAULTS = {"fast": {"devices": ("cpu",), "unavailable": None}, "badshape": {"double": True}}


@pytest.fixture
def plugin(install):
    """Install a test backend of `PLUGIN_TEMPLATES` as a plugin distribution, through the real entry-point path:
    ``plugin("fast", "gpuonly", devices=("cuda",))`` (the name defaults to the template's); returns its module's
    name (``khtest_<name>``)."""
    def _plugin(template, name=None, **fmt):
        return install(name or template, PLUGIN_TEMPLATES[template], **{**TEMPLATE_DEFAULTS.get(template, {}), **fmt})
    return _plugin


@pytest.fixture
def only_test_backends(monkeypatch):
    """Installed kernel backends that serve CPU calls (cuda_ext's C++ kernels) disabled: the tests' own backends
    and torch_ref compete."""
    monkeypatch.setenv("KERNELHUB_DISABLE", "cuda_ext")


@pytest.fixture
def tv_backend_hub():
    """A `kernelhub.hub.Hub` built directly (not the global hub) whose backend ``name``, first in its priority before
    torch_ref, serves tv_loss_l1_3d with ``forward`` and ``backward`` (torch_ref's dtypes and devices), its Impl
    declaring ``flags``: ``tv_backend_hub(name, forward, backward, **flags)``."""
    import dataclasses
    import types

    import kernelhub
    from kernelhub import hookimpl
    from kernelhub.config import Config
    from kernelhub.hub import Hub
    from kernelhub.spec import Backend, Impl

    def make(name, forward, backward, **flags):
        ref = kernelhub.get_hub().registry.impls("tv_loss_l1_3d")["torch_ref"]

        @hookimpl
        def kernelhub_register_impls(registry):
            registry.add_backend(Backend(name, "1.0"))
            registry.add_impl(Impl(op="tv_loss_l1_3d", backend=name, dtypes=ref.dtypes, devices=ref.devices,
                                   forward=forward, backward=backward, **flags))
        return Hub(extra_plugins=[(name, types.SimpleNamespace(kernelhub_register_impls=kernelhub_register_impls))],
                   config=dataclasses.replace(Config(), priority=(name, "torch_ref")))
    return make
