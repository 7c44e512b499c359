"""The conformance kit: the checks kernelhub's own tests and third-party backends run.

Every check takes an op name, a backend name and a `SampleInput` (or generates them
from the spec), runs the impl *through the hub* with that backend forced, and
compares with the float64 reference (the spec's ``reference_backend``) using the
spec's tolerances. A backend's test file can be as short as::

    import pytest
    from kernelhub import testing

    @pytest.mark.parametrize("case", testing.cases(backend="my_backend"), ids=str)
    def test_parity(case):
        testing.check_parity(case)

Error metric: non-finite entries (NaN, +-inf) must sit at the same places with the same
values; on the rest, ``max|out - ref| / max|ref|`` must not exceed the tolerance.
"""

from __future__ import annotations

from typing import Any

# the kit is laid out by subject (_core: cases, samples and runs; coverage: what a check reached; checks; checklist:
# which checks a backend must pass; cuda: CUDA safety); everything public is imported from here
from kernelhub.args import map_tensors, tensors_of  # noqa: F401 (kit API)
from kernelhub.parity import fresh_leaves, parity_error, to_dtype, upstream_grad  # noqa: F401 (kit API)
from kernelhub.testing._core import (  # noqa: F401
    TIERS,
    ParityCase,
    cases,
    leaves,
    measure,
    noncontiguous,
    reference,
    reference_with_upstream,
    run,
    samples,
    tier,
    with_grad,
)
from kernelhub.testing.checklist import CAPABILITY_CHECKS, CHECK_KINDS, Check, suite  # noqa: F401
from kernelhub.testing.checks import (  # noqa: F401
    CheckFailed,
    _worst_jacobian_entry,
    check_bad_inputs,
    check_gradcheck,
    check_noncontiguous,
    check_opcheck,
    check_parity,
    check_saved,
    check_weighted,
)
from kernelhub.testing.coverage import CONFIRM, MINIMUM, NotCovered, Reached, is_skip, reach, supported  # noqa: F401
from kernelhub.testing.cuda import check_cuda_graph_replay, check_no_host_sync, copy_into, cuda_args  # noqa: F401

__all__ = [
    "ParityCase", "cases", "samples", "parity_error", "reference", "run", "check_parity", "check_opcheck",
    "check_gradcheck", "check_noncontiguous", "check_bad_inputs", "noncontiguous", "to_dtype", "leaves",
    "with_grad", "fresh_leaves", "supported", "reach", "Reached", "NotCovered", "MINIMUM", "is_skip", "cuda_args",
    "copy_into",
    "check_no_host_sync", "check_cuda_graph_replay", "check_weighted", "check_saved", "CheckFailed", "tier", "Check",
    "CHECK_KINDS", "suite",
]


def __getattr__(name: str) -> Any:
    if name == "Case":  # the name of ParityCase before 2026-11-29
        import warnings

        warnings.warn("kernelhub.testing.Case is now kernelhub.testing.ParityCase (kernelhub.Case is an op's kind of "
                      "call)", DeprecationWarning, stacklevel=2)
        return ParityCase
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
