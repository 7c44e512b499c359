"""What a hostile user or a careless plugin author cannot do: crash the host, get a silent wrong result, or make
kernelhub write a file that is not its own (docs/reliability.md, "Hostile inputs"). The winners-file cases are
in tests/test_tune.py, the configuration's in tests/test_config.py."""

import os
import sys
import warnings

import harness
import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import kernelhub
from kernelhub.errors import StrictModeError, WrongOutputError
from kernelhub.select import MAX_CACHED_DECISIONS

# A backend serving tv_loss_l1_3d on the CPU in float32 that refuses inputs with a stride-0 dim (an expanded
# tensor) and, to show what it would give there, returns zeros for them.
STRIDES = '''
import torch
from kernelhub import hookimpl
from kernelhub.spec import Backend, Impl
from kernelhub_torch_ref import tv
from kernelhub_torch_ref.plugin import vjp_backward

def forward(volume):
    if 0 in volume.stride():
        return torch.zeros(3, dtype=volume.dtype)
    return tv.tv_loss_l1_3d(volume)

@hookimpl
def kernelhub_register_impls(registry):
    registry.add_backend(Backend("{name}", "0.1"))
    registry.add_impl(Impl(op="tv_loss_l1_3d", backend="{name}", forward=forward,
                           backward=vjp_backward(tv.tv_loss_l1_3d, (0,)), dtypes=(torch.float32,), devices=("cpu",),
                           not_supported_reasons=lambda a: ["a stride-0 dim"] if 0 in a[0].stride() else []))
'''

# A plugin whose entry point takes a first-party backend's name (or an op module's), registering "{name}2".
IMPOSTOR = '''
import torch
from kernelhub import hookimpl
from kernelhub.spec import Backend

@hookimpl
def kernelhub_register_impls(registry):
    registry.add_backend(Backend("{backend}", "6.6"))
'''

EXITS = '''
import sys
from kernelhub import hookimpl
from kernelhub.spec import Backend
{at_import}

@hookimpl
def kernelhub_register_impls(registry):
    registry.add_backend(Backend("{name}", "0.1", unavailable_reason=lambda: sys.exit(4)))
'''

# An impl of tikhonov_inverse_2xn returning its input (the output aliases an argument).
ALIASING = '''
import torch
from kernelhub import hookimpl
from kernelhub.spec import Backend, Impl

@hookimpl
def kernelhub_register_impls(registry):
    registry.add_backend(Backend("{name}", "0.1"))
    registry.add_impl(Impl(op="tikhonov_inverse_2xn", backend="{name}", forward=lambda M, lam: M,
                           backward=lambda g, M, lam, needs: [g], dtypes=(torch.complex64,), devices=("cpu",)))
'''


@pytest.fixture(autouse=True)
def _cpu_kernels_stay_out(monkeypatch):
    monkeypatch.setenv("KERNELHUB_DISABLE", "cuda_ext")  # the test backends compete with torch_ref only


# -- 1. semiconv with no input channel --------------------------------------------------------------------------
@pytest.mark.parametrize("backend", ["torch_ref", "cuda_ext", "triton", ""])
def test_semiconv_with_no_input_channel_is_a_value_error_on_every_backend(backend, monkeypatch):
    monkeypatch.delenv("KERNELHUB_DISABLE")
    kernelhub.reload()
    with pytest.raises(ValueError, match="semiconv: argument 'img' must have at least one channel"):
        kernelhub.op("semiconv", backend=backend or None)(torch.randn(1, 0, 6, 6), torch.randn(2, 0, 3, 3))


def test_the_cuda_ext_library_op_refuses_an_empty_window_instead_of_dividing_by_zero():
    pytest.importorskip("kernelhub_cuda_ext")
    code = ("import torch\nfrom kernelhub_cuda_ext import _lib\nassert _lib.load() is None, _lib.load()\n"
            "x, k = torch.randn(1, 0, 1, 6, 6), torch.randn(2, 0, 1, 3, 3)\n"
            "try:\n    torch.ops.kernelhub_cuda_ext.semiconv_forward(x, k, 0, 0.0, 1, [1, 1, 1], [0, 0, 0], [1, 1, 1], "
            "[1, 4, 4], False)\nexcept RuntimeError as e:\n    print('refused:', e)\n")
    proc = harness.run([sys.executable, "-c", code], timeout=600)
    assert proc.returncode == 0 and "needs a channel" in proc.stdout, \
        (proc.returncode, proc.stdout, proc.stderr[-2000:])


# -- 3. the decision cache carries strides ------------------------------------------------------------------------
def test_a_decision_made_for_a_transposed_call_is_not_reused_for_an_expanded_one(install):
    install("strides", STRIDES)
    kernelhub.reload()
    base = torch.randn(8, 8, 8)
    transposed = base.transpose(0, 2)
    expanded = torch.randn(1, 8, 8).expand(8, 8, 8)  # same shape, a stride-0 dim
    assert kernelhub.explain("tv_loss_l1_3d", transposed).chosen == "strides"
    kernelhub.op("tv_loss_l1_3d")(transposed)
    assert kernelhub.explain("tv_loss_l1_3d", expanded).chosen == "torch_ref"
    torch.testing.assert_close(kernelhub.op("tv_loss_l1_3d")(expanded),
                               kernelhub.op("tv_loss_l1_3d", backend="torch_ref")(expanded))


_LAYOUTS = st.sampled_from(["contiguous", "transposed", "expanded", "sliced", "double", "channels"])


def _layout(kind: str) -> torch.Tensor:
    x = torch.randn(4, 6, 5)
    return {"contiguous": x, "transposed": x.transpose(0, 2), "expanded": torch.randn(1, 6, 5).expand(4, 6, 5),
            "sliced": torch.randn(4, 12, 5)[:, ::2], "double": x.double(),
            "channels": torch.randn(1, 6, 5)[:, :, None].expand(1, 6, 3, 5)[0]}[kind]


@settings(max_examples=25, deadline=None, derandomize=True, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(st.lists(_LAYOUTS, min_size=1, max_size=12))
def test_fuzz_the_chosen_impl_always_accepts_the_call(install, calls):
    """Random sequences of calls with random layouts and dtypes against a plugin objecting on strides: the impl
    that runs always passes its own not_supported_reasons, and the result is the reference's."""
    install("strides", STRIDES)
    hub = kernelhub.reload()
    impls = hub.registry.impls("tv_loss_l1_3d")
    for kind in calls:
        x = _layout(kind)
        decision = hub.selector.decide("tv_loss_l1_3d", (x,))
        assert not impls[decision.chosen].not_supported_reasons((x,)), (kind, decision.chosen)
        torch.testing.assert_close(kernelhub.op("tv_loss_l1_3d")(x),
                                   kernelhub.op("tv_loss_l1_3d", backend="torch_ref")(x))


# -- 4. forward-mode AD and torch.func's reverse transforms are refused, naming the op ---------------------------
@pytest.mark.parametrize("how", ["func.jvp", "jacfwd", "forward_ad", "func.grad", "jacrev", "hessian"])
@pytest.mark.parametrize("op", ["tv_loss_sq_3d", "tikhonov_inverse_2xn"])
def test_forward_mode_ad_is_refused_naming_the_op_never_zeros(op, how):
    import torch.autograd.forward_ad as fwad

    if op == "tv_loss_sq_3d":
        x, f = torch.randn(3, 4, 5, dtype=torch.float64), kernelhub.op(op)
    else:
        x, f = torch.randn(4, 2, 3, dtype=torch.float64), lambda m: kernelhub.op(op)(m, 0.1).sum()
    t = torch.randn_like(x)

    def dual():
        with fwad.dual_level():
            return fwad.unpack_dual(f(fwad.make_dual(x, t))).tangent

    run = {"func.jvp": lambda: torch.func.jvp(f, (x,), (t,)), "jacfwd": lambda: torch.func.jacfwd(f)(x),
           "forward_ad": dual, "func.grad": lambda: torch.func.grad(f)(x), "jacrev": lambda: torch.func.jacrev(f)(x),
           "hessian": lambda: torch.func.hessian(f)(x)}[how]
    with pytest.raises(NotImplementedError, match=f"kernelhub.{op}: .*(forward-mode AD|torch.func).* not supported"):
        run()


def test_double_backward_is_refused_naming_the_op_and_vmap_still_works():
    v = torch.randn(3, 4, 5, requires_grad=True)
    (g,) = torch.autograd.grad(kernelhub.op("tv_loss_sq_3d")(v), v, create_graph=True)
    with pytest.raises(RuntimeError, match="double backward is not supported by kernelhub.tv_loss_sq_3d"):
        g.sum().backward()
    batch = torch.randn(2, 3, 4, 5)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # torch's note that the op has no batching rule (a loop)
        out = torch.func.vmap(kernelhub.op("tv_loss_sq_3d"))(batch)
    torch.testing.assert_close(out, torch.stack([kernelhub.op("tv_loss_sq_3d")(b) for b in batch]))


# -- 7, 8. plugins cannot remove the first-party backends, nor end the process -----------------------------------
@pytest.mark.parametrize("entry, backend", [("torch_ref", "torch_ref2"), ("triton", "triton2"),
                                            ("impostor", "inductor"), ("impostor", "torch_ref")])
def test_a_plugin_taking_a_first_party_name_is_the_one_skipped(install, entry, backend):
    mod = install(entry, IMPOSTOR.replace("{backend}", backend))
    hub = kernelhub.reload()
    assert {"torch_ref", "inductor"} <= set(hub.registry.backends)
    assert hub.registry.backends["torch_ref"].version != "6.6"
    assert hub.registry.unavailable_reason("torch_ref") is None
    errors = [e for e in hub.registry.plugin_errors]
    assert errors and all(mod in e.error or entry in e.plugin for e in errors), errors
    assert kernelhub.explain("tv_loss_l1_3d", torch.randn(3, 4, 5)).chosen is not None


def test_extra_plugins_reusing_the_ops_plugin_name_leave_every_op():
    import types

    hub = kernelhub.reload(extra_plugins=[("kernelhub.ops", types.ModuleType("intruder"))])
    assert set(hub.registry.specs) == set(kernelhub.op_names()) and len(hub.registry.specs) == 9
    assert any("kernelhub.ops" in e.plugin and "already taken" in e.error for e in hub.registry.plugin_errors)


@pytest.mark.parametrize("where", ["import", "unavailable_reason"])
def test_a_plugin_calling_sys_exit_is_contained(install, where):
    install("quitter", EXITS.replace("{at_import}", "sys.exit(4)" if where == "import" else ""))
    hub = kernelhub.reload()
    kernelhub.op("tv_loss_l1_3d")(torch.randn(3, 4, 5))
    reason = hub.registry.unavailable_reason("quitter")
    assert reason is not None and "SystemExit" in reason


@settings(max_examples=20, deadline=None, derandomize=True, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(st.lists(st.tuples(st.sampled_from(["torch_ref", "triton", "cuda_ext", "inductor", "kernelhub.ops", "p1",
                                           "p2"]),
                          st.sampled_from(["ok", "raise", "exit", "collide", "half"])), min_size=1, max_size=5))
def test_fuzz_plugin_loading_never_loses_the_first_party(plans):
    """Random plugins (extra_plugins): failing hooks (Exception, SystemExit), name collisions and partial
    registrations: the first-party backends and every op survive, and the hub serves calls."""
    import types

    extras = []
    for i, (name, behaviour) in enumerate(plans):
        module = types.ModuleType(f"fuzz_{i}")

        def hook(registry, i=i, behaviour=behaviour):
            from kernelhub.spec import Backend
            if behaviour == "half":  # registers a backend, then fails: rolled back whole
                registry.add_backend(Backend(f"half{i}", "0.1"))
                raise RuntimeError("half-way")
            if behaviour == "raise":
                raise ValueError("plugin bug")
            if behaviour == "exit":
                sys.exit(3)
            registry.add_backend(Backend("torch_ref" if behaviour == "collide" else f"ok{i}", "0.1"))
        hook = kernelhub.hookimpl(hook)
        module.kernelhub_register_impls = hook
        extras.append((name, module))
    hub = kernelhub.reload(extra_plugins=extras)
    assert len(hub.registry.specs) == 9
    assert {"torch_ref", "inductor"} <= set(hub.registry.backends)
    assert hub.registry.plugin_of("torch_ref") == "torch_ref"
    assert not any(n.startswith("half") for n in hub.registry.backends)
    torch.testing.assert_close(kernelhub.op("tv_loss_sq_3d")(torch.ones(2, 3, 4)), torch.tensor(0.0))


# -- 9. an impl returning its input is a wrong output -------------------------------------------------------------
@pytest.mark.parametrize("fast", [True, False])
def test_an_impl_returning_its_input_falls_back_with_one_warning(install, tmp_path, fast, monkeypatch):
    from kernelhub import _state

    monkeypatch.setattr(_state, "EAGER_FAST_PATH", fast)
    install("alias", ALIASING)
    (tmp_path / "kernelhub.toml").write_text('priority = ["alias", "torch_ref"]\n')
    kernelhub.reload()
    m = torch.randn(5, 2, 3, dtype=torch.complex64)
    with pytest.warns(RuntimeWarning, match="'alias' raised WrongOutputError: .*sharing memory with argument 'M'"):
        out = kernelhub.op("tikhonov_inverse_2xn")(m, 0.1)
    assert not torch._C._is_alias_of(out, m)
    torch.testing.assert_close(out, kernelhub.op("tikhonov_inverse_2xn", backend="torch_ref")(m, 0.1))
    (tmp_path / "kernelhub.toml").write_text('strict = true\npriority = ["alias", "torch_ref"]\n')
    kernelhub.reload()
    with pytest.raises(StrictModeError, match="sharing memory"):
        kernelhub.op("tikhonov_inverse_2xn")(m, 0.1)
    with pytest.raises(WrongOutputError, match="sharing memory"):
        kernelhub.op("tikhonov_inverse_2xn", backend="alias")(m, 0.1)


# -- 10. what kernelhub creates under a group-writable umask it can use -------------------------------------------
def test_the_cuda_ext_cache_it_creates_under_umask_002_is_accepted(tmp_path):
    pytest.importorskip("kernelhub_cuda_ext")
    from kernelhub_cuda_ext import _build

    old = os.umask(0o002)
    try:
        root = _build.cache_root_under(tmp_path / "xdg")
        directory = root / "probe"
        from kernelhub.config import make_private_dirs

        make_private_dirs(directory)
    finally:
        os.umask(old)
    for d in (tmp_path / "xdg", root.parent, root, directory):
        assert d.stat().st_mode & 0o777 == 0o700, d
    _build.check_private(root)
    _build.check_private(directory)


# -- 11. the decision cache is bounded, and one decision serves every float value --------------------------------
def test_the_decision_cache_is_bounded_and_keys_no_float_values():
    hub = kernelhub.get_hub()
    m = torch.randn(4, 2, 3, dtype=torch.complex64)
    for i in range(50):
        kernelhub.op("tikhonov_inverse_2xn")(m, 0.1 + i / 100)
    assert len([k for k in hub.selector._cache if k[0] == "tikhonov_inverse_2xn"]) == 1
    for n in range(MAX_CACHED_DECISIONS + 10):
        hub.selector.decide("tv_loss_sq_3d", (torch.empty(1, 1, n + 1),))
    assert len(hub.selector._cache) <= MAX_CACHED_DECISIONS


# -- 12. errors that say what to do ------------------------------------------------------------------------------
def test_an_unknown_keyword_names_the_op_and_its_arguments():
    with pytest.raises(TypeError, match=r"tv_loss_l1_3d: got an unexpected keyword argument 'vol'; its arguments: "
                                        r"\(volume\)"):
        kernelhub.op("tv_loss_l1_3d")(vol=torch.randn(3, 4, 5))


@pytest.mark.parametrize("kwargs, fragment", [({"padding": 2**62}, "padding"), ({"padding": 2**30}, "output would be"),
                                              ({"semifield": "tropical_max:"}, "semifield"),
                                              ({"semifield": "root:1_000"}, "semifield"),
                                              ({"semifield": "log:inf"}, "semifield")])
def test_semiconv_refuses_absurd_geometry_and_malformed_semifields_before_any_kernel(kwargs, fragment):
    with pytest.raises(ValueError, match=f"semiconv: .*{fragment}"):
        kernelhub.op("semiconv")(torch.randn(1, 2, 6, 6), torch.randn(2, 2, 3, 3), **kwargs)


_IMG, _KER = torch.randn(1, 2, 6, 6), torch.randn(2, 2, 3, 3)
_GOOD = dict(semifield="tropical_max", stride=1, padding=[(1, 1), (1, 1)], dilation=[1, 1], groups=1,
             kind="conv", group_broadcasting=False)


@pytest.mark.parametrize("bad, error", [({"groups": True}, ValueError), ({"stride": 1.0}, TypeError),
                                        ({"stride": [True, 1]}, TypeError), ({"dilation": (1, 1.0)}, TypeError),
                                        ({"padding": [(1.0, 1), (1, 1)]}, TypeError),
                                        ({"group_broadcasting": 0}, TypeError)])
def test_semiconv_arguments_equal_to_a_checked_call_are_still_checked(bad, error):
    """semiconv looks a checked call's canonical arguments up (kernelhub/ops/semiconv.py, `_normalize`): a value
    equal to a checked one (True == 1, 1.0 == 1) but of a type the checks refuse must still be refused."""
    op = kernelhub.op("semiconv", backend="torch_ref")
    op(_IMG, _KER, **_GOOD)
    name = next(iter(bad))
    with pytest.raises(error, match=f"semiconv: argument '{name}'"):
        op(_IMG, _KER, **{**_GOOD, **bad})


def test_semiconv_checks_a_call_once_and_gives_new_canonical_lists_each_time(monkeypatch):
    from kernelhub.ops import semiconv

    checked = []
    real = semiconv._checked
    monkeypatch.setattr(semiconv, "_checked", lambda *a: checked.append(a) or real(*a))
    monkeypatch.setattr(semiconv, "_SEEN", {})
    spec = kernelhub.get_hub().registry.spec("semiconv")
    first = spec.canonical(_IMG, _KER, "tropical_max", 1, "same", 1)
    first[3].append(99)  # a caller's change to its canonical lists reaches no later call
    again = spec.canonical(_IMG, _KER, "tropical_max", 1, "same", 1)
    assert len(checked) == 1
    assert again[3:6] == ([1, 1], [1, 1, 1, 1], [1, 1])
    spec.canonical(_IMG, _KER, "tropical_max", 2, "same_strided", 1)  # another stride: checked
    spec.canonical(_IMG.double(), _KER.double(), "tropical_max", 1, "same", 1)  # another dtype: checked
    assert len(checked) == 3
    with pytest.raises(TypeError, match="semiconv: argument 'kernel' has dtype"):
        spec.canonical(_IMG, _KER.double(), "tropical_max", 1, "same", 1)


def test_explain_of_a_huge_shape_allocates_nothing():
    # the growth of the process's peak memory over its peak once kernelhub is loaded: a CUDA build of torch maps
    # about 2 GiB of libraries at import, so the peak alone says little there
    code = ("import resource, sys\nimport kernelhub\nfrom kernelhub import cli\nkernelhub.get_hub()\n"
            "before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss\n"
            "rc = cli.main(['explain', 'tv_loss_l1_3d', '--shape', '1024,1024,1024', '--device', 'cpu'])\n"
            "print('grew MiB', (resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - before) // 1024)\n"
            "sys.exit(rc)\n")
    proc = harness.run([sys.executable, "-c", code], timeout=300)
    assert proc.returncode == 0, proc.stderr[-2000:]
    grew = int(proc.stdout.rsplit("grew MiB", 1)[1])
    assert grew < 1024, proc.stdout  # the 4 GiB volume is described with fake tensors (shapes only)


def _layouts():
    v = torch.randn(2, 4, 5, 6, generator=torch.Generator().manual_seed(0))
    return {"sparse_coo": v.to_sparse(), "sparse_csr": v[0].to_sparse_csr(), "mkldnn": v.to_mkldnn(),
            "nested": torch.nested.nested_tensor([v[0], v[1]]),
            "nested_jagged": torch.nested.nested_tensor([v[0], v[1, :3]], layout=torch.jagged)}


@pytest.mark.filterwarnings("ignore:Sparse CSR tensor support is in beta")
@pytest.mark.parametrize("backend", ["", "cuda_ext", "torch_ref"])
@pytest.mark.parametrize("layout", ["sparse_coo", "sparse_csr", "mkldnn", "nested", "nested_jagged"])
def test_a_tensor_that_is_not_dense_is_refused_naming_the_op_and_argument_before_any_kernel(layout, backend):
    """Sparse, nested and mkldnn tensors are refused by the argument check, before any kernel runs (a sparse COO
    volume reads an expanded tensor's strides, and was served by cuda_ext's kernel on that call's remembered
    decision, which then fell back with a warning), and the decision key tells the layouts apart."""
    from kernelhub.args import arg_key

    t = _layouts()[layout]
    kernelhub.op("tv_loss_l1_3d", backend=backend or None)(torch.randn(1, 1, 1, 1).expand(2, 4, 5, 6))  # remembered
    with warnings.catch_warnings():
        warnings.simplefilter("error", RuntimeWarning)  # no "backend ... raised ... falling back"
        with pytest.raises(TypeError, match="tv_loss_l1_3d: argument 'volume' must be a dense .strided. tensor, got a "
                                            f"{layout.split('_')[0]}"):
            kernelhub.op("tv_loss_l1_3d", backend=backend or None)(t)
        feats = torch.randn(7, 8, 3)
        with pytest.raises(TypeError, match="trilinear_interp: argument 'points' must be a dense .strided. tensor"):
            kernelhub.op("trilinear_interp", backend=backend or None)(feats, torch.rand(7, 3).to_sparse())
    if layout == "sparse_coo":
        assert arg_key(t) != arg_key(torch.randn(1, 1, 1, 1).expand(2, 4, 5, 6))
