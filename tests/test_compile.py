"""Each op inside torch.compile(fullgraph=True): one opaque node, same values and gradients as eager."""

import pytest
import torch

import kernelhub
from kernelhub import testing

OPS = kernelhub.op_names()


@pytest.mark.parametrize("name", OPS)
def test_compile_fullgraph_matches_eager(name):
    dtype = torch.float32
    sample = testing.samples(name, "small", dtype, "cpu")[0]
    op = kernelhub.op(name)

    def loss(*args):
        return (op(*args) * 1.5).abs().sum()  # hub op between ordinary torch ops

    def grads(fn):
        args = testing.with_grad(name, sample.args)
        value = fn(*args)
        value.backward()
        return value.detach(), [t.grad for t in testing.leaves(name, args)]

    torch._dynamo.reset()
    compiled = torch.compile(loss, fullgraph=True, backend="aot_eager")
    want, want_g = grads(loss)
    got, got_g = grads(compiled)
    torch.testing.assert_close(got, want)
    for g, w in zip(got_g, want_g):
        torch.testing.assert_close(g, w)


def test_compile_inductor_backend_once():
    """The default inductor backend too (needs a C++ compiler), on one op."""
    op = kernelhub.op("tv_loss_sq_3d")
    v = torch.randn(6, 7, 8, requires_grad=True)
    torch._dynamo.reset()
    f = torch.compile(lambda x: op(x).sqrt() * 2, fullgraph=True)
    out = f(v)
    out.backward()
    g = v.grad.clone()
    v.grad = None
    (op(v).sqrt() * 2).backward()
    torch.testing.assert_close(out, op(v).sqrt() * 2)
    torch.testing.assert_close(g, v.grad)
