"""The eager fast path (kernelhub/dispatch.py) and the torch.library operators serve a call alike: same backend,
same values and gradients, same errors; the fast path is taken in plain eager code only, never while dynamo,
a functorch transform or a dispatch mode traces. Fallback and WrongOutputError on both paths:
tests/test_selector.py runs those tests once per path (its `path` fixture)."""

import os
import sys

import harness
import pytest
import torch
from kernelhub_torch_ref import tv
from torch.utils._python_dispatch import TorchDispatchMode

import kernelhub
from kernelhub import _state, dispatch, testing

OPS = kernelhub.op_names()
FAST_FN = "KernelhubFunctionBackward"


def _call(op, args, fast, monkeypatch):
    monkeypatch.setattr(_state, "EAGER_FAST_PATH", fast)
    spec = kernelhub.get_hub().registry.spec(op)
    args = testing.with_grad(op, args)  # fresh leaves per call
    out = kernelhub.op(op)(*args)
    leaves = [t for i in spec.differentiable for t in (args[i] if isinstance(args[i], list) else [args[i]])]
    grads = torch.autograd.grad(out, leaves, testing.upstream_grad(out), allow_unused=True)
    return out, grads, kernelhub.explain(op, *args).chosen


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
@pytest.mark.parametrize("op", OPS)
def test_both_paths_choose_the_same_backend_and_agree(op, dtype, monkeypatch):
    spec = kernelhub.get_hub().registry.spec(op)
    dtype = dtype if dtype in spec.dtypes else {torch.float32: torch.complex64, torch.float64: torch.complex128}[dtype]
    for sample in testing.samples(op, "small", dtype)[:2]:
        out, grads, chosen = _call(op, sample.args, True, monkeypatch)
        ref, ref_grads, ref_chosen = _call(op, sample.args, False, monkeypatch)
        assert type(out.grad_fn).__name__ == FAST_FN and type(ref.grad_fn).__name__ != FAST_FN
        assert chosen == ref_chosen
        torch.testing.assert_close(out, ref, rtol=0, atol=0, equal_nan=True)
        for g, r in zip(grads, ref_grads, strict=True):
            torch.testing.assert_close(g, r, rtol=1e-12, atol=0, equal_nan=True)  # an impl may add with atomics


def test_no_grad_inference_mode_and_inputs_without_grad_take_the_fast_path_without_a_graph():
    v = torch.randn(3, 4, 5)
    assert kernelhub.op("tv_loss_l1_3d")(v).grad_fn is None
    w = v.clone().requires_grad_()
    with torch.no_grad():
        assert kernelhub.op("tv_loss_l1_3d")(w).grad_fn is None
    with torch.inference_mode():
        torch.testing.assert_close(kernelhub.op("tv_loss_l1_3d")(w), kernelhub.op("tv_loss_l1_3d")(v))


@pytest.mark.parametrize("fast", [True, False])
def test_the_same_errors_on_both_paths(fast, monkeypatch):
    monkeypatch.setattr(_state, "EAGER_FAST_PATH", fast)
    with pytest.raises(ValueError, match="tv_loss_l1_3d: argument 'volume' must have at least 3 dims"):
        kernelhub.op("tv_loss_l1_3d")(torch.ones(4, 4))
    pts, rot, planes = torch.zeros(4, 3), torch.eye(3)[None], torch.ones(3, 2, 4, 4)
    torch.use_deterministic_algorithms(True)
    try:  # its planes gradient adds with atomics
        with pytest.raises(kernelhub.NoImplementationError, match="forced backend 'triton' cannot serve"):
            kernelhub.op("kplanes_interp_tilted", backend="triton")(pts, rot, planes)
    finally:
        torch.use_deterministic_algorithms(False)
    v = torch.randn(3, 4, 5, requires_grad=True)
    (g,) = torch.autograd.grad(kernelhub.op("tv_loss_sq_3d")(v), v, create_graph=True)
    with pytest.raises(RuntimeError, match="double backward is not supported by kernelhub.tv_loss_sq_3d"):
        g.sum().backward()


@pytest.mark.parametrize("fast", [True, False])
@pytest.mark.parametrize("how", ["backward", "grad", "allow_unused", "penalty", "hessian"])
def test_double_backward_raises_naming_the_op_however_it_is_asked_for(fast, how, monkeypatch):
    """A gradient taken with create_graph=True raises when differentiated, on both paths, also by
    torch.autograd.grad against the call's inputs: a gradient penalty (``loss + |grad|^2``) whose second-order term
    found no path to the inputs once came back without it (and ``allow_unused=True`` gave None), and
    torch.autograd.functional.hessian returned zeros, silently."""
    monkeypatch.setattr(_state, "EAGER_FAST_PATH", fast)
    v = torch.randn(3, 4, 5, requires_grad=True)
    out = kernelhub.op("tv_loss_sq_3d")(v)
    assert (type(out.grad_fn).__name__ == FAST_FN) == fast
    (g,) = torch.autograd.grad(out, v, create_graph=True)
    torch.testing.assert_close(g, torch.autograd.grad(kernelhub.op("tv_loss_sq_3d")(v), v)[0], rtol=0, atol=0)
    run = {"backward": lambda: g.sum().backward(), "grad": lambda: torch.autograd.grad(g.sum(), v),
           "allow_unused": lambda: torch.autograd.grad(g.sum(), v, allow_unused=True),
           "penalty": lambda: torch.autograd.grad(v.square().sum() + g.square().sum(), v),
           "hessian": lambda: torch.autograd.functional.hessian(kernelhub.op("tv_loss_sq_3d"), v.detach())}[how]
    with pytest.raises(RuntimeError, match="double backward is not supported by kernelhub.tv_loss_sq_3d"):
        run()


@harness.cuda  # on the GPU where there is one
@pytest.mark.parametrize("fast", [True, False])
@pytest.mark.parametrize("op", ["tv_loss_l1_3d", "kplanes_interp_tilted_ms", "semiconv"])
def test_batched_upstream_gradients_and_vmap_run_sample_by_sample_on_both_paths(fast, op, monkeypatch):
    """torch.autograd.grad(..., is_grads_batched=True) (torch's legacy vmap: torch.autograd.functional.jacobian's
    vectorize=True), torch.func.vmap over the upstream gradient and torch.func.vmap of the op give what one call
    per sample gives, on both paths, also for an op with a list of tensors (K-Planes' planes): the backward
    operator returns a list, for which torch makes no batching fallback, and an impl's kernels take plain tensors
    only (`dispatch._per_sample`, `dispatch._per_grad_sample`)."""
    monkeypatch.setattr(_state, "EAGER_FAST_PATH", fast)
    spec = kernelhub.get_hub().registry.spec(op)
    device = "cuda" if torch.cuda.is_available() else "cpu"
    sample = testing.samples(op, "small", torch.float64, torch.device(device))[0]
    args = testing.with_grad(op, spec.normalize(*sample.args))
    leaves = testing.leaves(op, args)
    out = kernelhub.op(op)(*args)
    assert (type(out.grad_fn).__name__ == FAST_FN) == fast
    ups = torch.randn(3, *out.shape, dtype=out.dtype, device=out.device)
    batched = torch.autograd.grad(out, leaves, ups, is_grads_batched=True, retain_graph=True)
    # torch.func.vmap over the upstream gradient of a graph built outside it (functorch's batched tensors)
    mapped = torch.func.vmap(lambda up: torch.autograd.grad(out, leaves, up, retain_graph=True))(ups)
    for k, up in enumerate(ups):
        want = torch.autograd.grad(out, leaves, up, retain_graph=True)
        for got, got_mapped, w in zip(batched, mapped, want, strict=True):
            torch.testing.assert_close(got[k], w, rtol=1e-12, atol=1e-12)
            torch.testing.assert_close(got_mapped[k], w, rtol=1e-12, atol=1e-12)
    i = spec.tensor_args[0]  # vmap over the first tensor argument (each of a list's tensors)
    plain = [a.detach() if isinstance(a, torch.Tensor) else a for a in args]
    stacked = (torch.stack([plain[i], plain[i] * 0.5]) if isinstance(plain[i], torch.Tensor)
               else [torch.stack([t, t * 0.5]) for t in plain[i]])
    with_arg = lambda a: kernelhub.op(op)(*plain[:i], a, *plain[i + 1:])  # noqa: E731
    mapped = torch.func.vmap(with_arg)(stacked)
    for k, scale in enumerate((1.0, 0.5)):
        one = plain[i] * scale if isinstance(plain[i], torch.Tensor) else [t * scale for t in plain[i]]
        torch.testing.assert_close(mapped[k], with_arg(one), rtol=1e-12, atol=1e-12)
    empty = torch.func.vmap(with_arg)(stacked[:0] if isinstance(stacked, torch.Tensor) else [t[:0] for t in stacked])
    assert empty.shape == (0, *mapped.shape[1:]), empty.shape  # an empty batch, as torch.func.vmap(torch.sin)


def test_a_legacy_batched_gradient_is_unbatched_on_another_thread():
    """A CUDA backward runs on autograd's device thread, whose legacy-vmap level counter never entered the vmap
    of is_grads_batched=True: `dispatch._per_grad_sample` finds the level from the gradient itself (it had
    unbatched at the thread's level 0 and failed an internal assert of torch's, on an H200 host)."""
    import threading

    from torch._vmap_internals import _vmap

    def backward(g):
        result = []
        thread = threading.Thread(target=lambda: result.append(dispatch._per_grad_sample(g, lambda x: [x * 2, None])))
        thread.start()
        thread.join()
        return result[0][0]
    g = torch.randn(3, 4)
    torch.testing.assert_close(_vmap(backward, 0, 0)(g), g * 2, rtol=0, atol=0)


def test_the_fast_path_is_not_taken_while_dynamo_traces(monkeypatch):
    calls = []
    real = dispatch._apply
    monkeypatch.setattr(dispatch, "_apply", lambda *a: calls.append(1) or real(*a))
    graphs = []

    def backend(gm, example_inputs):
        graphs.append(gm)
        return gm.forward

    fn = kernelhub.op("tv_loss_sq_3d", backend="torch_ref")
    compiled = torch.compile(lambda v: fn(v * 2.0), backend=backend, fullgraph=True)
    v = torch.randn(3, 4, 5, requires_grad=True)
    torch.testing.assert_close(compiled(v), fn(v * 2.0))
    assert len(calls) == 1  # the eager call only
    targets = {n.target for g in graphs for n in g.graph.nodes}
    assert torch.ops.kernelhub.tv_loss_sq_3d.default in targets


def test_functorch_transforms_dispatch_modes_and_meta_tensors_take_the_operators():
    seen = []

    def f(v):
        seen.append(dispatch.traced((v,)))
        return kernelhub.op("tv_loss_sq_3d")(v)

    v = torch.randn(3, 4, 5)
    leaked = []
    torch.func.vmap(lambda t: leaked.append(t) or f(t))(torch.randn(2, 3, 4, 5))
    assert seen == [True] and not dispatch.traced((v,))
    assert dispatch.traced((leaked[0],))  # a wrapper that outlived its vmap: the operators, not the fast path

    class Recording(TorchDispatchMode):
        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            seen.append(func)
            return func(*args, **(kwargs or {}))

    with Recording():
        assert dispatch.traced((v,))
        kernelhub.op("tv_loss_sq_3d")(v)
    assert torch.ops.kernelhub.tv_loss_sq_3d.default in seen  # the mode saw the operator
    meta = torch.empty(3, 4, 5, device="meta")
    assert dispatch.traced((meta,)) and kernelhub.op("tv_loss_sq_3d")(meta).device.type == "meta"
    assert not dispatch.traced(([v, torch.nn.Parameter(v)], 1.0))

    class Sub(torch.Tensor):
        pass

    assert dispatch.traced(([v, v.as_subclass(Sub)],))


def test_a_hub_built_directly_runs_its_own_handles_eagerly_and_through_the_operators():
    """A `Hub` built directly (here with a backend the global hub lacks) runs its handles' calls itself, on the
    fast path and through the operators (under torch.compile), forward and backward; the global hub never sees
    that backend."""
    import dataclasses
    import types

    from kernelhub import hookimpl
    from kernelhub.config import Config
    from kernelhub.hub import Hub
    from kernelhub.spec import Backend, Impl

    ref = kernelhub.get_hub().registry.impls("tv_loss_l1_3d")["torch_ref"]
    calls = []

    @hookimpl
    def kernelhub_register_impls(registry):
        registry.add_backend(Backend("spy", "1.0"))
        registry.add_impl(Impl(op="tv_loss_l1_3d", backend="spy", dtypes=ref.dtypes, devices=ref.devices,
                               forward=lambda v: calls.append("forward") or ref.forward(v),
                               backward=lambda g, v, needs: calls.append("backward") or ref.backward(g, v,
                                                                                                    needs=needs)))
    hub = Hub(extra_plugins=[("spy", types.SimpleNamespace(kernelhub_register_impls=kernelhub_register_impls))],
                        config=dataclasses.replace(Config(), priority=("spy", "torch_ref")))
    assert "spy" not in kernelhub.get_hub().registry.backends and hub.key != 0
    v = torch.randn(3, 4, 5, requires_grad=True)
    for handle in (hub.handle("tv_loss_l1_3d"), hub.handle("tv_loss_l1_3d", backend="spy")):
        calls.clear()
        handle(v).sum().backward()  # the fast path
        assert calls == ["forward", "backward"]
        calls.clear()
        torch.compile(lambda x: handle(x), backend="aot_eager", fullgraph=True)(v).sum().backward()  # the operators
        assert calls.count("forward") >= 1 and calls.count("backward") == 1, calls
    with pytest.raises(kernelhub.NoImplementationError, match="spy"):
        kernelhub.op("tv_loss_l1_3d", backend="spy")


def test_the_backward_runs_on_the_hub_that_ran_the_forward(monkeypatch):
    """A reload between the forward and the backward (a new config, new plugins) does not change who computes the
    gradient: the forward's hub runs it, with the forward's decision, and the new hub is not asked."""
    v = torch.randn(3, 4, 5, requires_grad=True)
    first = kernelhub.get_hub()
    out = kernelhub.op("tv_loss_sq_3d")(v)
    asked = []
    real = first.backward_grads
    monkeypatch.setattr(first, "backward_grads", lambda *a, **k: asked.append("first") or real(*a, **k))
    second = kernelhub.reload()
    monkeypatch.setattr(second, "backward_grads", lambda *a, **k: asked.append("second"))
    (g,) = torch.autograd.grad(out, v)
    assert asked == ["first"]
    w = v.detach().requires_grad_()
    torch.testing.assert_close(g, torch.autograd.grad(tv.tv_loss_sq_3d(w), w)[0])  # torch_ref's math, plain autograd


def test_the_output_checks_run_once_per_layout_and_way_of_calling(monkeypatch):
    """The eager fast path checks outputs and gradients (kernelhub/hub.py: `_check_output`, `_check_grads`) on a
    layout's first call, and again for each new way of calling: another layout, another set of gradients needed
    (the same layout), an upstream gradient of other strides, a weighted handle; every call on the operators'
    path."""
    from kernelhub import hub as hub_module

    seen = []
    for name in ("_check_output", "_check_grads"):
        real = getattr(hub_module, name)
        monkeypatch.setattr(hub_module, name, lambda *a, _r=real, _n=name: seen.append(_n) or _r(*a))
    kernelhub.get_hub().selector.forget()
    op = kernelhub.op("trilinear_interp", backend="torch_ref")
    feats, pts = torch.randn(7, 8, 2, requires_grad=True), (torch.rand(7, 3) * 2 - 1).requires_grad_()

    def step(g=None, points=pts, handle=op):
        out = handle(feats, points)
        inputs = (feats, points) if points.requires_grad else (feats,)
        torch.autograd.grad(out, inputs, g if g is not None else torch.ones_like(out))
    step()
    assert seen == ["_check_output", "_check_grads"]
    step(), step()
    assert seen == ["_check_output", "_check_grads"]  # the layout's repeated calls: trusted
    step(points=pts.detach()), step(points=pts.detach())
    assert seen[2:] == ["_check_grads"]  # points that need no gradient, the same layout: checked once
    step(g=torch.ones(2, 7).t())  # an upstream gradient of other strides
    step(g=torch.ones(2, 7).t())
    assert seen[3:] == ["_check_grads"]
    with torch.no_grad():
        op(feats, pts), op(feats, pts)
    assert seen[4:] == []  # the plain forward is the no-grad call's way too
    op(feats[:5], pts[:5]), op(feats[:5], pts[:5])
    assert seen[4:] == ["_check_output"]  # another layout
    step(handle=op.weighted(torch.randn(7, 2)), g=torch.tensor(1.0))
    step(handle=op.weighted(torch.randn(7, 2)), g=torch.tensor(1.0))
    # weighted by an impl that fuses nothing: the plain forward's output (trusted), a gradient from another upstream
    # gradient's strides (0-d) checked once
    assert seen[5:] == ["_check_grads"]
    del seen[:]
    monkeypatch.setattr(_state, "EAGER_FAST_PATH", False)
    step(), step()
    assert seen == ["_check_output", "_check_grads"] * 2  # the operators: every call


def test_a_repeated_call_skips_the_checks_but_not_what_they_guard(monkeypatch):
    """The eager fast path's memo (kernelhub/dispatch.py, `Selector.remembered`): a call whose layout (tensor
    metadata, other arguments' values) was checked and decided before skips the spec's checks and gives the same
    result; a float the spec refuses still raises (values are part of the layout), defaults are completed,
    keywords and the deterministic switch are keyed, and forgetting the decisions forgets the layouts."""
    from kernelhub.spec import OpSpec

    checked = []
    real = OpSpec.canonical
    monkeypatch.setattr(OpSpec, "canonical", lambda self, *a, **k: checked.append(self.name) or real(self, *a, **k))
    hub = kernelhub.get_hub()
    hub.selector.forget()
    op = kernelhub.op("tv_loss_iso_3d")
    v = torch.randn(3, 4, 5, requires_grad=True)
    first = op(v, 1e-3)
    assert checked == ["tv_loss_iso_3d"]
    again = op(v, 1e-3)
    assert checked == ["tv_loss_iso_3d"] and type(again.grad_fn).__name__ == FAST_FN
    torch.testing.assert_close(again, first, rtol=0, atol=0)
    with pytest.raises(ValueError, match="tv_loss_iso_3d: argument 'eps' must be a finite number > 0"):
        op(v, -1e-3)
    op(v), op(v, 1e-8)  # the default eps: checked once, then completed from the memo
    checked.clear()
    torch.testing.assert_close(op(v), op(v, 1e-8), rtol=0, atol=0)
    assert checked == []
    op(volume=v, eps=1e-3)
    op(volume=v, eps=1e-3)
    assert checked == ["tv_loss_iso_3d"] * 2  # keywords: the checks every time
    torch.use_deterministic_algorithms(True)
    try:
        op(v, 1e-3)
    finally:
        torch.use_deterministic_algorithms(False)
    assert checked == ["tv_loss_iso_3d"] * 3
    hub.selector.forget()
    op(v, 1e-3)
    assert checked == ["tv_loss_iso_3d"] * 4
    with pytest.raises(TypeError, match="tv_loss_iso_3d: argument 'volume' must be a torch.Tensor"):
        op([1.0], 1e-3)  # an unhashable argument: looked up never, checked always
    semiconv = kernelhub.op("semiconv")
    img, kernel = torch.randn(1, 2, 8, 8), torch.randn(2, 1, 3, 3)
    semiconv(img, kernel, "tropical_max", [1, 1], [1, 1, 1, 1], [1, 1], 2, "corr")  # canonical as given
    semiconv(img, kernel, "tropical_max", [1, 1], [1, 1, 1, 1], [1, 1], 2, "corr")
    assert checked.count("semiconv") == 1
    with pytest.raises(TypeError, match="semiconv: argument 'stride' must be an int or 2 ints"):
        semiconv(img, kernel, "tropical_max", [True, True], [1, 1, 1, 1], [1, 1], 2, "corr")  # True == 1, a bool


def test_a_remembered_call_still_falls_back_and_stops_asking_the_failed_backend():
    """A backend that starts raising on a layout the memo knows is skipped from then on for it (one warning),
    like on a first call: the memo is dropped with the failed decision."""
    import dataclasses
    import types
    import warnings

    from kernelhub import hookimpl
    from kernelhub.config import Config
    from kernelhub.hub import Hub
    from kernelhub.spec import Backend, Impl

    ref = kernelhub.get_hub().registry.impls("tv_loss_l1_3d")["torch_ref"]
    calls, broken = [], []

    def forward(v):
        calls.append("spy")
        if broken:
            raise RuntimeError("kernel exploded")
        return ref.forward(v)

    @hookimpl
    def kernelhub_register_impls(registry):
        registry.add_backend(Backend("spy", "1.0"))
        registry.add_impl(Impl(op="tv_loss_l1_3d", backend="spy", dtypes=ref.dtypes, devices=ref.devices,
                               forward=forward, backward=ref.backward))
    hub = Hub(extra_plugins=[("spy", types.SimpleNamespace(kernelhub_register_impls=kernelhub_register_impls))],
              config=dataclasses.replace(Config(), priority=("spy", "torch_ref")))
    handle = hub.handle("tv_loss_l1_3d")
    v = torch.randn(3, 4, 5, requires_grad=True)
    handle(v), handle(v)
    assert calls == ["spy", "spy"] and hub.selector.remembered
    broken.append(1)
    with pytest.warns(RuntimeWarning, match="'spy' raised RuntimeError: kernel exploded"):
        out = handle(v)
    torch.testing.assert_close(out, ref.forward(v.detach()))
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        handle(v).sum().backward()
        handle(v)
    assert calls == ["spy"] * 3


@pytest.mark.parametrize("fast", [True, False])
@pytest.mark.parametrize("returned", ["the volume", "a view of it", "the upstream gradient expanded"])
def test_a_gradient_sharing_memory_with_the_call_is_a_wrong_output(returned, fast, monkeypatch):
    """The backward's memory check (kernelhub/hub.py: `_check_grads`, then `_check_result`) on both paths: a
    gradient that is an argument, a view of one, or the upstream gradient raises WrongOutputError naming what it
    shares."""
    import dataclasses
    import types

    from kernelhub import hookimpl
    from kernelhub.config import Config
    from kernelhub.hub import Hub
    from kernelhub.spec import Backend, Impl

    monkeypatch.setattr(_state, "EAGER_FAST_PATH", fast)
    ref = kernelhub.get_hub().registry.impls("tv_loss_sq_3d")["torch_ref"]
    wrong = {"the volume": lambda g, v: v, "a view of it": lambda g, v: v.view(v.shape[::-1]).view(v.shape),
             "the upstream gradient expanded": lambda g, v: g.expand(v.shape)}[returned]

    @hookimpl
    def kernelhub_register_impls(registry):
        registry.add_backend(Backend("alias", "1.0"))
        registry.add_impl(Impl(op="tv_loss_sq_3d", backend="alias", dtypes=ref.dtypes, devices=ref.devices,
                               forward=ref.forward, backward=lambda g, v, needs: [wrong(g, v)]))
    hub = Hub(extra_plugins=[("alias", types.SimpleNamespace(kernelhub_register_impls=kernelhub_register_impls))],
              config=dataclasses.replace(Config(), priority=("alias", "torch_ref")))
    v = torch.randn(3, 4, 5, requires_grad=True)
    what = "the upstream gradient" if "upstream" in returned else "argument 'volume'"
    for _ in range(2):  # the second call from the memo
        out = hub.handle("tv_loss_sq_3d", backend="alias")(v)
        with pytest.raises(kernelhub.WrongOutputError, match=f"gradient of 'volume' sharing memory with {what}"):
            torch.autograd.grad(out, v)


@pytest.mark.parametrize("fast", [True, False])
@pytest.mark.parametrize("returned", ["a plane", "the other scale's plane", "the points"])
def test_a_gradient_in_a_list_sharing_memory_with_the_call_is_a_wrong_output(returned, fast, monkeypatch):
    """The same check for a "tensors" argument's gradients, one by one: a planes gradient of the multiscale K-Planes
    op that is a plane, another scale's plane or the points (of the plane's shape) raises WrongOutputError naming
    the element."""
    import dataclasses
    import types

    from kernelhub import hookimpl
    from kernelhub.config import Config
    from kernelhub.hub import Hub
    from kernelhub.spec import Backend, Impl

    monkeypatch.setattr(_state, "EAGER_FAST_PATH", fast)
    op = "kplanes_interp_tilted_ms"
    ref = kernelhub.get_hub().registry.impls(op)["torch_ref"]
    pts = torch.rand(6, 3) * 2 - 1
    planes = [torch.randn(3, 2, 4, 4), torch.randn(3, 2, 4, 4)]
    rot = torch.eye(3).expand(1, 3, 3).clone()
    if returned == "the points":  # a planes-shaped view of a points tensor as large as a plane
        pts = torch.rand(planes[1].numel() // 3, 3) * 2 - 1

    def backward(g, p, r, pl, needs):
        grads = ref.backward(g, p, r, pl, needs=needs)
        wrong = {"a plane": lambda: pl[1], "the other scale's plane": lambda: pl[0].view(pl[1].shape),
                 "the points": lambda: p.view(pl[1].shape)}[returned]
        return [grads[0], grads[1], [grads[2][0], wrong()]]

    @hookimpl
    def kernelhub_register_impls(registry):
        registry.add_backend(Backend("alias", "1.0"))
        registry.add_impl(Impl(op=op, backend="alias", dtypes=ref.dtypes, devices=ref.devices, forward=ref.forward,
                               backward=backward))
    hub = Hub(extra_plugins=[("alias", types.SimpleNamespace(kernelhub_register_impls=kernelhub_register_impls))],
              config=dataclasses.replace(Config(), priority=("alias", "torch_ref")))
    planes = [p.requires_grad_() for p in planes]
    what = "argument 'pts'" if returned == "the points" else "argument 'planes'"
    for _ in range(2):  # the second call from the memo
        out = hub.handle(op, backend="alias")(pts, rot, planes)
        with pytest.raises(kernelhub.WrongOutputError, match=f"gradient of 'planes'\\[1\\] sharing memory with {what}"):
            torch.autograd.grad(out.sum(), planes)


@pytest.mark.parametrize("fast", [True, False])
@pytest.mark.parametrize("op", ["tv_loss_l1_3d", "tv_loss_sq_3d", "trilinear_interp", "tikhonov_inverse_2xn"])
def test_a_weighted_handle_gives_the_weighted_output_summed_in_one_node(op, fast, monkeypatch):
    """`OpHandle.weighted(w)(*args)` equals `(op(*args) * w).sum()`, values and gradients, for outputs of
    one dim, none, two (trilinear) and complex ones (Tikhonov, where the product's gradient conjugates w); on
    the fast path the weighting is inside the op's node (no multiplication node), through the operators it is
    the torch ops; weights that require grad get their gradient (the op's output) on both."""
    monkeypatch.setattr(_state, "EAGER_FAST_PATH", fast)
    spec = kernelhub.get_hub().registry.spec(op)
    dtype = torch.float64 if torch.float64 in spec.dtypes else torch.complex128
    sample = testing.samples(op, "small", dtype)[0]
    out = kernelhub.op(op)(*sample.args)
    w = torch.randn(out.shape, dtype=out.dtype, generator=torch.Generator().manual_seed(3))
    for learn in (False, True):
        args, ref_args = testing.with_grad(op, sample.args), testing.with_grad(op, sample.args)
        weights, ref_weights = w.clone().requires_grad_(learn), w.clone().requires_grad_(learn)
        got = kernelhub.op(op).weighted(weights)(*args)
        ref = (kernelhub.op(op)(*ref_args) * ref_weights).sum()
        assert got.shape == () and got.dtype == out.dtype
        if fast and not learn:
            assert type(got.grad_fn).__name__ == FAST_FN
        torch.testing.assert_close(got, ref, rtol=1e-12, atol=1e-12)
        leaves = [args[i] for i in spec.differentiable] + ([weights] if learn else [])
        ref_leaves = [ref_args[i] for i in spec.differentiable] + ([ref_weights] if learn else [])
        upstream = torch.tensor(0.75, dtype=got.dtype)
        for g, r in zip(torch.autograd.grad(got, leaves, upstream), torch.autograd.grad(ref, ref_leaves, upstream),
                        strict=True):
            torch.testing.assert_close(g, r, rtol=1e-10, atol=1e-12)
    with torch.no_grad():  # no input needs grad: no node at all, the same value
        plain = kernelhub.op(op).weighted(w)(*sample.args)
    assert plain.grad_fn is None
    torch.testing.assert_close(plain, (out * w).sum(), rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("fast", [True, False])
def test_a_weighted_handle_refuses_weights_that_do_not_fit_the_output(fast, monkeypatch):
    monkeypatch.setattr(_state, "EAGER_FAST_PATH", fast)
    handle, v = kernelhub.op("tv_loss_l1_3d"), torch.randn(3, 4, 5, dtype=torch.float64, requires_grad=True)
    for weights in (torch.ones(4, dtype=torch.float64), torch.ones(3), torch.ones((), dtype=torch.float64)):
        with pytest.raises(ValueError, match=r"tv_loss_l1_3d: argument 'weights' must have the output's shape, "
                                             r"dtype and device, float64\[3\]@cpu"):
            handle.weighted(weights)(v)
    with pytest.raises(TypeError, match="tv_loss_l1_3d: argument 'weights' must be a tensor, got list"):
        handle.weighted([1.0, 1.0, 1.0])
    with pytest.raises(ValueError, match="tv_loss_l1_3d: argument 'volume' must have at least 3 dims"):
        handle.weighted(torch.ones(3))(torch.ones(4, 4))
    with pytest.raises(ValueError, match="tv_loss_l1_3d: this handle is weighted already"):
        handle.weighted(torch.ones(3)).weighted(torch.ones(3))
    assert repr(handle.weighted(torch.ones(3))) == "kernelhub.op('tv_loss_l1_3d').weighted(float32[3])"


@pytest.mark.parametrize("raises", [False, True])
def test_an_impl_that_fuses_the_weights_gets_them_and_the_next_one_gets_them_weighed(raises, tv_backend_hub):
    """An impl declared `weighted` gets a weighted handle's weights in its forward and backward on the fast path
    (one call each way, with or without grad) and returns the weighted sum itself; where it raises, the next impl
    serves the plain call and the hub weighs it; weights that require grad are weighed by autograd around the
    plain call. The same values and gradients every way."""
    import warnings

    ref = kernelhub.get_hub().registry.impls("tv_loss_l1_3d")["torch_ref"]
    calls = []

    def forward(v, weights=None):
        calls.append(("forward", weights is not None))
        if raises:
            raise RuntimeError("no kernel for this call")
        out = ref.forward(v)
        return out if weights is None else (out * weights).sum()

    def backward(g, v, needs, weights=None):
        calls.append(("backward", weights is not None))
        return ref.backward(g if weights is None else weights * g, v, needs=needs)

    hub = tv_backend_hub("fused", forward, backward, weighted=True)
    v = torch.randn(3, 4, 5, dtype=torch.float64, generator=torch.Generator().manual_seed(5))
    w = torch.tensor([0.5, -1.0, 2.0], dtype=torch.float64)
    upstream = torch.tensor(0.75, dtype=torch.float64)
    x = v.clone().requires_grad_()
    want = (tv.tv_loss_l1_3d(x) * w).sum()
    want_grad = torch.autograd.grad(want, x, upstream)[0]
    handle = hub.handle("tv_loss_l1_3d").weighted(w)
    for first in (True, False):  # the second call from the memo (where the impl raised, it is set aside)
        calls.clear()
        x = v.clone().requires_grad_()
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            got = handle(x)
        assert [str(c.message) for c in caught if "falling back" in str(c.message)] == \
            (["kernelhub: tv_loss_l1_3d: backend 'fused' raised RuntimeError: no kernel for this call; falling back "
              "to the next eligible backend"] if raises and first else [])
        torch.testing.assert_close(got, want, rtol=1e-12, atol=1e-12)
        torch.testing.assert_close(torch.autograd.grad(got, x, upstream)[0], want_grad, rtol=1e-12, atol=1e-12)
        assert calls == ([("forward", True)] if first else []) if raises else [("forward", True), ("backward", True)]
    with torch.no_grad():
        torch.testing.assert_close(handle(v), want, rtol=1e-12, atol=1e-12)
    learnt = w.clone().requires_grad_()
    calls.clear()
    got = hub.handle("tv_loss_l1_3d").weighted(learnt)(v.clone().requires_grad_())
    torch.testing.assert_close(torch.autograd.grad(got, learnt)[0], tv.tv_loss_l1_3d(v), rtol=1e-12, atol=1e-12)
    assert all(not fused for _, fused in calls)


def test_a_weighted_handle_under_torch_compile_equals_eager():
    handle = kernelhub.op("tv_loss_l1_3d")
    weights = torch.tensor([0.5, 1.0, 2.0])

    @torch.compile(fullgraph=True, backend="aot_eager")
    def loss(v):
        return handle.weighted(weights)(v * 2.0)

    v = torch.randn(2, 5, 6, 7, requires_grad=True)
    w = v.detach().clone().requires_grad_()
    got, ref = loss(v), handle.weighted(weights)(w * 2.0)
    torch.testing.assert_close(got, ref)
    got.backward(), ref.backward()
    torch.testing.assert_close(v.grad, w.grad)


def test_a_call_taken_apart_by_its_plan_is_put_back_whole():
    """`kernelhub._glue.plan_call`, `put_back` and `to_slots` (every autograd glue's): the call rebuilt from its saved
    tensors, a "tensors" argument's one by one, each differentiable argument's need from its tensors' slots (any of
    a list's), and its gradients back in those slots, after ``offset`` inputs that are not tensors."""
    from kernelhub._glue import plan_call, put_back, to_slots

    spec = kernelhub.get_hub().registry.spec("kplanes_interp_tilted_ms")
    pts, rot, planes = torch.randn(5, 3), torch.eye(3)[None], [torch.randn(3, 2, 4, 4), torch.randn(3, 2, 8, 8)]
    for offset in (0, 1):
        plan = plan_call(spec, (pts, rot, planes), offset)
        saved = (pts, rot, *planes)
        for needs_input in [(True, False, False, True), (False, True, False, False), (False, False, True, False)]:
            needs_input = (False,) * offset + needs_input
            args, needs = put_back(plan, saved, needs_input)
            assert args[0] is pts and args[1] is rot and type(args[2]) is list and len(args[2]) == 2
            assert all(a is b for a, b in zip(args[2], planes))
            assert needs == [needs_input[offset], needs_input[offset + 1], any(needs_input[offset + 2:])]
            grads = ["g_pts", "g_rot", ["g_plane0", "g_plane1"]]
            want = [None] * offset + [g if need else None for g, need in
                                      zip(["g_pts", "g_rot", "g_plane0", "g_plane1"], needs_input[offset:])]
            assert to_slots(plan, needs, grads, needs_input) == tuple(want)
    semiconv = kernelhub.get_hub().registry.spec("semiconv")
    call = semiconv.canonical(torch.randn(1, 2, 8, 8), torch.randn(2, 1, 3, 3), "tropical_max", 1, 1, 1, 2)
    plan = plan_call(semiconv, call, 1)
    args, _ = put_back(plan, call[:2], ())
    assert args[3:6] == list(call[3:6]) and all(type(a) is list for a in args[3:6])
    args[3].append(99)  # an impl's change to the lists it was given reaches no later call of the layout
    assert put_back(plan, call[:2], ())[0][3] == call[3]
    # a call of differentiable tensors only (trilinear's): the saved tensors are the call, the slots in order
    trilinear = kernelhub.get_hub().registry.spec("trilinear_interp")
    feats, points = torch.randn(4, 8, 2), torch.rand(4, 3)
    assert plan.simple is None and plan_call(spec, (pts, rot, planes), 1).simple is None
    for offset in (0, 1):
        plan = plan_call(trilinear, (feats, points), offset)
        assert plan.simple == offset
        for needs_input in [(True, True), (False, True), (True, False)]:
            needs_input = (False,) * offset + needs_input
            args, needs = put_back(plan, (feats, points), needs_input)
            assert args[0] is feats and args[1] is points and needs == list(needs_input[offset:])
            want = (None,) * offset + tuple(g if n else None for g, n in zip(("g_feats", "g_points"), needs))
            assert to_slots(plan, needs, ["g_feats", "g_points"], needs_input) == want
        assert put_back(plan, (feats, points), ()) == ([feats, points], [])


def test_the_host_ladder_runs_every_row_and_leaves_the_checks_in_place():
    """benchmarks/host_ladder.py (where the per-call cost goes): each row is one forward + backward, and its
    diagnostic row without the hub's checks puts them back."""
    import importlib.util
    from pathlib import Path

    from kernelhub import hub as hub_module

    path = Path(__file__).parent.parent / "benchmarks" / "host_ladder.py"
    spec = importlib.util.spec_from_file_location("host_ladder", path)
    ladder = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(ladder)
    checks = hub_module._check_output, hub_module._check_grads
    fns, backend = ladder.rows("trilinear_interp", (torch.randn(4, 8, 2), torch.rand(4, 3) * 2 - 1))
    assert set(fns) == {"min", "min, raw apply", "glue", "glue + checks", "hub", "hub, no checks"}
    results = {label: f() for label, f in fns.items()}
    for grads in results.values():
        for g, ref in zip(grads, results["min"], strict=True):
            torch.testing.assert_close(g, ref, rtol=0, atol=0)
    assert (hub_module._check_output, hub_module._check_grads) == checks


@pytest.mark.parametrize("failing", ["", "backward", "forward"])
def test_an_impl_that_saves_gets_its_saved_tensor_back_in_its_backward_only(failing, tv_backend_hub):
    """An impl declared `saves` is called with ``saving=True`` where its backward follows (the fast path, an input
    requiring grad; a weighted handle weighing its output in torch ops too) and gets what it saved in that backward,
    each call its own; without grad, and through the operators, it is called plainly. Where its backward raises, the
    next impl serves the backward without the saved tensor; where its saving forward returns a wrong output,
    nothing is kept and the next impl serves both. The same values and gradients every way."""
    import warnings

    ref = kernelhub.get_hub().registry.impls("tv_loss_l1_3d")["torch_ref"]
    calls = []

    def forward(v, saving=False):
        calls.append(("forward", saving))
        out = ref.forward(v)
        if failing == "forward":
            out = out[:2]  # a wrong shape
        return (out, v.sum().reshape(1)) if saving else out  # what a backward could reuse: tied to this call

    def backward(g, v, needs, saved=None):
        calls.append(("backward", None if saved is None else saved.item()))
        if failing == "backward":
            raise RuntimeError("no kernel for this call")
        if saved is not None:
            assert saved.item() == v.sum().item()
        return ref.backward(g, v, needs=needs)

    hub = tv_backend_hub("saver", forward, backward, saves=True)
    gen = torch.Generator().manual_seed(5)
    w = torch.tensor([0.5, -1.0, 2.0], dtype=torch.float64)
    first = True
    for weights in (None, w):
        handle = hub.handle("tv_loss_l1_3d")
        handle = handle if weights is None else handle.weighted(weights)
        for _ in range(2):  # the second call from the memo
            v = torch.randn(3, 4, 5, dtype=torch.float64, generator=gen)
            upstream = torch.rand((3,) if weights is None else (), dtype=torch.float64, generator=gen)
            ref_x = v.clone().requires_grad_()
            want = tv.tv_loss_l1_3d(ref_x) if weights is None else (tv.tv_loss_l1_3d(ref_x) * weights).sum()
            want_grad = torch.autograd.grad(want, ref_x, upstream)[0]
            calls.clear()
            x = v.clone().requires_grad_()
            with warnings.catch_warnings(record=True):
                warnings.simplefilter("always")
                got = handle(x)
                grad = torch.autograd.grad(got, x, upstream)[0]
            torch.testing.assert_close(got, want.detach(), rtol=1e-12, atol=1e-12)
            torch.testing.assert_close(grad, want_grad, rtol=1e-12, atol=1e-12)
            if not failing:
                assert calls == [("forward", True), ("backward", v.sum().item())]
            elif first:  # then set aside for this call's key
                assert calls == [("forward", True)] + ([("backward", v.sum().item())] if failing == "backward" else [])
            else:
                assert calls == []
            first = False
    if not failing:
        v = torch.randn(3, 4, 5, dtype=torch.float64, generator=gen)
        calls.clear()
        hub.handle("tv_loss_l1_3d")(v)  # no grad: no saving
        x = v.clone().requires_grad_()
        out = torch.ops.kernelhub.tv_loss_l1_3d.default(x, "", hub.key)  # the operators: plain calls
        torch.autograd.grad(out.sum(), x)
        assert calls == [("forward", False), ("forward", False), ("backward", None)]


@pytest.mark.parametrize("fast", [True, False])
@pytest.mark.parametrize("case", ["tv_loss_sq_3d", "trilinear_interp", "semiconv", "weighted"])
def test_a_second_order_term_through_the_upstream_gradient_raises_never_vanishes(case, fast, monkeypatch):
    """``grad(c * op(x), x, create_graph=True)`` depends on c through the upstream gradient; differentiating it
    with respect to c must not give None (allow_unused) or zero: the op's double-backward error, on both paths."""
    monkeypatch.setattr(_state, "EAGER_FAST_PATH", fast)
    c = torch.tensor(0.5, requires_grad=True)
    if case == "weighted":
        x = torch.randn(2, 4, 5, 6, requires_grad=True)
        w = torch.tensor([1.0, 2.0, 3.0], requires_grad=True)
        out = kernelhub.op("tv_loss_l1_3d").weighted(w)(x)
        inputs = (c, w)
    else:
        from kernelhub import testing
        args = testing.with_grad(case, testing.samples(case, "small", torch.float64)[0].args)
        x = testing.leaves(case, args)[0]
        out = kernelhub.op(case)(*args)
        inputs = (c,)
    (g,) = torch.autograd.grad((c * out).sum(), x, create_graph=True)
    op = "tv_loss_l1_3d" if case == "weighted" else case
    with pytest.raises(RuntimeError, match=f"double backward is not supported by kernelhub.{op}"):
        torch.autograd.grad(g.pow(2).sum(), inputs, allow_unused=True)



@pytest.mark.parametrize("backend", ["torch_ref", "cuda_ext"])
def test_weights_changed_in_place_after_the_forward_raise_at_the_backward(backend):
    if kernelhub.get_hub().registry.unavailable_reason(backend):
        pytest.skip(f"{backend} is unavailable")
    v = torch.randn(2, 4, 5, 6, requires_grad=True)
    w = torch.tensor([1.0, 2.0, 3.0])
    loss = kernelhub.op("tv_loss_l1_3d", backend=backend).weighted(w)(v)
    w.mul_(10)
    with pytest.raises(RuntimeError, match="tv_loss_l1_3d: argument 'weights' was modified in place"):
        loss.backward()



@pytest.mark.parametrize("op", ["kplanes_interp_tilted", "tv_loss_sq_3d", "trilinear_interp", "semiconv"])
@pytest.mark.parametrize("kill", [True, False])
def test_autocast_does_not_change_an_ops_precision(op, kill, monkeypatch):
    """Under ``torch.autocast`` an op computes in its inputs' dtype, as outside it, on every backend (the reference
    included): docs/ops.md, "Autocast"."""
    from kernelhub import testing
    if kill:
        monkeypatch.setenv("KERNELHUB_KILL_SWITCH", "1")
        kernelhub.reload()
    args = testing.samples(op, "small", torch.float32)[0].args
    want = kernelhub.op(op)(*args)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        got = kernelhub.op(op)(*args)
    assert got.dtype == want.dtype
    torch.testing.assert_close(got, want, rtol=1e-6, atol=1e-6)



@pytest.mark.parametrize("value, off", [("0", True), ("false", True), ("off", True), ("no", True), ("1", False),
                                        ("true", False), ("on", False)])
def test_the_fast_path_switch_reads_the_usual_spellings(value, off):
    code = "import kernelhub._state as s; print(s.EAGER_FAST_PATH)"
    out = harness.run([sys.executable, "-c", code], timeout=120,
                         env=dict(os.environ, KERNELHUB_EAGER_FAST_PATH=value)).stdout.strip()
    assert out == str(not off)



def test_an_unknown_fast_path_spelling_is_an_error_naming_the_variable():
    """Where a hub is built (the import itself succeeds, so the command line can report it: test_config.py)."""
    code = "import kernelhub\ntry:\n    kernelhub.get_hub()\nexcept kernelhub.ConfigError as e:\n    print(e)"
    proc = harness.run([sys.executable, "-c", code], timeout=120,
                       env=dict(os.environ, KERNELHUB_EAGER_FAST_PATH="maybe"))
    assert proc.returncode == 0 and "KERNELHUB_EAGER_FAST_PATH='maybe'" in proc.stdout, proc.stderr
