"""The conformance matrix, generated from the registry: every impl x dtype x sample size on each device.

The fast tier (tests/conftest.py) runs a subset chosen by cost, in which every op x backend keeps a parity
case in float32 and in float64 where declared:
- torch_ref and cuda_ext: every case (milliseconds each);
- inductor: float32 and float64 only (its float16 / bfloat16 graphs are the same code computing in float32),
  and in the fast tier one small sample per dtype: each shape bucket is a compile (20-50 s of a cold 2-core
  machine per case of several samples);
- triton under the interpreter (no GPU): the small samples in float32 and float64 (in the fast tier the first
  small sample in the other dtypes), the edge ones in float32 and float64; its medium ones (seconds each,
  semiconv's tens of seconds) in the full tier. On a GPU every case.
Non-contiguous inputs: the small samples, in the fast tier without inductor and with the interpreter in
float32 and float64 on the first small sample only.
"""

import dataclasses

import pytest
import torch

import kernelhub
from kernelhub import testing

kernelhub.reload()
DEVICES = ["cpu"] + (["cuda"] if torch.cuda.is_available() else [])
WIDE = (torch.float32, torch.float64)
FAST = testing.tier() == "fast"
OPS = kernelhub.op_names()


def _first_small_sample(case):
    return testing.samples(case.op, "small", case.dtype, case.device)[0].name


def _as_tiered(case):
    """``case`` as this tier runs it, marked `full` where the fast tier leaves it out."""
    reason = None
    if case.backend == "inductor":
        if FAST and case.size == "small":
            case = dataclasses.replace(case, sample=_first_small_sample(case))
        elif FAST:
            reason = "inductor compiles each shape bucket; the fast tier runs one small sample per dtype"
    elif case.backend == "triton" and case.device == "cpu":  # CPU tensors: the interpreter
        if case.size == "medium" or (case.size == "edge" and case.dtype not in WIDE):
            reason = "the Triton interpreter: the small samples in every dtype, edge ones in float32 and float64"
        elif FAST and case.size == "small" and case.dtype not in WIDE:  # semiconv's six: 20 s per dtype
            case = dataclasses.replace(case, sample=_first_small_sample(case))
    marks = [pytest.mark.full(reason)] if reason else []
    return pytest.param(case, marks=marks, id=str(case))


CASES = [_as_tiered(c) for d in DEVICES for c in testing.cases(device=d)
         if c.backend != "inductor" or c.dtype in WIDE]


def _fast(params):
    return [p.values[0] for p in params if not p.marks]


def test_matrix_is_not_empty():
    assert len(OPS) == 9 and len(CASES) >= len(DEVICES) * 9 * 3 * 2


def test_the_fast_tier_keeps_float32_and_float64_parity_of_every_op_and_backend():
    hub = kernelhub.get_hub()
    for op in OPS:
        for backend, impl in hub.registry.impls(op).items():
            for device in DEVICES:
                if impl.devices is not None and device not in impl.devices:
                    continue
                kept = {c.dtype for c in _fast(CASES) if (c.op, c.backend, c.device) == (op, backend, device)}
                assert set(impl.dtypes) & set(WIDE) <= kept, (op, backend, device, kept)


@pytest.mark.parametrize("case", CASES)
def test_parity(case):
    testing.check_parity(case)


def _noncontiguous(param):
    """Non-contiguous inputs on the small samples; the fast tier leaves out inductor (its strides are
    torch_ref's code compiled again: a second compile per case, 3-40 s each) and runs the interpreter in
    float32 and float64 on the first small sample (semiconv's six took 45 s per dtype)."""
    case = param.values[0]
    if param.marks or not FAST:
        return param
    if case.backend == "inductor":
        return pytest.param(case, marks=pytest.mark.full("inductor: a compile per stride pattern"), id=str(case))
    if case.backend == "triton" and case.device == "cpu":
        if case.dtype not in WIDE:
            return pytest.param(case, marks=pytest.mark.full("the Triton interpreter: float32 and float64"),
                                id=str(case))
        return pytest.param(dataclasses.replace(case, sample=_first_small_sample(case)), id=str(case))
    return param


@pytest.mark.parametrize("case", [_noncontiguous(p) for p in CASES if p.values[0].size == "small"])
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
