"""What a model calling kernelhub does with the PyTorch 2 toolchain: several ops and modules in one
``torch.compile(fullgraph=True)`` step, first called in a fresh process; ``torch.export`` with a save/load round
trip; the hub's promises (fallback, kill switch, forced backends, pins) inside compiled code; and, on CUDA,
``mode="reduce-overhead"`` training loops and calls that keep no tensor past their end (docs/user-guide.md,
"torch.compile, torch.export, CUDA graphs")."""

import difflib
import importlib
import json
import os
import sys
import textwrap
import warnings

import harness
import pytest
import torch

import kernelhub
from kernelhub import cli, testing
from kernelhub import nn as khnn
from kernelhub.select import GENERATION

CUDA = torch.cuda.is_available()
needs_cuda = harness.on_cuda("needs CUDA")

# One step calling every op (so every pair of ops shares a graph), in the registry's order and reversed (on CUDA the
# first order only), compiled whole in a fresh process: its first kernelhub call is the compiled one. Prints what it
# saw as JSON.
ALL_OPS = textwrap.dedent('''
    import json, sys, warnings
    import torch, kernelhub
    from kernelhub import testing

    backend, device, compiler, orders = sys.argv[1] or None, sys.argv[2], sys.argv[3], int(sys.argv[4])
    torch.manual_seed(0)
    names = kernelhub.op_names()
    handles = [kernelhub.op(n, backend=backend) for n in names]  # builds the hub; no op runs before the step
    args = [testing.with_grad(n, testing.samples(n, "small", torch.float32, device)[0].args) for n in names]
    leaves = [t for n, a in zip(names, args) for t in testing.leaves(n, a)]

    def make(order):
        def step(args):
            total = 0.0
            for k in order:
                out = handles[k](*args[k])
                total = total + (out.real if out.is_complex() else out).square().mean()
            return total
        return step

    # a compiled graph may run another impl than the eager call (one traced into it, docs/user-guide.md): each
    # within its op's float32 tolerance of the float64 reference, so within twice that of each other (a
    # gradient: the op's backward of an upstream gradient that is itself within the forward's)
    hub = kernelhub.get_hub()
    tol = {n: hub.registry.spec(n).tolerances[torch.float32] for n in names}
    owner = [n for n, a in zip(names, args) for _ in testing.leaves(n, a)]
    report = {"graph_breaks": [], "graphs": [], "mismatches": []}
    steps = [make(order) for order in (list(range(len(names))), list(reversed(range(len(names)))))[:orders]]
    for step in steps:
        got = torch.compile(step, fullgraph=True, backend=compiler)(args)
        got_g = torch.autograd.grad(got, leaves)
        want = step(args)
        want_g = torch.autograd.grad(want, leaves)
        checks = [("value", got, want, 2 * max(t.forward for t in tol.values()))] + [
            (f"grad {i} ({owner[i]})", g, w, 2 * (tol[owner[i]].forward + tol[owner[i]].backward))
            for i, (g, w) in enumerate(zip(got_g, want_g))]
        for what, g, w, bound in checks:
            error = (g - w).abs().max().item() / max(w.abs().max().item(), 1e-30)
            if not error <= bound:
                report["mismatches"].append(f"{what}: relative error {error:.3g} over {bound:.3g}")
    for step in steps:  # last: explain resets dynamo, after which every compiled function compiles again (with the
        # inductor backend forced on CUDA, its 18 passes of seconds each, once more for each order: the test ran
        # past its deadline)
        explained = torch._dynamo.explain(step)(args)
        report["graph_breaks"].append(explained.graph_break_count)
        report["graphs"].append(explained.graph_count)
    report["chosen"] = {n: kernelhub.explain(n, *a).chosen for n, a in zip(names, args)} if backend is None else {}
    print(json.dumps(report))
''')


def _run_all_ops(backend, device, compiler, seed_cuda_ext_cache, tmp_path, orders=2, timeout=900):
    if backend:
        reason = kernelhub.get_hub().registry.unavailable_reason(backend)
        if reason:
            pytest.skip(f"{backend} is unavailable: {reason}")
    env = dict(os.environ, XDG_CACHE_HOME=str(tmp_path / "cache"), TORCHINDUCTOR_CACHE_DIR=str(tmp_path / "inductor"))
    seed_cuda_ext_cache(tmp_path / "cache")
    proc = harness.run([sys.executable, "-c", ALL_OPS, backend or "", device, compiler, str(orders)], timeout=timeout,
                       env=env, cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr[-4000:]
    report = json.loads(proc.stdout.strip().splitlines()[-1])
    assert report["mismatches"] == []
    assert report["graph_breaks"] == [0] * orders and report["graphs"] == [1] * orders
    return report


@pytest.mark.parametrize("backend, compiler", [
    (None, "aot_eager"), (None, "inductor"), ("torch_ref", "aot_eager"), ("cuda_ext", "aot_eager"),
    pytest.param("inductor", "aot_eager", marks=pytest.mark.full("compiles each op's reference forward and "
                                                                 "backward with inductor on the CPU")),
    pytest.param("triton", "aot_eager", marks=[
        pytest.mark.full("Triton's interpreter, every op"),
        pytest.mark.skipif(os.environ.get("TRITON_INTERPRET") != "1", reason="triton serves CPU tensors only "
                           "under its interpreter (TRITON_INTERPRET=1, set where there is no GPU)")])])
def test_every_op_in_one_compiled_step_first_in_a_fresh_process(backend, compiler, seed_cuda_ext_cache, tmp_path):
    """The nine ops in one compiled step, in two orders: one graph, no break, eager's value and every gradient.
    It once raised a KeyError inside dynamo at the second op (the traced path chose a backend while tracing)."""
    report = _run_all_ops(backend, "cpu", compiler, seed_cuda_ext_cache, tmp_path)
    if backend is None:
        assert set(report["chosen"]) == set(kernelhub.op_names())


# The two longest (minutes on a loaded GPU host) first: the CUDA tier's shards deal its fresh-process tests out in
# turn (tests/conftest.py), so that these two land on different GPUs.
@needs_cuda
@pytest.mark.parametrize("backend, compiler", [(None, "inductor"), ("inductor", "aot_eager"),
                                               ("torch_ref", "inductor"), ("cuda_ext", "inductor"),
                                               ("triton", "inductor")])
def test_every_op_in_one_compiled_step_first_in_a_fresh_process_on_cuda(backend, compiler, seed_cuda_ext_cache,
                                                                        tmp_path):
    """One order on CUDA: whether a pair of ops shares a graph does not depend on the device, and the CPU cases
    above check both; each order costs CUDA a compile of the whole step (over a minute on a loaded host)."""
    _run_all_ops(backend, "cuda", compiler, seed_cuda_ext_cache, tmp_path, orders=1)


def _modules(device):
    """The examples' kinds of step, built from kernelhub.nn: K-Planes tomography with a TV regulariser, a
    morphology net (semiconv, closing), TV on a ptychography-like complex-free volume, a phase step (Tikhonov)."""
    torch.manual_seed(0)
    field = khnn.KPlanesField(2, 8, (16,)).to(device)
    decoder = torch.nn.Linear(field.features, 1).to(device)
    tv = khnn.TVLoss3d("l1", (1.0, 0.5, 0.5))
    tv_iso = khnn.TVLoss3d("iso")
    conv = khnn.SemiConv(khnn.QuadraticKernelIso2D(1, 4, 3), "tropical_max", padding=1, groups=4).to(device)
    close = khnn.Closing(khnn.QuadraticKernelIso2D(1, 4, 3), padding=1, groups=4).to(device)
    volume = torch.randn(1, 6, 7, 8, device=device, requires_grad=True)
    image = torch.randn(2, 4, 12, 12, device=device)
    pts = torch.rand(64, 3, device=device) * 2 - 1
    spectra = torch.randn(3, 2, 5, device=device, dtype=torch.complex64)
    tikhonov = kernelhub.op("tikhonov_inverse_2xn")
    params = [volume, *field.parameters(), *decoder.parameters(), *conv.parameters(), *close.parameters()]

    def step(volume, image, pts, spectra):
        density = torch.nn.functional.softplus(decoder(field(pts, tv_taps=0.05))[..., 0])  # [4, B]
        loss = density[0].square().mean() + (density[1:] - density[:1]).abs().mean()
        loss = loss + tv(volume) + 0.1 * tv_iso(volume)
        loss = loss + close(conv(image)).square().mean()
        return loss + tikhonov(spectra, 0.3).abs().square().mean() * volume.mean()
    return step, (volume, image, pts, spectra), params


def test_the_examples_kinds_of_step_compile_whole_and_agree_with_eager():
    """K-Planes field + decoder + TV, semiconv + closing, TV iso, Tikhonov, all in one compiled step: one graph, no
    break; eager's value and the gradient of every parameter and of the volume."""
    step, inputs, params = _modules("cpu")
    want = step(*inputs)
    want_g = torch.autograd.grad(want, params)
    torch._dynamo.reset()
    got = torch.compile(step, fullgraph=True, backend="aot_eager")(*inputs)
    got_g = torch.autograd.grad(got, params)
    torch.testing.assert_close(got, want)
    for g, w in zip(got_g, want_g, strict=True):
        torch.testing.assert_close(g, w)
    explained = torch._dynamo.explain(step)(*inputs)
    assert explained.graph_break_count == 0 and explained.graph_count == 1


# The hub's promises, inside compiled code. With nothing traced ([compile] priority = []), the graph holds the
# operator, and the operator selects when it runs.


def _compiled_tv(backend=None):
    op = kernelhub.op("tv_loss_l1_3d", backend=backend)
    torch._dynamo.reset()
    return torch.compile(lambda v: (op(v) * torch.tensor([1.0, 2.0, 3.0])).sum(), fullgraph=True,
                         backend="aot_eager")


NOTHING_TRACED = '\n[compile]\npriority = []'  # compiled graphs hold the operators, which select when they run


def test_compiled_code_follows_the_kill_switch_pins_and_forced_backends(plugin, tmp_path, monkeypatch):
    monkeypatch.setenv("KERNELHUB_DISABLE", "cuda_ext")
    mod = plugin("fast")  # counts its calls
    harness.write_config(tmp_path, 'priority = ["fast"]' + NOTHING_TRACED)
    calls = importlib.import_module(mod).CALLS
    v = torch.randn(3, 4, 5, requires_grad=True)
    want = (kernelhub.op("tv_loss_l1_3d", backend="torch_ref")(v) * torch.tensor([1.0, 2.0, 3.0])).sum()
    step = _compiled_tv()
    out = step(v)
    out.backward()
    assert calls == {"forward": 1, "backward": 1}  # the priority's first, forward and backward
    assert kernelhub.explain("tv_loss_l1_3d", v).chosen == "fast"
    torch.testing.assert_close(out, want)

    # the same compiled function
    harness.write_config(tmp_path, 'priority = ["fast"]\nkill_switch = true' + NOTHING_TRACED)
    torch.testing.assert_close(step(v), want)
    assert calls["forward"] == 1

    harness.write_config(tmp_path,
                         'priority = ["torch_ref", "fast"]' + NOTHING_TRACED + '\n[ops.tv_loss_l1_3d]\npin = "fast"')
    step(v)
    assert calls["forward"] == 2
    harness.write_config(tmp_path, 'priority = ["torch_ref", "fast"]' + NOTHING_TRACED)
    step(v)
    assert calls["forward"] == 2
    _compiled_tv("fast")(v).backward()  # a forced backend
    assert calls == {"forward": 3, "backward": 2}
    with pytest.raises(kernelhub.NoImplementationError, match="forced backend 'fast' cannot serve"):
        _compiled_tv("fast")(v.double())


def test_compiled_code_falls_back_past_a_backend_that_raises(plugin, tmp_path):
    plugin("flaky")
    harness.write_config(tmp_path, 'priority = ["flaky", "torch_ref"]' + NOTHING_TRACED)
    v = torch.randn(3, 4, 5, requires_grad=True)
    step = _compiled_tv()
    with pytest.warns(RuntimeWarning, match="'flaky' raised RuntimeError: kernel exploded"):
        out = step(v)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        out.backward()
    want = (kernelhub.op("tv_loss_l1_3d", backend="torch_ref")(v) * torch.tensor([1.0, 2.0, 3.0])).sum()
    torch.testing.assert_close(out, want)
    assert "raised at call time" in str(kernelhub.explain("tv_loss_l1_3d", v))


# Traced into the graph ([compile] priority, docs/user-guide.md): AOTAutograd's graphs hold the impl's own ops.

UNTRACEABLE = '''
import torch
from kernelhub import hookimpl
from kernelhub.spec import Backend, Impl
from kernelhub_torch_ref import plugin, tv

def forward(volume):
    if {wrong!r}:
        return tv.tv_loss_l1_3d(volume).sum()  # a 0-d output: the spec says [3]
    volume.data_ptr()  # what a graph's functional tensors refuse
    return tv.tv_loss_l1_3d(volume)

backward = plugin.vjp_backward(tv.tv_loss_l1_3d, (0,))

@hookimpl
def kernelhub_register_impls(registry):
    registry.add_backend(Backend("pointer", "0.1"))
    registry.add_impl(Impl(op="tv_loss_l1_3d", backend="pointer", forward=forward, backward=backward,
                           dtypes=(torch.float32,), traceable=True))
'''


def _aot_graphs(fn, *args):
    """``fn`` compiled whole (aot_eager's graphs, recorded): the value, and the targets of AOTAutograd's forward
    and backward graphs (run by a backward of the value's sum)."""
    from functorch.compile import make_boxed_func
    from torch._dynamo.backends.common import aot_autograd

    targets = set()

    def record(gm, example_inputs):
        targets.update(n.target for n in gm.graph.nodes)
        return make_boxed_func(gm.forward)
    out = torch.compile(fn, fullgraph=True, backend=aot_autograd(fw_compiler=record, bw_compiler=record))(*args)
    out.sum().backward()
    return out, targets


def _kernelhub_nodes(targets):
    return sorted(str(t) for t in targets if str(t).startswith("kernelhub."))


def test_a_compiled_graph_holds_the_traced_impl_and_recompiles_when_the_hub_changes(plugin, tmp_path):
    """The shipped [compile] priority on the CPU traces inductor's impl (torch_ref's code): AOTAutograd's graphs
    hold no kernelhub operator, and value and gradient are the reference's. A new config (the kill switch) makes
    the same compiled function recompile (dynamo guards on the hub's generation) and hold the operators; a pinned
    backend whose impl is not traceable is called by the operator at run time."""
    v = torch.randn(2, 5, 6, 7, requires_grad=True)
    w = torch.tensor([1.0, 2.0, 3.0])
    op = kernelhub.op("tv_loss_l1_3d")
    reason = kernelhub.get_hub().registry.impls("tv_loss_l1_3d")["inductor"].not_supported_reasons((v,))
    if reason:
        pytest.skip(f"inductor cannot serve the call here: {reason}")
    assert kernelhub.get_hub().selector.traced("tv_loss_l1_3d", (v,)).backend == "inductor"
    explained = cli.cmd_explain(cli.build_parser().parse_args(["explain", "tv_loss_l1_3d", "--shape", "2,5,6,7"]))
    assert explained["compiled"] == \
        "traced into the graph: inductor"
    torch._dynamo.reset()
    out, targets = _aot_graphs(lambda x: op(x) * w, v)
    assert _kernelhub_nodes(targets) == []
    want = kernelhub.op("tv_loss_l1_3d", backend="torch_ref")(v) * w
    torch.testing.assert_close(out, want)
    got_grad, v.grad = v.grad, None
    want.sum().backward()
    torch.testing.assert_close(got_grad, v.grad)

    tag, token = torch.compiler.config.cache_key_tag, GENERATION.token
    kernelhub.reload()  # the same config and plugins: nothing to recompile
    assert (torch.compiler.config.cache_key_tag, GENERATION.token) == (tag, token)
    harness.write_config(tmp_path, "kill_switch = true")
    assert GENERATION.token != token
    assert torch.compiler.config.cache_key_tag != tag  # graphs cached on disk are the new config's own
    assert kernelhub.get_hub().selector.traced("tv_loss_l1_3d", (v,)) is None
    out, targets = _aot_graphs(lambda x: op(x) * w, v)  # no reset: a recompile
    assert _kernelhub_nodes(targets) == ["kernelhub.tv_loss_l1_3d.default", "kernelhub.tv_loss_l1_3d_backward.default"]
    torch.testing.assert_close(out, want)

    mod = plugin("fast")
    harness.write_config(tmp_path, '[ops.tv_loss_l1_3d]\npin = "fast"')
    v3 = torch.randn(5, 6, 7, requires_grad=True)
    out, targets = _aot_graphs(lambda x: op(x) * w, v3)
    assert _kernelhub_nodes(targets) == ["kernelhub.tv_loss_l1_3d.default", "kernelhub.tv_loss_l1_3d_backward.default"]
    assert importlib.import_module(mod).CALLS == {"forward": 1, "backward": 1}


def _generated_code(fn, *args):
    """The code inductor generates for ``fn`` compiled whole, forward and backward (a backward of its value), with
    comments, paths and hashes taken out."""
    import re

    from torch._inductor.utils import run_and_get_code

    torch._dynamo.reset()
    compiled = torch.compile(fn, fullgraph=True)
    leaves = [a for a in args if a.requires_grad]
    codes = run_and_get_code(lambda: torch.autograd.grad(compiled(*args), leaves))[1]
    return [re.sub(r"#.*|/tmp\S*|'[0-9a-z]{20,}'", "", c) for c in codes]


def _tv_call(device):
    return (torch.randn(2, 9, 10, 11, device=device, requires_grad=True),)


def _trilinear_call(device):
    return torch.randn(37, 8, 5, device=device, requires_grad=True), torch.rand(37, 3, device=device) * 2 - 1


@pytest.mark.parametrize("op, make, device", [
    ("tv_loss_l1_3d", _tv_call, "cpu"), ("trilinear_interp", _trilinear_call, "cpu"),
    harness.cuda_param("tv_loss_l1_3d", _tv_call, "cuda", marks=[harness.needs_gpu("needs CUDA")])])
def test_a_graph_tracing_inductor_is_the_compiled_reference_s_own_code(op, make, device):
    """Where a compiled graph traces inductor's impl (the shipped [compile] priority for these calls), inductor
    generates the very code it generates for a step calling the reference itself, forward and backward: the
    compiled hub costs what the compiled reference costs (dynamo's guards on the handle aside). Not every call
    does: K-Planes' graph copies the points' gradient into the contiguous layout the backward operator declares,
    and trilinear's on CUDA differs too (docs/user-guide.md)."""
    from kernelhub_torch_ref.plugin import DIFFERENTIATE, FORWARDS

    args = make(device)
    traced = kernelhub.get_hub().selector.traced(op, args)
    if traced is None or traced.backend != "inductor":
        pytest.skip(f"the graph traces {traced and traced.backend} here, not inductor")
    w = torch.randn(kernelhub.op(op)(*args).shape, device=device)
    ref, hub = DIFFERENTIATE.get(op, FORWARDS[op]), kernelhub.op(op)
    want = _generated_code(lambda *a: (ref(*a) * w).sum(), *args)
    got = _generated_code(lambda *a: (hub(*a) * w).sum(), *args)
    assert len(got) == len(want) == 2
    for g, w in zip(got, want):
        assert g == w, "\n".join(list(difflib.unified_diff(w.splitlines(), g.splitlines(), lineterm=""))[:60])


def test_a_backend_marked_failed_recompiles_only_the_graphs_that_traced_it():
    """A backend that raised for a call (eagerly, or in the operator) changes the generation dynamo guards on only
    where it was the traced choice for that call: those graphs retrace, with another impl."""
    selector = kernelhub.get_hub().selector
    v = torch.randn(2, 5, 6, 7)
    traced = selector.traced("tv_loss_l1_3d", (v,))
    token = GENERATION.token
    selector.mark_failed("tv_loss_l1_3d", (v,), "", "torch_ref", RuntimeError("not traced"))
    assert GENERATION.token == token
    if traced is None:
        pytest.skip("no impl is traced for this call here")
    selector.mark_failed("tv_loss_l1_3d", (v,), "", traced.backend, RuntimeError("traced"))
    assert GENERATION.token != token
    assert selector.traced("tv_loss_l1_3d", (v,)) is not traced


@pytest.mark.parametrize("wrong, says", [(False, "RuntimeError"), (True, "WrongOutputError.*the spec says")])
def test_an_impl_that_cannot_be_traced_leaves_the_operator_in_the_graph(install, tmp_path, wrong, says):
    """A traceable impl whose forward raises on the graph's tensors, or gives an output of the wrong shape: one
    warning naming it, the graph holds the operator (forward and backward), and the value and gradient are right
    (the operator runs the impl eagerly, or falls back past its wrong output)."""
    install("pointer", UNTRACEABLE, wrong=wrong)
    harness.write_config(tmp_path, 'priority = ["pointer", "torch_ref"]\n[compile]\npriority = ["pointer"]')
    v = torch.randn(2, 5, 6, 7, requires_grad=True)
    op = kernelhub.op("tv_loss_l1_3d")
    torch._dynamo.reset()
    with pytest.warns(RuntimeWarning, match=f"tracing backend 'pointer' into a torch.compile graph raised {says}"):
        out, targets = _aot_graphs(lambda x: op(x) * 2, v)
    assert "kernelhub.tv_loss_l1_3d.default" in _kernelhub_nodes(targets)
    want = kernelhub.op("tv_loss_l1_3d", backend="torch_ref")(v) * 2
    torch.testing.assert_close(out, want)
    got_grad, v.grad = v.grad, None
    want.sum().backward()
    torch.testing.assert_close(got_grad, v.grad)


# torch.export: the op is one node, named kernelhub.<op>; the exported program runs the hub's choice.
class OneOp(torch.nn.Module):
    def forward(self, v):
        return kernelhub.op("tv_loss_l1_3d")(v).sum()


class SeveralOps(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.field = khnn.KPlanesField(2, 4, (8,))
        self.tv = khnn.TVLoss3d("sq")
        self.conv = khnn.SemiConv(khnn.QuadraticKernelIso2D(1, 4, 3), "tropical_max", padding=1, groups=4)

    def forward(self, v, pts, image):
        return self.tv(v) + self.field(pts).square().mean() + self.conv(image).mean() + \
            kernelhub.op("trilinear_interp")(v.reshape(-1)[:120].reshape(5, 8, 3), pts[:5].abs()).sum()


def _export_inputs(model):
    torch.manual_seed(1)
    if isinstance(model, OneOp):
        return (torch.randn(2, 8, 9, 10),)
    return torch.randn(1, 6, 7, 8), torch.rand(32, 3) * 2 - 1, torch.randn(2, 4, 10, 10)


@pytest.mark.parametrize("model_type", [OneOp, SeveralOps])
def test_export_holds_each_op_as_one_named_node_and_round_trips(model_type, tmp_path, seed_cuda_ext_cache):
    torch.manual_seed(0)
    model = model_type()
    inputs = _export_inputs(model)
    ep = torch.export.export(model, inputs)
    ops = sorted({str(n.target) for n in ep.graph.nodes if str(n.target).startswith("kernelhub.")})
    want_ops = ["kernelhub.tv_loss_l1_3d.default"] if model_type is OneOp else \
        ["kernelhub.kplanes_interp_tilted_ms.default", "kernelhub.semiconv.default",
         "kernelhub.trilinear_interp.default", "kernelhub.tv_loss_sq_3d.default"]
    assert ops == want_ops
    want = model(*inputs)
    torch.testing.assert_close(ep.module()(*inputs), want)
    path = tmp_path / "model.pt2"
    torch.export.save(ep, path)
    torch.save((inputs, want), tmp_path / "io.pt")
    # loaded in a fresh process: the hub defines the operators, then the program loads and runs
    code = textwrap.dedent(f'''
        import torch, kernelhub
        kernelhub.get_hub()
        ep = torch.export.load({str(path)!r})
        inputs, want = torch.load({str(tmp_path / "io.pt")!r})
        torch.testing.assert_close(ep.module()(*inputs), want)
        print("ok")
    ''')
    seed_cuda_ext_cache(tmp_path / "cache")
    proc = harness.run([sys.executable, "-c", code], timeout=600,
                          env=dict(os.environ, XDG_CACHE_HOME=str(tmp_path / "cache")), cwd=tmp_path)
    assert proc.returncode == 0 and proc.stdout.strip() == "ok", proc.stderr[-3000:]


def test_an_exported_program_without_the_hub_says_what_to_do(tmp_path):
    """Loading an exported program whose ops kernelhub has not defined in this process: torch's error names
    the operator (docs/user-guide.md says to call kernelhub.get_hub() first)."""
    ep = torch.export.export(OneOp(), _export_inputs(OneOp()))
    path = tmp_path / "model.pt2"
    torch.export.save(ep, path)
    code = f"import torch\ntorch.export.load({str(path)!r})\n"
    proc = harness.run([sys.executable, "-c", code], timeout=300)
    assert proc.returncode != 0 and "tv_loss_l1_3d" in proc.stderr


# CUDA graphs


def _pin_every_op(directory, backend):
    """A kernelhub.toml in ``directory`` (a test's working directory) pinning every op to ``backend`` (None: none)."""
    if backend:
        (directory / "kernelhub.toml").write_text("".join(f'[ops.{op}]\npin = "{backend}"\n'
                                                          for op in kernelhub.op_names()))


def _adam_losses(step, inputs, params, compile_mode, steps=6):
    opt = torch.optim.Adam(params, lr=1e-2)
    fn = step if compile_mode is None else torch.compile(step, mode=compile_mode)
    losses = []
    for _ in range(steps):
        opt.zero_grad(set_to_none=True)
        loss = fn(*inputs)
        loss.backward()
        opt.step()
        losses.append(loss.item())
    return losses


@needs_cuda
@pytest.mark.parametrize("backend", [None, "cuda_ext", "triton", "torch_ref"])
def test_reduce_overhead_training_matches_eager_in_a_fresh_process(backend, seed_cuda_ext_cache, tmp_path):
    """A 6-step Adam loop of the examples' kinds of step under ``mode="reduce-overhead"`` (CUDA graphs), first
    in a fresh process, and a TV-only loop: the losses eager gives. A buffer a call kept past its end once made
    cudagraph trees fail ("tensors in the cudagraph pool not tracked as outputs")."""
    code = textwrap.dedent(f'''
        import torch, kernelhub, sys
        sys.path.insert(0, {os.path.dirname(__file__)!r})
        from test_toolchain import _modules, _adam_losses
        losses = {{}}
        for mode in ("reduce-overhead", None):
            step, inputs, params = _modules("cuda")
            losses[mode] = _adam_losses(step, inputs, params, mode)
        print(losses)
        torch.testing.assert_close(torch.tensor(losses["reduce-overhead"]), torch.tensor(losses[None]),
                                   rtol=1e-4, atol=1e-5)
        v = torch.randn(4, 64, 64, 64, device="cuda", requires_grad=True)
        v2 = v.detach().clone().requires_grad_()  # before Adam moves v
        tv = kernelhub.op("tv_loss_l1_3d")
        got = _adam_losses(lambda x: tv(x).sum(), (v,), [v], "reduce-overhead")
        want = _adam_losses(lambda x: tv(x).sum(), (v2,), [v2], None)
        torch.testing.assert_close(torch.tensor(got), torch.tensor(want), rtol=1e-5, atol=1e-3)
        print("ok")
    ''')
    _pin_every_op(tmp_path, backend)  # the modules' handles too
    seed_cuda_ext_cache(tmp_path / "cache")
    proc = harness.run([sys.executable, "-c", code], timeout=900, cwd=tmp_path,
                          env=dict(os.environ, XDG_CACHE_HOME=str(tmp_path / "cache"),
                                   TORCHINDUCTOR_CACHE_DIR=str(tmp_path / "inductor")))
    assert proc.returncode == 0 and proc.stdout.strip().endswith("ok"), (proc.stdout[-2000:], proc.stderr[-4000:])


@needs_cuda
def test_no_call_keeps_a_tensor_past_its_end(seed_cuda_ext_cache, tmp_path):
    """Every op x kernel backend on CUDA, forward and backward through the operators and on the eager fast path,
    each backend's first call of the op and dtype in a fresh process: once the outputs and gradients are dropped,
    the allocator holds what it held before (a scratch buffer kept between calls is what broke CUDA graphs). The
    reference runs each call first, so torch's own lazily made workspaces (cuBLAS's) are there before."""
    code = textwrap.dedent('''
        import gc, torch, kernelhub
        from kernelhub import _state, testing
        hub = kernelhub.get_hub()

        def call(name, backend, dtype):
            args = testing.with_grad(name, testing.samples(name, "small", dtype, "cuda")[0].args)
            gc.collect()  # what earlier calls left to the collector is freed before, not during, this one
            torch.cuda.synchronize()
            before = torch.cuda.memory_allocated()
            out = kernelhub.op(name, backend=backend)(*args)
            grads = torch.autograd.grad(out, testing.leaves(name, args), testing.upstream_grad(out))
            del out, grads, args
            torch.cuda.synchronize()
            return torch.cuda.memory_allocated() - before

        leaks, calls = [], 0
        for fast in (False, True):
            _state.EAGER_FAST_PATH = fast
            for name in kernelhub.op_names():
                for dtype in (torch.float32, torch.float64):
                    if dtype not in hub.registry.spec(name).dtypes:
                        continue
                    call(name, "torch_ref", dtype)
                    for backend in hub.registry.impls(name):
                        if backend == "inductor" or hub.registry.unavailable_reason(backend):
                            continue
                        calls += 1
                        kept = call(name, backend, dtype)
                        if kept > 0:
                            leaks.append((fast, name, backend, str(dtype), kept))
        print("leaks:", leaks)
        assert calls >= 9 * 2 * 2 * 2, calls
        print("ok" if not leaks else "leaked")
    ''')
    seed_cuda_ext_cache(tmp_path / "cache")
    proc = harness.run([sys.executable, "-c", code], timeout=900, cwd=tmp_path,
                          env=dict(os.environ, XDG_CACHE_HOME=str(tmp_path / "cache")))
    assert proc.returncode == 0 and proc.stdout.strip().endswith("ok"), (proc.stdout[-3000:], proc.stderr[-3000:])


@needs_cuda
@pytest.mark.parametrize("backend", ["cuda_ext", "triton"])
def test_export_on_cuda_runs_the_pinned_backend(backend, tmp_path):
    if kernelhub.get_hub().registry.unavailable_reason(backend):
        pytest.skip(f"{backend} is unavailable")
    _pin_every_op(tmp_path, backend)
    kernelhub.reload()
    model = SeveralOps().cuda()
    inputs = tuple(t.cuda() for t in _export_inputs(model))
    ep = torch.export.export(model, inputs)
    torch.testing.assert_close(ep.module()(*inputs), model(*inputs))
    assert kernelhub.explain("tv_loss_sq_3d", inputs[0]).chosen == backend


AOTI_BROKEN = tuple(int(x) for x in torch.__version__.split("+")[0].split(".")[:2]) < (2, 13)
AOTI_SKIP = "loading an AOTInductor package of a module calling kernelhub crashed the process (segfault in " \
    "aoti_load_package) on torch 2.11 (H200 machine, 2026-11-27), with its ops' operators in the package and with " \
    "triton's kernels traced in; it works on torch 2.13 (docs/user-guide.md)"
AOTI = textwrap.dedent('''
    import sys, torch, kernelhub
    sys.path.insert(0, {tests!r})
    from test_toolchain import OneOp, SeveralOps, _export_inputs
    device = {device!r}
    model = SeveralOps().to(device)
    inputs = tuple(t.to(device) for t in _export_inputs(model))
    path = torch._inductor.aoti_compile_and_package(torch.export.export(model, inputs))
    torch.testing.assert_close(torch._inductor.aoti_load_package(path)(*inputs), model(*inputs))
    print("ok", kernelhub.explain("tv_loss_sq_3d", inputs[0]).chosen)
''')


def _aoti(device, backend, tmp_path, seed_cuda_ext_cache):
    """AOTInductor of a module calling several ops, in a subprocess (a crash stays there): the package holds the
    impls traced into it, and calls the other ops' operators through the dispatcher (so it runs in a Python process
    that built the hub)."""
    _pin_every_op(tmp_path, backend)
    seed_cuda_ext_cache(tmp_path / "cache")
    proc = harness.run([sys.executable, "-c", AOTI.format(tests=os.path.dirname(__file__), device=device)],
                       timeout=900, cwd=tmp_path, env=dict(os.environ, XDG_CACHE_HOME=str(tmp_path / "cache"),
                                                           TORCHINDUCTOR_CACHE_DIR=str(tmp_path / "inductor")))
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert proc.stdout.split()[-2:] == ["ok", backend or kernelhub.explain("tv_loss_sq_3d", torch.randn(
        1, 6, 7, 8, device=device)).chosen]


@pytest.mark.skipif(AOTI_BROKEN, reason=AOTI_SKIP)
@pytest.mark.full("AOTInductor compiles C++ for the CPU: slow on 2 cores")
def test_aot_inductor_on_the_cpu(tmp_path, seed_cuda_ext_cache):
    """The shipped [compile] priority traces inductor's impl into the package."""
    _aoti("cpu", None, tmp_path, seed_cuda_ext_cache)


@needs_cuda
@pytest.mark.skipif(AOTI_BROKEN, reason=AOTI_SKIP)
@pytest.mark.parametrize("backend", ["cuda_ext", "triton"])
def test_aot_inductor_on_cuda(backend, tmp_path, seed_cuda_ext_cache):
    _aoti("cuda", backend, tmp_path, seed_cuda_ext_cache)



def _empty_samples():
    out = []
    for op in kernelhub.op_names():
        spec = kernelhub.get_hub().registry.spec(op)
        for dtype in [d for d in (torch.float32, torch.complex64) if d in spec.dtypes]:
            for s in testing.samples(op, "edge", dtype, "cpu"):
                if any(t.numel() == 0 for t in testing.leaves(op, s.args)):
                    out.append(pytest.param(op, dtype, s.name, id=f"{op}-{str(dtype)[6:]}-{s.name}"))
    return out


@pytest.mark.parametrize("op, dtype, name", _empty_samples())
def test_every_op_on_empty_inputs_inside_a_compiled_step(op, dtype, name):
    """docs/ops.md promises the reference's result for empty inputs, and a compiled step keeps it: forward and
    backward through `torch.compile(fullgraph=True)` (inductor) equal eager's (an empty complex Tikhonov input raised
    InductorError at lowering, from the traced impl's backward)."""
    sample = next(s for s in testing.samples(op, "edge", dtype, "cpu") if s.name == name)
    args = testing.with_grad(op, sample.args)
    leaves = testing.leaves(op, args)
    handle = kernelhub.op(op)

    def step(*a):  # the loss alone: inductor itself fails to return an empty complex tensor beside a loss taken
        # from its real part (torch 2.13, `m * 2` in place of the op does the same)
        out = handle(*a)
        return (out.real if out.is_complex() else out).square().sum()

    torch._dynamo.reset()
    with torch.no_grad():
        got, want = torch.compile(handle, fullgraph=True)(*args), handle(*args)
    torch.testing.assert_close(got, want, equal_nan=True)
    got_grads = torch.autograd.grad(torch.compile(step, fullgraph=True)(*args), leaves, allow_unused=True,
                                    materialize_grads=True)
    want_grads = torch.autograd.grad(step(*args), leaves, allow_unused=True, materialize_grads=True)
    for g, w in zip(got_grads, want_grads, strict=True):
        torch.testing.assert_close(g, w, equal_nan=True)
