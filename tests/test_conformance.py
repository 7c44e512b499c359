"""The conformance matrix: `kernelhub.testing.suite` (the checks `kernelhub check` runs) for every backend on
each device, generated from the registry.

The fast tier (tests/conftest.py) runs a subset chosen by cost, in which every op x backend keeps a parity
case in float32 and in float64 where declared, and every kind of check runs:
- torch_ref and cuda_ext: every check (milliseconds each; gradcheck against one random projection of the
  Jacobian, the full tier against all of it: slow for torch_ref's K-Planes taps alone);
- inductor: parity in float32 and float64 only (its float16 / bfloat16 graphs are the same code computing in
  float32), and in the fast tier one small sample per dtype: each shape bucket is a compile (the slowest checks
  of a cold 2-core machine: docs/lab/benchmarks-history.md, "Test tiers"); its non-contiguous, opcheck and
  gradcheck checks (a compile each) in the full tier;
- triton under the interpreter (no GPU): parity on the small samples in float32 and float64 (in the fast tier
  the first small sample in the other dtypes), the edge ones in float32 and float64; its medium ones (seconds
  each, semiconv's tens of seconds) in the full tier. Non-contiguous in float32 and float64 on the first small
  sample; opcheck and gradcheck in the full tier (tests/test_triton_backend.py runs its gradcheck in the fast
  tier, in fast mode). On a GPU every check.
"""

import dataclasses

import harness
import pytest
import torch

import kernelhub
from kernelhub import testing

kernelhub.reload()
DEVICES = ["cpu"] + (["cuda"] if harness.CUDA else [])
WIDE = (torch.float32, torch.float64)
FAST = testing.tier() != "full"  # the CUDA tier runs the fast tier's cases
OPS = kernelhub.op_names()
TORCH_2_11 = torch.__version__.startswith("2.11.")


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
        elif FAST and case.size == "small" and case.dtype not in WIDE:  # semiconv's six: a compile each
            case = dataclasses.replace(case, sample=_first_small_sample(case))
    marks = [pytest.mark.full(reason)] if reason else []
    return pytest.param(case, marks=_on_device(case.device, marks), id=str(case))


def _on_device(device, marks):
    """``marks``, and the CUDA tier's where the check runs on CUDA."""
    return [harness.cuda, *marks] if device == "cuda" else marks


def _is_full(param):
    return any(m.name == "full" for m in param.marks)


def _check_tiered(check):
    """``check`` as this tier runs it, marked `full` where the fast tier leaves it out."""
    if check.kind == "parity":
        param = _as_tiered(check.case)
        return pytest.param(dataclasses.replace(check, case=param.values[0]), marks=param.marks, id=str(check))
    reason = None
    interpreted = check.backend == "triton" and check.device == "cpu"
    if check.kind == "non-contiguous" and check.backend == "inductor":
        reason = "inductor: a compile per stride pattern"
    elif check.kind == "non-contiguous" and interpreted:
        if check.case.dtype not in WIDE:
            reason = "the Triton interpreter: float32 and float64"
        elif FAST:
            check = dataclasses.replace(check, case=dataclasses.replace(check.case,
                                                                        sample=_first_small_sample(check.case)))
    elif check.kind == "opcheck" and check.backend == "inductor" and check.op == "semiconv" and TORCH_2_11:
        return pytest.param(check, marks=_on_device(check.device, [pytest.mark.skip(
            reason="torch 2.11 (the GPU host): inductor's compiled semiconv backward aborts the process ('double free "
                   "or corruption') inside opcheck's AOT-autograd check, static or symbolic sizes (H200 host, "
                   "2026-11-24); passes on torch 2.13")]), id=str(check))
    elif check.kind in ("opcheck", "gradcheck") and check.backend == "inductor":
        reason = "inductor: a compile per sample"
    elif check.kind in ("opcheck", "gradcheck") and interpreted:
        reason = "the Triton interpreter: every small float64 sample, several runs each"
    elif check.kind == "weighted" and interpreted:
        reason = "the Triton interpreter: four runs of each small sample in each dtype (slow on a CPU)"
    elif check.kind == "saved" and interpreted:  # tests/test_triton_backend.py checks one call of each semifield
        reason = "the Triton interpreter: four runs of every small, medium and edge sample in each dtype (minutes)"
    elif check.kind == "gradcheck" and FAST:  # one random projection of the Jacobian; the full tier: all of it
        check = dataclasses.replace(check, fast_mode=True)
    return pytest.param(check, marks=_on_device(check.device, [pytest.mark.full(reason)] if reason else []),
                        id=str(check))


BACKENDS = sorted(kernelhub.get_hub().registry.backends)
CHECKS = [_check_tiered(c) for d in DEVICES for b in BACKENDS for c in testing.suite(b, d)
          if c.backend != "inductor" or c.case is None or c.case.dtype in WIDE]
CASES = [pytest.param(p.values[0].case, marks=p.marks, id=str(p.values[0].case)) for p in CHECKS
         if p.values[0].kind == "parity"]


def _fast(params):
    return [p.values[0] for p in params if not _is_full(p)]


def test_matrix_is_not_empty():
    assert len(OPS) == 9 and len(CASES) >= len(DEVICES) * 9 * 3 * 2
    kinds = {p.values[0].kind for p in CHECKS if not _is_full(p)}
    assert kinds == set(testing.CHECK_KINDS) - ({"no host sync", "CUDA graph replay"} if DEVICES == ["cpu"] else set())


def test_the_fast_tier_keeps_float32_and_float64_parity_of_every_op_and_backend():
    hub = kernelhub.get_hub()
    for op in OPS:
        for backend, impl in hub.registry.impls(op).items():
            for device in DEVICES:
                if impl.devices is not None and device not in impl.devices:
                    continue
                kept = {c.dtype for c in _fast(CASES) if (c.op, c.backend, c.device) == (op, backend, device)}
                assert set(impl.dtypes) & set(WIDE) <= kept, (op, backend, device, kept)


# parts of an op's space a built-in impl declines by design (docs/ops.md's inventory): its checks pass without them
ALLOW_PARTIAL = {("inductor", "cuda"): ["semifield=root"]}  # torch 2.11's compiled root gradient was wrong on CUDA


@pytest.mark.parametrize("check", CHECKS)
def test_conformance(check):
    check.run(ALLOW_PARTIAL.get((check.backend, check.device), ()))


@pytest.mark.parametrize("device", harness.devices())
@pytest.mark.parametrize("op", OPS)
def test_opcheck_of_the_selecting_operator(op, device):
    """The operator as a call reaches it (backend '': the hub selects), beside each backend's own opcheck."""
    testing.check_opcheck(op, device=device)


def test_parity_check_catches_a_wrong_result():
    """The kit must fail an impl that is off by more than the tolerance."""
    ref = torch.tensor([1.0, 2.0, 3.0], dtype=torch.float64)
    assert testing.parity_error(ref * (1 + 1e-3), ref) > 1e-4
    assert testing.parity_error(torch.tensor([1.0, float("nan"), 3.0]), ref) == float("inf")
    assert testing.parity_error(ref, ref) == 0.0
