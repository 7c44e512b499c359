"""Selection rules, proven with test-only backends installed through the real entry-point path."""

import re
import sys
import warnings

import harness
import pytest
import torch

import kernelhub
from kernelhub import _state, cli
from kernelhub.errors import ConfigError, NoImplementationError, StrictModeError

# the rules are shown among the test backends and torch_ref
pytestmark = pytest.mark.usefixtures("only_test_backends")


@pytest.fixture(params=["fast path", "operator"])
def path(request, monkeypatch):
    """Run the test on the eager fast path and on the torch.library operators (kernelhub/dispatch.py)."""
    monkeypatch.setattr(_state, "EAGER_FAST_PATH", request.param == "fast path")
    return request.param




def test_priority_and_constraints(plugin, tmp_path):
    mod = plugin("fast")
    harness.write_config(tmp_path, 'priority = ["fast", "torch_ref"]')
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


def test_device_and_availability(plugin, tmp_path):
    plugin("fast", "gpuonly", devices=("cuda",))
    plugin("fast", "broken_build", unavailable="nvcc failed: missing header")
    harness.write_config(tmp_path, 'priority = ["gpuonly", "broken_build", "torch_ref"]')
    d = kernelhub.explain("tv_loss_l1_3d", torch.randn(3, 4, 5))
    reasons = {c.backend: " ".join(c.reasons) for c in d.candidates}
    assert d.chosen == "torch_ref"
    assert "device 'cpu' not in ['cuda']" in reasons["gpuonly"]
    assert "backend unavailable: nvcc failed: missing header" in reasons["broken_build"]
    listed = cli.cmd_list(cli.build_parser().parse_args(["list"]))
    assert listed["backends"]["broken_build"]["reason"] == "nvcc failed: missing header"


def test_disabled_kill_switch_and_env(plugin, tmp_path, path, monkeypatch):
    plugin("fast")
    harness.write_config(tmp_path, 'priority = ["fast"]\ndisabled = ["fast"]')
    v = torch.randn(3, 4, 5)
    assert kernelhub.explain("tv_loss_l1_3d", v).chosen == "torch_ref"
    harness.write_config(tmp_path, 'priority = ["fast"]\nkill_switch = true')
    d = kernelhub.explain("tv_loss_l1_3d", v)
    assert d.chosen == "torch_ref" and "kill switch" in str(d)
    harness.write_config(tmp_path, 'priority = ["fast"]')
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


def test_per_op_priority_and_pin(plugin, tmp_path, path):
    plugin("fast")
    v = torch.randn(3, 4, 5)
    harness.write_config(tmp_path, 'priority = ["torch_ref", "fast"]\n[ops.tv_loss_l1_3d]\npriority = ["fast"]')
    assert kernelhub.explain("tv_loss_l1_3d", v).chosen == "fast"
    assert kernelhub.explain("tv_loss_sq_3d", v).chosen == "torch_ref"
    harness.write_config(tmp_path, 'priority = ["torch_ref", "fast"]\n[ops.tv_loss_l1_3d]\npin = "fast"')
    d = kernelhub.explain("tv_loss_l1_3d", v)
    assert d.chosen == "fast" and "pinned" in str(d)
    # a pin that cannot serve the call: one warning, then priority; strict mode raises
    with pytest.warns(RuntimeWarning, match="pinned backend 'fast' cannot serve"):
        assert kernelhub.explain("tv_loss_l1_3d", v.double()).chosen == "torch_ref"
    harness.write_config(tmp_path, 'strict = true\n[ops.tv_loss_l1_3d]\npin = "fast"')
    with pytest.raises(StrictModeError, match="pinned backend"):
        kernelhub.op("tv_loss_l1_3d")(v.double())


def test_a_case_of_an_op_takes_its_own_priority_before_the_ops(plugin, tmp_path, path):
    """``[ops.semiconv.cases.tropical_2d_depthwise] priority`` orders the calls of that case (kernelhub/ops/semiconv.py
    defines it), before ``[ops.semiconv] priority``; the op's other calls keep the op's order; explain names the
    case; the backend chosen runs the forward and the backward."""
    mod = plugin("morph", "morph")
    harness.write_config(tmp_path, """
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


def test_a_case_test_that_raises_leaves_the_call_to_the_ops_priority(plugin, tmp_path, monkeypatch):
    """A spec's case test is a plugin's code: one that raises is contained (one warning; strict mode raises)."""
    plugin("morph", "morph")
    harness.write_config(tmp_path, '[ops.semiconv]\npriority = ["torch_ref", "morph"]\n'
                                   '[ops.semiconv.cases.tropical_2d_depthwise]\npriority = ["morph"]')

    def broken(spec, args):
        raise ValueError("no such shape")
    monkeypatch.setattr(kernelhub.spec.OpSpec, "case_of", broken)
    img, kernel = torch.randn(1, 2, 8, 8), torch.randn(2, 1, 3, 3)
    with pytest.warns(RuntimeWarning, match="semiconv: the spec's case test raised ValueError: no such shape"):
        assert kernelhub.explain("semiconv", img, kernel, "tropical_max", padding="same", groups=2).chosen == \
            "torch_ref"
    harness.write_config(tmp_path, 'strict = true\n[ops.semiconv.cases.tropical_2d_depthwise]\npriority = ["morph"]')
    with pytest.raises(StrictModeError, match="case test raised"):
        kernelhub.explain("semiconv", img, kernel, "tropical_max", padding="same", groups=2)


def test_forced_backend(plugin, tmp_path, path):
    plugin("fast")
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


def test_call_time_failure_falls_back_once(plugin, tmp_path, path):
    plugin("flaky", "flaky")
    harness.write_config(tmp_path, 'priority = ["flaky", "torch_ref"]')
    v = torch.randn(3, 4, 5, requires_grad=True)
    with pytest.warns(RuntimeWarning, match="'flaky' raised RuntimeError: kernel exploded"):
        out = kernelhub.op("tv_loss_l1_3d")(v)
    torch.testing.assert_close(out, kernelhub.op("tv_loss_l1_3d", backend="torch_ref")(v))
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # no second warning, and the backward does not hit flaky
        kernelhub.op("tv_loss_l1_3d")(v).sum().backward()
        kernelhub.op("tv_loss_l1_3d")(torch.randn(3, 4, 5))
    assert "raised at call time" in str(kernelhub.explain("tv_loss_l1_3d", v))
    harness.write_config(tmp_path, 'strict = true\npriority = ["flaky", "torch_ref"]')
    with pytest.raises(StrictModeError, match="kernel exploded"):
        kernelhub.op("tv_loss_l1_3d")(v)


def test_the_fast_path_backward_runs_the_backend_of_its_forward(plugin, tmp_path):
    mod = plugin("fast")
    kernelhub.reload()
    v = torch.randn(3, 4, 5, requires_grad=True)
    out = kernelhub.op("tv_loss_l1_3d")(v)  # served by fast
    harness.write_config(tmp_path, 'priority = ["torch_ref", "fast"]')  # a new hub that would now pick torch_ref
    before = dict(sys.modules[mod].CALLS)
    (g,) = torch.autograd.grad(out.sum(), v)
    assert sys.modules[mod].CALLS["backward"] == before["backward"] + 1
    want = kernelhub.op("tv_loss_l1_3d", backend="torch_ref")(v).sum()
    torch.testing.assert_close(g, torch.autograd.grad(want, v)[0])


@pytest.mark.parametrize("shape", [False, True])
def test_a_wrong_output_shape_or_dtype_never_reaches_the_user(plugin, tmp_path, path, shape):
    plugin("badshape", "badshape", shape=shape)
    harness.write_config(tmp_path, 'priority = ["badshape", "torch_ref"]')
    v = torch.randn(3, 4, 5, requires_grad=True)
    want = "float32[4]@cpu" if shape else "float64[3]@cpu"
    with pytest.raises(kernelhub.WrongOutputError, match=rf"'badshape' returned an output {re.escape(want)}; the spec "
                       r"says float32\[3\]@cpu"):
        kernelhub.op("tv_loss_l1_3d", backend="badshape")(v)
    with pytest.warns(RuntimeWarning, match="'badshape' raised WrongOutputError"):
        out = kernelhub.op("tv_loss_l1_3d")(v)
    assert out.dtype == torch.float32 and out.shape == (3,)
    torch.testing.assert_close(out, kernelhub.op("tv_loss_l1_3d", backend="torch_ref")(v))
    harness.write_config(tmp_path, 'strict = true\npriority = ["badshape", "torch_ref"]')
    with pytest.raises(StrictModeError, match="WrongOutputError"):
        kernelhub.op("tv_loss_l1_3d")(v)


def test_a_wrong_gradient_shape_never_reaches_the_user(plugin, tmp_path, path):
    """The forward is right (float32 [3]), the backward's gradient has the wrong shape: the backward falls back."""
    plugin("badshape", shape=False, double=False)
    harness.write_config(tmp_path, 'priority = ["badshape", "torch_ref"]')
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


def test_deterministic_algorithms_set_aside_a_backend_that_adds_with_atomics(plugin, tmp_path, path):
    plugin("atomic", "atomic")
    harness.write_config(tmp_path, 'priority = ["atomic", "torch_ref"]')
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


def test_decision_cache_is_keyed_cheaply(plugin, tmp_path):
    plugin("fast")
    hub = kernelhub.reload()
    v = torch.randn(3, 4, 5)
    d1 = hub.selector.decide("tv_loss_l1_3d", (v,))
    assert hub.selector.decide("tv_loss_l1_3d", (torch.randn(3, 4, 5),)) is d1  # same key: cached object
    assert hub.selector.decide("tv_loss_l1_3d", (torch.randn(3, 4, 6),)) is not d1
    assert hub.selector.decide("tv_loss_l1_3d", (v.double(),)).chosen == "torch_ref"






























