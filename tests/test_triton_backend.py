"""The triton backend beyond the generated parity matrix: availability, interpreter-only selection,
determinism, float64 gradcheck, and (on a big GPU) tensors past 2^31 elements, for cuda_ext's kernels too."""

import os
import re
import sys
from pathlib import Path

import harness
import pytest
import torch

import kernelhub
from kernelhub import parity, testing

triton = pytest.importorskip("triton")
from kernelhub_triton import plugin  # noqa: E402

CUDA = torch.cuda.is_available()
DEVICE = "cuda" if CUDA else "cpu"
if not CUDA and not plugin.interpret_mode():
    pytest.skip("no GPU and TRITON_INTERPRET is not set", allow_module_level=True)
OPS = sorted(plugin.IMPLS)
pytestmark = harness.cuda  # Triton's compiled kernels where there is a GPU (DEVICE), its interpreter elsewhere


def test_unavailable_without_a_gpu_names_the_reason(monkeypatch):
    monkeypatch.setenv("TRITON_INTERPRET", "0")
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    reason = plugin.unavailable_reason()
    assert "no CUDA device" in reason and "TRITON_INTERPRET=1" in reason


def test_unavailable_without_triton(monkeypatch):
    monkeypatch.setitem(sys.modules, "triton", None)  # import triton raises ImportError
    assert "triton cannot be imported" in plugin.unavailable_reason()


@pytest.mark.skipif(CUDA, reason="the interpreter serves CPU tensors only where there is no GPU")
def test_interpreter_serves_forced_calls_only():
    v = torch.randn(4, 5, 6)
    decision = kernelhub.explain("tv_loss_l1_3d", v)
    assert decision.chosen not in (None, "triton")
    triton_c = next(c for c in decision.candidates if c.backend == "triton")
    assert triton_c.status == "rejected" and "TRITON_INTERPRET" in " ".join(triton_c.reasons)
    # a forced call runs the interpreted kernel
    torch.testing.assert_close(kernelhub.op("tv_loss_l1_3d", backend="triton")(v), kernelhub.op("tv_loss_l1_3d")(v))


@pytest.mark.parametrize("op", ["tv_loss_l1_3d", "tv_loss_sq_3d", "tv_loss_iso_3d"])
def test_tv_is_bitwise_deterministic(op):
    shape = (64, 256, 256) if CUDA else (2, 9, 10, 11)
    gen = torch.Generator(device=DEVICE).manual_seed(3)
    v = torch.randn(shape, device=DEVICE, generator=gen)
    fn = kernelhub.op(op, backend="triton")

    def run():
        x = v.clone().requires_grad_()
        out = fn(x)
        out.backward(torch.ones_like(out))
        return out.detach(), x.grad

    (a, ga), (b, gb) = run(), run()
    assert torch.equal(a, b) and torch.equal(ga, gb)


@pytest.mark.parametrize("op", OPS)
def test_gradcheck_float64(op):
    # the interpreter is slow: one random projection of the Jacobian, and in the fast tier semiconv's first
    # small sample only (its six are slow on a 2-core machine; the full tier runs them all)
    one = not CUDA and op == "semiconv" and testing.tier() == "fast"
    sample = testing.samples(op, "small", torch.float64, DEVICE)[0].name if one else None
    testing.check_gradcheck(op, "triton", device=DEVICE, fast_mode=not CUDA, sample=sample)



@pytest.mark.parametrize("dtype", [torch.complex64, torch.float32])
def test_tikhonov_long_rows_take_several_z_chunks(dtype):
    # the spec's samples have Z <= 21, which one register chunk holds; Z = 70 takes three chunks of 32
    from kernelhub_triton import tikhonov
    assert 70 > tikhonov.MAX_BLOCK_Z
    gen = torch.Generator(device=DEVICE).manual_seed(5)
    M = torch.randn((6, 2, 70), device=DEVICE, generator=gen, dtype=dtype)
    tol = kernelhub.get_hub().registry.spec("tikhonov_inverse_2xn").tolerances[dtype]
    fwd, bwd = testing.measure("tikhonov_inverse_2xn", "triton", (M, 0.3))
    assert fwd <= tol.forward and bwd <= tol.backward, (fwd, bwd)

@pytest.mark.parametrize("semifield", ["tropical_max", "tropical_min"])
def test_semiconv_row_kernel_gives_an_all_zero_window_s_gradient_to_its_first_tap(semifield):
    # max/min of a 2-D call take the row kernel; where every product of a window is the semifield's zero (-inf for
    # max, +inf for min), the first tap wins: here it lies in the padding, so only the kernel's gradient gets it
    from kernelhub_triton import semiconv

    zero = float("-inf") if semifield == "tropical_max" else float("inf")
    x = torch.full((1, 1, 4, 4), zero, dtype=torch.float64, device=DEVICE)
    x[0, 0, 3, 3] = 1.0
    k = torch.randn((1, 1, 3, 3), dtype=torch.float64, device=DEVICE, generator=torch.Generator(DEVICE).manual_seed(2))
    args = (semifield, [1, 1], [1, 1, 1, 1], [1, 1], 1, "conv", False)
    assert semiconv._call(x, k, *args).rows is not None  # the row kernel serves it
    assert semiconv._call(x, k, "log:1", *args[1:]).rows is None  # the smooth semifields walk and gather
    g = torch.arange(16.0, dtype=torch.float64, device=DEVICE).view(1, 1, 4, 4)
    got, want = [], []
    for backend, into in (("triton", got), ("torch_ref", want)):
        xi, ki = x.clone().requires_grad_(), k.clone().requires_grad_()
        out = kernelhub.op("semiconv", backend=backend)(xi, ki, *args)
        out.backward(g)
        into += [out.detach(), xi.grad, ki.grad]
    assert got[2].abs().sum() > 0  # the padded first taps' upstream gradients reached the kernel
    for a, b in zip(got, want):
        torch.testing.assert_close(a, b, rtol=0, atol=0)


def test_semiconv_kernel_gradient_copies_are_bounded_by_the_kernels_size():
    # a dense call's row kernels add the kernel's gradient into KERNEL_COPIES copies, fewer where the copies would
    # hold more than COPIES_ELEMENTS values (the layout alone: nothing is allocated or launched)
    from kernelhub_triton import semiconv

    def copies(o, cg, k):
        args = ("tropical_max", (1, 1), (1, 1, 1, 1), (1, 1), 1, "corr", False, torch.float32, 132)
        return semiconv._call_of((2, cg, 64, 64), (o, cg, k, k), *args).rows.copies

    assert copies(64, 64, 3) == semiconv.KERNEL_COPIES  # 36,864 entries
    assert copies(256, 256, 5) == semiconv.COPIES_ELEMENTS // (256 * 256 * 25) == 2
    assert copies(512, 512, 7) == 1  # more entries than COPIES_ELEMENTS: one copy, the gradient itself
    assert copies(4, 1, 3) == 1  # a depthwise window of 9 indices: the one-hot pass, no copies


@pytest.mark.parametrize("semifield", ["tropical_max", "tropical_min"])
def test_semiconv_dense_calls_take_the_dense_rows_and_match_the_reference(semifield):
    # windows of semiconv.DENSE channels or more compute semiconv.DENSE_BLOCK outputs at a time on DENSE_WARPS warps
    # (the benchmark and parity samples' max/min windows have fewer channels): forward and both gradients in float64
    from kernelhub_triton import semiconv

    gen = torch.Generator(DEVICE).manual_seed(6)
    x = torch.randn((2, semiconv.DENSE, 6, 5), dtype=torch.float64, device=DEVICE, generator=gen)
    k = torch.randn((3, semiconv.DENSE, 3, 3), dtype=torch.float64, device=DEVICE, generator=gen)
    args = (semifield, [1, 1], [1, 1, 1, 1], [1, 1], 1, "conv", False)
    rows = semiconv._call(x, k, *args).rows
    assert rows.forward.kwargs["num_warps"] == semiconv.DENSE_WARPS != semiconv.ROW_WARPS
    assert rows.forward.kwargs["RB"] * rows.forward.kwargs["BW"] == min(semiconv.DENSE_BLOCK, 8 * 8)  # 6 x 5: 8 x 8
    g = torch.rand((2, 3, 6, 5), dtype=torch.float64, device=DEVICE, generator=gen)
    outs = {}
    for backend in ("triton", "torch_ref"):
        xi, ki = x.clone().requires_grad_(), k.clone().requires_grad_()
        out = kernelhub.op("semiconv", backend=backend)(xi, ki, *args)
        out.backward(g)
        outs[backend] = (out.detach(), xi.grad, ki.grad)
    for got, want in zip(outs["triton"], outs["torch_ref"]):
        torch.testing.assert_close(got, want, rtol=1e-12, atol=1e-12)
    # the row kernels add the kernel's gradient themselves here (a window of more than MAX_BINS indices): each
    # gradient alone, from the saved winners and from a search
    assert rows.grad is None and semiconv.DENSE * 9 > semiconv.MAX_BINS
    _, saved = semiconv.forward(x, k, *args, saving=True)
    for needs in ([True, False], [False, True]):
        for winners in (saved, None):
            got = semiconv.backward(g, x, k, *args, needs, saved=winners)
            for i in (0, 1):
                if needs[i]:
                    torch.testing.assert_close(got[i], outs["torch_ref"][1 + i], rtol=1e-12, atol=1e-12)
                else:
                    assert got[i] is None


@pytest.mark.parametrize("semifield", ["tropical_min", "log:0.5", "root:2", "linear"])
def test_semiconv_backward_from_the_saving_forward_matches_the_one_that_recomputes(semifield):
    """`Impl.can` "saves" (the conformance kit's check of it runs every sample: on CUDA, and in the full tier under
    the interpreter): a strided, dilated, padded, grouped "conv" call in float64, whose saving forward gives the same
    output and whose backward from the saved winners or statistics gives the recomputing backward's gradients, which
    match the reference's."""
    from kernelhub_triton import semiconv

    gen = torch.Generator(DEVICE).manual_seed(4)
    x = torch.randn((2, 4, 9, 7), dtype=torch.float64, device=DEVICE, generator=gen)
    k = torch.randn((6, 2, 3, 2), dtype=torch.float64, device=DEVICE, generator=gen)
    if semifield.startswith("root"):  # root takes inputs >= 0
        x, k = x.abs(), k.abs()
    args = (semifield, [2, 1], [1, 0, 2, 1], [1, 2], 2, "conv", False)
    out = semiconv.forward(x, k, *args)
    again, saved = semiconv.forward(x, k, *args, saving=True)
    assert torch.equal(out, again)
    assert (saved is None) == (semifield == "linear")  # linear's shares need no statistic
    g = torch.rand(out.shape, dtype=torch.float64, device=DEVICE, generator=gen)
    recomputed = semiconv.backward(g, x, k, *args, [True, True])
    from_saved = semiconv.backward(g, x, k, *args, [True, True], saved=saved)
    xi, ki = x.clone().requires_grad_(), k.clone().requires_grad_()
    kernelhub.op("semiconv", backend="torch_ref")(xi, ki, *args).backward(g)
    for got, same, want in zip(from_saved, recomputed, (xi.grad, ki.grad)):
        torch.testing.assert_close(got, same, rtol=1e-12, atol=1e-12)
        torch.testing.assert_close(got, want, rtol=1e-10, atol=1e-10)


def test_kernel_resources_compiles_each_launch_for_hopper_without_a_gpu():
    """scripts/kernel_resources.py: the triton impl's launches recorded on CPU tensors (none run) and compiled for
    sm_90 the way Triton's launch compiles them, with their registers (in a child without the interpreter, whose
    kernels are not compiled)."""
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    sample = testing.samples("tv_loss_l1_3d", "small", torch.float32, "cpu")[0].name
    script = Path(__file__).resolve().parents[1] / "scripts" / "kernel_resources.py"
    done = harness.run([sys.executable, str(script), "tv_loss_l1_3d",
                        "--size", "small", "--sample", sample], timeout=300, env=env, check=True)
    lines = {m.group(1): int(m.group(2)) for m in re.finditer(r" (_tv_\w+_kernel) grid \d+: (\d+) registers",
                                                              done.stdout)}
    assert set(lines) == {"_tv_forward_kernel", "_tv_backward_kernel"} and min(lines.values()) > 0, done.stdout
    # spills are counted (ptxas puts them in the stack frame, which cuobjdump does not call local): iso's backward
    # capped at 24 registers cannot hold its values (triton 3.6 and 3.9)
    sample = testing.samples("tv_loss_iso_3d", "small", torch.float32, "cpu")[0].name
    done = harness.run([sys.executable, str(script), "tv_loss_iso_3d", "--size", "small", "--sample", sample,
                        "--set", "maxnreg=24"], timeout=300, env=env, check=True)
    spills = [(int(m.group(1)), int(m.group(2)), int(m.group(3))) for m in re.finditer(
        r"24 registers, (\d+) B spilled \(LDL (\d+), STL (\d+)\)", done.stdout)]
    assert len(spills) == 2 and any(b > 0 and ldl + stl > 0 for b, ldl, stl in spills), done.stdout


# -- past 2^31 elements: 64-bit offsets (GPU with >= 60 GB) --------------------------------

BIG = CUDA and torch.cuda.get_device_properties(0).total_memory >= 60 * 2**30
# one such test at a time where pytest-xdist spreads the suite (scripts/gpu_check.sh: --dist loadgroup)
big = pytest.mark.skipif(not BIG, reason="needs a GPU with >= 60 GB")
gpu_memory = pytest.mark.xdist_group("gpu_memory")


def _randn(shape, dtype, seed=0):
    gen = torch.Generator(device="cuda").manual_seed(seed)
    return torch.randn(shape, device="cuda", generator=gen, dtype=torch.float32).to(dtype)


GPU_BACKENDS = ["triton", "cuda_ext"]  # the GPU backends share these checks


def _skip_unless_available(backend):
    hub = kernelhub.get_hub()
    if backend not in hub.registry.backends or hub.registry.unavailable_reason(backend):
        pytest.skip(f"{backend} is not available here")


@big
@gpu_memory
@pytest.mark.parametrize("backend", GPU_BACKENDS)
def test_tv_past_2_31_elements(backend):
    _skip_unless_available(backend)
    v = _randn((2049, 1024, 1024), torch.float16)  # 2.149e9 elements
    assert v.numel() > 2**31
    x = v.requires_grad_()
    g = torch.tensor([0.5, -1.0, 2.0], device="cuda")
    out = kernelhub.op("tv_loss_l1_3d", backend=backend)(x)
    out.backward(g)
    want = torch.zeros(3, dtype=torch.float64, device="cuda")
    with torch.no_grad():
        for d0 in range(0, v.shape[0], 128):
            chunk = v[d0:d0 + 129].double()  # one plane of overlap for the D differences
            want[0] += (chunk[1:] - chunk[:-1]).abs().sum()
            own = chunk[:128]
            want[1] += (own[:, 1:] - own[:, :-1]).abs().sum()
            want[2] += (own[..., 1:] - own[..., :-1]).abs().sum()
    tol = kernelhub.get_hub().registry.spec("tv_loss_l1_3d").tolerances[torch.float16]
    assert testing.parity_error(out.detach(), want) <= tol.forward
    # the gradient of the last planes (offsets past 2^31) is local: compare with the tail's reference
    tail = v.detach()[-3:].double().requires_grad_()
    kernelhub.op("tv_loss_l1_3d", backend="torch_ref")(tail).backward(g.double())
    assert testing.parity_error(x.grad[-2:], tail.grad[1:]) <= tol.backward


@big
@gpu_memory
@pytest.mark.parametrize("backend", GPU_BACKENDS)
def test_trilinear_past_2_31_elements(backend):
    _skip_unless_available(backend)
    n, f = 2**21 + 8, 128  # feats: 2.147e9 + 8192 elements
    feats, points = _randn((n, 8, f), torch.float16), _randn((n, 3), torch.float16, 1)
    rows = slice(n - 512, n)
    args = testing.with_grad("trilinear_interp", (feats, points))
    out = kernelhub.op("trilinear_interp", backend=backend)(*args)
    grad = _randn((n, f), torch.float16, 2)
    out.backward(grad)
    sub = (feats[rows], points[rows])
    ref, ref_g = testing.reference("trilinear_interp", sub, grad[rows])
    tol = kernelhub.get_hub().registry.spec("trilinear_interp").tolerances[torch.float16]
    assert testing.parity_error(out[rows].detach(), ref) <= tol.forward
    for leaf, want in zip(args, ref_g):
        assert testing.parity_error(leaf.grad[rows], want) <= tol.backward


@big
@gpu_memory
@pytest.mark.parametrize("backend", GPU_BACKENDS)
def test_tikhonov_past_2_31_elements(backend):
    _skip_unless_available(backend)
    p = 2**31 // (2 * 21 * 2) + 4096  # the real view holds > 2^31 floats
    M = torch.complex(_randn((p, 2, 21), torch.float32), _randn((p, 2, 21), torch.float32, 1))
    Mg = M.requires_grad_()
    out = kernelhub.op("tikhonov_inverse_2xn", backend=backend)(Mg, 0.3)
    grad = torch.complex(_randn((p, 2, 21), torch.float32, 2), _randn((p, 2, 21), torch.float32, 3))
    out.backward(grad)
    rows = slice(p - 512, p)
    ref, (ref_g,) = testing.reference("tikhonov_inverse_2xn", (M.detach()[rows], 0.3), grad[rows])
    tol = kernelhub.get_hub().registry.spec("tikhonov_inverse_2xn").tolerances[torch.complex64]
    assert testing.parity_error(out[rows].detach(), ref) <= tol.forward
    assert testing.parity_error(Mg.grad[rows], ref_g) <= tol.backward


@pytest.mark.parametrize("op", ["kplanes_interp_tilted", "kplanes_interp_tilted_ms", "kplanes_interp_tilted_taps"])
def test_kplanes_planes_gradient_uses_atomics_and_says_so(op):
    impl = kernelhub.get_hub().registry.impls(op)["triton"]
    assert not impl.deterministic
    from kernelhub_triton import kplanes

    big = torch.empty(1).expand(2**31)  # one element of memory: only its element count is read
    assert "2^31" in kplanes.not_supported_reasons((None, None, big))[0]
    assert kplanes.not_supported_reasons((None, None, [torch.empty(6, 2, 3, 3)])) == []


@pytest.mark.parametrize("backend", ["triton", "cuda_ext"])
def test_kplanes_non_finite_points_read_an_in_range_neighbour_as_torch_does(backend):
    if backend not in kernelhub.get_hub().registry.impls("kplanes_interp_tilted"):
        pytest.skip(f"{backend} is not installed")
    nan, inf = float("nan"), float("inf")
    pts = torch.tensor([[nan, 0.2, 0.1], [0.3, inf, -inf], [0.1, 0.2, 0.3]], device=DEVICE)
    rot, planes = torch.eye(3, device=DEVICE).repeat(2, 1, 1), torch.rand(6, 3, 5, 4, device=DEVICE)
    got = kernelhub.op("kplanes_interp_tilted", backend=backend)(pts, rot, planes)
    torch.testing.assert_close(got, kernelhub.op("kplanes_interp_tilted", backend="torch_ref")(pts, rot, planes),
                               equal_nan=True)


def test_launch_hands_a_kept_kernel_its_parameters_in_signature_order():
    """A kept kernel's later launches take its parameters after the call's arguments from the Bound's values and
    the defaults (`_launch._tail`, fixed once per key): whatever the keywords' order, with launch options
    (num_warps) among them, with a default left out, with one parameter or none after the call's arguments. A
    key holds the Bound by identity and the call's arguments' specialisations."""
    import triton
    import triton.language as tl
    from kernelhub_triton import _launch

    @triton.jit
    def kernel(x_ptr, n, A: tl.constexpr, B, C: tl.constexpr = 7, D=2.5):
        pass

    def tail(n, **kwargs):
        return _launch._tail(_launch.Bound(kernel, **kwargs), n)

    assert tail(2, A=1, B=4, C=5, D=0.5) == (1, 4, 5, 0.5)
    assert tail(2, num_warps=4, D=0.5, B=4, A=1) == (1, 4, 7, 0.5)
    assert tail(3, B=4, num_warps=2) == (4, 7, 2.5)
    assert tail(5, num_warps=2) == (2.5,)
    assert tail(6) == ()
    x = torch.empty(4)
    bound = _launch.Bound(kernel, A=1, B=4)
    key, values = _launch._key(bound, 0, (x, 3))
    # another Bound with the same values is another key (a launcher keeps one per layout)
    assert key != _launch._key(_launch.Bound(kernel, A=1, B=4), 0, (x, 3))[0]
    assert key == _launch._key(bound, 0, (torch.empty(4), 3))[0]
    # the arguments as a kept kernel gets them: each tensor as its address
    assert values == [x.data_ptr(), 3]
    # a tensor's dtype, device and alignment, an integer's value and a float's type are in the key, a float's
    # value is not
    assert key != _launch._key(bound, 0, (x.double(), 3))[0]
    assert key != _launch._key(bound, 0, (torch.empty(5)[1:], 3))[0]
    assert key != _launch._key(bound, 0, (x, 16))[0]
    assert _launch._key(bound, 0, (x, 0.5))[0] == _launch._key(bound, 0, (x, 2.0))[0]
    assert _launch._key(bound, 0, (x, 0.5))[1] == [x.data_ptr(), 0.5]
    if CUDA:
        assert key != _launch._key(bound, 0, (x.cuda(), 3))[0]


def test_each_triton_launcher_keeps_one_bound_kernel_per_layout():
    """A launcher's Bound kernels come from its layout cache: the same object on every call of one layout (a new
    one per call would be a new key per call, and every launch would take Triton's own path)."""
    from kernelhub_triton import kplanes, semiconv, tikhonov, trilinear, tv

    assert tv._layout((1, 8, 8, 8), 4, 0, torch.float32, False)[1] is \
        tv._layout((1, 8, 8, 8), 4, 0, torch.float32, False)[1]
    assert tv._layout((1, 8, 8, 8), 4, 0, torch.float32, True)[1] is not \
        tv._layout((1, 8, 8, 8), 4, 0, torch.float32, False)[1]  # the weighted kernels: a layout of their own
    assert trilinear._forward_kernel(8, torch.float32, True) is trilinear._forward_kernel(8, torch.float32, True)
    assert trilinear._backward_kernel(8, torch.float32, True, False, False) is \
        trilinear._backward_kernel(8, torch.float32, True, False, False)
    assert kplanes._forward_kernel(1, 8, torch.float32) is kplanes._forward_kernel(1, 8, torch.float32)
    assert tikhonov._kernels(5, True) is tikhonov._kernels(5, True)
    x, k = torch.randn(1, 2, 8, 8), torch.randn(2, 1, 3, 3)
    args = ("tropical_max", [1, 1], [1, 1, 1, 1], [1, 1], 2, "conv", False)
    call, again = semiconv._call(x, k, *args), semiconv._call(x.clone(), k.clone(), *args)
    assert call.rows is again.rows and call.smooth is None  # max/min never walk
    smooth, again = (semiconv._call(x, k, "log:1", *args[1:]), semiconv._call(x.clone(), k.clone(), "log:1", *args[1:]))
    assert smooth.smooth is again.smooth and smooth.rows is None


def test_launch_takes_tritons_path_while_a_launch_hook_is_set():
    """A profiler's launch hook gets Triton's launch metadata, computed from the tensors: `launch` then takes
    Triton's own path (`_launch._hooked`), for either hook, as None, a function or a chain of them (newer triton)."""
    from types import SimpleNamespace

    from kernelhub_triton import _launch

    class Chain:  # triton's HookChain: a list of functions
        def __init__(self, calls):
            self.calls = calls

    def hook(metadata):
        pass

    assert not _launch._hooked(SimpleNamespace(launch_enter_hook=None, launch_exit_hook=None))
    assert not _launch._hooked(SimpleNamespace(launch_enter_hook=Chain([]), launch_exit_hook=Chain([])))
    assert _launch._hooked(SimpleNamespace(launch_enter_hook=hook, launch_exit_hook=None))
    assert _launch._hooked(SimpleNamespace(launch_enter_hook=None, launch_exit_hook=Chain([hook])))
    assert _launch._hooked(SimpleNamespace(launch_enter_hook=Chain([hook]), launch_exit_hook=Chain([])))


@pytest.mark.skipif(not CUDA, reason="launch keeps compiled kernels for CUDA tensors (the interpreter has none)")
def test_launch_keeps_the_compiled_kernel_per_key_and_matches_tritons_own_launch():
    from kernelhub_triton import _launch, tv

    v = torch.randn(2, 9, 10, 11, device="cuda", dtype=torch.float64)
    expected = kernelhub.op("tv_loss_l1_3d", backend="torch_ref")(v)
    _launch._HANDLES.clear()
    first = tv.l1_forward(v)  # Triton's own launch, which compiles; its kernel is kept
    assert len(_launch._HANDLES) == 1
    again = tv.l1_forward(v)  # the kept kernel, called directly
    assert len(_launch._HANDLES) == 1 and torch.equal(first, again)
    torch.testing.assert_close(again, expected)
    # a pointer that is not 16-byte aligned is another specialisation: a key of its own, the right result
    buf = torch.empty(v.numel() + 1, device="cuda", dtype=v.dtype)
    shifted = buf[1:].view(v.shape).copy_(v)
    torch.testing.assert_close(tv.l1_forward(shifted), expected)
    assert len(_launch._HANDLES) == 2
    # a launch on a stream other than the default one runs on that stream
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        on_side = tv.l1_forward(v)
    side.synchronize()
    torch.testing.assert_close(on_side, expected)


@pytest.mark.skipif(not CUDA, reason="launch keeps compiled kernels for CUDA tensors (the interpreter has none)")
def test_launch_refuses_a_cpu_tensor_beside_cuda_ones_as_triton_does():
    """A kept kernel gets each tensor as its address, which Triton's C launcher takes unchecked. A CPU tensor among
    a launch's CUDA tensors makes a key of its own, whose first launch (Triton's own path, which checks each
    address) raises, so nothing is kept for it and no CPU address ever reaches the GPU."""
    import triton
    import triton.language as tl
    from kernelhub_triton import _launch

    @triton.jit
    def copy(x_ptr, y_ptr, n, BLOCK: tl.constexpr):
        offs = tl.arange(0, BLOCK)
        tl.store(y_ptr + offs, tl.load(x_ptr + offs, mask=offs < n), mask=offs < n)

    x = torch.arange(8.0, device="cuda")
    y = torch.zeros(8, device="cuda")
    bound = _launch.Bound(copy, BLOCK=8)
    _launch._HANDLES.clear()
    for _ in range(3):  # Triton's path, then the kept kernel twice
        _launch.launch(bound, (1,), x, y, 8)
    assert len(_launch._HANDLES) == 1 and torch.equal(y, x)
    for _ in range(2):
        with pytest.raises(ValueError, match="cpu tensor"):
            _launch.launch(bound, (1,), x, torch.zeros(8), 8)
    assert len(_launch._HANDLES) == 1
    z = torch.zeros(8, device="cuda")
    _launch.launch(bound, (1,), x, z, 8)
    assert torch.equal(z, x)


@pytest.mark.parametrize("op", ["tv_loss_l1_3d", "tv_loss_iso_3d"])
def test_tv_forward_finishes_its_sum_in_the_launch_on_every_stream_and_in_a_graph(op):
    """The forward's last program sums the partials, counted with a per-stream counter (kernelhub_triton's
    `counter`): calls back to back, calls on two streams at once and a captured call replayed on another stream
    each give the sum of their own volume, bitwise the same every time."""
    fn, ref = kernelhub.op(op, backend="triton"), kernelhub.op(op, backend="torch_ref")
    shape = (2, 64, 128, 128) if CUDA else (2, 5, 6, 7)
    gen = torch.Generator(device=DEVICE).manual_seed(5)
    vols = [torch.randn(shape, device=DEVICE, generator=gen) * (k + 1) for k in range(2)]
    tol = parity.spec_tolerance(kernelhub.get_hub().registry.spec(op), torch.float32).forward
    first = [fn(v) for v in vols]
    for v, out in zip(vols, first):
        expected = ref(v.double())
        assert (out.double() - expected).abs().max() <= tol * expected.abs().max()
        assert all(torch.equal(fn(v), out) for _ in range(3))
    if not CUDA:
        return
    streams = [torch.cuda.Stream() for _ in vols]
    outs: list[list] = [[] for _ in vols]
    for s in streams:
        s.wait_stream(torch.cuda.current_stream())
    for _ in range(20):  # the two streams' launches overlap on the GPU
        for s, v, o in zip(streams, vols, outs):
            with torch.cuda.stream(s):
                o.append(fn(v))
    torch.cuda.synchronize()
    assert all(torch.equal(r, f) for o, f in zip(outs, first) for r in o)
    graph = torch.cuda.CUDAGraph()
    static = vols[0].clone()
    with torch.cuda.graph(graph):
        captured = fn(static)
    static.copy_(vols[1])
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        graph.replay()
        eager = fn(vols[0])  # the side stream's own counter, after the replay on that stream
    torch.cuda.synchronize()
    assert torch.equal(captured, first[1]) and torch.equal(eager, first[0])


@pytest.mark.parametrize("op", ["tv_loss_l1_3d", "tv_loss_sq_3d", "tv_loss_iso_3d"])
def test_tv_in_narrow_tall_tiles_matches_the_reference(op, monkeypatch):
    """tv.LAUNCH's widest row: with rows of 8 voxels, tiles of 8 x 8 cover a 9 x 21 plane in 2 x 3 tiles, so every
    (h +- 1, w) and (h, w +- 1) neighbour the kernels read at a tile's edge is another program's (the shipped rows of
    256 make one tile row across every plane the other tests use); forward and backward against float64."""
    from kernelhub_triton import tv

    monkeypatch.setattr(tv, "LAUNCH", {mode: (64, 4, 32, 32, 8) for mode in (tv.L1, tv.SQ, tv.ISO)})
    tv._layout.cache_clear()
    try:
        gen = torch.Generator(device=DEVICE).manual_seed(5)
        v = torch.randn(2, 5, 9, 21, device=DEVICE, dtype=torch.float64, generator=gen)
        layout = tv._layout(tuple(v.shape), tv.sm_count(v), tv.L1, v.dtype, False)
        assert layout[0] % 6 == 0 and layout[2] % 6 == 0  # 2 x 3 tiles a plane, times the items and D chunks
        outs = {}
        for backend in ("triton", "torch_ref"):
            x = v.clone().requires_grad_()
            out = kernelhub.op(op, backend=backend)(x)
            out.backward(torch.arange(1, out.numel() + 1, dtype=out.dtype, device=DEVICE).reshape(out.shape))
            outs[backend] = (out.detach(), x.grad)
        torch.testing.assert_close(outs["triton"][0], outs["torch_ref"][0], rtol=1e-12, atol=1e-12)
        torch.testing.assert_close(outs["triton"][1], outs["torch_ref"][1], rtol=1e-12, atol=1e-12)
    finally:
        monkeypatch.undo()
        tv._layout.cache_clear()
