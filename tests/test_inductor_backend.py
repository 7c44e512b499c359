"""The inductor backend (torch_ref through torch.compile): never picked by priority alone, picked by the tuner
where it is fastest, compiled once per key with dynamic shapes, usable inside the user's own
torch.compile(fullgraph=True), and unavailable with the reason where torch.compile cannot run."""

import pytest
import torch

import kernelhub
from kernelhub import cli
from kernelhub.errors import NoImplementationError

inductor = pytest.importorskip("kernelhub_torch_ref.inductor")

FEATS = torch.randn(4096, 8, 32, generator=torch.Generator().manual_seed(0))
POINTS = torch.rand(4096, 3, generator=torch.Generator().manual_seed(1)) * 2 - 1


@pytest.fixture(autouse=True)
def _without_cuda_ext(monkeypatch):
    """inductor against torch_ref alone: cuda_ext's C++ kernels would win these CPU calls."""
    monkeypatch.setenv("KERNELHUB_DISABLE", "cuda_ext")
    kernelhub.reload()


def test_priority_alone_never_picks_it():
    decision = kernelhub.explain("trilinear_interp", FEATS, POINTS)
    by = {c.backend: c for c in decision.candidates}
    assert decision.chosen == "torch_ref"
    assert by["inductor"].status == "rejected" and "chosen only where `kernelhub tune`" in by["inductor"].reasons[0]


def test_the_tuner_picks_it_where_it_is_fastest_and_reports_its_compile_time(monkeypatch):
    monkeypatch.setattr(inductor, "_COMPILED", {})  # compiled by an earlier test of this process: compile again
    parser = cli.build_parser()
    data = cli.cmd_tune(parser.parse_args(["tune", "trilinear_interp", "--shape", "4096,8,32", "--shape", "4096,3",
                                           "--device", "cpu"]))
    c = data["tuned"][0]["candidates"]
    assert set(c) == {"inductor", "torch_ref"} and c["inductor"]["error"] is None
    # the compile is the first call, timed apart; the timed runs are warm (fused trilinear: several x eager)
    assert c["inductor"]["first_call_s"] > 10 * c["inductor"]["step_ms"] / 1e3
    assert c["inductor"]["step_ms"] < c["torch_ref"]["step_ms"]
    decision = kernelhub.explain("trilinear_interp", FEATS, POINTS)
    assert decision.chosen == "inductor" and "tuned winner" in decision.candidates[0].reasons[0]


def test_one_compile_per_key_for_every_size_inside_an_outer_fullgraph_compile():
    fn = kernelhub.op("tv_loss_sq_3d", backend="inductor")

    @torch.compile(fullgraph=True)
    def loss(v):
        return fn(v * 2.0).sum()

    keys_before = set(inductor.COMPILE_S)
    for shape in [(2, 9, 10, 11), (2, 12, 7, 9), (3, 5, 6, 14)]:
        v = torch.randn(shape, requires_grad=True)
        loss(v).backward()
        w = v.detach().clone().requires_grad_()
        kernelhub.op("tv_loss_sq_3d", backend="torch_ref")(w * 2.0).sum().backward()
        torch.testing.assert_close(v.grad, w.grad, rtol=1e-5, atol=1e-5)
    new = set(inductor.COMPILE_S) - keys_before
    assert new <= {("tv_loss_sq_3d", "forward", "cpu", "torch.float32"), ("tv_loss_sq_3d", "backward", "cpu",
                                                                            "torch.float32")}


def test_without_a_compiler_it_is_unavailable_for_the_cpu_with_the_reason(monkeypatch):
    monkeypatch.delenv("CXX", raising=False)
    monkeypatch.setattr(inductor.shutil, "which", lambda name: None)
    decision = kernelhub.explain("tv_loss_l1_3d", torch.randn(4, 5, 6))
    by = {c.backend: c for c in decision.candidates}
    assert "needs a C++ compiler" in " ".join(by["inductor"].reasons)
    with pytest.raises(NoImplementationError, match="needs a C\\+\\+ compiler"):
        kernelhub.op("tv_loss_l1_3d", backend="inductor")(torch.randn(4, 5, 6))
