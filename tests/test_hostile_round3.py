"""Reliability, round three: no silent wrong gradient, no clobbered shared file, no hang (docs/reliability.md,
"Hostile inputs"). Each test failed before its fix."""

import json
import os
import stat
import sys
import threading
import warnings

import harness
import pytest
import torch

import kernelhub
from kernelhub import _state, cli
from kernelhub import nn as khnn
from kernelhub.config import Config, ConfigError, TuneConfig

# --- silent wrong results ---


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


@pytest.mark.parametrize("make", [lambda: khnn.QuadraticKernelIso2D(1, 4, 1),
                                  lambda: khnn.QuadraticKernelSpectral2D(1, 4, 1, init={"var": "ss-iso"}),
                                  lambda: khnn.QuadraticKernelCholesky2D(1, 4, 1, init={"var": "ss-iso"}),
                                  lambda: khnn.QuadraticKernelIso2D(1, 4, 1, init={"var": "log-ss"})])
def test_a_size_1_quadratic_kernel_is_finite(make):
    kernel = make()
    assert torch.isfinite(kernel()).all(), kernel()
    out = khnn.SemiConv(kernel, "tropical_max", groups=1)(torch.randn(1, 1, 5, 5))
    assert torch.isfinite(out).all()


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


# --- the winners file: shared, read-only, special ---


def _tune_quick(tmp_path, cache: str):
    (tmp_path / "kernelhub.toml").write_text(f'[tune]\ncache = "{cache}"\n')
    kernelhub.reload()
    return cli.main(["tune", "tv_loss_sq_3d", "--quick", "--shape", "1,8,8,8", "--json"])


@pytest.mark.parametrize("dangling", [False, True])
def test_a_symlinked_winners_file_is_written_through_the_link(tmp_path, dangling, capsys):
    shared = tmp_path / "shared" / "tuning.json"
    shared.parent.mkdir()
    if not dangling:
        shared.write_text(json.dumps({"format": "kernelhub-tuning/1", "entries": {}}))
    link = tmp_path / "link.json"
    link.symlink_to(shared)
    _tune_quick(tmp_path, str(link))
    assert link.is_symlink() and os.readlink(link) == str(shared)
    assert shared.is_file() and json.loads(shared.read_text())["entries"], "the shared file got no entry"


def test_a_read_only_winners_file_is_left_untouched(tmp_path, capsys):
    path = tmp_path / "tuning.json"
    text = json.dumps({"format": "kernelhub-tuning/1", "entries": {}})
    path.write_text(text)
    path.chmod(0o444)
    with pytest.warns(RuntimeWarning, match="read-only"):
        rc = _tune_quick(tmp_path, str(path))
    assert rc == 1
    assert path.read_text() == text and stat.S_IMODE(path.stat().st_mode) == 0o444


@pytest.mark.parametrize("special", ["fifo", "/dev/zero", "/dev/null"])
def test_a_winners_path_that_is_not_a_regular_file_is_not_ours_and_never_blocks(tmp_path, special):
    if special == "fifo":
        path = tmp_path / "fifo"
        os.mkfifo(path)
    else:
        path = special
    (tmp_path / "kernelhub.toml").write_text(f'[tune]\ncache = "{path}"\nmode = "cached"\n')
    result = []
    def call():
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            kernelhub.reload()
            result.append((kernelhub.op("tv_loss_sq_3d")(torch.randn(2, 3, 4)),
                           [str(w.message) for w in caught]))
    thread = threading.Thread(target=call, daemon=True)
    thread.start()
    thread.join(60)
    assert not thread.is_alive(), "the call blocked on the winners path"
    assert result and any("not a regular file" in m for m in result[0][1]), result


@pytest.mark.parametrize("candidate", [{"step_ms": 1.0}, {"error": None, "step_ms": 1.0, "step_spread": "wide"},
                                       {"error": None, "step_ms": 1.0, "forward_ms": "x"}])
@pytest.mark.parametrize("within", [None, "torch_ref", [1, 2]])
def test_a_malformed_winners_entry_is_dropped_with_a_warning_naming_the_file(tmp_path, candidate, within):
    from kernelhub.winners import entry_key

    v = torch.randn(1, 8, 8, 8)
    key = entry_key("tv_loss_sq_3d", (v,))
    entry = {"candidates": {"torch_ref": candidate, "cuda_ext": {"error": None, "step_ms": 0.5}}}
    if within is not None:
        entry["within_noise"] = within
    path = tmp_path / "tuning.json"
    path.write_text(json.dumps({"format": "kernelhub-tuning/1", "entries": {key: entry}}))
    (tmp_path / "kernelhub.toml").write_text(f'[tune]\ncache = "{path}"\n')
    kernelhub.reload()
    with pytest.warns(RuntimeWarning, match=f"tuning cache {path}: 1 malformed entr"):
        out = kernelhub.op("tv_loss_sq_3d")(v)
    torch.testing.assert_close(out, kernelhub.op("tv_loss_sq_3d", backend="torch_ref")(v))
    assert cli.main(["list", "--json"]) == 0


@pytest.mark.parametrize("mode", ["online", "cached"])
def test_expanded_inputs_tune_and_keep_their_bucket_for_contiguous_calls(tmp_path, mode, monkeypatch):
    """A stride-0 (expanded) input: online tuning times it (fresh inputs of its layout, not written into its
    overlapping memory), and a cached winner checked on such a call still serves the bucket's contiguous ones."""
    monkeypatch.setenv("KERNELHUB_DISABLE", "inductor")
    (tmp_path / "kernelhub.toml").write_text(f'[tune]\nmode = "{mode}"\ncache = "{tmp_path / "t.json"}"\n')
    kernelhub.reload()
    expanded = torch.randn(1, 1, 1, 64).expand(2, 8, 8, 64)
    if mode == "cached":
        assert cli.main(["tune", "tv_loss_sq_3d", "--quick", "--shape", "2,8,8,64"]) in (0, 1)
        kernelhub.reload()
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        torch.testing.assert_close(kernelhub.op("tv_loss_sq_3d")(expanded),
                                   kernelhub.op("tv_loss_sq_3d", backend="torch_ref")(expanded))
        dense = expanded.contiguous()
        decision = kernelhub.explain("tv_loss_sq_3d", dense)
    assert not any("parity" in r for c in decision.candidates for r in c.reasons), str(decision)


# --- errors that name what is wrong ---


@pytest.mark.parametrize("argv, says", [
    (["explain", "tv_loss[/]"], "tv_loss[/]"), (["check", "x[/red]"], "x[/red]")])
def test_cli_arguments_are_never_read_as_markup(argv, says, capsys):
    rc = cli.main(argv)
    assert rc != 0
    captured = capsys.readouterr()
    assert says in captured.out + captured.err


def test_config_objects_are_validated_like_files():
    with pytest.raises(ConfigError, match="kill_switch"):
        kernelhub.reload(config=Config(kill_switch="no"))
    with pytest.raises(ConfigError, match="mode"):
        kernelhub.reload(config=Config(tune=TuneConfig(mode="bogus")))
    with pytest.raises(ConfigError, match="nope"):
        kernelhub.reload(config=Config(priority=("nope",)))
    from kernelhub.config import OpConfig
    for device_sizes, says in (({"": ((5, ("triton",)),)}, "device_sizes: expected device text"),
                               ({"H100": ((5, ("nope",)),)}, r"device_sizes\['H100'\]\[5\].*nope"),
                               ({"H100": ((9, ()), (5, ()))}, r"device_sizes\['H100'\]: expected .* ascending")):
        with pytest.raises(ConfigError, match=says):
            kernelhub.reload(config=Config(ops={"tv_loss_l1_3d": OpConfig(device_sizes=device_sizes)}))


def test_a_deeply_nested_toml_and_a_nul_byte_are_config_errors(tmp_path):
    (tmp_path / "kernelhub.toml").write_text("x = " + "[" * 100_000 + "]" * 100_000 + "\n")
    with pytest.raises(ConfigError, match="kernelhub.toml"):
        kernelhub.reload()
    (tmp_path / "kernelhub.toml").write_text('[tune]\ncache = "a\\u0000b"\n')
    with pytest.raises(ConfigError, match="cache"):
        kernelhub.reload()


@pytest.mark.parametrize("make, says", [
    (lambda: khnn.TVLoss3d(weights="0.5"), "TVLoss3d: weights"),
    (lambda: khnn.TVLoss3d(weights="123"), "TVLoss3d: weights"),
    (lambda: khnn.QuadraticKernelIso2D(1, 1, -3), "QuadraticKernelIso2D: argument .kernel_size."),
    (lambda: khnn.QuadraticKernelIso2D(1, 1, 0), "QuadraticKernelIso2D: argument .kernel_size.")])
def test_module_constructors_name_the_module_and_argument(make, says):
    with pytest.raises((ValueError, TypeError), match=says):
        make()


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


@pytest.mark.parametrize("argv, says", [
    (["tune", "tv_loss_sq_3d", "--dtype", "int64", "--quick"], "int64"),
    (["bench", "tv_loss_sq_3d", "--backends", "nope", "--quick"], "nope"),
    (["explain", "tv_loss_sq_3d", "--shape", "9223372036854775808,2,2"], "--shape")])
def test_cli_refuses_what_it_cannot_do_naming_it(argv, says, capsys):
    try:
        rc = cli.main(argv)
    except SystemExit as exc:  # a usage error: argparse's exit 2
        rc = exc.code
    captured = capsys.readouterr()
    assert rc != 0 and says in captured.out + captured.err, captured


def test_an_overflowing_float_argument_names_the_op():
    with pytest.raises((ValueError, OverflowError), match="tikhonov_inverse_2xn"):
        kernelhub.op("tikhonov_inverse_2xn")(torch.randn(3, 2, 5), 10 ** 400)
