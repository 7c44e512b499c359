"""kernelhub.nn against pytorch_nd_semiconv: a model ports by changing its imports.

Where pytorch_nd_semiconv is installed (it is in the test extra: it installs cleanly with today's numpy and its
pure-torch path, ``BroadcastSemifield(...).dynamic()``, runs on any device), the expected values are its own:
``GenericConv`` / ``GenericClosing`` with that path on the same inputs, and its quadratic kernels, whose state dicts
load into ours unchanged. Where it is not installed, the expected values come from the formulas of its
documentation (``expected_conv`` below: pad with the semifield's zero, its ``"same"`` rule, windows, the kernel
flipped for ``kind="conv"``, ``⊗`` then ``⊕`` over (channel, taps)), and the kernel tests skip (tests/test_nn.py
checks our kernels against their formulas). Float64 inputs drawn at random (no ties), so values and gradients
agree to float64 rounding."""

import importlib.util
import itertools

import harness
import pytest
import torch
from torch import nn

import kernelhub
from kernelhub import nn as khnn

HAVE_PACKAGE = importlib.util.find_spec("pytorch_nd_semiconv") is not None
DEVICES = ["cpu"] + (["cuda"] if torch.cuda.is_available() else [])


def _backends(device):
    hub = kernelhub.get_hub()
    names = ["torch_ref", "cuda_ext"] + (["triton"] if device == "cuda" else [])
    return [n for n in names if n in hub.registry.backends and not hub.registry.unavailable_reason(n)]


# -- the expected values -------------------------------------------------------------------------------------------
# semifield name (ours) -> (multiply, reduce over dims, the absorbing zero padded with, the package's constructor)
SEMIFIELDS = {
    "tropical_max": (torch.add, lambda a, d: a.amax(d), -torch.inf, ("tropical_max",)),
    "tropical_min_negated": (torch.sub, lambda a, d: a.amin(d), torch.inf, ("tropical_min_negated",)),
    "linear": (torch.mul, lambda a, d: a.sum(d), 0.0, ("linear",)),
    "log:2": (torch.add, lambda a, d: torch.logsumexp(2 * a, d) / 2, -torch.inf, ("log", 2.0)),
    "log:-1.5": (torch.add, lambda a, d: torch.logsumexp(-1.5 * a, d) / -1.5, torch.inf, ("log", -1.5)),
    "root:2": (torch.mul, lambda a, d: a.pow(2).sum(d).sqrt(), 0.0, ("root", 2.0)),
}


def _pairs(padding, ksize, dilation):
    """The documented padding forms as (begin, end) per spatial dim; "same" = k - 1 dilated steps, odd one last."""
    n = len(ksize)
    dil = (dilation,) * n if isinstance(dilation, int) else dilation
    if padding == "valid":
        return [(0, 0)] * n
    if padding == "same":
        return [(((k - 1) // 2) * d, (k - 1 - (k - 1) // 2) * d) for k, d in zip(ksize, dil)]
    if isinstance(padding, int):
        return [(padding, padding)] * n
    return [p if isinstance(p, tuple) else (p, p) for p in padding]


def expected_conv(x, k, semifield, stride, padding, dilation, groups, group_broadcasting, kind):
    """pytorch_nd_semiconv's documented semifield convolution, from the formulas (no kernelhub code)."""
    mul, reduce, zero, _ = SEMIFIELDS[semifield]
    n = x.dim() - 2
    ksize = tuple(k.shape[2:])
    stride = (stride,) * n if isinstance(stride, int) else stride
    dil = (dilation,) * n if isinstance(dilation, int) else dilation
    pads = _pairs(padding, ksize, dilation)
    xp = torch.constant_pad_nd(x, [p for pair in reversed(pads) for p in pair], zero)
    win = xp
    for i in range(n):  # windows: [B, C, *out, *K]
        win = win.unfold(2 + i, dil[i] * (ksize[i] - 1) + 1, stride[i])
    for i in range(n):  # the dilated taps of each window
        win = win[(slice(None),) * (2 + n + i) + (slice(None, None, dil[i]),)]
    B, C = x.shape[:2]
    out_sp = win.shape[2:2 + n]
    if group_broadcasting:
        k = k.repeat(groups, *([1] * (k.dim() - 1)))
    if kind == "conv":
        k = k.flip(tuple(range(2, 2 + n)))
    O, Cg = k.shape[:2]
    win = win.reshape(B, groups, 1, Cg, *out_sp, *ksize)
    kk = k.reshape(1, groups, O // groups, Cg, *([1] * n), *ksize)
    out = reduce(mul(win, kk), (3, *range(4 + n, 4 + 2 * n)))
    return out.reshape(B, O, *out_sp)


class _Fixed(nn.Module):
    """A kernel module holding a tensor parameter ``kernel`` (LearnedKernel's parameter name)."""

    def __init__(self, kernel):
        super().__init__()
        self.kernel = nn.Parameter(kernel.clone())

    def forward(self):
        return self.kernel


def _theirs(kernel_module, semifield, **conv_args):
    if not HAVE_PACKAGE:
        return lambda x: expected_conv(x, kernel_module(), semifield, **conv_args)
    import pytorch_nd_semiconv as pnds
    name, *param = SEMIFIELDS[semifield][3]
    conv = getattr(pnds.BroadcastSemifield, name)(*param).dynamic()
    return pnds.GenericConv(kernel_module, conv, **conv_args)


# -- SemiConv = GenericConv ----------------------------------------------------------------------------------------
# (semifield, kernel: (module name, in per group, out, size) or a spatial shape, image [B, C, *S], stride, padding,
#  dilation, groups, group_broadcasting, kind): every semifield, padding form, stride, dilation, groups and
# group_broadcasting, 1-3 spatial dims, even and odd kernels
CASES = [
    ("tropical_max", ("QuadraticKernelIso2D", 1, 4, 5), (2, 4, 9, 10), 1, "same", 1, 4, False, "conv"),
    ("tropical_max", ("QuadraticKernelIso2D", 1, 2, 4), (2, 3, 9, 10), 2, "same", 2, 3, True, "conv"),
    ("tropical_max", ("QuadraticKernelCholesky2D", 1, 4, 4), (2, 2, 8, 9), 1, "same", 1, 2, False, "corr"),
    ("tropical_min_negated", ("QuadraticKernelSpectral2D", 2, 3, 3), (2, 2, 9, 10), (1, 2), 1, 1, 1, False, "corr"),
    ("tropical_min_negated", ("QuadraticKernelCholesky2D", 2, 4, 5), (2, 4, 9, 10), 1, ((0, 2), (1, 0)), (2, 1), 2,
     False, "conv"),
    ("tropical_min_negated", ("LearnedKernel2D", 1, 1, 2), (2, 1, 7, 8), 3, "same", 1, 1, False, "conv"),
    ("linear", ("LearnedKernel2D", 2, 3, 3), (2, 4, 9, 10), 1, (1, 2), 1, 2, True, "corr"),
    ("log:2", ("QuadraticKernelIso2D", 1, 2, 3), (2, 2, 9, 10), 2, "same", 1, 2, False, "conv"),
    ("log:-1.5", ("QuadraticKernelSpectral2D", 2, 2, 3), (2, 2, 9, 10), 1, "valid", 2, 1, False, "corr"),
    ("root:2", ("LearnedKernel2D", 2, 3, 3), (2, 2, 9, 10), 1, 0, 1, 1, False, "conv"),
    ("tropical_max", (4,), (2, 4, 17), 2, "same", 3, 4, False, "conv"),
    ("log:2", (3, 3, 3), (1, 2, 6, 7, 5), (1, 2, 1), 1, 1, 2, True, "conv"),
]


def _kernels(spec, groups, group_broadcasting, C, positive):
    """(ours, theirs): the same kernel as two modules with equal state dicts."""
    torch.manual_seed(0)
    if isinstance(spec[0], str):
        name, cin, cout, size = spec
        ours = getattr(khnn, name)(cin, cout, size)  # float32 parameters (the package's Cholesky kernel is float32
        if HAVE_PACKAGE:                            # whatever its parameters' dtype); the images are float64
            theirs = getattr(__import__("pytorch_nd_semiconv"), name)(cin, cout, size)
            ours.load_state_dict(theirs.state_dict())  # strict: same names and shapes
        else:  # the convolution's formula alone: both hold the kernel as a tensor
            ours, theirs = _Fixed(ours().detach()), _Fixed(ours().detach())
    else:
        cout = C if not group_broadcasting else C // groups
        kernel = torch.randn(cout, C // groups, *spec, dtype=torch.float64)
        ours, theirs = khnn.LearnedKernel(C // groups, cout, spec, ndim=len(spec)), _Fixed(kernel)
        ours.kernel.data = kernel.clone()
    if positive:  # root semifields: inputs >= 0
        for m in (ours, theirs):
            for p in m.parameters():
                p.data = p.data.abs() + 0.1
    return ours, theirs


@pytest.mark.parametrize("device", harness.devices())
@pytest.mark.parametrize("case", CASES, ids=lambda c: f"{c[0]}-{c[1][0] if isinstance(c[1][0], str) else len(c[1])}d")
def test_semiconv_equals_generic_conv_values_and_gradients(case, device):
    semifield, kspec, shape, stride, padding, dilation, groups, bcast, kind = case
    root = semifield.startswith("root")
    torch.manual_seed(1)
    x = torch.randn(shape, dtype=torch.float64)
    x = (x.abs() + 0.1 if root else x).to(device)
    args = dict(stride=stride, padding=padding, dilation=dilation, groups=groups, group_broadcasting=bcast,
                kind=kind)
    for backend in _backends(device):
        ours, theirs = (m.to(device) for m in _kernels(kspec, groups, bcast, shape[1], root))
        torch.testing.assert_close(ours(), theirs())
        xo, xt = x.clone().requires_grad_(), x.clone().requires_grad_()
        out = khnn.SemiConv(ours, semifield, backend=backend, **args)(xo)
        want = _theirs(theirs, semifield, **args)(xt)
        torch.testing.assert_close(out, want, msg=lambda m: f"{backend}: {m}")
        g = torch.randn_like(want)
        out.backward(g)
        want.backward(g)
        torch.testing.assert_close(xo.grad, xt.grad, msg=lambda m: f"{backend}, img grad: {m}")
        mine, other = dict(ours.named_parameters()), dict(theirs.named_parameters())
        assert mine.keys() == other.keys()
        for name in mine:
            torch.testing.assert_close(mine[name].grad, other[name].grad, msg=lambda m: f"{backend}, {name}: {m}")


@pytest.mark.parametrize("group_broadcasting", [False, True])
def test_closing_equals_generic_closing(group_broadcasting):
    torch.manual_seed(2)
    x = torch.randn(2, 4, 9, 10, dtype=torch.float64, requires_grad=True)
    ours, theirs = _kernels(("QuadraticKernelCholesky2D", 1, 1 if group_broadcasting else 4, 3), 4,
                            group_broadcasting, 4, False)
    args = dict(stride=1, padding="same", dilation=1, groups=4, group_broadcasting=group_broadcasting)
    out = khnn.Closing(ours, **args)(x)
    if HAVE_PACKAGE:
        import pytorch_nd_semiconv as pnds
        want = pnds.GenericClosing(theirs, pnds.BroadcastSemifield.tropical_max().dynamic(),
                                   pnds.BroadcastSemifield.tropical_min_negated().dynamic(), **args)(x)
    else:
        want = expected_conv(expected_conv(x, theirs(), "tropical_max", kind="conv", **args), theirs(),
                             "tropical_min_negated", kind="corr", **args)
    torch.testing.assert_close(out, want)
    assert (out >= x - 1e-12).all()


# -- the kernels: pytorch_nd_semiconv's state dicts load into ours and give the same kernels ------------------------
@pytest.mark.skipif(not HAVE_PACKAGE, reason="pytorch_nd_semiconv is not installed: tests/test_nn.py checks the "
                                            "kernels against their formulas")
@pytest.mark.parametrize("name, inits", [
    ("QuadraticKernelIso2D", [None, {"var": 3.0}, {"var": "uniform"}, {"var": "log-ss"}, {"var": "normal"}]),
    ("QuadraticKernelSpectral2D", [None, {"var": "ss-iso", "theta": "uniform"}, {"var": "normal", "theta": "spin"}]),
    ("QuadraticKernelCholesky2D", [{"var": "skewed"}, {"var": "uniform-iso"}, {"var": 2.0}]),
    ("LearnedKernel2D", [None]),
])
def test_kernel_modules_port_with_their_state_dicts(name, inits):
    import pytorch_nd_semiconv as pnds
    for init, size in itertools.product(inits, (3, 4, 5)):
        args = (2, 3, size) if init is None else (2, 3, size, init)
        theirs, ours = getattr(pnds, name)(*args), getattr(khnn, name)(*args)
        assert ours().shape == theirs().shape == (3, 2, size, size)
        ours.load_state_dict(theirs.state_dict())  # strict
        torch.testing.assert_close(ours(), theirs())
        if hasattr(theirs, "inspect_parameters"):
            for a, b in zip(ours.inspect_parameters(), theirs.inspect_parameters()):
                torch.testing.assert_close(a, b)


# -- pytorch_nd_semiconv's tropical options: spread_gradient and channels_add (semiconv v3) -------------------------
@pytest.mark.skipif(not HAVE_PACKAGE, reason="pytorch_nd_semiconv is not installed")
@pytest.mark.parametrize("semifield", ["tropical_max", "tropical_min_negated"])
@pytest.mark.parametrize("spread_gradient, channels_add", [(True, False), (False, True), (True, True)])
@pytest.mark.parametrize("integers", [False, True], ids=["random", "ties"])
def test_spread_gradient_and_channels_add_equal_the_packages(semifield, spread_gradient, channels_add, integers):
    """Values and both gradients equal pytorch_nd_semiconv's on random inputs and on small integers (many exact
    ties: where spread_gradient differs from the first-winner rule); the hub serves them with a v3 backend (the
    reference), triton's and cuda_ext's semiconv being v2."""
    import pytorch_nd_semiconv as pnds
    torch.manual_seed(3)
    draw = (lambda *s: torch.randint(0, 3, s).double()) if integers else (lambda *s: torch.randn(*s).double())
    x, k = draw(2, 4, 8, 9), draw(6, 2, 3, 3)
    args = dict(stride=1, padding="same", dilation=1, groups=2, group_broadcasting=False, kind="conv")
    xo, xt = x.clone().requires_grad_(), x.clone().requires_grad_()
    ours, theirs = _Fixed(k), _Fixed(k)
    out = khnn.SemiConv(ours, semifield, spread_gradient=spread_gradient, channels_add=channels_add, **args)(xo)
    conv = getattr(pnds.BroadcastSemifield, semifield)(channels_add=channels_add,
                                                       spread_gradient=spread_gradient).dynamic()
    want = pnds.GenericConv(theirs, conv, **args)(xt)
    torch.testing.assert_close(out, want)
    g = torch.randn_like(want)
    out.backward(g)
    want.backward(g)
    torch.testing.assert_close(xo.grad, xt.grad)
    torch.testing.assert_close(ours.kernel.grad, theirs.kernel.grad)
    chosen = kernelhub.explain("semiconv", x, k, "tropical_max", 1, "same", 1, 2, "conv", False, spread_gradient,
                               channels_add)
    reasons = {c.backend: c.reasons for c in chosen.candidates}
    assert chosen.chosen == "torch_ref" and any("needs v3" in r for r in reasons["cuda_ext"])


def test_a_semifield_object_or_unknown_name_is_refused_at_construction_with_the_string_to_use():
    k = torch.zeros(1, 1, 3, 3)
    if HAVE_PACKAGE:
        import pytorch_nd_semiconv as pnds
        for obj in (pnds.BroadcastSemifield.log(2.0), pnds.BroadcastSemifield.log(2.0).dynamic()):
            for make in (lambda: khnn.SemiConv(k, obj), lambda: kernelhub.op("semiconv")(k, k, obj)):
                with pytest.raises(TypeError, match=r"semiconv: argument 'semifield' must be a str, got \w+ \(a "
                                                    r"pytorch_nd_semiconv semifield: pass its name and parameter "
                                                    r"instead, e.g. BroadcastSemifield.log\(2.0\) -> 'log:2.0'"):
                    make()
    with pytest.raises(ValueError, match=r"must be one of \['tropical_max', 'tropical_min', 'linear', 'root:p', "
                                         r"'log:mu', 'tropical_min_negated'\], got 'tropical'"):
        khnn.SemiConv(k, "tropical")
    assert khnn.SemiConv(k, "tropical_min_negated").semifield == "tropical_min"


# -- closings: the package's checkpoints load, any two semifields -------------------------------------------------
@pytest.mark.skipif(not HAVE_PACKAGE, reason="pytorch_nd_semiconv is not installed")
@pytest.mark.parametrize("semifields", [("tropical_max", "tropical_min_negated"), ("log:2", "log:-1.5")])
def test_a_packages_closing_checkpoint_loads_strictly_and_computes_the_same(semifields):
    """A model holding pytorch_nd_semiconv's GenericClosing as ``close``: its state dict (``close.kernel.*``) loads
    into the same model with kernelhub's GenericClosing (Closing for the tropical pair) with strict=True; ``.kernel``
    is the kernel module; values and every gradient equal, for a log-semifield closing too."""
    import pytorch_nd_semiconv as pnds
    torch.manual_seed(4)
    args = dict(stride=1, padding="same", dilation=1, groups=4, group_broadcasting=False)
    convs = [getattr(pnds.BroadcastSemifield, SEMIFIELDS[s][3][0])(*SEMIFIELDS[s][3][1:]).dynamic() for s in semifields]
    theirs = nn.Sequential()
    theirs.close = pnds.GenericClosing(pnds.QuadraticKernelCholesky2D(1, 4, 3), *convs, **args)
    ours = nn.Sequential()
    kernel = khnn.QuadraticKernelCholesky2D(1, 4, 3)
    ours.close = khnn.Closing(kernel, **args) if semifields[0] == "tropical_max" else \
        khnn.GenericClosing(kernel, *semifields, **args)
    assert sorted(ours.state_dict()) == sorted(theirs.state_dict()) and ours.close.kernel is kernel
    ours.load_state_dict(theirs.state_dict(), strict=True)
    x = torch.randn(2, 4, 9, 10, dtype=torch.float64)
    xo, xt = x.clone().requires_grad_(), x.clone().requires_grad_()
    out, want = ours.close(xo), theirs.close(xt)
    torch.testing.assert_close(out, want)
    g = torch.randn_like(want)
    out.backward(g)
    want.backward(g)
    torch.testing.assert_close(xo.grad, xt.grad)
    for (name, a), (_, b) in zip(ours.named_parameters(), theirs.named_parameters()):
        torch.testing.assert_close(a.grad, b.grad, msg=name)


def test_a_checkpoint_of_the_old_closing_layout_loads_and_a_package_style_call_is_refused_at_construction():
    kernel = khnn.QuadraticKernelIso2D(1, 2, 3)
    old = {f"{part}.kernel.{k}": v for part in ("first", "second") for k, v in kernel.state_dict().items()}
    close = khnn.Closing(khnn.QuadraticKernelIso2D(1, 2, 3), padding=1, groups=2)
    close.load_state_dict(old, strict=True)
    torch.testing.assert_close(close.kernel(), kernel())
    with pytest.raises(TypeError, match=r"Closing: argument 'stride' got 'tropical_max' \(the semifields of a closing "
                                        r"go to kernelhub.nn.GenericClosing\(kernel, dilation_semifield, "
                                        r"erosion_semifield, ...\)\)"):
        khnn.Closing(kernel, "tropical_max", "tropical_min_negated", groups=2)


# -- the one-line conversion ---------------------------------------------------------------------------------------
@pytest.mark.skipif(not HAVE_PACKAGE, reason="pytorch_nd_semiconv is not installed")
@pytest.mark.parametrize("inplace", [False, True])
def test_from_pytorch_nd_semiconv_converts_a_model_keeping_values_and_gradients(inplace):
    """A five-layer pnds morphological model (quadratic Iso / Spectral / Cholesky kernels, a learned kernel with a
    log semifield, stride 2, asymmetric padding, dilation, groups, a GenericClosing with group broadcasting,
    kind="corr", a spread_gradient + channels_add layer) converted in one line: every pnds module replaced, the
    same values and gradients on tied inputs."""
    import pytorch_nd_semiconv as pnds
    torch.manual_seed(5)
    sf = pnds.BroadcastSemifield
    model = nn.Sequential(
        pnds.GenericConv(pnds.QuadraticKernelIso2D(1, 4, 3), sf.tropical_max().dynamic(), padding="same", groups=4),
        pnds.GenericConv(pnds.QuadraticKernelSpectral2D(2, 4, 3), sf.tropical_min_negated().dynamic(), stride=2,
                         padding=((0, 2), (1, 0)), groups=2, kind="corr"),
        pnds.GenericConv(pnds.LearnedKernel2D(4, 4, 3), sf.log(2.0).dynamic(), padding="same", dilation=2),
        pnds.GenericClosing(pnds.QuadraticKernelCholesky2D(1, 1, 3), sf.tropical_max().dynamic(),
                            sf.tropical_min_negated().dynamic(), padding="same", groups=4, group_broadcasting=True),
        pnds.GenericConv(pnds.QuadraticKernelIso2D(2, 4, 3), sf.tropical_max(channels_add=True,
                                                                             spread_gradient=True).dynamic(),
                         padding="same", groups=2),
    ).double()
    x = torch.randint(0, 4, (2, 4, 12, 11)).double()
    xt, xo = x.clone().requires_grad_(), x.clone().requires_grad_()
    want = model(xt)
    converted = khnn.from_pytorch_nd_semiconv(model, inplace=inplace)
    assert (converted is model) == inplace
    assert not [m for m in converted.modules() if type(m).__module__.startswith("pytorch_nd_semiconv")]
    assert [type(m).__name__ for m in converted] == ["SemiConv"] * 3 + ["Closing", "SemiConv"]
    assert converted[4].spread_gradient and converted[4].channels_add and converted[2].semifield == "log:2.0"
    out = converted(xo)
    torch.testing.assert_close(out, want)
    g = torch.randn_like(want)
    want.backward(g)
    out.backward(g)
    torch.testing.assert_close(xo.grad, xt.grad)
    if not inplace:  # the kernels' parameters: float32 rounding (the package's Cholesky kernel computes in float32
        # whatever its parameters' dtype, so its gradients carry float32 sums taken in another order)
        for (name, a), (_, b) in zip(converted.named_parameters(), model.named_parameters()):
            torch.testing.assert_close(a.grad, b.grad, rtol=1e-5, atol=1e-6, msg=lambda m, name=name: f"{name}: {m}")


@pytest.mark.skipif(not HAVE_PACKAGE, reason="pytorch_nd_semiconv is not installed")
def test_from_pytorch_nd_semiconv_refuses_what_it_cannot_convert_and_leaves_the_model_whole():
    import pytorch_nd_semiconv as pnds
    manual = pnds.BroadcastSemifield(add_reduce=lambda a, d: a.sum(d), multiply=lambda a, b: a * b, zero=0.0)
    model = nn.Sequential(pnds.GenericConv(pnds.QuadraticKernelIso2D(1, 2, 3), pnds.BroadcastSemifield.tropical_max()
                                           .dynamic(), groups=2),
                          pnds.GenericConv(pnds.QuadraticKernelIso2D(1, 2, 3), manual.dynamic(), groups=2))
    with pytest.raises(ValueError, match=r"from_pytorch_nd_semiconv: 1: cannot read the semifield of BroadcastConv "
                                         r"\(a semifield made by hand"):
        khnn.from_pytorch_nd_semiconv(model, inplace=True)
    assert isinstance(model[0], pnds.GenericConv)  # untouched


def test_same_means_the_packages_in_the_op_and_the_modules_and_the_old_meaning_is_same_strided():
    """One "same": the op's is pytorch_nd_semiconv's (``d(k-1)`` per dim at any stride, as the modules'); where the
    stride-aware one it had before differs, a call warns FutureWarning naming "same_strided", which keeps it."""
    import warnings
    x, k = torch.randn(2, 3, 10, 9, dtype=torch.float64), torch.randn(3, 1, 4, 3, dtype=torch.float64)
    op, spec = kernelhub.op("semiconv"), kernelhub.get_hub().registry.spec("semiconv")
    with pytest.warns(FutureWarning, match="padding='same' is pytorch_nd_semiconv's .* pass padding='same_strided'"):
        out = op(x, k, "tropical_max", 2, "same", 1, 3)
    torch.testing.assert_close(out, khnn.SemiConv(k, "tropical_max", stride=2, padding="same", groups=3)(x))
    assert spec.canonical(x, k, "tropical_max", 2, "same", 1, 3)[4] == [1, 2, 1, 1]
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert spec.canonical(x, k, "tropical_max", 2, "same_strided", 1, 3)[4] == [1, 1, 1, 1]  # the old one
        spec.canonical(x, k, "tropical_max", 1, "same", 1, 3)  # stride 1, no dilation: the two agree, no warning


@pytest.mark.skipif(not HAVE_PACKAGE, reason="pytorch_nd_semiconv is not installed")
def test_from_pytorch_nd_semiconv_refuses_the_packages_torch_wrappers_naming_torchs_layer():
    import pytorch_nd_semiconv as pnds
    with pytest.raises(ValueError, match=r"from_pytorch_nd_semiconv: pool: TorchMaxPool2D is torch's own layer in the "
                                         r"package's interface; use torch.nn.MaxPool2d / torch.nn.Conv2d"):
        khnn.from_pytorch_nd_semiconv(nn.ModuleDict({"pool": pnds.TorchMaxPool2D(3)}))
