"""The conformance matrix, generated from the registry: every impl x dtype x sample size on the CPU."""

import os

import pytest
import torch

import kernelhub
from kernelhub import testing

kernelhub.reload()
DEVICES = ["cpu"] + (["cuda"] if torch.cuda.is_available() else [])
# inductor (torch_ref compiled) in float32 and float64: it compiles every shape bucket of every case (about 13
# minutes on the 2-core machine with a partly warm inductor cache), and its float16 / bfloat16 graphs are the
# same code computing in float32. KERNELHUB_TEST_INDUCTOR=quick keeps its float32 medium samples only.
INDUCTOR_QUICK = os.environ.get("KERNELHUB_TEST_INDUCTOR", "") == "quick"
CASES = [c for d in DEVICES for c in testing.cases(device=d)
         if c.backend != "inductor" or (c.dtype == torch.float32 and c.size == "medium" if INDUCTOR_QUICK
                                         else c.dtype in (torch.float32, torch.float64))]
OPS = kernelhub.op_names()


def test_matrix_is_not_empty():
    assert len(OPS) == 9 and len(CASES) >= len(DEVICES) * 9 * 3 * 2


@pytest.mark.parametrize("case", CASES, ids=str)
def test_parity(case):
    testing.check_parity(case)


@pytest.mark.parametrize("case", [c for c in CASES if c.size == "small"], ids=str)
def test_noncontiguous(case):
    testing.check_noncontiguous(case)


@pytest.mark.parametrize("op", OPS)
def test_bad_inputs(op):
    testing.check_bad_inputs(op)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("op", OPS)
def test_opcheck(op, device):
    testing.check_opcheck(op, device=device)


@pytest.mark.parametrize("op", OPS)
def test_gradcheck(op):
    testing.check_gradcheck(op, "torch_ref")


def test_parity_check_catches_a_wrong_result():
    """The kit must fail an impl that is off by more than the tolerance."""
    ref = torch.tensor([1.0, 2.0, 3.0], dtype=torch.float64)
    assert testing.parity_error(ref * (1 + 1e-3), ref) > 1e-4
    assert testing.parity_error(torch.tensor([1.0, float("nan"), 3.0]), ref) == float("inf")
    assert testing.parity_error(ref, ref) == 0.0
