"""What a model calling kernelhub does with the PyTorch 2 toolchain: several ops and modules in one
``torch.compile(fullgraph=True)`` step, first called in a fresh process; ``torch.export`` with a save/load round
trip; the hub's promises (fallback, kill switch, forced backends, pins) inside compiled code; and, on CUDA,
``mode="reduce-overhead"`` training loops and calls that keep no tensor past their end (docs/user-guide.md,
"torch.compile, torch.export, CUDA graphs")."""

import importlib
import json
import os
import subprocess
import sys
import textwrap
import warnings

import pytest
import torch

import kernelhub
from kernelhub import nn as khnn
from test_selector import FAST, FLAKY, config

CUDA = torch.cuda.is_available()
needs_cuda = pytest.mark.skipif(not CUDA, reason="needs CUDA")

# One step calling every op (so every pair of ops shares a graph), in the registry's order and reversed, compiled
# whole in a fresh process: its first kernelhub call is the compiled one. Prints what it saw as JSON.
ALL_OPS = textwrap.dedent('''
    import json, sys, warnings
    import torch, kernelhub
    from kernelhub import testing

    backend, device, compiler = sys.argv[1] or None, sys.argv[2], sys.argv[3]
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

    report = {"graph_breaks": [], "graphs": [], "mismatches": []}
    for order in (list(range(len(names))), list(reversed(range(len(names))))):
        step = make(order)
        got = torch.compile(step, fullgraph=True, backend=compiler)(args)
        got_g = torch.autograd.grad(got, leaves)
        want = step(args)
        want_g = torch.autograd.grad(want, leaves)
        for what, g, w in [("value", got, want), *[(f"grad {i}", g, w) for i, (g, w) in enumerate(zip(got_g, want_g))]]:
            try:
                torch.testing.assert_close(g, w)
            except AssertionError as exc:
                report["mismatches"].append(f"{what}: {exc}")
        explained = torch._dynamo.explain(step)(args)
        report["graph_breaks"].append(explained.graph_break_count)
        report["graphs"].append(explained.graph_count)
    report["chosen"] = {n: kernelhub.explain(n, *a).chosen for n, a in zip(names, args)} if backend is None else {}
    print(json.dumps(report))
''')


def _run_all_ops(backend, device, compiler, seed_cuda_ext_cache, tmp_path, timeout=900):
    if backend:
        reason = kernelhub.get_hub().registry.unavailable_reason(backend)
        if reason:
            pytest.skip(f"{backend} is unavailable: {reason}")
    env = dict(os.environ, XDG_CACHE_HOME=str(tmp_path / "cache"), TORCHINDUCTOR_CACHE_DIR=str(tmp_path / "inductor"))
    seed_cuda_ext_cache(tmp_path / "cache")
    proc = subprocess.run([sys.executable, "-c", ALL_OPS, backend or "", device, compiler], capture_output=True,
                          text=True, timeout=timeout, env=env, cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr[-4000:]
    report = json.loads(proc.stdout.strip().splitlines()[-1])
    assert report["mismatches"] == []
    assert report["graph_breaks"] == [0, 0] and report["graphs"] == [1, 1]
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


@needs_cuda
@pytest.mark.parametrize("backend, compiler", [(None, "inductor"), ("torch_ref", "inductor"),
                                               ("cuda_ext", "inductor"), ("triton", "inductor"),
                                               ("inductor", "aot_eager")])
def test_every_op_in_one_compiled_step_first_in_a_fresh_process_on_cuda(backend, compiler, seed_cuda_ext_cache,
                                                                        tmp_path):
    _run_all_ops(backend, "cuda", compiler, seed_cuda_ext_cache, tmp_path)


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


# The hub's promises, inside compiled code: the graph holds the operator, and the operator selects when it runs.


def _compiled_tv(backend=None):
    op = kernelhub.op("tv_loss_l1_3d", backend=backend)
    torch._dynamo.reset()
    return torch.compile(lambda v: (op(v) * torch.tensor([1.0, 2.0, 3.0])).sum(), fullgraph=True,
                         backend="aot_eager")


def test_compiled_code_follows_the_kill_switch_pins_and_forced_backends_without_recompiling(install, tmp_path,
                                                                                          monkeypatch):
    monkeypatch.setenv("KERNELHUB_DISABLE", "cuda_ext")
    mod = install("fast", FAST, devices=("cpu",), unavailable=None)  # counts its calls
    config(tmp_path, 'priority = ["fast"]')
    calls = importlib.import_module(mod).CALLS
    v = torch.randn(3, 4, 5, requires_grad=True)
    want = (kernelhub.op("tv_loss_l1_3d", backend="torch_ref")(v) * torch.tensor([1.0, 2.0, 3.0])).sum()
    step = _compiled_tv()
    counters = torch._dynamo.utils.counters
    counters.clear()
    out = step(v)
    out.backward()
    assert calls == {"forward": 1, "backward": 1}  # the priority's first, forward and backward
    assert kernelhub.explain("tv_loss_l1_3d", v).chosen == "fast"
    torch.testing.assert_close(out, want)
    frames = counters["stats"]["unique_graphs"]

    config(tmp_path, 'priority = ["fast"]\nkill_switch = true')  # the same compiled function, no retrace
    torch.testing.assert_close(step(v), want)
    assert calls["forward"] == 1 and counters["stats"]["unique_graphs"] == frames

    config(tmp_path, 'priority = ["torch_ref", "fast"]\n[ops.tv_loss_l1_3d]\npin = "fast"')
    step(v)
    assert calls["forward"] == 2
    config(tmp_path, 'priority = ["torch_ref", "fast"]')
    step(v)
    assert calls["forward"] == 2
    _compiled_tv("fast")(v).backward()  # a forced backend
    assert calls == {"forward": 3, "backward": 2}
    with pytest.raises(kernelhub.NoImplementationError, match="forced backend 'fast' cannot serve"):
        _compiled_tv("fast")(v.double())


def test_compiled_code_falls_back_past_a_backend_that_raises(install, tmp_path):
    install("flaky", FLAKY)
    config(tmp_path, 'priority = ["flaky", "torch_ref"]')
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
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=600,
                          env=dict(os.environ, XDG_CACHE_HOME=str(tmp_path / "cache")), cwd=tmp_path)
    assert proc.returncode == 0 and proc.stdout.strip() == "ok", proc.stderr[-3000:]


def test_an_exported_program_without_the_hub_says_what_to_do(tmp_path):
    """Loading an exported program whose ops kernelhub has not defined in this process: torch's error names
    the operator (docs/user-guide.md says to call kernelhub.get_hub() first)."""
    ep = torch.export.export(OneOp(), _export_inputs(OneOp()))
    path = tmp_path / "model.pt2"
    torch.export.save(ep, path)
    code = f"import torch\ntorch.export.load({str(path)!r})\n"
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
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
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=900, cwd=tmp_path,
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
        from kernelhub import dispatch, testing
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
            dispatch.EAGER_FAST_PATH = fast
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
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=900, cwd=tmp_path,
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
AOTI_SKIP = "loading an AOTInductor package that calls a Python-defined operator crashed the process (segfault in " \
    "aoti_load_package) on torch 2.11 (H200 machine, 2026-11-27); it works on torch 2.13 (docs/user-guide.md)"
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
    """AOTInductor of a module calling four ops, in a subprocess (a crash stays there): the package calls the
    kernelhub operators through the dispatcher, so it runs in a Python process that built the hub."""
    _pin_every_op(tmp_path, backend)
    seed_cuda_ext_cache(tmp_path / "cache")
    proc = subprocess.run([sys.executable, "-c", AOTI.format(tests=os.path.dirname(__file__), device=device)],
                          capture_output=True, text=True, timeout=900, cwd=tmp_path,
                          env=dict(os.environ, XDG_CACHE_HOME=str(tmp_path / "cache"),
                                   TORCHINDUCTOR_CACHE_DIR=str(tmp_path / "inductor")))
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert proc.stdout.split()[-2:] == ["ok", backend or kernelhub.explain("tv_loss_sq_3d", torch.randn(
        1, 6, 7, 8, device=device)).chosen]


@pytest.mark.skipif(AOTI_BROKEN, reason=AOTI_SKIP)
@pytest.mark.full("AOTInductor compiles C++ for the CPU: about 30 s on 2 cores")
def test_aot_inductor_on_the_cpu(tmp_path, seed_cuda_ext_cache):
    _aoti("cpu", None, tmp_path, seed_cuda_ext_cache)


@needs_cuda
@pytest.mark.skipif(AOTI_BROKEN, reason=AOTI_SKIP)
@pytest.mark.parametrize("backend", ["cuda_ext", "triton"])
def test_aot_inductor_on_cuda(backend, tmp_path, seed_cuda_ext_cache):
    _aoti("cuda", backend, tmp_path, seed_cuda_ext_cache)
