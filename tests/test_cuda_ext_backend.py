"""The cuda_ext backend beyond the generated parity matrix: its build (cache, locking, timeouts,
failures, permissions), gradients, determinism."""

import json
import os
import re
import shutil
import signal
import stat
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import harness
import pytest
import torch

import kernelhub
from kernelhub import testing

pytest.importorskip("kernelhub_cuda_ext")
from kernelhub_cuda_ext import _build, _lib, plugin  # noqa: E402

OPS = sorted(plugin.IMPLS)
BUILT = _lib.load() is None
built = pytest.mark.skipif(not BUILT, reason=f"cuda_ext did not build here: {_lib.load()}")

# A stand-in for torch's builder: waits while its baton file exists (as torch.utils.cpp_extension does), counts
# its runs, optionally sleeps or fails, then writes the library.
FAKE = textwrap.dedent("""
    import json, os, sys, time
    a = json.loads(sys.argv[1])
    while os.path.exists(os.path.join(a["dir"], "lock")):
        time.sleep(0.1)
    with open(os.path.join(os.path.dirname(a["dir"]), "runs"), "a") as f:
        f.write("run\\n")
    time.sleep(float(os.environ.get("FAKE_SLEEP", "0")))
    if os.environ.get("FAKE_FAIL"):
        print("cpu.cpp:1:1: error: the compiler said no", file=sys.stderr)
        sys.exit(1)
    open(os.path.join(a["dir"], a["name"] + ".so"), "wb").write(b"not really")
""")
SRC = [_build.CSRC / "cpu.cpp"]


def _build_in_subprocess(root, env=None, timeout=60):
    code = (f"import sys; from pathlib import Path; from kernelhub_cuda_ext import _build\n"
            f"print(_build.build('fake', [Path({str(SRC[0])!r})], False, root=Path({str(root)!r}), timeout={timeout}, "
            f"compile_script={FAKE!r}))")
    return subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            env=harness.child_env({**os.environ, **(env or {})}))


def test_build_dirs_are_private_and_reused(tmp_path):
    root = tmp_path / "cache"
    lib = _build.build("fake", SRC, False, root=root, compile_script=FAKE)
    assert stat.S_IMODE(root.stat().st_mode) == 0o700 and stat.S_IMODE(lib.parent.stat().st_mode) == 0o700
    assert _build.build("fake", SRC, False, root=root, compile_script=FAKE) == lib  # cached: no second run
    assert (root / "runs").read_text().count("run") == 1


def test_concurrent_first_uses_build_once(tmp_path):
    root = tmp_path / "cache"
    procs = [_build_in_subprocess(root, {"FAKE_SLEEP": "2"}) for _ in range(3)]
    outs = [harness.wait(p, 120) for p in procs]
    assert all(p.returncode == 0 for p in procs), outs
    assert len({o[0].strip() for o in outs}) == 1  # the same library for all three
    assert (root / "runs").read_text().count("run") == 1


def test_a_build_killed_half_way_does_not_block_the_next(tmp_path):
    root = tmp_path / "cache"
    # on a loaded machine (15 test workers) the victim's start, a Python importing torch and then the compiler's,
    # can be slow: the wait for it is generous, and it must still hold the lock when killed
    victim = _build_in_subprocess(root, {"FAKE_SLEEP": "60"})
    deadline = time.time() + 180
    while not (root / "runs").exists() and time.time() < deadline:  # it holds the lock and is compiling
        time.sleep(0.1)
    assert (root / "runs").exists() and victim.poll() is None
    victim.send_signal(signal.SIGKILL)
    victim.wait()
    directory = next(p for p in root.iterdir() if p.is_dir())
    (directory / "lock").write_text("")  # what torch's own builder leaves behind when killed
    t0 = time.time()
    lib = _build.build("fake", SRC, False, root=root, compile_script=FAKE, timeout=30)
    assert lib.exists() and time.time() - t0 < 20


def test_a_hung_compiler_times_out_with_the_reason(tmp_path, monkeypatch):
    monkeypatch.setenv("FAKE_SLEEP", "60")
    t0 = time.time()
    with pytest.raises(_build.BuildError, match="timed out after 2 s"):
        _build.build("fake", SRC, False, root=tmp_path / "cache", compile_script=FAKE, timeout=2)
    assert time.time() - t0 < 20


def test_a_failing_compiler_gives_its_message(tmp_path, monkeypatch):
    monkeypatch.setenv("FAKE_FAIL", "1")
    with pytest.raises(_build.BuildError, match="the compiler said no"):
        _build.build("fake", SRC, False, root=tmp_path / "cache", compile_script=FAKE)


def test_a_failing_build_makes_the_backend_unavailable_with_the_reason(monkeypatch, tmp_path):
    def fail(*args, **kwargs):
        raise _build.BuildError("building kernelhub_cuda_ext failed: cpu.cpp:1:1: error: the compiler said no")

    monkeypatch.setattr(_lib, "build", fail)
    monkeypatch.setattr(_lib, "aot_library", lambda: None)  # as if installed without an ahead-of-time build
    monkeypatch.setattr(_lib, "_OUTCOME", [])
    with kernelhub.scoped() as hub:
        assert "the compiler said no" in hub.registry.unavailable_reason("cuda_ext")
        decision = kernelhub.explain("tv_loss_l1_3d", torch.randn(3, 4, 5))
        assert decision.chosen != "cuda_ext"
        cand = next(c for c in decision.candidates if c.backend == "cuda_ext")
        assert cand.status == "rejected" and "the compiler said no" in " ".join(cand.reasons)
        (tmp_path / "a_file").write_text("")
        code = ("from kernelhub_cuda_ext import _lib; _lib.aot_library = lambda: None\n"
                "from kernelhub import cli; raise SystemExit(cli.main(['list', '--json']))")
        out = harness.run([sys.executable, "-c", code], timeout=300,
                          env={**os.environ, "XDG_CACHE_HOME": str(tmp_path / "a_file" / "x")})
        # in a fresh process whose cache directory cannot be created: unavailable, with the reason, no crash
        assert out.returncode == 0, out.stderr
        backend = json.loads(out.stdout)["backends"]["cuda_ext"]
        assert not backend["available"] and "cannot create the build directory" in backend["reason"]


def _load_in_subprocess(target, cache):
    code = "from kernelhub_cuda_ext import _lib\nprint(_lib.load()); print(_lib.loaded_from())"
    out = harness.run([sys.executable, "-c", code], timeout=600,
                         env={**os.environ, "PYTHONPATH": str(target), "XDG_CACHE_HOME": str(cache)})
    reason, loaded = (out.stdout.split("\n") + ["", ""])[:2]
    return reason, loaded, out.stdout + out.stderr


@built
def test_ahead_of_time_build_is_loaded_instead_of_compiling_unless_unsafe(tmp_path, seed_cuda_ext_cache):
    # a package holding _C_<torch>_<digest>.so (setup.py's name for it; the library is this session's build,
    # so nothing compiles here: the real setup.py build is the full tier's test below) is loaded without
    # touching the compile-on-first-use cache
    target, cache = tmp_path / "site", tmp_path / "cache"
    package = target / "kernelhub_cuda_ext"
    shutil.copytree(_build.CSRC.parent, package, ignore=shutil.ignore_patterns("*.so", "__pycache__"))
    shutil.copyfile(_lib.loaded_from(), package / f"{_build.aot_name(torch.__version__)}.so")
    reason, loaded, log = _load_in_subprocess(target, cache)
    assert reason == "None", log
    assert loaded.startswith(str(target)) and _build.aot_name(torch.__version__) in loaded
    assert not cache.exists()  # nothing compiled at first use
    # sources changed since the build (an in-place build of a developer's tree): the library is not found
    header = package / "csrc" / "ops.h"
    original = header.read_text()
    header.write_text(original + "// edited\n")
    stale = harness.run([sys.executable, "-c", "from kernelhub_cuda_ext import _lib; print(_lib.aot_library())"],
                        timeout=300, env={**os.environ, "PYTHONPATH": str(target)})
    assert stale.stdout.strip() == "None", stale.stdout + stale.stderr
    header.write_text(original)
    # a package directory others can write to: its library is not loaded, the backend takes its own first-use
    # build (seeded with this session's: the same sources, so the same key and directory)
    seed_cuda_ext_cache(cache)
    package.chmod(0o777)
    reason, loaded, log = _load_in_subprocess(target, cache)
    assert reason == "None" and loaded.startswith(str(cache)), log


@pytest.mark.full("compiles the C++ sources once more, through setup.py (a minute on 2 cores)")
def test_setup_py_builds_the_ahead_of_time_library(tmp_path):
    # torch importable at build time (no build isolation): setup.py compiles _C_<torch>_<digest>.so into the
    # package, which the backend loads
    target, cache, src = tmp_path / "site", tmp_path / "cache", tmp_path / "src"
    # a clean copy of this repository's backend (the installed package may hold no setup.py): no stale build/
    shutil.copytree(Path(__file__).resolve().parents[1] / "backends" / "cuda_ext", src,
                    ignore=shutil.ignore_patterns("build", "*.egg-info", "*.so", "__pycache__"))
    pip = harness.run([sys.executable, "-m", "pip", "install", "-q", "--no-build-isolation", "--no-deps",
                       "--target", str(target), str(src)], timeout=900)
    assert pip.returncode == 0, pip.stderr[-2000:]
    reason, loaded, log = _load_in_subprocess(target, cache)
    assert reason == "None", log
    assert loaded.startswith(str(target)) and _build.aot_name(torch.__version__) in loaded
    assert not cache.exists()


@pytest.mark.parametrize("mode", [0o777, 0o770])
def test_refuses_a_directory_others_can_write(tmp_path, mode):
    d = tmp_path / "shared"
    d.mkdir()
    d.chmod(mode)
    with pytest.raises(_build.BuildError, match="writable by no one else"):
        _build.check_private(d)


def test_refuses_a_directory_under_a_shared_parent(tmp_path):
    parent = tmp_path / "open"
    parent.mkdir()
    parent.chmod(0o777)  # world-writable and not sticky: anyone may swap the directory below
    child = parent / "mine"
    child.mkdir(mode=0o700)
    with pytest.raises(_build.BuildError, match="could be changed by another user"):
        _build.check_private(child)


def test_refuses_a_symlink(tmp_path):
    real = tmp_path / "real"
    real.mkdir(mode=0o700)
    link = tmp_path / "link"
    link.symlink_to(real)
    with pytest.raises(_build.BuildError, match="not a symlink"):
        _build.check_private(link)


@built
@pytest.mark.parametrize("op,device", [(op, "cpu") if d == "cpu" else harness.cuda_param(op, d)
                                       for op in OPS for d in plugin.IMPLS[op][3] if d == "cpu" or harness.CUDA])
def test_gradcheck_float64(op, device):
    testing.check_gradcheck(op, "cuda_ext", device)


@built
@pytest.mark.parametrize("device", harness.devices())
@pytest.mark.parametrize("op", ["tv_loss_l1_3d", "tv_loss_sq_3d", "tv_loss_iso_3d"])
def test_tv_is_bitwise_deterministic_for_any_thread_count(op, device):
    v = torch.randn((3, 17, 30, 41), generator=torch.Generator().manual_seed(2)).to(device)
    fn = kernelhub.op(op, backend="cuda_ext")

    def run():
        x = v.clone().requires_grad_()
        out = fn(x)
        out.backward(torch.ones_like(out))
        return out.detach(), x.grad

    threads = torch.get_num_threads()
    try:
        a, ga = run()
        torch.set_num_threads(1)
        b, gb = run()
    finally:
        torch.set_num_threads(threads)
    assert torch.equal(a, b) and torch.equal(ga, gb)


@built
@harness.on_cuda()
@pytest.mark.parametrize("op", ["tv_loss_l1_3d", "tv_loss_sq_3d", "tv_loss_iso_3d"])
def test_tv_on_cuda_is_one_kernel_each_way_and_streams_keep_their_own_sums(op):
    """On CUDA a TV forward is one kernel (its last block adds the blocks' partial sums) after the zeroing of the
    counter it reads (new per call: no buffer outlives a call, so CUDA graphs can capture it), and a backward one
    kernel (the upstream gradient read in its own dtype and strides: a stride-0 one, as ``sum()``'s backward gives,
    with no copy); forwards issued on two streams at once, with no synchronisation between them, each give their
    own volume's result (each call has its own partial sums and counter)."""
    impl = kernelhub.get_hub().registry.impls(op)["cuda_ext"]
    extra = (1e-8,) if op == "tv_loss_iso_3d" else ()
    vols = [torch.randn((2, 40, 50, 60), generator=torch.Generator().manual_seed(s)).cuda() for s in (0, 1)]
    want = [impl.forward(v, *extra) for v in vols]
    assert not torch.equal(want[0], want[1])
    grad = torch.full_like(want[0], 0.5)
    stride0 = torch.full((), 0.5, device="cuda").expand(grad.shape)
    torch.testing.assert_close(impl.backward(stride0, vols[0], *extra, needs=[True])[0],
                               impl.backward(grad, vols[0], *extra, needs=[True])[0], rtol=0, atol=0)
    for zeroing, run in ((1, lambda: impl.forward(vols[0], *extra)),
                         (0, lambda: impl.backward(grad, vols[0], *extra, needs=[True]))):
        run()
        torch.cuda.synchronize()
        with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA]) as prof:
            run()
            torch.cuda.synchronize()
        launched = [e.name for e in prof.events() if e.device_type == torch.autograd.DeviceType.CUDA]
        ours = [n for n in launched if "kernelhub_cuda_ext" in n]
        fills = [n for n in launched if "FillFunctor" in n or "emset" in n]
        assert len(ours) == 1 and len(fills) == zeroing and len(launched) == 1 + zeroing, launched
    streams = [torch.cuda.Stream(), torch.cuda.Stream()]
    for s in streams:
        s.wait_stream(torch.cuda.current_stream())
    got: list[list[torch.Tensor]] = [[], []]
    for _ in range(20):
        for k, s in enumerate(streams):
            with torch.cuda.stream(s):
                got[k].append(impl.forward(vols[k], *extra))
    torch.cuda.synchronize()
    assert all(torch.equal(g, want[k]) for k in range(2) for g in got[k])


@built
def test_a_fused_weighted_sum_is_checked_once_per_layout(monkeypatch):
    """The eager fast path checks the fused weighted sum (a way of calling of its own: kernelhub/hub.py,
    `Hub.forward`'s ``trusted``) and its gradient on the layout's first call only; the plain call of the same layout
    is checked once too."""
    from kernelhub import hub as hub_module

    seen = []
    for name in ("_check_output", "_check_grads"):
        real = getattr(hub_module, name)
        monkeypatch.setattr(hub_module, name, lambda *a, _r=real, _n=name: seen.append(_n) or _r(*a))
    kernelhub.get_hub().selector.forget()
    v = torch.randn(2, 3, 4, 5, requires_grad=True)
    op = kernelhub.op("tv_loss_l1_3d", backend="cuda_ext")
    tv = op.weighted(torch.tensor([1.0, 2.0, 3.0]))
    for _ in range(3):
        tv(v).backward()
    assert seen == ["_check_output", "_check_grads"]
    for _ in range(3):
        op(v).sum().backward()
    assert seen == ["_check_output", "_check_grads"] * 2


@built
@pytest.mark.parametrize("device", harness.devices())
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
@pytest.mark.parametrize("op", ["tv_loss_l1_3d", "tv_loss_sq_3d", "tv_loss_iso_3d"])
def test_tv_with_weights_is_the_weighted_output_and_its_gradient(op, dtype, device):
    """Given a weighted handle's weights (`Impl.can` "weighted"), the TV functions return the 0-d weighted sum of their
    output and the gradient for that sum's upstream gradient, within the op's parity tolerance of the plain
    functions' output weighed in float64 and of their gradient for the upstream gradient ``weights * grad``."""
    impl = kernelhub.get_hub().registry.impls(op)["cuda_ext"]
    assert "weighted" in impl.can
    extra = (1e-8,) if op == "tv_loss_iso_3d" else ()
    gen = torch.Generator().manual_seed(4)
    v = torch.randn((2, 9, 10, 11), generator=gen, dtype=dtype).to(device)
    out = impl.forward(v, *extra)
    w = torch.randn(out.shape, generator=gen, dtype=out.dtype).to(device)
    g = torch.tensor(0.75, dtype=out.dtype, device=device)
    got = impl.forward(v, *extra, weights=w)
    (got_grad,) = impl.backward(g, v, *extra, needs=[True], weights=w)
    (want_grad,) = impl.backward(w * g, v, *extra, needs=[True])
    tol = kernelhub.get_hub().registry.spec(op).tolerances[dtype]
    assert got.shape == () and got.dtype == out.dtype and got.device == v.device
    assert testing.parity_error(got, (out.double() * w.double()).sum()) <= tol.forward
    assert testing.parity_error(got_grad, want_grad) <= tol.backward


@built
def test_library_ops_pass_opcheck():
    lib = torch.ops.kernelhub_cuda_ext
    x = torch.randn(2, 3, 4, 5)
    feats, points = torch.randn(6, 8, 4), torch.rand(6, 3) * 2 - 1
    M = torch.randn(5, 2, 7, dtype=torch.complex64)
    feats_t = torch.randn(6, 4, 8).transpose(1, 2)  # non-contiguous: the outputs are contiguous all the same
    M_t = torch.randn(7, 2, 5, dtype=torch.complex64).permute(2, 1, 0)
    for op, args in [(lib.trilinear_backward, (torch.randn(6, 4), feats_t, points, True, True)),
                     (lib.tikhonov_forward, (M_t, 0.3)), (lib.tv_backward, (torch.ones(3), x.transpose(2, 3), 0, 0.0)),
                     (lib.tv_forward, (x, 0, 0.0)), (lib.tv_backward, (torch.ones(3), x, 0, 0.0)),
                     (lib.tv_forward, (x, 2, 1e-8)), (lib.tv_forward, (x, 0, 0.0, torch.ones(3))),
                     (lib.tv_backward, (torch.ones(()), x, 0, 0.0, torch.ones(3))),
                     (lib.trilinear_forward, (feats, points)),
                     (lib.trilinear_backward, (torch.randn(6, 4), feats, points, True, True)),
                     (lib.tikhonov_forward, (M, 0.3)), (lib.tikhonov_backward, (torch.randn_like(M), M, 0.3))]:
        torch.library.opcheck(op.default, args, test_utils=("test_schema", "test_faketensor"))


@built
@pytest.mark.parametrize("device", harness.devices())
@pytest.mark.parametrize("dtype", [torch.complex64, torch.float64])
def test_tikhonov_reads_the_permuted_view_in_place(dtype, device):
    """docs/ops.md's layout, [2, Z, Y, X] moved to [Y, X, 2, Z]: the kernels read M (and the upstream gradient)
    through their strides, with no copy, and give bitwise the result of a contiguous copy (same sums in the
    same order); the outputs are contiguous."""
    from kernelhub_cuda_ext import ops
    M = torch.randn(2, 9, 24, 40, dtype=dtype, device=device).permute(2, 3, 0, 1)  # [Y, X, 2, Z]
    G = torch.randn(2, 9, 24, 40, dtype=dtype, device=device).permute(2, 3, 0, 1)
    with torch.profiler.profile() as prof:
        W = ops.tikhonov_forward(M, 0.01)
        (dM,) = ops.tikhonov_backward(G, M, 0.01, (True,))
    copies = [e.name for e in prof.events() if e.name in ("aten::copy_", "aten::clone", "aten::contiguous")]
    assert not copies, copies
    assert W.is_contiguous() and dM.is_contiguous()
    assert torch.equal(W, ops.tikhonov_forward(M.contiguous(), 0.01))
    assert torch.equal(dM, ops.tikhonov_backward(G.contiguous(), M.contiguous(), 0.01, (True,))[0])


@built
@pytest.mark.parametrize("device", harness.devices())
@pytest.mark.parametrize("dtype", [torch.float32, torch.complex64, torch.float64])
def test_tikhonov_at_every_row_length_matches_the_reference(dtype, device):
    """The CUDA kernel holds a lane's entries in registers up to Z = 32 (8 lanes of 4) and reads them per pass
    beyond: each length around those bounds, contiguous and permuted, forward and backward within the op's
    tolerance of the float64 reference."""
    impl = kernelhub.get_hub().registry.impls("tikhonov_inverse_2xn")["cuda_ext"]
    ref = kernelhub.op("tikhonov_inverse_2xn", backend="torch_ref")
    tol = kernelhub.get_hub().registry.spec("tikhonov_inverse_2xn").tolerances[dtype]
    gen = torch.Generator().manual_seed(5)
    for Z in (1, 7, 8, 9, 21, 24, 25, 32, 33, 70):
        for permuted in (False, True):
            M = torch.randn((2, Z, 6, 5) if permuted else (30, 2, Z), generator=gen, dtype=dtype)
            G = torch.randn(M.shape, generator=gen, dtype=dtype)
            if permuted:
                M, G = M.permute(2, 3, 0, 1), G.permute(2, 3, 0, 1)
            M64 = M.to(torch.complex128 if dtype.is_complex else torch.float64).requires_grad_()
            want = ref(M64, 0.3)
            (want_grad,) = torch.autograd.grad(want, M64, G.to(M64.dtype))
            got = impl.forward(M.to(device), 0.3)
            (got_grad,) = impl.backward(G.to(device), M.to(device), 0.3, needs=[True])
            where = f"Z {Z}, permuted {permuted}"
            assert testing.parity_error(got.cpu(), want) <= tol.forward, where
            assert testing.parity_error(got_grad.cpu(), want_grad) <= tol.backward, where


@built
@pytest.mark.parametrize("device", harness.devices())
@pytest.mark.parametrize("taps", [1, 4])
def test_kplanes_library_ops_pass_opcheck(taps, device):
    lib = torch.ops.kernelhub_cuda_ext
    pts, rot, planes = torch.rand(9, 3, device=device) * 2 - 1, torch.randn(2, 3, 3, device=device), \
        torch.randn(6, 3, 5, 4, device=device)
    grad = torch.randn(taps, 9, 6, device=device)
    torch.library.opcheck(lib.kplanes_forward.default, (pts, rot, planes, taps, 0.01),
                          test_utils=("test_schema", "test_faketensor"))
    for needs in [(True, True, True), (True, False, False), (False, True, True)]:
        torch.library.opcheck(lib.kplanes_backward.default, (grad, pts, rot, planes, taps, 0.01, *needs),
                              test_utils=("test_schema", "test_faketensor"))


def _corner_weights(points: torch.Tensor) -> torch.Tensor:
    """docs/ops.md: corner k = 4i + 2j + l has weight (i ? u : 1-u)(j ? v : 1-v)(l ? w : 1-w),
    (u, v, w) = (p + 1) / 2."""
    u, v, w = ((points + 1) / 2).unbind(-1)
    return torch.stack([(u if k >> 2 else 1 - u) * (v if (k >> 1) & 1 else 1 - v) * (w if k & 1 else 1 - w)
                        for k in range(8)], dim=-1)


@pytest.mark.parametrize("backend, device", [(b, "cpu") for b in ("torch_ref", "cuda_ext")] + (
    [harness.cuda_param(b, "cuda") for b in ("torch_ref", "cuda_ext", "triton")] if harness.CUDA else []))
def test_trilinear_corner_order_and_points_gradient(backend, device):
    # The CUDA-extension tutorial kernel copied into many projects gives no gradient to points. Ours: one-hot
    # features read each corner's weight back (the corner order of docs/ops.md, inside and outside [-1, 1]),
    # and the points' gradient is the derivative of those weights.
    if backend == "cuda_ext" and not BUILT:
        pytest.skip(f"cuda_ext did not build here: {_lib.load()}")
    gen = torch.Generator().manual_seed(5)
    points = (torch.rand(64, 3, generator=gen, dtype=torch.float64) * 3 - 1.5).to(device)  # some outside
    feats = torch.eye(8, dtype=torch.float64, device=device).expand(64, 8, 8).clone()
    upstream = torch.randn(64, 8, generator=gen, dtype=torch.float64).to(device)
    p = points.clone().requires_grad_()
    out = kernelhub.op("trilinear_interp", backend=backend)(feats, p)
    torch.testing.assert_close(out, _corner_weights(points), rtol=1e-12, atol=1e-12)
    out.backward(upstream)
    q = points.clone().requires_grad_()
    (_corner_weights(q) * upstream).sum().backward()
    assert p.grad.abs().max() > 0.1
    torch.testing.assert_close(p.grad, q.grad, rtol=1e-12, atol=1e-12)


# Calls semiconv_cuda.h's tiled max/min kernels take (2-D, unit stride and dilation, padding below the kernel size):
# images spanning several 64-wide tiles, kernel widths 1, 2 and 4-7 (3x3 calls are the conformance cases'),
# heights past 7, asymmetric padding, a channel multiplier (two outputs per input channel), group broadcasting,
# and one call with two channels per group (the forward tiled, the backward the window walk). The backward's block
# shape is the one with fewer threads over the image (semiconv_cuda.h's tt_plan): 256 threads for (64 - k + 1)-wide
# image tiles in the first, third and last calls, the wide shape (image tiles of at least 64) in the others (WIDE).
# (img shape, kernel shape, semifield, padding, groups, kind, bcast)
TILED = [
    ((2, 3, 130, 70), (3, 1, 5, 5), "tropical_max", "same", 3, "conv", False),
    ((1, 2, 67, 129), (4, 1, 3, 7), "tropical_min", [2, 0, 6, 3], 2, "corr", False),
    ((1, 3, 70, 66), (1, 1, 9, 1), "tropical_max", "valid", 3, "corr", True),
    ((2, 2, 65, 9), (2, 1, 2, 6), "tropical_min", [1, 1, 5, 0], 2, "conv", False),
    ((1, 4, 64, 61), (2, 2, 4, 2), "tropical_max", 1, 2, "conv", False),
    ((1, 1, 40, 50), (1, 1, 11, 4), "tropical_max", "same", 1, "corr", False),
    ((1, 2, 128, 64), (2, 1, 5, 5), "tropical_max", "same", 2, "conv", False),
]
WIDE = {1, 3, 6}  # positions in TILED


def _tiled_call(case, dtype, device, gen, values):
    ishape, kshape, sf, pad, groups, kind, bcast = case
    if values == "integers":  # sums exact in any order, and many exact ties: the first winner must win
        img, ker = (torch.randint(-3, 4, s, generator=gen).to(dtype) for s in (ishape, kshape))
    else:
        img, ker = (torch.randn(s, generator=gen, dtype=torch.float64).to(dtype) for s in (ishape, kshape))
    if values == "nonfinite":
        flat = img.view(-1)
        flat[torch.randint(flat.numel(), (6,), generator=gen)] = torch.tensor([float("nan"), float("inf"),
                                                                               -float("inf")] * 2, dtype=dtype)
    return (img.to(device), ker.to(device), sf, 1, pad, 1, groups, kind, bcast)


@built
@harness.on_cuda("the tiled kernels are CUDA's")
@pytest.mark.parametrize("case", TILED, ids=lambda c: f"{c[2]}_{'x'.join(map(str, c[0]))}_k{'x'.join(map(str, c[1]))}")
@pytest.mark.parametrize("dtype,values", [(torch.float64, "random"), (torch.float32, "integers"),
                                          (torch.bfloat16, "integers"), (torch.float32, "nonfinite")])
def test_semiconv_tiled_kernels_equal_the_reference(case, dtype, values):
    """Values, NaN and Inf placement and both gradients equal torch_ref's in the same dtype: exactly where the
    sums are exact (integer values, one winner per output), to float64 rounding otherwise; and the profiler
    shows the tiled kernels ran (the backward's only where one input channel feeds each output channel). On the
    eager fast path the forward saves the winners and the backward reads them (`Impl.can` "saves"; the kernels' WIN and
    SAVED template arguments), through the operators the backward searches: both exact."""
    gen = torch.Generator().manual_seed(11)
    args = _tiled_call(case, dtype, "cuda", gen, values)
    results = {}
    for backend, path in (("torch_ref", "hub"), ("cuda_ext", "hub"), ("cuda_ext", "operator")):
        img, ker = args[0].clone().requires_grad_(), args[1].clone().requires_grad_()
        with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA]) as prof:
            out = (kernelhub.op("semiconv", backend=backend)(img, ker, *args[2:]) if path == "hub" else
                   torch.ops.kernelhub.semiconv.default(img, ker, *kernelhub.get_hub().registry.spec(
                       "semiconv").canonical(*args)[2:], backend, 0))
            upstream = torch.randint(-2, 3, out.shape, generator=torch.Generator().manual_seed(3)).to(dtype).cuda()
            out.backward(upstream)
            torch.cuda.synchronize()
        results[backend, path] = (out.detach(), img.grad, ker.grad, {e.name for e in prof.events()})
    want, want_x, want_k, _ = results["torch_ref", "hub"]
    exact = dict(rtol=0, atol=0) if values != "random" else dict(rtol=1e-12, atol=1e-12)
    one_channel = case[1][1] == 1
    for path in ("hub", "operator"):
        got, got_x, got_k, kernels = results["cuda_ext", path]
        torch.testing.assert_close(got, want, equal_nan=True, **exact)
        torch.testing.assert_close(got_x, want_x, **exact)
        torch.testing.assert_close(got_k, want_k, **exact)
        forward = [k for k in kernels if "tt_forward_kernel" in k]
        backward = [k for k in kernels if "tt_backward_kernel" in k]
        assert forward and bool(backward) == one_channel, sorted(kernels)
        saving = one_channel and path == "hub"
        assert all(bool(re.search(r"tt_forward_kernel<\d+, \d+, [\w:]+, (true|\(bool\)1)", k)) == saving
                   for k in forward), forward
        if one_channel:  # the kernel's name holds its WIDE and SAVED template arguments
            wide = all(re.search(r"tt_backward_kernel<\d+, \d+, (true|\(bool\)1)", k) for k in backward)
            assert wide == (TILED.index(case) in WIDE), backward
            assert all(bool(re.search(r"tt_backward_kernel<\d+, \d+, \w+, [\w:]+, (true|\(bool\)1)", k)) == saving
                       for k in backward), backward
    # the op's case that the shipped configuration gives to cuda_ext is these calls
    spec = kernelhub.get_hub().registry.spec("semiconv")
    assert (spec.case_of(spec.canonical(*args)) == "tropical_2d_depthwise") == one_channel


@built
@harness.on_cuda("triton serves CUDA tensors")
def test_the_shipped_priority_gives_the_large_tiled_calls_to_cuda_ext_and_the_others_to_triton():
    """kernelhub/kernelhub.toml: semiconv's calls under 4,194,304 image elements run on triton (its size range),
    larger ones of the tropical_2d_depthwise case (the calls both tiled kernels serve) on cuda_ext, the other large
    ones on triton; explain names the range or the case that decided."""
    if kernelhub.get_hub().registry.unavailable_reason("triton"):
        pytest.skip("triton is unavailable here")
    gen = torch.Generator().manual_seed(0)
    for case in TILED:  # all under the size range's bound
        d = kernelhub.explain("semiconv", *_tiled_call(case, torch.float32, "cuda", gen, "random"))
        assert d.chosen == "triton" and "semiconv calls from the smallest size" in str(d), str(d)
    img = torch.randn(1, 16, 512, 512, device="cuda")  # 4,194,304 elements: the next range
    for kernel, semifield, want in ((torch.randn(16, 1, 5, 5), "tropical_max", "cuda_ext"),
                                    (torch.randn(16, 1, 3, 3), "log:1", "triton"),
                                    (torch.randn(16, 1, 9, 9), "tropical_max", "triton")):
        d = kernelhub.explain("semiconv", img, kernel.cuda(), semifield, 1, "same", 1, 16)
        assert d.chosen == want, str(d)
        assert ("case tropical_2d_depthwise" in str(d)) == (want == "cuda_ext"), str(d)
