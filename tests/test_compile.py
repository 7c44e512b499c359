"""Each op inside torch.compile(fullgraph=True): one opaque node whichever backend serves it, same values and
gradients as eager. Several ops and modules in one step, torch.export and CUDA graphs: tests/test_toolchain.py."""

import sys

import harness
import pytest
import torch

import kernelhub
from kernelhub import testing

OPS = kernelhub.op_names()


@pytest.mark.parametrize("name", OPS)
def test_compile_fullgraph_matches_eager(name):
    dtype = torch.float32
    sample = testing.samples(name, "small", dtype, "cpu")[0]
    op = kernelhub.op(name)

    def loss(*args):
        return (op(*args) * 1.5).abs().sum()  # hub op between ordinary torch ops

    def grads(fn):
        args = testing.with_grad(name, sample.args)
        value = fn(*args)
        value.backward()
        return value.detach(), [t.grad for t in testing.leaves(name, args)]

    torch._dynamo.reset()
    compiled = torch.compile(loss, fullgraph=True, backend="aot_eager")
    want, want_g = grads(loss)
    got, got_g = grads(compiled)
    # the graph may run another impl than the eager call (one traced into it): each within the op's tolerance of
    # the float64 reference, so within twice that of each other
    tol = kernelhub.get_hub().registry.spec(name).tolerances[dtype]
    for g, w, bound in [(got, want, 2 * tol.forward), *[(g, w, 2 * (tol.forward + tol.backward))
                                                        for g, w in zip(got_g, want_g)]]:
        assert (g - w).abs().max() <= bound * w.abs().max(), (name, (g - w).abs().max(), w.abs().max())


def test_compile_inductor_backend_once():
    """The default inductor backend too (needs a C++ compiler), on one op."""
    op = kernelhub.op("tv_loss_sq_3d")
    v = torch.randn(6, 7, 8, requires_grad=True)
    torch._dynamo.reset()
    f = torch.compile(lambda x: op(x).sqrt() * 2, fullgraph=True)
    out = f(v)
    out.backward()
    g = v.grad.clone()
    v.grad = None
    (op(v).sqrt() * 2).backward()
    torch.testing.assert_close(out, op(v).sqrt() * 2)
    torch.testing.assert_close(g, v.grad)


def _traced(fn, *args, dynamic=None):
    """The targets of the FX graphs dynamo builds for ``fn`` (fullgraph), and the compiled function's value."""
    graphs = []

    def backend(gm, example_inputs):
        graphs.append(gm)
        return gm.forward

    torch._dynamo.reset()
    out = torch.compile(fn, backend=backend, fullgraph=True, dynamic=dynamic)(*args)
    # an autograd.Function's forward and backward are subgraphs (submodules) of the graph
    return {n.target for g in graphs for m in g.modules() if isinstance(m, torch.fx.GraphModule)
            for n in m.graph.nodes}, out


def _graph_of(fn, *args, dynamic=None):
    """`_traced`, and the compiled function's gradient with respect to its first argument."""
    targets, out = _traced(fn, *args, dynamic=dynamic)
    grad, = torch.autograd.grad(out, args[0])
    return targets, out, grad


def _reference_step(v):
    return (kernelhub.op("tv_loss_l1_3d", backend="torch_ref")(v) * torch.tensor([1.0, 2.0, 3.0])).sum()


@pytest.mark.parametrize("backend", [None, "torch_ref", "inductor", "cuda_ext"])
@pytest.mark.parametrize("dynamic", [None, True])
def test_the_graph_holds_the_operator_whichever_backend_serves_it(backend, dynamic):
    """Selection is the operator's, at run time: whatever backend is forced (or chosen), and for static or symbolic
    sizes, the graph holds one ``kernelhub::tv_loss_l1_3d`` node and none of a backend's functions."""
    reason = backend and kernelhub.get_hub().registry.unavailable_reason(backend)
    if reason:
        pytest.skip(f"{backend} is unavailable: {reason}")
    op = kernelhub.op("tv_loss_l1_3d", backend=backend)
    v = torch.randn(2, 5, 6, 7, dtype=torch.float64, requires_grad=True)
    targets, out, grad = _graph_of(lambda x: (op(x) * torch.tensor([1.0, 2.0, 3.0])).sum(), v, dynamic=dynamic)
    assert torch.ops.kernelhub.tv_loss_l1_3d.default in targets
    assert not any(str(t).startswith("kernelhub_") for t in targets)  # no backend's own operator
    want = _reference_step(v)
    torch.testing.assert_close(out, want)
    torch.testing.assert_close(grad, torch.autograd.grad(want, v)[0])


@pytest.mark.parametrize("backend", ["torch_ref", "inductor"])
def test_a_handle_made_inside_the_compiled_function_works(backend):
    """``kernelhub.op(name)`` called inside the traced function, its handle not made before (each test starts from a
    fresh hub): dynamo replays the handle's side effects only after the trace; the graph holds the operator."""
    v = torch.randn(2, 5, 6, 7, dtype=torch.float64, requires_grad=True)
    targets, out, grad = _graph_of(
        lambda x: (kernelhub.op("tv_loss_l1_3d", backend=backend)(x) * torch.tensor([1.0, 2.0, 3.0])).sum(), v)
    assert torch.ops.kernelhub.tv_loss_l1_3d.default in targets
    want = _reference_step(v)
    torch.testing.assert_close(out, want)
    torch.testing.assert_close(grad, torch.autograd.grad(want, v)[0])


def test_a_lazy_function_imports_at_its_first_call():
    """A backend's lazily imported function (`kernelhub.spec.lazy`) imports its module at its first call, and is
    that function from then on."""
    import sys

    from kernelhub.spec import lazy

    sys.modules.pop("colorsys", None)
    to_hls = lazy("colorsys", "rgb_to_hls")
    assert "colorsys" not in sys.modules and to_hls.__name__ == "colorsys.rgb_to_hls"
    assert to_hls(1.0, 0.0, 0.0) == (0.0, 0.5, 1.0) and "colorsys" in sys.modules


def test_the_first_use_of_the_hub_inside_a_compiled_function(monkeypatch):
    """No hub built yet: under fullgraph a clear error (dynamo cannot trace the plugins' loading); without fullgraph
    dynamo breaks the graph there and the hub is built eagerly."""
    from kernelhub import _state

    v = torch.randn(3, 4, 5, requires_grad=True)

    def step(x):
        return kernelhub.op("tv_loss_sq_3d")(x) * 2

    monkeypatch.setattr(_state, "hub", None)
    torch._dynamo.reset()
    with pytest.raises(Exception, match="the hub is built at its first use outside torch.compile"):
        torch.compile(step, fullgraph=True, backend="aot_eager")(v)
    assert _state.hub is None
    torch._dynamo.reset()
    out = torch.compile(step, backend="aot_eager")(v)
    assert _state.hub is not None
    torch.testing.assert_close(out, kernelhub.op("tv_loss_sq_3d", backend="torch_ref")(v) * 2)


def test_an_eager_program_does_not_import_dynamo():
    """Importing kernelhub and running an op forward and backward, eagerly, leave torch._dynamo unimported (its
    import is a large part of a process's start); a compiled call still builds the hub eagerly (above)."""
    code = ("import sys, torch, kernelhub\n"
            "x = torch.randn(2, 4, 5, 6, requires_grad=True)\n"
            "kernelhub.op('tv_loss_l1_3d')(x).sum().backward()\n"
            "kernelhub.explain('tv_loss_l1_3d', x)\n"
            "assert x.grad is not None\n"
            "print(sorted(m for m in sys.modules if m.startswith('torch._dynamo')))\n")
    proc = harness.run([sys.executable, "-c", code], timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert proc.stdout.strip() == "[]", proc.stdout
