"""The suite: which checks a backend must pass (`suite`, `Check`; kernelhub.testing re-exports it)."""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable

import torch

from kernelhub.hub import get_hub
from kernelhub.testing._core import ParityCase, cases
from kernelhub.testing.checks import (
    check_bad_inputs,
    check_gradcheck,
    check_noncontiguous,
    check_opcheck,
    check_parity,
    check_saved,
    check_weighted,
)
from kernelhub.testing.coverage import Reached
from kernelhub.testing.cuda import check_cuda_graph_replay, check_no_host_sync


# -- the suite: which checks a backend must pass ----------------------------------------------------------------
@dataclasses.dataclass(frozen=True)
class Check:
    """One conformance check of one backend's impl of one op on one device (``case``: the parity case, for the
    parity and non-contiguous checks; ``fast_mode``: a gradcheck against one random projection of the Jacobian,
    `check_gradcheck`). `suite` lists them; ``run()`` runs it."""

    kind: str  # one of CHECK_KINDS
    op: str
    backend: str
    device: str
    case: ParityCase | None = None
    fast_mode: bool = False

    def __str__(self) -> str:
        return f"{self.kind.replace(' ', '-')}-{self.case}" if self.case else \
            f"{self.kind.replace(' ', '-')}-{self.op}-{self.backend}-{self.device}"

    @property
    def label(self) -> str:
        """What `kernelhub check` shows in its "check" column."""
        if self.case is not None and self.kind == "parity":
            return f"parity {str(self.case.dtype).removeprefix('torch.')} {self.case.size}"
        if self.case is not None and self.kind == "non-contiguous":
            return f"non-contiguous {str(self.case.dtype).removeprefix('torch.')}"
        return f"{self.kind} float64" if self.kind in ("opcheck", "gradcheck") else self.kind

    def run(self, allow: Iterable[str] = ()) -> Reached | None:
        """Run the check: an AssertionError on a failure, `NotCovered` where a tag its size requires (and
        ``allow``'s fnmatch patterns do not name) was reached by no call the impl accepts; returns what it
        reached (None for the checks that run one fixed call: bad inputs and the CUDA ones)."""
        if self.kind in ("parity", "non-contiguous"):
            assert self.case is not None, f"a {self.kind} check without its case"
            check = check_parity if self.kind == "parity" else check_noncontiguous
            return check(self.case, allow=allow)
        if self.kind == "opcheck":
            return check_opcheck(self.op, self.backend, "small", self.device, allow=allow)
        if self.kind == "gradcheck":
            return check_gradcheck(self.op, self.backend, self.device, fast_mode=self.fast_mode, allow=allow)
        if self.kind == "bad inputs":
            check_bad_inputs(self.op, self.backend)
        elif self.kind == "weighted":
            check_weighted(self.op, self.backend, self.device)
        elif self.kind == "saved":
            check_saved(self.op, self.backend, self.device)
        elif self.kind == "no host sync":
            check_no_host_sync(self.op, self.backend)
        else:
            check_cuda_graph_replay(self.op, self.backend)
        return None


CHECK_KINDS = ("parity", "non-contiguous", "opcheck", "gradcheck", "bad inputs", "weighted", "saved",
               "no host sync", "CUDA graph replay")
# the check of each capability (`kernelhub.spec.CAPABILITIES`) that has one: an impl declaring it gets it
CAPABILITY_CHECKS = {"weighted": "weighted", "saves": "saved"}


def suite(backend: str, device: str = "cpu", ops: Iterable[str] | None = None) -> list[Check]:
    """Every check ``backend`` must pass on ``device``, for each op it serves there (``ops``: only those): parity
    of every case (`cases`), non-contiguous inputs on the small ones, opcheck and gradcheck in float64 where it
    takes float64, the spec's bad inputs, its fused weights where it declares them (`check_weighted`), and on
    CUDA, for every backend but the op's reference, no host synchronisation and CUDA-graph replay. The one
    definition that `kernelhub check`, kernelhub's conformance tests and a plugin's own tests run."""
    hub = get_hub()
    out = []
    for op in sorted(ops or hub.registry.specs):
        impl = hub.registry.impls(op).get(backend)
        if impl is None or (impl.devices is not None and device not in impl.devices):
            continue
        every = cases(backend, device, ops=[op])
        out += [Check("parity", op, backend, device, c) for c in every]
        out += [Check("non-contiguous", op, backend, device, c) for c in every if c.size == "small"]
        if torch.float64 in impl.dtypes:
            out += [Check("opcheck", op, backend, device), Check("gradcheck", op, backend, device)]
        out.append(Check("bad inputs", op, backend, device))
        out += [Check(CAPABILITY_CHECKS[c], op, backend, device) for c in sorted(impl.can) if c in CAPABILITY_CHECKS]
        # the CUDA promises are the kernel backends': a reference may synchronise (torch_ref's Tikhonov is an SVD)
        if device == "cuda" and backend != hub.registry.spec(op).reference_backend:
            out += [Check("no host sync", op, backend, device), Check("CUDA graph replay", op, backend, device)]
    return out
