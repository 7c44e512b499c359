"""Each op inside torch.compile(fullgraph=True): one opaque node, same values and gradients as eager; where the
hub would run the inductor backend, the reference's own torch ops in the graph instead, and where it would run
cuda_ext, cuda_ext's operators (`Impl.inline`)."""

import subprocess
import sys

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
    torch.testing.assert_close(got, want)
    for g, w in zip(got_g, want_g):
        torch.testing.assert_close(g, w)


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


@pytest.mark.parametrize("how", ["forced", "pinned"])
def test_where_the_hub_would_run_inductor_the_graph_holds_the_references_ops(how, tmp_path, monkeypatch):
    if how == "pinned":
        (tmp_path / "kernelhub.toml").write_text('[ops.tv_loss_l1_3d]\npin = "inductor"\n')
        kernelhub.reload()
    op = kernelhub.op("tv_loss_l1_3d", backend="inductor" if how == "forced" else None)
    v = torch.randn(2, 5, 6, 7, dtype=torch.float64, requires_grad=True)
    assert kernelhub.explain("tv_loss_l1_3d", v).chosen == "inductor" or how == "forced"
    targets, out, grad = _graph_of(lambda x: (op(x) * torch.tensor([1.0, 2.0, 3.0])).sum(), v)
    assert not any("kernelhub" in str(t) for t in targets)  # no opaque node: the reference's ops
    want = _reference_step(v)
    torch.testing.assert_close(out, want)
    torch.testing.assert_close(grad, torch.autograd.grad(want, v)[0])


def test_elsewhere_and_for_symbolic_sizes_the_graph_holds_the_operator():
    v = torch.randn(2, 5, 6, 7, dtype=torch.float64, requires_grad=True)
    for op, dynamic in [(kernelhub.op("tv_loss_l1_3d", backend="torch_ref"), None),  # no Impl.inline: the node
                        (kernelhub.op("tv_loss_l1_3d", backend="inductor"), True)]:  # sizes unknown at compile time
        targets, out, grad = _graph_of(lambda x: (op(x) * torch.tensor([1.0, 2.0, 3.0])).sum(), v, dynamic=dynamic)
        assert torch.ops.kernelhub.tv_loss_l1_3d.default in targets
        want = _reference_step(v)
        torch.testing.assert_close(out, want)
        torch.testing.assert_close(grad, torch.autograd.grad(want, v)[0])


@pytest.mark.parametrize("backend", ["torch_ref", "inductor"])
def test_a_handle_made_inside_the_compiled_function_works(backend):
    """``kernelhub.op(name)`` called inside the traced function, its handle not made before (each test starts from a
    fresh hub): dynamo replays the handle's side effects only after the trace, so the choice between the operator
    and the reference's inlined ops must not depend on them (it raised a KeyError inside dynamo)."""
    v = torch.randn(2, 5, 6, 7, dtype=torch.float64, requires_grad=True)
    targets, out, grad = _graph_of(
        lambda x: (kernelhub.op("tv_loss_l1_3d", backend=backend)(x) * torch.tensor([1.0, 2.0, 3.0])).sum(), v)
    assert (torch.ops.kernelhub.tv_loss_l1_3d.default in targets) == (backend == "torch_ref")
    want = _reference_step(v)
    torch.testing.assert_close(out, want)
    torch.testing.assert_close(grad, torch.autograd.grad(want, v)[0])


def _forced_step(backend, name, dtype, index, device):
    """A step around ``name`` with ``backend`` forced (skipped where it is unavailable): ``(op(*a) * 1.5).abs().sum()``
    of the real part, the small sample ``index`` with gradients, and its leaves."""
    reason = kernelhub.get_hub().registry.unavailable_reason(backend)
    if reason:
        pytest.skip(f"{backend} is unavailable: {reason}")
    op = kernelhub.op(name, backend=backend)
    args = testing.with_grad(name, testing.samples(name, "small", dtype, device)[index].args)

    def step(*a):
        out = op(*a)
        return ((out.real if out.is_complex() else out) * 1.5).abs().sum()

    return step, args, testing.leaves(name, args)


def _cuda_ext_inline_cases():
    try:
        from kernelhub_cuda_ext.plugin import IMPLS
    except ImportError:  # installed without cuda_ext (CUDA_EXT=0 on the GPU machine, a user's own set)
        return [pytest.param(None, None, 0, marks=pytest.mark.skip(reason="kernelhub_cuda_ext is not installed"))]
    semiconv = len(testing.samples("semiconv", "small", torch.float32, "cpu"))  # its semifields, dims and groups
    return [(name, torch.float32, 0) for name in sorted(IMPLS)] + [("tikhonov_inverse_2xn", torch.complex64, 0)] + \
        [("semiconv", torch.float32, i) for i in range(1, semiconv)]


@pytest.mark.parametrize("name, dtype, index", _cuda_ext_inline_cases())
def test_where_the_hub_would_run_cuda_ext_the_graph_calls_its_operators(name, dtype, index):
    """cuda_ext forced (the same decision as where selection picks it): the graph calls cuda_ext's operators, no
    opaque kernelhub node, with eager cuda_ext's values and gradients. The operators' fake implementations are what
    lets dynamo trace them. The multi-scale K-Planes' planes are a list of tensors, each one of the Function's
    inputs; semiconv runs every small sample (semifields, 1-3 dims, stride, dilation, groups, group broadcasting)."""
    step, args, leaves = _forced_step("cuda_ext", name, dtype, index, "cpu")
    targets, got = _traced(step, *args)
    got_g = torch.autograd.grad(got, leaves)
    targets = {str(t) for t in targets}
    assert not any(t.startswith("kernelhub.") for t in targets)
    assert any(t.startswith("kernelhub_cuda_ext.") and "_forward" in t for t in targets)
    assert any(t.startswith("kernelhub_cuda_ext.") and "_backward" in t for t in targets)
    want = step(*args)
    torch.testing.assert_close(got, want)
    for g, w in zip(got_g, torch.autograd.grad(want, leaves)):
        torch.testing.assert_close(g, w)


def _triton_inline_cases():
    try:
        from kernelhub_triton.plugin import IMPLS
    except ImportError:
        return [pytest.param(None, None, 0, None, marks=pytest.mark.skip(reason="kernelhub_triton is not installed"))]
    semiconv = len(testing.samples("semiconv", "small", torch.float32, "cpu"))
    return [(name, torch.float32, 0, None) for name in sorted(IMPLS)] + \
        [("tikhonov_inverse_2xn", torch.complex64, 0, None), ("tv_loss_iso_3d", torch.float64, 0, None)] + \
        [("semiconv", torch.float32, i, None) for i in range(1, semiconv)] + \
        [("trilinear_interp", torch.float32, 0, 0), ("trilinear_interp", torch.float32, 0, 1)]


@pytest.mark.skipif(not torch.cuda.is_available(), reason="inductor compiles user-defined Triton kernels for CUDA only")
@pytest.mark.parametrize("name, dtype, index, only", _triton_inline_cases())
def test_where_the_hub_would_run_triton_the_graph_launches_its_kernels(name, dtype, index, only):
    """triton forced on CUDA: dynamo puts the launchers' Triton kernels into the graph as user-defined kernels (no
    opaque kernelhub node), and the step compiled by inductor gives eager triton's values and gradients: every op
    (K-Planes' backward on copies of its points and rotations, `kernelhub_triton.kplanes._launch_backward`), every
    small semiconv sample, float64 and complex, and trilinear with one input needing its gradient (``only``: the
    other is a constant of the step)."""
    step, args, leaves = _forced_step("triton", name, dtype, index, "cuda")
    if only is not None:
        args = [a if i == only else a.detach() for i, a in enumerate(args)]
        leaves = [args[only]]
    targets, _ = _traced(step, *args)
    targets = {str(t) for t in targets}
    assert not any(t.startswith("kernelhub.") for t in targets)
    assert any("triton_kernel_wrapper" in t for t in targets)
    torch._dynamo.reset()
    got = torch.compile(step, fullgraph=True)(*args)
    got_g = torch.autograd.grad(got, leaves)
    want = step(*args)
    torch.testing.assert_close(got, want)
    for g, w in zip(got_g, torch.autograd.grad(want, leaves)):
        torch.testing.assert_close(g, w)


def test_a_lazy_function_resolves_before_a_trace():
    """A backend's lazily imported function (`kernelhub.spec.lazy`) imports on ``resolve()`` as on its first call;
    `_inline_choice` resolves the chosen impl's functions there, outside dynamo's trace (which cannot import)."""
    from kernelhub.spec import lazy

    dumps = lazy("json", "dumps")
    import json

    assert dumps.resolve() is json.dumps and dumps([1]) == "[1]"


def test_a_layout_cache_caches_eagerly_and_is_the_plain_function_while_dynamo_traces():
    """`kernelhub.spec.layout_cache`, the launchers' per-layout plans: eager calls of one layout compute it once;
    a graph being traced calls the plain function (no dynamo warning about tracing through an ``lru_cache``)."""
    import warnings

    from kernelhub.spec import layout_cache

    calls = []

    @layout_cache(maxsize=8)
    def plan(n):
        calls.append(n)
        return n * 2

    assert plan(3) == plan(3) == 6 and calls == [3]
    plan.cache_clear()
    assert plan(3) == 6 and calls == [3, 3]
    torch._dynamo.reset()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        out = torch.compile(lambda x: x * plan(x.shape[0]), fullgraph=True, backend="eager")(torch.ones(4))
    assert torch.equal(out, torch.full((4,), 8.0))
    assert calls == [3, 3, 4]  # traced: the plain function ran, and nothing was cached for 4
    assert not any("lru_cache" in str(w.message) for w in caught)


def test_the_first_use_of_the_hub_inside_a_compiled_function(monkeypatch):
    """No hub built yet: under fullgraph a clear error (dynamo cannot trace the plugins' loading); without fullgraph
    dynamo breaks the graph there and the hub is built eagerly."""
    from kernelhub import hub

    v = torch.randn(3, 4, 5, requires_grad=True)

    def step(x):
        return kernelhub.op("tv_loss_sq_3d")(x) * 2

    monkeypatch.setattr(hub, "_HUB", None)
    torch._dynamo.reset()
    with pytest.raises(Exception, match="the hub is built at its first use outside torch.compile"):
        torch.compile(step, fullgraph=True, backend="aot_eager")(v)
    assert hub._HUB is None
    torch._dynamo.reset()
    out = torch.compile(step, backend="aot_eager")(v)
    assert hub._HUB is not None
    torch.testing.assert_close(out, kernelhub.op("tv_loss_sq_3d", backend="torch_ref")(v) * 2)


def test_the_inline_choice_is_marked_as_assume_constant_result_marks_a_function():
    """`dispatch._inline_choice` sets the attribute that `torch.compiler.assume_constant_result` sets (which would
    import dynamo at kernelhub's import); where torch marks a function otherwise, this fails."""
    from kernelhub import dispatch

    def probe():
        return 0

    assert torch.compiler.assume_constant_result(probe) is probe
    assert vars(probe) == {"_dynamo_marked_constant": True}
    assert dispatch._inline_choice._dynamo_marked_constant is True


def test_an_eager_program_does_not_import_dynamo():
    """Importing kernelhub and running an op forward and backward, eagerly, leave torch._dynamo unimported (its
    import is 2 s of a 2-core CPU's process start); a compiled call still builds the hub eagerly (above)."""
    code = ("import sys, torch, kernelhub\n"
            "x = torch.randn(2, 4, 5, 6, requires_grad=True)\n"
            "kernelhub.op('tv_loss_l1_3d')(x).sum().backward()\n"
            "kernelhub.explain('tv_loss_l1_3d', x)\n"
            "assert x.grad is not None\n"
            "print(sorted(m for m in sys.modules if m.startswith('torch._dynamo')))\n")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert proc.stdout.strip() == "[]", proc.stdout
