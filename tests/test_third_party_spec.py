"""A third party adds a new op (spec + reference impl) through kernelhub_register_specs."""

import dataclasses
import json
import types

import pytest
import torch

import kernelhub
from kernelhub import hookimpl, testing
from kernelhub.errors import PluginValidationError
from kernelhub.spec import Arg, Backend, Impl, OpSpec, SampleInput, Tolerance


def _normalize(x):
    if not isinstance(x, torch.Tensor) or x.dtype not in (torch.float32, torch.float64):
        raise TypeError(f"cube_sum: argument 'x' must be a float32/float64 tensor, got {x!r:.40}")
    return (x,)


SPEC = OpSpec(
    name="cube_sum", args=(Arg("x", "tensor", differentiable=True),), doc="sum of x**3",
    dtypes=(torch.float32, torch.float64),
    tolerances={torch.float32: Tolerance(2e-6, 2e-6), torch.float64: Tolerance(3.6e-15, 3.6e-15)},
    normalize=_normalize, output=lambda x: x.new_empty(()),
    samples=lambda size, dtype, device, gen: [SampleInput("x", (torch.randn(7, 5, generator=gen, device=device,
                                                                             dtype=dtype),))],
    bad_inputs=lambda: [((torch.zeros(2, dtype=torch.int64),), {}, TypeError, "x")],
    reference_backend="cube_ref",
)


def _plugin(spec):
    plugin = types.ModuleType("cube_plugin")

    @hookimpl
    def kernelhub_register_specs(registry):
        registry.add_spec(spec)

    @hookimpl
    def kernelhub_register_impls(registry):
        registry.add_backend(Backend("cube_ref", "1.0"))
        registry.add_impl(Impl(op="cube_sum", backend="cube_ref", forward=lambda x: x.pow(3).sum(),
                               backward=lambda g, x, needs: [3 * x.square() * g], dtypes=spec.dtypes))

    plugin.kernelhub_register_specs = kernelhub_register_specs
    plugin.kernelhub_register_impls = kernelhub_register_impls
    return plugin


def test_new_op_runs_and_passes_the_kit():
    kernelhub.reload(extra_plugins=[("cube_plugin", _plugin(SPEC))])
    x = torch.randn(4, 3, requires_grad=True)
    out = kernelhub.op("cube_sum")(x)
    out.backward()
    torch.testing.assert_close(x.grad, 3 * x.detach().square())
    for case in testing.cases(ops=["cube_sum"], sizes=["small"]):
        testing.check_parity(case)
    testing.check_opcheck("cube_sum")
    testing.check_bad_inputs("cube_sum")


def test_duplicate_op_name_is_rejected():
    import dataclasses
    hub = kernelhub.reload(extra_plugins=[("dup", _plugin(dataclasses.replace(SPEC, name="tv_loss_l1_3d")))])
    (err,) = hub.registry.plugin_errors
    assert err.plugin == "dup" and "already registered" in err.error
    with pytest.raises(PluginValidationError, match="dup"):
        from kernelhub.registry import Registry
        Registry().load([("dup", _plugin(dataclasses.replace(SPEC, name="tv_loss_l1_3d")))], strict=True)


def test_the_kit_checks_the_samples_an_impl_accepts_and_that_forcing_a_rejected_one_names_the_reason():
    import dataclasses

    two = dataclasses.replace(SPEC, samples=lambda size, dtype, device, gen: [
        SampleInput("x", (torch.randn(7, 5, generator=gen, device=device, dtype=dtype),)),
        SampleInput("big", (torch.randn(20, 5, generator=gen, device=device, dtype=dtype),))])

    def plugin(rejects: bool):
        p = _plugin(two)

        @hookimpl
        def kernelhub_register_impls(registry):
            registry.add_backend(Backend("cube_fast", "1.0"))
            # right below 11 rows, wrong above: it covers only part of the inputs, and says so (or not)
            registry.add_impl(Impl(op="cube_sum", backend="cube_fast",
                                   forward=lambda x: x.pow(3).sum() * (1 if x.shape[0] <= 10 else 0),
                                   backward=lambda g, x, needs: [3 * x.square() * g], dtypes=two.dtypes,
                                   not_supported_reasons=lambda args: ["more than 10 rows"] * (
                                       rejects and args[0].shape[0] > 10)))
        p.fast = types.SimpleNamespace(kernelhub_register_impls=kernelhub_register_impls)
        return [("cube_plugin", p), ("cube_fast", p.fast)]

    kernelhub.reload(extra_plugins=plugin(rejects=True))
    case = next(c for c in testing.cases(ops=["cube_sum"], sizes=["small"]) if c.backend == "cube_fast")
    assert [s.name for s in testing.supported("cube_sum", "cube_fast", testing.samples("cube_sum", "small",
                                                                                       case.dtype, "cpu"))] == ["x"]
    testing.check_parity(case)  # "big" is refused with its reason, not compared
    kernelhub.reload(extra_plugins=plugin(rejects=False))
    with pytest.raises(AssertionError, match="big"):
        testing.check_parity(case)
    kernelhub.reload()


def test_a_case_whose_samples_are_all_rejected_is_not_covered_not_passed():
    plugin = _plugin(SPEC)

    @hookimpl
    def kernelhub_register_impls(registry):
        registry.add_backend(Backend("cube_none", "1.0"))
        registry.add_impl(Impl(op="cube_sum", backend="cube_none", forward=lambda x: x.sum(),
                               backward=lambda g, x, needs: [g.expand_as(x)], dtypes=SPEC.dtypes,
                               not_supported_reasons=lambda args: ["covers nothing"]))
    kernelhub.reload(extra_plugins=[("cube_plugin", plugin),
                                    ("cube_none",
                                     types.SimpleNamespace(kernelhub_register_impls=kernelhub_register_impls))])
    case = next(c for c in testing.cases(ops=["cube_sum"], sizes=["small"]) if c.backend == "cube_none")
    for check in (testing.check_parity, testing.check_noncontiguous,
                  lambda case: testing.check_gradcheck(case.op, case.backend),
                  lambda case: testing.check_opcheck(case.op, case.backend)):
        with pytest.raises(testing.NotCovered, match=r"not covered: any call \(.*0 accepted, \d+ declined, 0 run") as e:
            check(case)
        assert e.value.reached.reasons["covers nothing"] >= 1
    # a partial impl may be allowed to leave a part out: then the check passes on what it reached (nothing here)
    assert testing.check_parity(case, allow=["any call"]).run == 0
    kernelhub.reload()


def test_the_kill_switch_runs_a_third_party_ops_own_reference_backend():
    """The spec's reference_backend is the one source of truth: with the kill switch on, cube_sum runs cube_ref
    (its reference), not torch_ref (which has no impl of it), and every other backend is set aside, saying why."""
    import dataclasses

    from kernelhub.config import Config

    plugin = _plugin(SPEC)

    @hookimpl
    def kernelhub_register_impls(registry):
        registry.add_backend(Backend("cube_fast", "1.0"))
        registry.add_impl(Impl(op="cube_sum", backend="cube_fast", forward=lambda x: x.pow(3).sum(),
                               backward=lambda g, x, needs: [3 * x.square() * g], dtypes=SPEC.dtypes))
    plugins = [("cube_plugin", plugin),
               ("cube_fast", types.SimpleNamespace(kernelhub_register_impls=kernelhub_register_impls))]
    x = torch.randn(4, 3, requires_grad=True)
    with kernelhub.scoped(extra_plugins=plugins) as hub:
        assert hub.explain("cube_sum", x).chosen == "cube_fast"
    with kernelhub.scoped(extra_plugins=plugins, config=dataclasses.replace(Config(), kill_switch=True)) as hub:
        decision = hub.explain("cube_sum", x)
        assert decision.chosen == "cube_ref"
        (fast,) = [c for c in decision.candidates if c.backend == "cube_fast"]
        assert any("kill switch" in r and "'cube_ref'" in r for r in fast.reasons)
        kernelhub.op("cube_sum")(x).backward()
        torch.testing.assert_close(x.grad, 3 * x.detach().square())


def test_bench_names_a_third_party_ops_reference_backend(capsys):
    """`kernelhub bench` of a third party's op: its reference row is the backend that served it (cube_ref), not
    torch_ref, and the ratios against it are filled."""
    from kernelhub import bench, cli

    kernelhub.reload(extra_plugins=[("cube_plugin", _plugin(SPEC))])
    data = bench.run(["cube_sum"], device="cpu", quick=True)
    refs = [r for r in data["rows"] if r["impl"] == "cube_ref"]
    assert refs and all(r["reference"] == "cube_ref" and r["vs_torch_ref"] == 1.0 for r in refs)
    assert not any(r["impl"] == "torch_ref" for r in data["rows"])
    cli.render_bench({**data, "wide": False}, cli.Console(width=80))
    out = capsys.readouterr().out
    assert "cube_ref" in out and "the op's reference backend" in " ".join(out.split())


def test_check_says_when_an_op_has_no_measured_tolerances(capsys):
    """`kernelhub check` of a new op whose spec has no measured tolerances yet: a row says parity fell back to
    per-call tolerances and how to measure them."""
    from kernelhub import cli

    kernelhub.reload(extra_plugins=[("cube_plugin", _plugin(dataclasses.replace(SPEC, tolerances={})))])
    assert cli.main(["check", "cube_ref", "--json"]) == 0
    rows = json.loads(capsys.readouterr().out)["rows"]
    note = [r for r in rows if r["check"] == "tolerances"]
    assert len(note) == 1 and note[0]["status"] == "skip"
    assert "none measured for float32, float64: parity used per-call tolerances" in note[0]["detail"]
    assert "python -m kernelhub.testing.tolerances" in note[0]["detail"]
    kernelhub.reload(extra_plugins=[("cube_plugin", _plugin(SPEC))])
    assert cli.main(["check", "cube_ref", "--json"]) == 0
    assert not [r for r in json.loads(capsys.readouterr().out)["rows"] if r["check"] == "tolerances"]


def test_the_backend_guide_names_what_a_new_op_needs():
    """docs/backend-guide.md is enough to write a new op: it lists every argument kind and sample size the spec
    takes, the form of bad_inputs, and, among what a backend may import, tolerances_from (section 7 uses it)."""
    import pathlib

    from kernelhub.spec import ARG_KINDS
    guide = (pathlib.Path(__file__).parent.parent / "docs" / "backend-guide.md").read_text()
    section8 = guide[guide.index("## 8. What a backend may import"):guide.index("## 9.")]
    for kind in ARG_KINDS:
        assert f'`"{kind}"`' in guide, kind
    for size in OpSpec.SAMPLE_SIZES:
        assert f'`"{size}"`' in guide, size
    assert "`(args, kwargs, exception type, text)`" in guide
    assert "`kernelhub.ops.tolerances` | `tolerances_from`" in section8


def test_the_gradcheck_summary_locates_a_wrong_gradient_of_a_later_input():
    """`kernelhub check`'s one-line gradcheck failure on an op of two inputs: the worst Jacobian entry is found in the
    second input too (each input perturbed by its position)."""
    class Mul(torch.autograd.Function):
        @staticmethod
        def forward(ctx, x, y):
            ctx.save_for_backward(x, y)
            return x * y

        @staticmethod
        def backward(ctx, g):
            x, y = ctx.saved_tensors
            return g * y, (g * x).sum(0) * 1.5  # y's gradient 50% too large

    x, y = torch.randn(2, 3, dtype=torch.float64), torch.randn(3, dtype=torch.float64)
    line = testing._worst_jacobian_entry(Mul.apply, [x, y], ["x", "y"])
    assert "/ d y[" in line and "entries out of tolerance" in line, line
