"""Op contracts that grow without breaking the plugins written against them (docs/backend-guide.md, "When an op's
contract changes"): semiconv v2 appended `group_broadcasting`; a plugin written for v1 (tests/semiconv_v1, eight
arguments, kept unchanged) keeps serving what it understands, passes `kernelhub check` at its version and is told
about the change; plugins with a wrong hook, signature or version are refused at load with the reason."""

import json
import sys
import tomllib
import types
from pathlib import Path

import pytest
import torch

import kernelhub
from kernelhub import cli, hookimpl
from kernelhub.errors import NoImplementationError, PluginValidationError
from kernelhub.spec import Arg, Backend, Change, Impl, OpSpec

HERE = Path(__file__).parent / "semiconv_v1"
sys.path.insert(0, str(HERE))
import kernelhub_semiconv_v1 as v1  # noqa: E402

# what the v1 backend declines of semiconv's space (2-D depthwise tropical only), as 'not covered' rows name it
DECLINED = ["semifield=linear", "semifield=root", "semifield=log", "dims=[13]"]
ALLOW = [a for tag in DECLINED for a in ("--allow-partial", tag)]


@pytest.fixture
def hub_with():
    """``hub_with(plugin_module, name)``: the global hub reloaded with that plugin; the plain hub again after."""
    def load(module, name="semiconv_v1"):
        kernelhub.reload(extra_plugins=[(name, module)])
        return kernelhub.get_hub()
    yield load
    kernelhub.reload()


def _call(bcast=False, dtype=torch.float64):
    g = torch.Generator().manual_seed(0)
    img = torch.randn(2, 4 if bcast else 3, 9, 9, dtype=dtype, generator=g).requires_grad_()
    ker = torch.randn(3, 2 if bcast else 1, 3, 3, dtype=dtype, generator=g).requires_grad_()
    return (img, ker, "tropical_max", [2, 1], [1, 0, 2, 1], [1, 2], 2 if bcast else 3, "conv", bcast)


def test_the_v1_plugin_is_inferred_v1_and_serves_plain_calls_with_its_eight_arguments(hub_with):
    hub = hub_with(v1.plugin())
    assert hub.registry.plugin_errors == []
    assert hub.registry.impls("semiconv")["semiconv_v1"].version == 1 and hub.registry.spec("semiconv").version == 3
    for args in (_call(), _call()[:8]):  # group_broadcasting at its default, given or not
        got = kernelhub.op("semiconv", backend="semiconv_v1")(*args)
        want = kernelhub.op("semiconv", backend="torch_ref")(*args)
        torch.testing.assert_close(got, want, rtol=0, atol=0)
        for a, b in zip(torch.autograd.grad(got.square().sum(), args[:2]),
                        torch.autograd.grad(want.square().sum(), args[:2])):
            torch.testing.assert_close(a, b)
    # pinned, it is what the hub chooses for the calls it understands
    cfg = kernelhub.config.parse_config({"ops": {"semiconv": {"pin": "semiconv_v1"}}}, "test",
                                        kernelhub.registry.declared_backend_names() | {"semiconv_v1"})
    kernelhub.reload(extra_plugins=[("semiconv_v1", v1.plugin())], config=cfg)
    assert kernelhub.explain("semiconv", *_call()).chosen == "semiconv_v1"


def test_a_call_that_needs_v2_is_declined_for_the_v1_impl_with_the_version_named_and_selection_moves_on(hub_with):
    hub_with(v1.plugin())
    args = _call(bcast=True)
    decision = kernelhub.explain("semiconv", *args)
    row = next(c for c in decision.candidates if c.backend == "semiconv_v1")
    assert row.status == "rejected" and row.reasons == ("implements semiconv v1; group_broadcasting=True needs v2",)
    assert decision.chosen not in (None, "semiconv_v1")
    out = kernelhub.op("semiconv")(*args)  # served by another backend, no crash
    torch.testing.assert_close(out, kernelhub.op("semiconv", backend="torch_ref")(*args))
    with pytest.raises(NoImplementationError, match="group_broadcasting=True needs v2"):
        kernelhub.op("semiconv", backend="semiconv_v1")(*args)


def test_kernelhub_check_passes_the_v1_plugin_at_its_version_and_says_what_is_not_in_v1(hub_with, capsys):
    hub_with(v1.plugin())
    code = cli.main(["check", "semiconv_v1", "--json", *ALLOW])
    data = json.loads(capsys.readouterr().out)
    assert code == 0 and data["fail"] == data["not covered"] == 0 and data["pass"] >= 8, data["rows"]
    details = " ".join(r["detail"] for r in data["rows"])
    assert "not in v1: group_broadcasting (v2)" in details
    assert not any("group_broadcasting" in r["detail"] for r in data["rows"] if r["status"] != "pass")


def test_kernelhub_check_fails_a_planted_v1_mistake(hub_with, capsys):
    hub_with(v1.plugin("kernel_sign"))
    code = cli.main(["check", "semiconv_v1", "--json", *ALLOW])
    failed = [r for r in json.loads(capsys.readouterr().out)["rows"] if r["status"] == "fail"]
    assert code == 1 and any(r["check"].startswith("parity") for r in failed), v1.MISTAKES["kernel_sign"]


def test_a_plugin_asking_for_a_version_this_kernelhub_does_not_know_is_refused_at_load_the_rest_unaffected(hub_with):
    hub = hub_with(v1.plugin("future_version"))
    (error,) = hub.registry.plugin_errors
    assert error.plugin == "semiconv_v1" and error.stage == "register_impls"
    assert "implements semiconv v99, and this kernelhub knows semiconv up to v3; upgrade kernelhub" in error.error
    assert "semiconv_v1" not in hub.registry.impls("semiconv") and "semiconv_v1" not in hub.registry.backends
    torch.testing.assert_close(kernelhub.op("semiconv")(*_call()),
                               kernelhub.op("semiconv", backend="torch_ref")(*_call()))


def test_doctor_and_list_show_each_third_party_impls_contract_version(hub_with, capsys):
    hub_with(v1.plugin())
    assert cli.main(["doctor", "--json"]) == 0
    rows = json.loads(capsys.readouterr().out)["contracts"]
    assert rows == [{"op": "semiconv", "backend": "semiconv_v1", "implements": 1, "current": 3,
                     "missing": ["v2: group broadcasting: one kernel serves every group",
                                 "v3: pytorch_nd_semiconv's tropical options: spread_gradient, channels_add"]}]
    assert cli.main(["list", "--json"]) == 0
    impl = json.loads(capsys.readouterr().out)["ops"]["semiconv"]["semiconv_v1"]
    assert (impl["version"], impl["op_version"]) == (1, 3)
    assert cli.main(["doctor"]) == 0
    assert "the op contract each implements" in capsys.readouterr().out


def _one_impl_plugin(**impl):
    @hookimpl
    def kernelhub_register_impls(registry):
        registry.add_backend(Backend("probe", "0.1"))
        registry.add_impl(Impl(op="semiconv", backend="probe", dtypes=(torch.float64,), **impl))
    return types.SimpleNamespace(kernelhub_register_impls=kernelhub_register_impls)


def _fwd9(img, kernel, semifield, stride, padding, dilation, groups, kind, bcast):
    return img


def _bwd9(grad, img, kernel, semifield, stride, padding, dilation, groups, kind, bcast, needs):
    return [None, None]


@pytest.mark.parametrize("impl, words", [
    (dict(forward=_fwd9, backward=_bwd9, version=1),
     "impl of op 'semiconv' by backend 'probe': forward(img, kernel, semifield, stride, padding, dilation, groups, "
     "kind, bcast) must take the 8 arguments of semiconv v1"),
    (dict(forward=_fwd9, backward=lambda grad, img, needs: [None, None]),
     "backward(grad, img, needs) must take grad, the 9 arguments of semiconv v2 and needs="),
    (dict(forward=_fwd9, backward=_bwd9, not_supported_reasons=lambda: []),
     "not_supported_reasons() must take one argument"),
    (dict(forward=lambda img, kernel: img, backward=_bwd9),
     "forward(img, kernel) takes no version's arguments (v1 has 8, v2 has 9, v3 has 11); declare "
     "Impl(version=...)"),
    (dict(forward=_fwd9, backward=_bwd9, weighted=True),
     "forward(img, kernel, semifield, stride, padding, dilation, groups, kind, bcast) must take the 9 arguments of "
     "semiconv v2 and weights="),
    (dict(forward=_fwd9, backward=_bwd9, version=0), "version must be an int from 1, got 0"),
])
def test_signatures_are_checked_against_the_declared_version_at_load(hub_with, impl, words):
    hub = hub_with(_one_impl_plugin(**impl), "probe")
    (error,) = hub.registry.plugin_errors
    assert error.plugin == "probe" and words in error.error, error.error
    assert "probe" not in hub.registry.backends


def test_an_impl_whose_forward_takes_star_args_is_the_current_version_or_what_it_declares(hub_with):
    seen = []

    def forward(*args):
        seen.append(len(args))
        return kernelhub.get_hub().registry.impls("semiconv")["torch_ref"].forward(*args, *[False][:9 - len(args)])
    hub = hub_with(_one_impl_plugin(forward=forward, backward=lambda grad, *a, needs: [None, None], version=1),
                   "probe")
    assert hub.registry.impls("semiconv")["probe"].version == 1
    kernelhub.op("semiconv", backend="probe")(*[a.detach() if isinstance(a, torch.Tensor) else a for a in _call()])
    assert seen == [8]
    hub = hub_with(_one_impl_plugin(forward=forward, backward=lambda grad, *a, needs: [None, None]), "probe")
    assert hub.registry.impls("semiconv")["probe"].version == 3


def test_a_misspelled_or_unmarked_hook_is_reported_at_load():
    misspelled = types.SimpleNamespace(kernelhub_register_impl=hookimpl(lambda registry: None))
    unmarked = types.SimpleNamespace(kernelhub_register_impls=lambda registry: None)
    with kernelhub.scoped(extra_plugins=[("misspelled", misspelled), ("unmarked", unmarked)]) as hub:
        errors = {e.plugin: e.error for e in hub.registry.plugin_errors}
    assert "hook 'kernelhub_register_impl' is not a kernelhub hook (did you mean 'kernelhub_register_impls'?)" \
        in errors["misspelled"]
    assert "kernelhub_register_impls is not marked with @kernelhub.hookimpl, so it would never run" in \
        errors["unmarked"]


def test_a_spec_change_must_append_non_tensor_arguments_in_version_order():
    base = dict(name="probe", doc="", dtypes=(torch.float64,), tolerances={}, normalize=lambda *a: a,
                output=lambda *a: a[0], samples=lambda *a: [], bad_inputs=lambda: [])
    args = (Arg("x", "tensor", differentiable=True), Arg("flag", "bool"))
    spec = OpSpec(args=args, changes=(Change(2, (("flag", False),), "a flag"),), **base)
    assert (spec.version, spec.arity(1), spec.arity(2)) == (2, 1, 2)
    assert spec.beyond(1, (None, True)) == ["implements probe v1; flag=True needs v2"]
    assert spec.beyond(1, (None, False)) == [] and spec.beyond(2, (None, True)) == []
    for changes in ((Change(3, (("flag", False),), ""),), (Change(2, (("x", None),), ""),),
                    (Change(2, (("y", 0),), ""),)):
        with pytest.raises(ValueError, match="changes must be versions 2, 3"):
            OpSpec(args=args, changes=changes, **base)


def test_determinism_is_declared_per_device_and_the_selector_reads_it_for_the_calls_device():
    reg = kernelhub.get_hub().registry
    ref = reg.impls("kplanes_interp_tilted")["torch_ref"]  # grid_sample's CUDA backward adds with atomics
    assert ref.deterministic_on("cpu") and not ref.deterministic_on("cuda")
    args = kernelhub.testing.samples("kplanes_interp_tilted", "small", torch.float32)[0].args
    torch.use_deterministic_algorithms(True)
    try:
        decision = kernelhub.explain("kplanes_interp_tilted", *args)
    finally:
        torch.use_deterministic_algorithms(False)
    status = {c.backend: (c.status, c.reasons) for c in decision.candidates}
    assert status["torch_ref"][0] != "rejected"
    assert any("not deterministic" in r for r in status["cuda_ext"][1])


def test_the_v1_plugin_is_a_distribution_whose_entry_point_is_the_module():
    meta = tomllib.loads((HERE / "pyproject.toml").read_text())
    assert meta["project"]["entry-points"]["kernelhub.backends"] == {"semiconv_v1": "kernelhub_semiconv_v1"}
    assert v1.kernelhub_register_impls is not None
    with pytest.raises(PluginValidationError, match="semiconv_v1"):
        kernelhub.reload(extra_plugins=[("semiconv_v1", v1.plugin("future_version"))],
                         config=kernelhub.config.parse_config({"strict": True}, "test",
                                                              kernelhub.registry.declared_backend_names()))
    kernelhub.reload()


def test_an_overflowing_float_argument_names_the_op():
    with pytest.raises((ValueError, OverflowError), match="tikhonov_inverse_2xn"):
        kernelhub.op("tikhonov_inverse_2xn")(torch.randn(3, 2, 5), 10 ** 400)
