"""kernelhub.nn and the semiconv op's group_broadcasting.

pytorch_nd_semiconv is not installed here (it is not in the test extra: its compiled path needs a numpy it does
not declare), so the expected values come from the formulas of its documentation: the isotropic quadratic
kernel ``-|x|^2 / s^2``, dilation ``max_y x(p - y) + b(y)``, erosion with ``tropical_min_negated`` =
``min_y x(p + y) - b(y)``, group broadcasting = the one group's kernel repeated for every group."""

import math

import harness
import pytest
import torch
import torch.nn.functional as F

import kernelhub
from kernelhub import nn as khnn

BACKENDS = ["torch_ref", "cuda_ext", "triton"]


def _backend(name):
    hub = kernelhub.get_hub()
    if name not in hub.registry.backends or (name != "triton" and hub.registry.unavailable_reason(name)):
        pytest.skip(f"{name}: {hub.registry.unavailable_reason(name)}")
    return name


# -- group_broadcasting in the op ----------------------------------------------------------------------------------
@harness.cuda  # on the GPU where there is one
@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("semifield, groups, nd", [("tropical_max", 3, 2), ("linear", 2, 1), ("log:1.5", 2, 2),
                                                   ("tropical_min", 4, 2)])  # 3-D: the conformance edge samples
def test_group_broadcasting_equals_the_kernel_repeated_and_sums_its_gradient(backend, semifield, groups, nd):
    _backend(backend)
    g = torch.Generator().manual_seed(0)
    dev = "cuda" if torch.cuda.is_available() else "cpu"  # triton: the GPU, or its interpreter on CPU tensors
    img = torch.randn(2, groups * 2, *[6] * nd, generator=g, dtype=torch.float64).to(dev).requires_grad_()
    ker = torch.randn(3, 2, *[3] * nd, generator=g, dtype=torch.float64).to(dev).requires_grad_()  # one group's
    op = kernelhub.op("semiconv", backend=backend)
    out = op(img, ker, semifield, 1, 1, 1, groups, "conv", True)
    rep = ker.detach().repeat(groups, *[1] * (nd + 1)).requires_grad_()
    ref = kernelhub.op("semiconv", backend="torch_ref")(img, rep, semifield, 1, 1, 1, groups, "conv")
    assert out.shape == ref.shape == (2, 3 * groups, *[6] * nd)
    torch.testing.assert_close(out, ref, rtol=1e-12, atol=1e-12)
    w = torch.randn(out.shape, generator=g, dtype=torch.float64).to(dev)
    gi, gk = torch.autograd.grad((out * w).sum(), (img, ker))
    ri, rk = torch.autograd.grad((ref * w).sum(), (img, rep))
    torch.testing.assert_close(gi, ri, rtol=1e-10, atol=1e-10)
    torch.testing.assert_close(gk, rk.reshape(groups, *ker.shape).sum(0), rtol=1e-10, atol=1e-10)


def test_group_broadcasting_is_checked_and_keyed():
    img, ker = torch.randn(1, 4, 5, 5), torch.randn(2, 2, 3, 3)
    assert kernelhub.op("semiconv")(img, ker, group_broadcasting=True, groups=2).shape == (1, 4, 3, 3)
    with pytest.raises(ValueError, match="semiconv: argument 'kernel'"):
        kernelhub.op("semiconv")(img, torch.randn(2, 4, 3, 3), groups=2, group_broadcasting=True)
    with pytest.raises(TypeError, match="group_broadcasting"):
        kernelhub.op("semiconv")(img, ker, groups=2, group_broadcasting="yes")


# -- TVLoss3d ------------------------------------------------------------------------------------------------------
def _tv_formula(v, kind, weights, reduction, eps=1e-8):
    d = [v.diff(dim=a) for a in (-3, -2, -1)]
    if kind == "l1":
        sums = [x.abs().sum() for x in d]
        counts = [x[0].numel() if v.ndim > 3 else x.numel() for x in d]
        if reduction == "sum":
            return sum(w * s for w, s in zip(weights, sums))
        active = [a for a in range(3) if weights[a] > 0 and counts[a] > 0]
        return sum(weights[a] * sums[a] / counts[a] for a in active) / len(active)
    if kind == "sq":
        total = sum((x * x).sum() for x in d)
        per_volume = sum(x[0].numel() if v.ndim > 3 else x.numel() for x in d)
        return weights[0] * (total / per_volume if reduction == "mean" else total)
    D, H, W = v.shape[-3:]
    corner = (d[0][..., :, :H - 1, :W - 1] ** 2 + d[1][..., :D - 1, :, :W - 1] ** 2
              + d[2][..., :D - 1, :H - 1, :] ** 2 + eps).sqrt()
    return weights[0] * (corner.mean() if reduction == "mean" else corner.sum())


@pytest.mark.parametrize("kind, weights", [("l1", (1.0, 0.5, 0.25)), ("l1", (0.0, 1.0, 1.0)), ("sq", (2.0,) * 3),
                                           ("iso", (1.5,) * 3)])
@pytest.mark.parametrize("reduction", ["mean", "sum"])
@pytest.mark.parametrize("shape", [(5, 6, 7), (2, 5, 6, 7), (1, 6, 7)])
def test_tvloss3d_is_the_normalised_weighted_formula_values_and_gradients(kind, weights, reduction, shape):
    if kind == "iso" and shape[-3] < 2:
        pytest.skip("iso: no corner")
    v = torch.randn(shape, dtype=torch.float64, requires_grad=True)
    loss = khnn.TVLoss3d(kind, weights, reduction)
    out = loss(v)
    ref = _tv_formula(v, kind, weights, reduction)
    torch.testing.assert_close(out, ref, rtol=1e-12, atol=1e-12)
    torch.testing.assert_close(torch.autograd.grad(out, v)[0], torch.autograd.grad(ref, v)[0], rtol=1e-10,
                               atol=1e-12)
    assert out.ndim == 0


@pytest.mark.parametrize("kind", ["l1", "sq", "iso"])
def test_tvloss3d_is_one_autograd_node_one_hub_forward_and_one_hub_backward(kind, monkeypatch):
    """The weighting is inside the op's node (`OpHandle.weighted`): the loss's graph is that node and the
    volume's AccumulateGrad, and a forward + backward is one hub forward and one hub backward."""
    hub, calls = kernelhub.get_hub(), []
    forward, backward = hub.forward, hub.backward_grads
    monkeypatch.setattr(hub, "forward", lambda *a, **k: calls.append("forward") or forward(*a, **k))
    monkeypatch.setattr(hub, "backward_grads", lambda *a, **k: calls.append("backward") or backward(*a, **k))
    v = torch.randn(2, 5, 6, 7, requires_grad=True)
    loss = khnn.TVLoss3d(kind, 0.5)
    for _ in range(2):  # the second call from the memo, with the coefficients kept
        out = loss(v)
        assert type(out.grad_fn).__name__ == "KernelhubFunctionBackward"
        assert [type(f).__name__ for f, _ in out.grad_fn.next_functions] == ["AccumulateGrad"]
        out.backward()
    assert calls == ["forward", "backward"] * 2 and len(loss._weighted) == 1


def test_tvloss3d_refuses_what_it_cannot_weigh():
    with pytest.raises(ValueError, match="takes one weight"):
        khnn.TVLoss3d("sq", (1.0, 0.5, 0.5))
    with pytest.raises(ValueError, match="kind must be one of"):
        khnn.TVLoss3d("l2")
    with pytest.raises(ValueError, match="weights"):
        khnn.TVLoss3d("l1", (1.0, -1.0, 1.0))
    with pytest.raises(ValueError, match=r"TVLoss3d: argument 'volume' must be a tensor \[\.\.\., D, H, W\], "
                                         r"got \(4, 5\)"):
        khnn.TVLoss3d()(torch.ones(4, 5))
    with pytest.raises(ValueError, match="TVLoss3d: argument 'volume' must be a tensor .* got list"):
        khnn.TVLoss3d()([1.0])


def test_tvloss3d_keeps_its_coefficients_per_volume_size_and_a_bounded_number_of_them():
    loss, iso_sum = khnn.TVLoss3d("l1", (1.0, 0.5, 0.5)), khnn.TVLoss3d("iso", 1.0, "sum")
    for batch in (1, 2, 3):  # the batch changes l1's coefficients not, iso "sum"'s (every volume's corners) yes
        v = torch.randn(batch, 4, 5, 6)
        torch.testing.assert_close(loss(v), _tv_formula(v, "l1", (1.0, 0.5, 0.5), "mean"))
        torch.testing.assert_close(iso_sum(v), _tv_formula(v, "iso", (1.0,) * 3, "sum"))
    assert len(loss._weighted) == 1 and len(iso_sum._weighted) == 3
    for d in range(3, 70):
        loss(torch.randn(d, 3, 3))
    assert 0 < len(loss._weighted) <= 64


# -- kernels, SemiConv, Closing, Opening ---------------------------------------------------------------------------
def test_quadratic_iso_kernel_is_minus_squared_distance_over_variance():
    k = khnn.QuadraticKernelIso2D(2, 3, 5, {"var": 3.0})
    w = k()
    assert w.shape == (3, 2, 5, 5)
    y, x = torch.meshgrid(torch.arange(5.0) - 2, torch.arange(5.0) - 2, indexing="ij")
    torch.testing.assert_close(w[1, 0], -(y * y + x * x) / 3.0)
    for init in ("ss", "log-ss", "uniform", "normal"):
        var = khnn.QuadraticKernelIso2D(4, 4, 5, {"var": init}).log_std.detach().mul(2).exp()
        assert var.min() >= 1 - 1e-5 and var.max() <= 16 + 1e-4, init
    ss = khnn.QuadraticKernelIso2D(2, 2, 5).log_std.detach().mul(2).exp().flatten().sort().values
    torch.testing.assert_close(ss, torch.linspace(1, 8, 4))  # scale-space: evenly spaced in [1, 2 (K//2)^2]
    # the squared distances it keeps follow a state dict's grid, as the formula on the loaded grid does
    state = k.state_dict()
    state["_pos_grid"] = state["_pos_grid"] * 2
    k.load_state_dict(state)
    torch.testing.assert_close(k()[1, 0], -4 * (y * y + x * x) / 3.0)
    assert set(state) == {"log_std", "_pos_grid"}


def test_anisotropic_quadratic_kernels_are_minus_the_mahalanobis_distance():
    y, x = torch.meshgrid(torch.arange(5.0) - 2, torch.arange(5.0) - 2, indexing="ij")
    p = torch.stack((y.flatten(), x.flatten()))  # tap offsets (row, column)
    spec = khnn.QuadraticKernelSpectral2D(2, 3, 5)
    chol = khnn.QuadraticKernelCholesky2D(2, 3, 5)
    with torch.no_grad():
        spec.covs.theta.zero_()
        spec.covs.log_std.copy_(torch.tensor([2.0, 9.0]).log().mul(0.5))  # variances 2 (rows) and 9 (columns)
        torch.testing.assert_close(spec()[2, 1], -(y * y / 2 + x * x / 9))
        spec.covs.theta.fill_(0.3)
        c, s_ = math.cos(0.3), math.sin(0.3)
        rot = torch.tensor([[c, -s_], [s_, c]])
        inv = rot @ torch.diag(torch.tensor([1 / 2.0, 1 / 9.0])) @ rot.T
        torch.testing.assert_close(spec()[0, 0].flatten(), -(p * (inv @ p)).sum(0))
        chol.covs.corr.fill_(0.4)
        L = chol.covs.cholesky()[1, 1]
        cov = L @ L.T
        torch.testing.assert_close(chol()[1, 1].flatten(), -(p * (torch.linalg.inv(cov) @ p)).sum(0), rtol=1e-5,
                                   atol=1e-5)
    var = khnn.QuadraticKernelSpectral2D(4, 4, 5).covs.log_std.detach().mul(2).exp()  # "skewed"
    assert var[..., 0].min() >= 1 - 1e-5 and var[..., 0].max() <= 8 + 1e-4 and var[..., 1].min() >= 20 - 1e-4
    theta = khnn.QuadraticKernelSpectral2D(2, 2, 5).covs.theta.detach().flatten().sort().values  # "spin"
    torch.testing.assert_close(theta, torch.linspace(0, math.pi, 5)[:-1])
    chol_var = khnn.QuadraticKernelCholesky2D(3, 3, 5, {"var": "ss-iso"}).covs.log_std.detach().mul(2).exp()
    torch.testing.assert_close(chol_var[0], chol_var[1])
    kernel = khnn.QuadraticKernelCholesky2D(1, 2, 5)
    khnn.SemiConv(kernel, "tropical_max", padding="same", groups=2)(torch.randn(1, 2, 8, 8)).sum().backward()
    assert kernel.covs.corr.grad is not None and kernel.covs.log_std.grad is not None


def _dilation_formula(x, b):
    """max_y x(p - y) + b(y) over the kernel's taps, x [B, C, H, W] padded 'same' with -inf, depthwise
    b [C, 1, K, K]."""
    K = b.shape[-1]
    xp = F.pad(x, [K // 2] * 4, value=-math.inf)
    H, W = x.shape[-2:]
    out = torch.full_like(x, -math.inf)
    for i in range(K):
        for j in range(K):  # tap (i, j) of the flipped kernel reads x at offset (i, j) of the window
            out = torch.maximum(out, xp[..., i:i + H, j:j + W] + b[:, 0, K - 1 - i, K - 1 - j][None, :, None, None])
    return out


def test_semiconv_module_with_a_quadratic_kernel_is_the_dilation_formula_and_learns():
    kernel = khnn.QuadraticKernelIso2D(1, 3, 5, {"var": 2.0})
    conv = khnn.SemiConv(kernel, "tropical_max", padding="same", groups=3)
    x = torch.randn(2, 3, 9, 8)
    out = conv(x)
    torch.testing.assert_close(out, _dilation_formula(x, kernel().detach()))
    out.sum().backward()
    assert kernel.log_std.grad is not None and kernel.log_std.grad.abs().sum() > 0
    alias = khnn.SemiConv(kernel, "tropical_min_negated", padding="same", groups=3, kind="corr")
    torch.testing.assert_close(alias(x), -_dilation_formula(-x, kernel().detach().flip(-1, -2)))


@pytest.mark.parametrize("broadcast", [False, True])
def test_closing_is_above_and_opening_below_the_input(broadcast):
    torch.manual_seed(0)
    kernel = khnn.LearnedKernel(1, 1 if broadcast else 4, 3, init="normal")
    x = torch.randn(2, 4, 10, 9)
    close = khnn.Closing(kernel, padding="same", groups=4, group_broadcasting=broadcast)
    open_ = khnn.Opening(kernel, padding="same", groups=4, group_broadcasting=broadcast)
    assert (close(x) >= x - 1e-6).all() and (open_(x) <= x + 1e-6).all()
    assert not torch.equal(close(x), x)  # it did something
    close(x).sum().backward()
    assert kernel.kernel.grad is not None


def test_the_modules_go_through_the_hub():
    calls = []
    hub = kernelhub.get_hub()
    real = hub.forward
    hub.forward = lambda op, *rest, **kw: calls.append(op) or real(op, *rest, **kw)
    try:
        khnn.TVLoss3d()(torch.randn(4, 5, 6))
        khnn.SemiConv(torch.zeros(2, 1, 3, 3), "tropical_max", groups=2)(torch.randn(1, 2, 5, 5))
    finally:
        hub.forward = real
    assert calls == ["tv_loss_l1_3d", "semiconv"]


def test_kplanes_field_features_and_taps_are_the_ops_on_its_planes():
    field = khnn.KPlanesField(T=2, C=3, resolutions=[4, 8], seed=1)
    assert field.rotations.shape == (2, 3, 3) and torch.equal(field.rotations[0], torch.eye(3))
    torch.testing.assert_close(field.rotations[1] @ field.rotations[1].T, torch.eye(3))  # a rotation
    assert [p.shape for p in field.planes] == [(6, 3, 4, 4), (6, 3, 8, 8)] and field.features == 12
    assert "rotations" in dict(field.named_buffers()) and len(list(field.parameters())) == 2
    pts = torch.rand(10, 3) * 2 - 1
    ref = kernelhub.op("kplanes_interp_tilted", backend="torch_ref")
    expected = torch.cat([ref(pts, field.rotations, p) for p in field.planes], dim=-1)
    torch.testing.assert_close(field(pts), expected)
    taps = field(pts, tv_taps=0.05)
    assert taps.shape == (4, 10, 12)
    torch.testing.assert_close(taps[0], expected)
    shifted = pts + 0.05 * torch.eye(3)[1]
    torch.testing.assert_close(taps[2], torch.cat([ref(shifted, field.rotations, p) for p in field.planes], -1))
    taps.sum().backward()
    assert all(p.grad is not None for p in field.planes)
    learned = khnn.KPlanesField(2, 3, [4], learn_rotations=True)
    learned(pts).sum().backward()
    assert learned.rotations.grad is not None


@harness.cuda  # on the GPU where there is one
@pytest.mark.parametrize("backend", BACKENDS)
def test_kplanes_field_planes_are_channels_last_and_their_gradient_keeps_the_planes_layout(backend):
    """KPlanesField stores its planes channels-last, the layout the kernels read (no copy per call); the kernel
    backends' backwards give a planes gradient in the planes' own layout (channels-last or NCHW), equal to the
    reference's."""
    _backend(backend)
    dev = "cuda" if torch.cuda.is_available() else "cpu"  # triton: the GPU, or its interpreter on CPU tensors
    field = khnn.KPlanesField(T=2, C=3, resolutions=[5], seed=2, backend=backend).to(dev).double()
    planes = field.planes[0]
    assert planes.is_contiguous(memory_format=torch.channels_last) and not planes.is_contiguous()
    g = torch.Generator().manual_seed(3)
    pts = (torch.rand(17, 3, generator=g, dtype=torch.float64) * 2 - 1).to(dev)
    op, ref = kernelhub.op("kplanes_interp_tilted", backend=backend), kernelhub.op("kplanes_interp_tilted",
                                                                                 backend="torch_ref")
    for p in (planes.detach(), planes.detach().contiguous()):  # channels-last, then NCHW
        p = p.requires_grad_()
        got, = torch.autograd.grad(op(pts, field.rotations, p).sum(), p)
        want, = torch.autograd.grad(ref(pts, field.rotations, p).sum(), p)
        torch.testing.assert_close(got, want, rtol=1e-10, atol=1e-10)
        if backend != "torch_ref":  # torch's own grid_sample backward gives NCHW
            assert got.stride() == p.stride(), (got.stride(), p.stride())
    field(pts).sum().backward()  # the parameter's .grad follows the parameter's layout (torch's AccumulateGrad)
    assert planes.grad.is_contiguous(memory_format=torch.channels_last)


@pytest.mark.parametrize("kind", ["l1", "sq", "iso"])
def test_a_tvloss3d_first_called_inside_a_compiled_function_makes_its_weighted_handle_there(kind):
    """The weighted handle for a volume size made while dynamo traces (fullgraph) is the graph's, not kept: its
    coefficients would be an output of the graph that a later CUDA-graph replay overwrites."""
    weights = (1.0, 0.5, 0.5) if kind == "l1" else 0.5
    loss, v = khnn.TVLoss3d(kind, weights), torch.randn(2, 6, 7, 8, requires_grad=True)
    compiled = torch.compile(loss, fullgraph=True, backend="aot_eager")
    got = compiled(v)
    want = khnn.TVLoss3d(kind, weights)(v)
    torch.testing.assert_close(got, want)
    torch.testing.assert_close(torch.autograd.grad(got, v)[0], torch.autograd.grad(want, v)[0])
    assert len(loss._weighted) == 0
    torch.testing.assert_close(compiled(v), want)


def test_the_modules_pickle_save_and_deepcopy_through_their_handles():
    """``torch.save`` of a model (pickle), ``copy.deepcopy`` and a plain pickle give modules that compute the same:
    a handle pickles as its op's name, forced backend and weights (`OpHandle.__reduce__`); one of a hub built
    directly is refused with the reason."""
    import copy
    import io
    import pickle

    from kernelhub.hub import Hub

    torch.manual_seed(0)
    x, v, pts = torch.randn(1, 2, 8, 8), torch.randn(2, 4, 5, 6), torch.rand(16, 3) * 2 - 1
    cases = [(khnn.TVLoss3d("l1", (1.0, 0.5, 0.5), backend="torch_ref"), v), (khnn.TVLoss3d("iso", 2.0, "sum"), v),
             (khnn.SemiConv(khnn.QuadraticKernelIso2D(1, 2, 3), "tropical_max", groups=2), x),
             (khnn.Closing(torch.zeros(2, 1, 3, 3), padding=1, groups=2), x), (khnn.KPlanesField(2, 4, [8]), pts)]
    for module, inputs in cases:
        want = module(inputs)  # TVLoss3d: a weighted handle made, which is pickled too
        buffer = io.BytesIO()
        torch.save(module, buffer)
        buffer.seek(0)
        for other in (torch.load(buffer, weights_only=False), copy.deepcopy(module),
                      pickle.loads(pickle.dumps(module))):
            assert other is not module
            torch.testing.assert_close(other(inputs), want, rtol=0, atol=0)
    loss = pickle.loads(pickle.dumps(cases[0][0]))
    assert loss._op.backend == "torch_ref" and loss._op is kernelhub.op("tv_loss_l1_3d", backend="torch_ref")
    with pytest.raises(TypeError, match="tv_loss_l1_3d: a handle of a hub built directly .* cannot be serialised"):
        pickle.dumps(Hub().handle("tv_loss_l1_3d"))


def test_the_modules_compile_whole_and_agree_with_eager():
    """Each module under ``torch.compile(fullgraph=True)``: no graph break, eager's values and gradients."""
    torch.manual_seed(0)
    x = torch.randn(2, 4, 12, 12, requires_grad=True)
    pts = torch.rand(32, 3) * 2 - 1
    vol = torch.randn(2, 6, 7, 8, requires_grad=True)
    cases = [(khnn.SemiConv(khnn.QuadraticKernelIso2D(1, 4, 5), "tropical_max", padding=2, groups=4), (x,)),
             (khnn.Closing(khnn.QuadraticKernelIso2D(1, 4, 3), padding=1, groups=4), (x,)),
             (khnn.KPlanesField(2, 4, [8, 16]), (pts,)),
             (khnn.TVLoss3d("l1", (1.0, 0.5, 0.5)), (vol,))]
    for module, inputs in cases:
        leaves = [t for t in (*inputs, *module.parameters()) if t.requires_grad]
        want = module(*inputs)
        want_g = torch.autograd.grad(want.square().sum(), leaves)
        compiled = torch.compile(module, fullgraph=True, backend="aot_eager")
        got = compiled(*inputs)
        got_g = torch.autograd.grad(got.square().sum(), leaves)
        torch.testing.assert_close(got, want)
        for g, w in zip(got_g, want_g, strict=True):
            torch.testing.assert_close(g, w)
    field = cases[2][0]
    torch.testing.assert_close(torch.compile(field, fullgraph=True, backend="aot_eager")(pts, tv_taps=0.01),
                               field(pts, tv_taps=0.01))


def _k():
    return khnn.QuadraticKernelIso2D(1, 4, 3)


@pytest.mark.parametrize("make, says", [
    (lambda: khnn.KPlanesField(T=-1, C=2, resolutions=[8]), r"KPlanesField: argument 'T' must be an int >= 1, got -1"),
    (lambda: khnn.KPlanesField(T=2.5, C=2, resolutions=[8]), r"KPlanesField: argument 'T' must be an int >= 1, got 2"),
    (lambda: khnn.KPlanesField(T=0, C=2, resolutions=[8]), r"KPlanesField: argument 'T' must be an int >= 1, got 0"),
    (lambda: khnn.KPlanesField(2, -2, [8]), r"KPlanesField: argument 'C' must be an int >= 1, got -2"),
    (lambda: khnn.KPlanesField(2, 2, 8), r"KPlanesField: argument 'resolutions' must be a non-empty list .* got 8"),
    (lambda: khnn.KPlanesField(2, 2, ()), r"KPlanesField: argument 'resolutions' must be a non-empty list"),
    (lambda: khnn.KPlanesField(2, 2, (0,)), r"KPlanesField: argument 'resolutions' must be an int >= 1 .* got \[0\]"),
    (lambda: khnn.KPlanesField(2, 2, [8], tilt=float("nan")), r"KPlanesField: argument 'tilt' must be a finite number"),
    (lambda: khnn.SemiConv("x", "tropical_max"), r"SemiConv: argument 'kernel' must be a kernel module .* got str"),
    (lambda: khnn.Closing(None), r"Closing: argument 'kernel' must be a kernel module .* got NoneType"),
    (lambda: khnn.LearnedKernel(-1, 2, 3), r"LearnedKernel: argument 'in_channels' must be an int >= 1, got -1"),
    (lambda: khnn.LearnedKernel(1, 2, 3, ndim=4), r"LearnedKernel: argument 'ndim' must be 1, 2 or 3"),
    (lambda: khnn.QuadraticKernelIso2D(1, 1, 3, init=5), r"QuadraticKernelIso2D: argument 'init' must be a dict"),
    (lambda: khnn.SemiConv(_k(), "tropical_max", stride=0), r"SemiConv: argument 'stride' must be an int >= 1"),
    (lambda: khnn.SemiConv(_k(), "tropical_max", groups=0), r"SemiConv: argument 'groups' must be an int >= 1"),
    (lambda: khnn.SemiConv(_k(), "tropical_max", padding="full"), r"SemiConv: argument 'padding' got 'full' \(an int"),
    (lambda: khnn.SemiConv(_k(), "tropical_max", kind="CONV"), r"SemiConv: argument 'kind' must be 'conv' or 'corr'"),
    (lambda: khnn.Closing(_k(), stride=-1), r"Closing: argument 'stride' must be an int >= 1 .* got -1")])
def test_module_constructors_refuse_what_the_first_forward_would(make, says):
    """Each constructor names the module, the argument, what it got and what it takes (these raised errors naming
    neither, failed only at the first forward with the op's error, or were accepted: NaN rotations)."""
    with pytest.raises((ValueError, TypeError), match=says):
        make()


def test_module_constructors_take_every_form_the_op_does():
    k = _k()
    for padding in ("same", "valid", "same_strided", 1, [1, 2], [[1, 1], [0, 2]]):
        khnn.SemiConv(k, "tropical_max", padding=padding, stride=(1, 2), groups=4)
    khnn.Opening(k, padding=[[1, 1], [1, 1]], dilation=[1, 2], groups=4)
    assert khnn.LearnedKernel(2, 3, (3, 5), ndim=2)().shape == (3, 2, 3, 5)
    assert khnn.KPlanesField(1, 3, (8, 16)).features == 6


@pytest.mark.parametrize("make", [lambda: khnn.QuadraticKernelIso2D(1, 4, 1),
                                  lambda: khnn.QuadraticKernelSpectral2D(1, 4, 1, init={"var": "ss-iso"}),
                                  lambda: khnn.QuadraticKernelCholesky2D(1, 4, 1, init={"var": "ss-iso"}),
                                  lambda: khnn.QuadraticKernelIso2D(1, 4, 1, init={"var": "log-ss"})])
def test_a_size_1_quadratic_kernel_is_finite(make):
    kernel = make()
    assert torch.isfinite(kernel()).all(), kernel()
    out = khnn.SemiConv(kernel, "tropical_max", groups=1)(torch.randn(1, 1, 5, 5))
    assert torch.isfinite(out).all()



@pytest.mark.parametrize("make, says", [
    (lambda: khnn.TVLoss3d(weights="0.5"), "TVLoss3d: weights"),
    (lambda: khnn.TVLoss3d(weights="123"), "TVLoss3d: weights"),
    (lambda: khnn.QuadraticKernelIso2D(1, 1, -3), "QuadraticKernelIso2D: argument .kernel_size."),
    (lambda: khnn.QuadraticKernelIso2D(1, 1, 0), "QuadraticKernelIso2D: argument .kernel_size.")])
def test_module_constructors_name_the_module_and_argument(make, says):
    with pytest.raises((ValueError, TypeError), match=says):
        make()
