"""Property tests: hypothesis draws shapes, strides, dtypes and value ranges for every impl of every op and
compares it with the float64 reference.

Each example draws a dtype the impl declares, the op's shapes and non-tensor arguments (`DRAW` below: one
function per op, and a new op must add one), a value mode and a memory layout per tensor. Then:

- every impl: the same values in contiguous copies give the same result, within the tolerance below (this
  is what checks the reference backend itself, whose parity against float64 is how tolerances are measured);
- every other impl: forward and backward against the float64 reference within the tolerance measured on this
  very input, `kernelhub.testing.tolerances.call_tolerance` (4 x eager torch's error in that dtype against
  float64; for float64, where that is zero, 4 x how far the reference's forward and gradients move when its inputs move
  by one rounding), and never below the spec's tolerance. Values are scaled by powers of ten, but coordinates (points,
  rotations) keep their drawn range: it is part of the problem, not of its scale. Inputs with NaN or Inf compare
  forwards only: the contract is that non-finite values propagate to the output as in the reference; their gradients are
  not specified.

On failure the message repeats the drawn case (op, backend, dtype, shapes, layouts, values, torch seed) and hypothesis
prints the falsifying draws and a `@reproduce_failure` blob. ``KERNELHUB_PROPERTY_EXAMPLES`` sets the examples per impl
(default 10 in the full tier, 3 in the fast one, the first 3 of the same sequence), ``KERNELHUB_PROPERTY_DEVICES`` the
devices (default "cpu,cuda"). The examples are the same in every run (CI stays reproducible) unless
``KERNELHUB_PROPERTY_RANDOM=1`` draws new ones. Without a GPU the Triton kernels run under the interpreter; inductor (a
compile per shape) is left out unless
``KERNELHUB_TEST_INDUCTOR=all``.
"""

import dataclasses
import math
import os

import harness
import pytest
import torch
from hypothesis import HealthCheck, assume, given, note, settings
from hypothesis import strategies as st

import kernelhub
from kernelhub import accumulation_dtype, testing
from kernelhub.testing.tolerances import call_tolerance, tolerance_for

kernelhub.reload()
# the full tier's 10 examples per impl; the fast tier's 3 (the interpreted Triton kernels dominate the time)
EXAMPLES = int(os.environ.get("KERNELHUB_PROPERTY_EXAMPLES", "") or (10 if testing.tier() == "full" else 3))
RANDOM = os.environ.get("KERNELHUB_PROPERTY_RANDOM", "") == "1"  # new examples each run (else the same each run)
DEVICES = [d for d in ["cpu"] + (["cuda"] if torch.cuda.is_available() else [])
           if d in os.environ.get("KERNELHUB_PROPERTY_DEVICES", "cpu,cuda").split(",")]
VALUE_MODES = ("normal", "scaled", "half_integers", "nonfinite")
COORDINATES = ("pts", "rotations", "points")  # drawn from the normal distribution at every scale
LAYOUTS = ("contiguous", "spread", "transposed", "offset", "expanded")


def _size(lo, hi):
    return st.integers(lo, hi)


def _tv(draw, with_eps):
    shape = draw(st.lists(_size(0, 2), min_size=0, max_size=2)) + draw(st.lists(_size(1, 7), min_size=3, max_size=3))
    shape[-3 + draw(st.integers(0, 2))] = draw(_size(0, 7))  # sometimes an empty or size-1 axis
    return [("volume", shape)], ((draw(st.sampled_from([1e-8, 1e-3, 1.0])),) if with_eps else ())


def _kplanes(draw, kind):
    B, T = draw(_size(0, 40)), draw(_size(1, 3))
    tensors = [("pts", [B, 3]), ("rotations", [T, 3, 3])]
    for s in range(draw(_size(1, 3)) if kind == "ms" else 1):
        tensors.append((f"planes{s}", [3 * T, draw(_size(1, 5)), draw(_size(1, 9)), draw(_size(1, 9))]))
    return tensors, ((draw(st.floats(1e-4, 0.1)),) if kind == "taps" else ())


def _trilinear(draw):
    n = draw(_size(0, 50))
    return [("feats", [n, 8, draw(_size(1, 9))]), ("points", [n, 3])], ()


def _tikhonov(draw):
    # lam from the samples' range (0.05 to 1) and beyond; `_draw_call` multiplies it by the square of the values'
    # scale, so a scale changes the range, not the conditioning (W(sM, s^2 lam) = W(M, lam) / s). The float64
    # reference's gradient is the textbook closed form, whose determinant (a + lam)(c + lam) - |b|^2 cancels where
    # M M^H is near singular (Z = 1, small lam: ~eps |M|^2 / lam; the kernels' determinant does not cancel,
    # docs/ops.md), so past the samples' conditioning the reference stops being a float64-accurate judge.
    lead = draw(st.lists(_size(0, 6), min_size=0, max_size=2))
    return [("M", [*lead, 2, draw(_size(1, 12))])], (draw(st.floats(0.05, 10.0)),)


def _semiconv(draw):
    nd = draw(_size(1, 3))
    groups, cg, og = draw(_size(1, 2)), draw(_size(1, 3)), draw(_size(1, 2))
    spatial = [draw(_size(1, 7 if nd < 3 else 5)) for _ in range(nd)]
    ksize = [draw(_size(1, 4)) for _ in range(nd)]
    stride, dilation = [draw(_size(1, 2)) for _ in range(nd)], [draw(_size(1, 2)) for _ in range(nd)]
    padding = [(draw(_size(0, 2)), draw(_size(0, 2))) for _ in range(nd)]
    semifield = draw(st.sampled_from(["tropical_max", "tropical_min", "linear", "root:2", "root:0.5", "log:1",
                                      "log:-1.5", "log:4"]))
    kind = draw(st.sampled_from(["conv", "corr"]))
    tensors = [("img", [draw(_size(0, 2)), groups * cg, *spatial]), ("kernel", [groups * og, cg, *ksize])]
    return tensors, (semifield, stride, padding, dilation, groups, kind)


# op -> draw(draw) returning ([(tensor name, shape)], the call's other arguments in order)
DRAW = {
    "tv_loss_l1_3d": lambda d: _tv(d, False),
    "tv_loss_sq_3d": lambda d: _tv(d, False),
    "tv_loss_iso_3d": lambda d: _tv(d, True),
    "kplanes_interp_tilted": lambda d: _kplanes(d, "single"),
    "kplanes_interp_tilted_ms": lambda d: _kplanes(d, "ms"),
    "kplanes_interp_tilted_taps": lambda d: _kplanes(d, "taps"),
    "trilinear_interp": _trilinear,
    "tikhonov_inverse_2xn": _tikhonov,
    "semiconv": _semiconv,
}


def _values(shape, dtype, device, gen, mode, scale, positive):
    """Values for one tensor: normal, normal times a power of ten, half-integers (exact ties, points on the
    grid and the border), or normal with NaN, +Inf and -Inf at drawn places (no -Inf where inputs must be >= 0)."""
    x = torch.randn(shape, generator=gen, device=device, dtype=accumulation_dtype(dtype))  # complex: complex normal
    if mode == "scaled":
        x = x * scale
    elif mode == "half_integers":
        x = torch.complex(torch.round(x.real * 2), torch.round(x.imag * 2)) / 2 if x.is_complex() \
            else torch.round(x * 2) / 2
    if positive:  # the root semifields take inputs >= 0
        x = x.abs()
    x = x.to(dtype)
    if mode == "nonfinite" and x.numel():
        flat = x.view(-1)
        at = torch.randint(0, x.numel(), (3,), generator=gen, device=device)
        special = [float("nan"), float("inf"), float("inf") if positive else -float("inf")]
        flat[at] = torch.tensor(special, dtype=dtype, device=device)
    return x


def _relayout(t, how):
    """The same values (or, for "expanded", the first row repeated) in another memory layout."""
    if t.ndim == 0 or t.numel() == 0 or how == "contiguous":
        return t
    if how == "spread":
        return testing.noncontiguous((t,))[0]
    if how == "transposed":
        return t.transpose(0, -1).contiguous().transpose(0, -1) if t.ndim >= 2 else t
    if how == "offset":
        buf = torch.empty(t.numel() + 1, dtype=t.dtype, device=t.device)
        buf[1:].copy_(t.reshape(-1))
        return buf[1:].view(t.shape)
    return t[:1].expand(t.shape) if t.shape[0] > 1 else t  # "expanded": stride 0 in dim 0


def _draw_call(data, op, dtype, device):
    tensors, others = DRAW[op](data.draw)
    mode = data.draw(st.sampled_from(VALUE_MODES), label="values")
    low_precision = dtype in (torch.float16, torch.bfloat16)
    scale = 10.0 ** data.draw(st.integers(-2, 1 if low_precision else 3), label="log10 scale")
    seed = data.draw(st.integers(0, 2**31 - 1), label="torch seed")
    gen = torch.Generator(device=device).manual_seed(seed)
    positive = op == "semiconv" and others[0].startswith("root")
    values = {name: _values(shape, dtype, device, gen, mode, 1.0 if name in COORDINATES else scale, positive)
              for name, shape in tensors}
    if op == "tikhonov_inverse_2xn" and mode == "scaled":
        others = (others[0] * scale**2,)
    layouts = {name: data.draw(st.sampled_from(LAYOUTS), label=f"layout of {name}") for name in values}
    tensors_in = {name: _relayout(t, layouts[name]) for name, t in values.items()}
    if op == "kplanes_interp_tilted_ms":
        planes = [tensors_in[n] for n in tensors_in if n.startswith("planes")]
        call = (tensors_in["pts"], tensors_in["rotations"], planes, *others)
    elif op.startswith("kplanes"):
        call = (tensors_in["pts"], tensors_in["rotations"], tensors_in["planes0"], *others)
    else:
        call = (*tensors_in.values(), *others)
    try:
        args = kernelhub.get_hub().registry.spec(op).normalize(*call)
    except ValueError:  # a drawn geometry the op rejects (semiconv: an empty output)
        assume(False)
    described = (f"{op} dtype={str(dtype).removeprefix('torch.')} device={device} shapes="
                 f"{ {n: list(t.shape) for n, t in values.items()} } others={others} values={mode} "
                 f"scale={scale:g} layouts={layouts} seed={seed}")
    note(described)
    return args, mode, described


def _impls():
    out = []
    for device in DEVICES:
        for op in sorted(kernelhub.get_hub().registry.specs):
            for backend, impl in sorted(kernelhub.get_hub().registry.impls(op).items()):
                if backend == "inductor" and os.environ.get("KERNELHUB_TEST_INDUCTOR") != "all":
                    continue
                if impl.devices is None or device in impl.devices:
                    out.append(pytest.param(op, backend, device, id=f"{op}-{backend}-{device}",
                                            marks=[harness.cuda] if device == "cuda" else []))
    return out


def test_every_op_has_a_draw_and_every_impl_is_drawn():
    assert set(DRAW) == set(kernelhub.op_names())
    assert {p.values[0] for p in _impls()} == set(DRAW)


def _check(label, what, err, tol):
    assert err <= tol, f"{label}: {what} error {err:.3g} > {tol:.3g}"


@pytest.mark.parametrize("op,backend,device", _impls())
@settings(max_examples=EXAMPLES, deadline=None, print_blob=True, derandomize=not RANDOM,
          suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow,
                                 HealthCheck.filter_too_much])
@given(data=st.data())
def test_impl_matches_the_reference_on_drawn_inputs(op, backend, device, data):
    hub = kernelhub.get_hub()
    if hub.registry.unavailable_reason(backend):
        pytest.skip(f"{backend}: {hub.registry.unavailable_reason(backend)}")
    spec, impl = hub.registry.spec(op), hub.registry.impls(op)[backend]
    dtype = data.draw(st.sampled_from(impl.dtypes), label="dtype")
    args, mode, label = _draw_call(data, op, dtype, device)
    assume(not impl.not_supported_reasons(args))
    label = f"{backend}: {label}"
    tol = spec.tolerances[dtype]
    contiguous = testing.map_tensors(args, lambda t: t.contiguous())
    if mode == "nonfinite":  # forwards only
        out, _ = testing.run(op, backend, args)
        want, _ = testing.run(op, backend, contiguous)
        _check(label, "strided against contiguous forward", testing.parity_error(out, want), tol.forward)
        if backend != spec.reference_backend:
            ref, _ = testing.reference(op, args)
            eager, _ = testing.run(op, spec.reference_backend, args)
            allowed = max(tol.forward, tolerance_for(dtype, testing.parity_error(eager, ref)))
            _check(label, "forward", testing.parity_error(out, ref), allowed)
        return
    grad = testing.upstream_grad(spec.output(*args))
    out, grads = testing.run(op, backend, args, grad)
    want, want_grads = testing.run(op, backend, contiguous, grad)
    # the tolerance on this input (two correct summation orders may differ by that much)
    tol_f, tol_b = dataclasses.astuple(call_tolerance(op, args))
    _check(label, "strided against contiguous forward", testing.parity_error(out, want), tol_f)
    for g, w in zip(grads, want_grads):
        _check(label, "strided against contiguous backward", testing.parity_error(g, w), tol_b)
    if backend != spec.reference_backend:
        fwd, bwd = testing.measure(op, backend, args)
        _check(label, "forward", fwd, tol_f)
        _check(label, "backward", bwd, tol_b)


def _tikhonov_extremes():
    """(dtype, the scale of M, lam): the magnitudes docs/ops.md's contract allows where the unscaled closed form
    overflowed or underflowed (reliability round four: W = 0 for complex128 at lam 1e160 and 1e200, float64 at lam
    1e300 and |M| 1e80; NaN for complex64 and float32 at lam 1e308), and their small-side mirror."""
    return [(torch.complex128, 1.0, 1e160), (torch.complex128, 1.0, 1e200), (torch.float64, 1.0, 1e300),
            (torch.complex64, 1.0, 1e308), (torch.float32, 1.0, 1e308), (torch.complex128, 1e80, 0.1),
            (torch.float64, 1e-100, 1e-250), (torch.complex128, 1e-90, 1e-300), (torch.float64, 1e120, 1e250)]


@pytest.mark.parametrize("device", harness.devices())
@pytest.mark.parametrize("dtype, scale, lam", _tikhonov_extremes())
def test_tikhonov_at_extreme_magnitudes_matches_the_reference(dtype, scale, lam, device):
    """Every kernel backend at the extremes: the forward against the SVD reference (which scales by itself), the
    backward against the reference's gradient at the same matrix scaled to moderate size (W(M, lam) = W(M/s, lam/s^2)
    / s, so dM(G, M, lam) = dM(G, M/s, lam/s^2) / s^2, with s a power of two: exact)."""
    hub = kernelhub.get_hub()
    names = [n for n, i in hub.registry.impls("tikhonov_inverse_2xn").items()
             if n in ("cuda_ext", "triton") and not hub.registry.unavailable_reason(n)
             and (i.devices is None or device in i.devices) and dtype in i.dtypes]
    if not names:
        pytest.skip(f"no kernel backend serves {dtype} on {device} here")
    g = torch.Generator().manual_seed(0)
    M = (torch.randn(8, 2, 21, generator=g, dtype=dtype) * scale).to(device)
    G = torch.randn(8, 2, 21, generator=g, dtype=dtype).to(device)
    ref = kernelhub.op("tikhonov_inverse_2xn", backend="torch_ref")
    want = ref(M, lam)
    assert torch.isfinite(torch.view_as_real(want) if want.is_complex() else want).all()
    k = math.frexp(math.sqrt(lam) if lam > scale * scale else scale)[1]  # 2^k near the largest magnitude
    moderate = (M.to(torch.complex128 if dtype.is_complex else torch.float64) * 2.0 ** -k).requires_grad_()
    out = ref(moderate, lam * 4.0 ** -k)
    (want_grad,) = torch.autograd.grad(out, moderate, G.to(out.dtype))
    want_grad = want_grad * 4.0 ** -k
    tol = kernelhub.get_hub().registry.spec("tikhonov_inverse_2xn").tolerances[dtype]
    for name in names:
        x = M.clone().requires_grad_()
        got = kernelhub.op("tikhonov_inverse_2xn", backend=name)(x, lam)
        (got_grad,) = torch.autograd.grad(got, x, G)
        assert testing.parity_error(got, want) <= tol.forward, (name, testing.parity_error(got, want))
        error = testing.parity_error(got_grad, want_grad.to(dtype))
        assert error <= tol.backward, (name, error)
