"""Selection rules, proven with test-only backends installed through the real entry-point path."""

import importlib.metadata
import json
import os
import re
import sys
import textwrap
import warnings

import harness
import pytest
import torch

import kernelhub
from kernelhub import _state, cli, testing
from kernelhub.errors import ConfigError, NoImplementationError, PluginValidationError, StrictModeError

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

# Returns a float64 [3] for a float32 call (the spec says float32) or, with SHAPE, a float32 [4].
BADSHAPE = '''
import torch
from kernelhub import hookimpl
from kernelhub.spec import Backend, Impl
from kernelhub_torch_ref import tv

def forward(volume):
    out = tv.tv_loss_l1_3d(volume)
    return torch.cat([out, out[:1]]) if {shape!r} else out.double()

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


def fast(install, name="fast", devices=("cpu",), unavailable=None):
    mod = install(name, FAST, devices=devices, unavailable=unavailable)
    return mod


@pytest.fixture(autouse=True)
def _only_test_backends_compete(monkeypatch):
    """The rules are shown among the test backends and torch_ref: installed kernel backends that serve
    CPU calls (cuda_ext's C++ kernels) are disabled here."""
    monkeypatch.setenv("KERNELHUB_DISABLE", "cuda_ext")


@pytest.fixture(params=["fast path", "operator"])
def path(request, monkeypatch):
    """Run the test on the eager fast path and on the torch.library operators (kernelhub/dispatch.py)."""
    monkeypatch.setattr(_state, "EAGER_FAST_PATH", request.param == "fast path")
    return request.param


def config(tmp_path, text, monkeypatch=None):
    path = tmp_path / "kernelhub.toml"
    path.write_text(textwrap.dedent(text))
    return kernelhub.reload()


def test_priority_and_constraints(install, tmp_path):
    mod = fast(install)
    config(tmp_path, 'priority = ["fast", "torch_ref"]')
    v = torch.randn(5, 6, 7)
    d = kernelhub.explain("tv_loss_l1_3d", v)
    assert d.chosen == "fast"
    statuses = {c.backend: c.status for c in d.candidates}
    assert statuses["fast"] == "accepted" and statuses["torch_ref"] == "lost"
    assert all(s == "rejected" for b, s in statuses.items() if b not in ("fast", "torch_ref"))  # GPU-only ones
    assert next(c for c in d.candidates if c.backend == "torch_ref").lost_to == "fast"
    # dtype and per-impl constraint rejections, with reasons
    d64 = kernelhub.explain("tv_loss_l1_3d", v.double())
    assert d64.chosen == "torch_ref"
    assert "dtype torch.float64 not in" in " ".join(next(c for c in d64.candidates if c.backend == "fast").reasons)
    d4 = kernelhub.explain("tv_loss_l1_3d", torch.randn(2, 5, 6, 7))
    assert d4.chosen == "torch_ref" and "needs a 3-D volume" in str(d4)
    # it really runs, forward and backward on the same backend
    calls = sys.modules[mod].CALLS
    v.requires_grad_()
    out = kernelhub.op("tv_loss_l1_3d")(v)
    out.backward(torch.tensor([1.0, 2.0, 3.0]))
    assert calls == {"forward": 1, "backward": 1}
    ref = v.detach().requires_grad_()
    kernelhub.op("tv_loss_l1_3d", backend="torch_ref")(ref).backward(torch.tensor([1.0, 2.0, 3.0]))
    torch.testing.assert_close(v.grad, ref.grad)


def test_device_and_availability(install, tmp_path):
    fast(install, "gpuonly", devices=("cuda",))
    fast(install, "broken_build", unavailable="nvcc failed: missing header")
    config(tmp_path, 'priority = ["gpuonly", "broken_build", "torch_ref"]')
    d = kernelhub.explain("tv_loss_l1_3d", torch.randn(3, 4, 5))
    reasons = {c.backend: " ".join(c.reasons) for c in d.candidates}
    assert d.chosen == "torch_ref"
    assert "device 'cpu' not in ['cuda']" in reasons["gpuonly"]
    assert "backend unavailable: nvcc failed: missing header" in reasons["broken_build"]
    listed = cli.cmd_list(cli.build_parser().parse_args(["list"]))
    assert listed["backends"]["broken_build"]["reason"] == "nvcc failed: missing header"


def test_disabled_kill_switch_and_env(install, tmp_path, path, monkeypatch):
    fast(install)
    config(tmp_path, 'priority = ["fast"]\ndisabled = ["fast"]')
    v = torch.randn(3, 4, 5)
    assert kernelhub.explain("tv_loss_l1_3d", v).chosen == "torch_ref"
    config(tmp_path, 'priority = ["fast"]\nkill_switch = true')
    d = kernelhub.explain("tv_loss_l1_3d", v)
    assert d.chosen == "torch_ref" and "kill switch" in str(d)
    config(tmp_path, 'priority = ["fast"]')
    assert kernelhub.explain("tv_loss_l1_3d", v).chosen == "fast"
    monkeypatch.setenv("KERNELHUB_KILL_SWITCH", "1")
    assert kernelhub.reload().config.kill_switch and kernelhub.explain("tv_loss_l1_3d", v).chosen == "torch_ref"
    monkeypatch.delenv("KERNELHUB_KILL_SWITCH")
    monkeypatch.setenv("KERNELHUB_DISABLE", "fast,cuda_ext")
    kernelhub.reload()
    assert kernelhub.explain("tv_loss_l1_3d", v).chosen == "torch_ref"
    monkeypatch.setenv("KERNELHUB_DISABLE", "fsat")
    with pytest.raises(ConfigError, match="KERNELHUB_DISABLE: unknown backend 'fsat'"):
        kernelhub.reload()
    monkeypatch.setenv("KERNELHUB_DISABLE", "")
    monkeypatch.setenv("KERNELHUB_KILL_SWITCH", "yes")
    with pytest.raises(ConfigError, match="KERNELHUB_KILL_SWITCH"):
        kernelhub.reload()


def test_per_op_priority_and_pin(install, tmp_path, path):
    fast(install)
    v = torch.randn(3, 4, 5)
    config(tmp_path, 'priority = ["torch_ref", "fast"]\n[ops.tv_loss_l1_3d]\npriority = ["fast"]')
    assert kernelhub.explain("tv_loss_l1_3d", v).chosen == "fast"
    assert kernelhub.explain("tv_loss_sq_3d", v).chosen == "torch_ref"
    config(tmp_path, 'priority = ["torch_ref", "fast"]\n[ops.tv_loss_l1_3d]\npin = "fast"')
    d = kernelhub.explain("tv_loss_l1_3d", v)
    assert d.chosen == "fast" and "pinned" in str(d)
    # a pin that cannot serve the call: one warning, then priority; strict mode raises
    with pytest.warns(RuntimeWarning, match="pinned backend 'fast' cannot serve"):
        assert kernelhub.explain("tv_loss_l1_3d", v.double()).chosen == "torch_ref"
    config(tmp_path, 'strict = true\n[ops.tv_loss_l1_3d]\npin = "fast"')
    with pytest.raises(StrictModeError, match="pinned backend"):
        kernelhub.op("tv_loss_l1_3d")(v.double())


def test_a_case_of_an_op_takes_its_own_priority_before_the_ops(install, tmp_path, path):
    """``[ops.semiconv.cases.tropical_2d_depthwise] priority`` orders the calls of that case (kernelhub/ops/semiconv.py
    defines it), before ``[ops.semiconv] priority``; the op's other calls keep the op's order; explain names the
    case; the backend chosen runs the forward and the backward."""
    mod = install("morph", MORPH)
    config(tmp_path, """
        [ops.semiconv]
        priority = ["torch_ref", "morph"]
        [ops.semiconv.cases.tropical_2d_depthwise]
        priority = ["morph"]
    """)
    img = torch.randn(2, 4, 9, 8, requires_grad=True)
    depthwise, dense = torch.randn(4, 1, 3, 3), torch.randn(4, 4, 3, 3)
    d = kernelhub.explain("semiconv", img, depthwise, "tropical_min", padding="same", groups=4)
    assert d.chosen == "morph" and "priority order morph > torch_ref (case tropical_2d_depthwise of semiconv)" in str(d)
    others = [(img, dense, "tropical_max", 1, "same"),           # dense
              (img, depthwise, "tropical_max", 2, "same"),       # strided
              (img, depthwise, "linear", 1, "same"),             # not max/min
              (img, depthwise, "tropical_max", 1, [3, 3, 1, 1])]  # padding as large as the kernel
    for x, k, sf, stride, padding in others:
        d = kernelhub.explain("semiconv", x, k, sf, stride=stride, padding=padding, groups=x.shape[1] // k.shape[1])
        assert d.chosen == "torch_ref" and "case" not in str(d), (sf, stride, padding)
    calls = sys.modules[mod].CALLS
    kernelhub.op("semiconv")(img, depthwise, "tropical_max", padding="same", groups=4).sum().backward()
    assert calls == {"forward": 1, "backward": 1}
    kernelhub.op("semiconv")(img, dense, "tropical_max", padding="same").sum().backward()
    assert calls == {"forward": 1, "backward": 1}


def test_a_case_test_that_raises_leaves_the_call_to_the_ops_priority(install, tmp_path, monkeypatch):
    """A spec's case test is a plugin's code: one that raises is contained (one warning; strict mode raises)."""
    install("morph", MORPH)
    config(tmp_path, '[ops.semiconv]\npriority = ["torch_ref", "morph"]\n[ops.semiconv.cases.tropical_2d_depthwise]\n'
                     'priority = ["morph"]')

    def broken(spec, args):
        raise ValueError("no such shape")
    monkeypatch.setattr(kernelhub.spec.OpSpec, "case_of", broken)
    img, kernel = torch.randn(1, 2, 8, 8), torch.randn(2, 1, 3, 3)
    with pytest.warns(RuntimeWarning, match="semiconv: the spec's case test raised ValueError: no such shape"):
        assert kernelhub.explain("semiconv", img, kernel, "tropical_max", padding="same", groups=2).chosen == \
            "torch_ref"
    config(tmp_path, 'strict = true\n[ops.semiconv.cases.tropical_2d_depthwise]\npriority = ["morph"]')
    with pytest.raises(StrictModeError, match="case test raised"):
        kernelhub.explain("semiconv", img, kernel, "tropical_max", padding="same", groups=2)


def test_forced_backend(install, tmp_path, path):
    fast(install)
    kernelhub.reload()
    v = torch.randn(3, 4, 5)
    assert kernelhub.explain("tv_loss_l1_3d", v).chosen == "fast"  # unlisted backends come before torch_ref
    out = kernelhub.op("tv_loss_l1_3d", backend="torch_ref")(v)
    torch.testing.assert_close(out, kernelhub.op("tv_loss_l1_3d")(v))
    with pytest.raises(NoImplementationError, match="forced backend 'fast' cannot serve.*dtype torch.float64"):
        kernelhub.op("tv_loss_l1_3d", backend="fast")(v.double())
    with pytest.raises(NoImplementationError, match="backend 'fast' has no impl of tv_loss_sq_3d"):
        kernelhub.op("tv_loss_sq_3d", backend="fast")(v)
    with pytest.raises(NoImplementationError, match="'nope'"):
        kernelhub.op("tv_loss_l1_3d", backend="nope")


def test_call_time_failure_falls_back_once(install, tmp_path, path):
    install("flaky", FLAKY)
    config(tmp_path, 'priority = ["flaky", "torch_ref"]')
    v = torch.randn(3, 4, 5, requires_grad=True)
    with pytest.warns(RuntimeWarning, match="'flaky' raised RuntimeError: kernel exploded"):
        out = kernelhub.op("tv_loss_l1_3d")(v)
    torch.testing.assert_close(out, kernelhub.op("tv_loss_l1_3d", backend="torch_ref")(v))
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # no second warning, and the backward does not hit flaky
        kernelhub.op("tv_loss_l1_3d")(v).sum().backward()
        kernelhub.op("tv_loss_l1_3d")(torch.randn(3, 4, 5))
    assert "raised at call time" in str(kernelhub.explain("tv_loss_l1_3d", v))
    config(tmp_path, 'strict = true\npriority = ["flaky", "torch_ref"]')
    with pytest.raises(StrictModeError, match="kernel exploded"):
        kernelhub.op("tv_loss_l1_3d")(v)


def test_the_fast_path_backward_runs_the_backend_of_its_forward(install, tmp_path):
    mod = fast(install)
    kernelhub.reload()
    v = torch.randn(3, 4, 5, requires_grad=True)
    out = kernelhub.op("tv_loss_l1_3d")(v)  # served by fast
    config(tmp_path, 'priority = ["torch_ref", "fast"]')  # a new hub that would now pick torch_ref
    before = dict(sys.modules[mod].CALLS)
    (g,) = torch.autograd.grad(out.sum(), v)
    assert sys.modules[mod].CALLS["backward"] == before["backward"] + 1
    want = kernelhub.op("tv_loss_l1_3d", backend="torch_ref")(v).sum()
    torch.testing.assert_close(g, torch.autograd.grad(want, v)[0])


@pytest.mark.parametrize("shape", [False, True])
def test_a_wrong_output_shape_or_dtype_never_reaches_the_user(install, tmp_path, path, shape):
    install("badshape", BADSHAPE, shape=shape)
    config(tmp_path, 'priority = ["badshape", "torch_ref"]')
    v = torch.randn(3, 4, 5, requires_grad=True)
    want = "float32[4]@cpu" if shape else "float64[3]@cpu"
    with pytest.raises(kernelhub.WrongOutputError, match=rf"'badshape' returned an output {re.escape(want)}; the spec "
                       r"says float32\[3\]@cpu"):
        kernelhub.op("tv_loss_l1_3d", backend="badshape")(v)
    with pytest.warns(RuntimeWarning, match="'badshape' raised WrongOutputError"):
        out = kernelhub.op("tv_loss_l1_3d")(v)
    assert out.dtype == torch.float32 and out.shape == (3,)
    torch.testing.assert_close(out, kernelhub.op("tv_loss_l1_3d", backend="torch_ref")(v))
    config(tmp_path, 'strict = true\npriority = ["badshape", "torch_ref"]')
    with pytest.raises(StrictModeError, match="WrongOutputError"):
        kernelhub.op("tv_loss_l1_3d")(v)


def test_a_wrong_gradient_shape_never_reaches_the_user(install, tmp_path, path):
    """The forward is right (float32 [3]), the backward's gradient has the wrong shape: the backward falls back."""
    install("badshape", BADSHAPE.replace("out.double()", "out"), shape=False)
    config(tmp_path, 'priority = ["badshape", "torch_ref"]')
    v = torch.randn(3, 4, 5, requires_grad=True)
    g = torch.tensor([1.0, -2.0, 0.5])
    out = kernelhub.op("tv_loss_l1_3d", backend="badshape")(v)
    with pytest.raises(kernelhub.WrongOutputError, match=r"gradient of 'volume' float32\[3, 4\]@cpu; the spec says "
                       r"float32\[3, 4, 5\]@cpu"):
        out.backward(g)
    with pytest.warns(RuntimeWarning, match="'badshape' raised WrongOutputError"):
        kernelhub.op("tv_loss_l1_3d")(v).backward(g)
    w = v.detach().requires_grad_()
    kernelhub.op("tv_loss_l1_3d", backend="torch_ref")(w).backward(g)
    torch.testing.assert_close(v.grad, w.grad)


def test_deterministic_algorithms_set_aside_a_backend_that_adds_with_atomics(install, tmp_path, path):
    install("atomic", ATOMIC)
    config(tmp_path, 'priority = ["atomic", "torch_ref"]')
    v = torch.randn(5, 6, 7)
    assert kernelhub.explain("tv_loss_l1_3d", v).chosen == "atomic"
    torch.use_deterministic_algorithms(True)
    try:
        d = kernelhub.explain("tv_loss_l1_3d", v)
        assert d.chosen == "torch_ref"
        assert "not deterministic" in " ".join(next(c for c in d.candidates if c.backend == "atomic").reasons)
        with pytest.raises(NoImplementationError, match="torch.use_deterministic_algorithms"):
            kernelhub.op("tv_loss_l1_3d", backend="atomic")(v)
    finally:
        torch.use_deterministic_algorithms(False)
    assert kernelhub.explain("tv_loss_l1_3d", v).chosen == "atomic"  # the switch is part of the cache key


def test_decision_cache_is_keyed_cheaply(install, tmp_path):
    fast(install)
    hub = kernelhub.reload()
    v = torch.randn(3, 4, 5)
    d1 = hub.selector.decide("tv_loss_l1_3d", (v,))
    assert hub.selector.decide("tv_loss_l1_3d", (torch.randn(3, 4, 5),)) is d1  # same key: cached object
    assert hub.selector.decide("tv_loss_l1_3d", (torch.randn(3, 4, 6),)) is not d1
    assert hub.selector.decide("tv_loss_l1_3d", (v.double(),)).chosen == "torch_ref"


def test_plugin_failing_to_import_is_skipped_and_reported(install, tmp_path, capsys):
    install("broken", "raise ImportError('libfoo.so: cannot open shared object file')\n")
    hub = kernelhub.reload()
    assert [(e.plugin, e.stage) for e in hub.registry.plugin_errors] == [("broken", "import")]
    assert kernelhub.op("tv_loss_l1_3d")(torch.ones(2, 2, 2)).tolist() == [0.0, 0.0, 0.0]
    for command in ("list", "doctor"):
        assert cli.main([command, "--json"]) == 0
        data = json.loads(capsys.readouterr().out)
        assert any(e["plugin"] == "broken" and "libfoo.so" in e["error"] for e in data["plugin_errors"])
        assert cli.main([command]) == 0
        assert "libfoo.so" in capsys.readouterr().out
    # strict mode makes it fatal
    (tmp_path / "kernelhub.toml").write_text("strict = true\n")
    with pytest.raises(PluginValidationError, match="broken"):
        kernelhub.reload()


def test_doctor_reports_the_installed_versions(capsys):
    """Every runtime dependency pyproject.toml declares, with its installed version (numpy was named by the user
    guide but neither declared nor listed, and torch warned without it on every command)."""
    import re
    import tomllib
    from pathlib import Path

    assert cli.main(["doctor", "--json"]) == 0
    versions = json.loads(capsys.readouterr().out)["versions"]
    project = tomllib.loads((Path(__file__).resolve().parents[1] / "pyproject.toml").read_text())["project"]
    declared = [re.match(r"[A-Za-z0-9_.-]+", d).group(0) for d in project["dependencies"]]
    assert "numpy" in declared
    for dist in declared:  # rich has no __version__ attribute: it once read "not importable"
        assert versions[dist] == (torch.__version__ if dist == "torch" else importlib.metadata.version(dist)), versions


def test_plugin_failing_validation_is_skipped(install):
    install("invalid", INVALID)
    hub = kernelhub.reload()
    (err,) = hub.registry.plugin_errors
    assert err.plugin == "invalid" and "PluginValidationError" in err.error and "torch.int32" in err.error
    assert "invalid" not in hub.registry.backends  # rolled back whole


@pytest.mark.parametrize("command", [["explain", "tv_loss_l1_3d", "--shape", "4,5,6"], ["tune", "tv_loss_l1_3d"],
                                     ["bench", "tv_loss_l1_3d"], ["check", "torch_ref"]])
@pytest.mark.parametrize("device, says", [harness.cuda_param("cuda:99", "'cuda:99': this machine has"),
                                          ("bogus", "'bogus' is not a device"),
                                          ("meta", "'meta': the commands run on cpu or cuda")])
def test_cli_refuses_a_device_this_machine_lacks_naming_the_option(capsys, command, device, says):
    """Every command's --device is checked before anything runs: a usage error (exit 2) naming the option, where
    torch's own was a note about its CUDA library (explain) or a traceback (bench)."""
    with pytest.raises(SystemExit) as exc:
        cli.main([*command, "--device", device])
    assert exc.value.code == 2
    err = capsys.readouterr().err
    assert "argument --device" in err and says in err, err


def test_cli_explain_describes_every_op_list_arguments_included(tmp_path):
    """`kernelhub explain` on the command line, as a user runs it (a subprocess at 80 columns): each op's tensor
    arguments take one --shape each, in order, and a list argument (the multiscale planes) one per tensor in it,
    which the call shows; too few shapes is a usage error that names the arguments, not a call with made-up planes."""
    env = dict(os.environ, COLUMNS="80")
    base = [sys.executable, "-m", "kernelhub.cli", "explain", "kplanes_interp_tilted_ms", "--shape", "512,3",
            "--shape", "2,3,3"]
    done = harness.run([*base, "--shape", "6,8,32,32", "--shape", "6,8,16,16", "--json"], timeout=300, env=env,
                       cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    data = json.loads(done.stdout)
    assert "[float32[6, 8, 32, 32]@cpu, float32[6, 8, 16, 16]@cpu]" in data["call"] and data["chosen"]
    shown = harness.run([*base, "--shape", "6,8,32,32"], timeout=300, env=env, cwd=tmp_path)
    assert shown.returncode == 0 and max(map(len, shown.stdout.splitlines())) <= 80, shown.stdout
    short = harness.run(base, timeout=300, env=env, cwd=tmp_path)
    assert short.returncode == 2
    assert "planes (a list: one --shape per tensor in it); got 2" in " ".join(short.stderr.split()), short.stderr
    for op in kernelhub.op_names():  # every op, with its first small sample's shapes
        sample = testing.samples(op, "small", torch.float32 if torch.float32 in
                                 kernelhub.get_hub().registry.spec(op).dtypes else torch.complex64, "cpu")[0]
        shapes = [t.shape for a in sample.args for t in (a if isinstance(a, (list, tuple)) else [a])
                  if isinstance(t, torch.Tensor)]
        argv = ["explain", op, "--json"] + [x for s in shapes for x in ("--shape", ",".join(map(str, s)))]
        if op == "semiconv":
            argv += ["--arg", f"groups={sample.args[6]}"]
        assert cli.main(argv) == 0, op


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


def test_cli_check_of_a_wrong_gradient_stays_readable(install, tmp_path):
    """A plugin author's wrong gradient under `kernelhub check` (a subprocess at 80 columns): each failing check one
    row of a short line naming the worst Jacobian entry, its index and both values, not gradcheck's whole matrix
    (907 lines once); --verbose and the JSON give the whole message."""
    install("wronggrad", WRONG_GRAD)
    env = dict(os.environ, COLUMNS="80", PYTHONPATH=os.pathsep.join([str(tmp_path / "site"), *sys.path]))
    argv = [sys.executable, "-m", "kernelhub.cli", "check", "wronggrad", "--op", "tv_loss_sq_3d"]
    table = harness.run(argv, timeout=600, env=env, cwd=tmp_path)
    assert table.returncode == 1, table.stderr
    lines = table.stdout.splitlines()
    assert len(lines) < 150 and max(map(len, lines)) <= 80, table.stdout
    text = " ".join(table.stdout.replace("│", " ").split())
    assert "gradcheck of tv_loss_sq_3d on wronggrad" in text and "analytical" in text and "numerical" in text, text
    assert "d output[0] / d volume[" in text and "numerical:tensor" not in text
    data = json.loads(harness.run([*argv, "--json"], timeout=600, env=env, cwd=tmp_path).stdout)
    failed = [r for r in data["rows"] if r["status"] == "fail"]
    assert any("gradcheck" in r["check"] for r in failed)
    assert all("\n" not in r["detail"] for r in failed) and any("numerical:tensor" in r["full"] for r in failed)
    verbose = harness.run([*argv, "--verbose"], timeout=600, env=env, cwd=tmp_path)
    assert "numerical:tensor" in verbose.stdout and "analytical:tensor" in verbose.stdout


def test_cli_explain(capsys, install, tmp_path):
    fast(install)
    config(tmp_path, 'priority = ["fast", "torch_ref"]\n[compile]\npriority = ["fast"]')
    assert cli.main(["explain", "tv_loss_l1_3d", "--shape", "4,5,6", "--json"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert data["chosen"] == "fast"
    assert data["compiled"] == "the operator, which selects when it runs, as above"  # fast's impl is not traceable
    assert cli.main(["explain", "tv_loss_l1_3d", "--shape", "4,5,6"]) == 0
    out = capsys.readouterr().out
    assert "lost to fast" in out
    assert "in a torch.compile graph ([compile] priority): " in out
    assert cli.main(["explain", "tv_loss_l1_3d", "--shape", "4,5,6", "--dtype", "float64"]) == 0
    out = capsys.readouterr().out
    assert "rejected" in out and "dtype torch.float64 not in" in out
    # arguments left out take the op's defaults (groups 1, tropical_max, ...), not a sample's
    assert cli.main(["explain", "semiconv", "--shape", "1,2,8,8", "--shape", "2,2,3,3", "--json"]) == 0
    call = json.loads(capsys.readouterr().out)["call"]
    assert "'tropical_max', [1, 1], [0, 0, 0, 0], [1, 1], 1, 'conv', False" in call
    assert cli.main(["explain", "semiconv", "--shape", "1,2,8,8", "--shape", "2,1,3,3", "--arg", "groups=2"]) == 0
    capsys.readouterr()
    assert cli.main(["explain", "semiconv", "--shape", "1,2,8,8", "--shape", "2,1,3,3"]) == 2
    assert "C/groups = 2 input" in capsys.readouterr().err  # errors go to stderr


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


def test_cli_check_passes_a_correct_backend_and_fails_a_wrong_one(capsys, install):
    install("atomic", ATOMIC)
    install("wrong", WRONG)
    kernelhub.reload()
    assert cli.main(["check", "atomic", "--json"]) == 0
    data = json.loads(capsys.readouterr().out)
    checks = {r["check"] for r in data["rows"]}
    # every check the kit has for a float32-only CPU impl ran and passed; no float64, so no opcheck/gradcheck
    assert {"parity float32 small", "parity float32 edge", "parity float32 medium", "non-contiguous float32",
            "bad inputs"} == checks and data["fail"] == 0 and data["pass"] == len(data["rows"]) == 5
    assert cli.main(["check", "wrong"]) == 1
    out = capsys.readouterr().out
    assert "FAIL" in out and "forward error" in out
    assert cli.main(["check", "no_such_backend"]) == 2
    assert "unknown backend" in capsys.readouterr().err


def test_cli_check_runs_opcheck_and_gradcheck_where_float64_is_declared(capsys):
    # two ops (--op); the user guide's last block runs `kernelhub check torch_ref` on every op
    assert cli.main(["check", "torch_ref", "--op", "tv_loss_l1_3d", "--op", "tikhonov_inverse_2xn", "--json"]) == 0
    data = json.loads(capsys.readouterr().out)
    checks = {(r["op"], r["check"]) for r in data["rows"]}
    assert {r["op"] for r in data["rows"]} == {"tv_loss_l1_3d", "tikhonov_inverse_2xn"}
    assert {(op, f"{c} float64") for op in ("tv_loss_l1_3d", "tikhonov_inverse_2xn")
            for c in ("opcheck", "gradcheck")} <= checks
    assert data["fail"] == 0 and data["pass"] > 10


def test_cli_check_refuses_an_op_the_backend_does_not_serve(capsys):
    assert cli.main(["check", "torch_ref", "--op", "no_such_op"]) == 2
    assert "--op 'no_such_op'" in " ".join(capsys.readouterr().err.split())


def test_list_and_tune_print_whole_names_in_80_columns(monkeypatch, capsys):
    """A CI log, a pipe, a laptop terminal: `kernelhub list`'s op names and `kernelhub tune`'s calls come whole
    (no "kplanes_inte…", no call folded over five lines of a cell), and no line is wider than the terminal."""
    monkeypatch.setenv("COLUMNS", "80")
    assert cli.main(["list"]) == 0
    out = capsys.readouterr().out
    assert max(map(len, out.splitlines())) <= 80 and "…" not in out
    for op in kernelhub.get_hub().registry.specs:
        assert f" {op} " in out
    call = "float32[4, 64, 64, 64]@cuda:0, " * 3 + "'tropical_max'"
    data = {"device": "cuda:0 NVIDIA H200", "cache": "/home/user/.cache/kernelhub/winners.json", "skipped": [],
            "not_timed": [], "failed": [],
            "tuned": [{"op": "kplanes_interp_tilted_taps", "call": call, "winner": "triton", "within_noise": [],
                       "candidates": {"triton": {"error": "", "first_call_s": 0.5, "forward_ms": 0.25, "step_ms": 1.0},
                                      "cuda_ext": {"error": "", "first_call_s": 2.0, "forward_ms": 0.5,
                                                   "step_ms": 1.6}}}]}
    from rich.console import Console
    console = Console(width=80, record=True)
    cli.render_tune(data, console)
    text = console.export_text()
    assert max(map(len, text.splitlines())) <= 80
    assert "kplanes_interp_tilted_taps(float32[4, 64, 64, 64]@cuda:0," in text and "1.60x slower" in text


@pytest.mark.parametrize("columns", ["80", None])  # a terminal of 80 columns; a pipe (rich then uses 80)
def test_the_tuned_winners_table_keeps_every_op_whole_in_80_columns_and_wide_shows_every_time(monkeypatch, capsys,
                                                                                               columns):
    if columns is None:
        monkeypatch.delenv("COLUMNS", raising=False)
    else:
        monkeypatch.setenv("COLUMNS", columns)
    data = cli.cmd_list(cli.build_parser().parse_args(["list"]))
    ops = sorted(kernelhub.get_hub().registry.specs)
    row = lambda op: {"op": op, "dtype": "float32", "bucket": "1048576x4 4x4x4 16x32x256x256",  # noqa: E731
                      "winner": "triton", "within_noise": [], "failed": {}, "stale": "cuda_ext changed",
                      "step_ms": {"triton": 0.5123, "cuda_ext": 0.7345, "torch_ref": 12.5}}
    semiconv = {**row("semiconv"), "bucket": "2x8x32x32 8x1x8x8 'tropical_max' [1, 1] [2, 2, 2, 2] [1, 1] 8 'conv' "
                                              "False False False"}  # a real one, from the README's main job
    data["winners"] = {"cache": "/home/user/.cache/kernelhub/tuning.json", "mode": "cached",
                       "devices": {"NVIDIA H200": [row(op) for op in ops] + [semiconv]}}
    monkeypatch.setitem(cli.COMMANDS, "list",
                        cli.COMMANDS["list"]._replace(run=lambda args: {**data, "wide": args.wide}))
    assert cli.main(["list"]) == 0
    out = capsys.readouterr().out
    table = out[out.index("tuned winners on"):]
    assert max(map(len, out.splitlines())) <= 80 and "…" not in out[:out.index("tuned winners on")]
    lines = [line for line in table.splitlines() if line.startswith("│")]
    for op in ops:  # the op whole, its winner and its note beside it
        assert any(f"│ {op} " in line and "triton 0.512" in line and "set aside:" in line for line in lines), op
    assert len(lines) <= 2 * (len(ops) + 1)  # each entry on at most two lines
    assert "8x1x8x8 'tropical" in table and "False False False" not in table  # the long bucket cut, not wrapped
    assert "cuda_ext 0.7345" not in table
    assert cli.main(["list", "--wide"]) == 0
    wide = capsys.readouterr().out
    assert "triton 0.5123, cuda_ext 0.7345, torch_ref 12.5" in wide and "set aside: cuda_ext changed" in wide
    assert "[1, 1] 8 'conv' False False False" in wide
