"""kernelhub's own op specs, registered through the same hook a third party uses.

To add an op, follow the checklist in docs/backend-guide.md ("A new op"): its `OpSpec` in a module here (one
module per op family), listed in `SPECS`; its reference in backends/torch_ref; its measured tolerances
(until then it loads marked unmeasured, and its tolerance test fails); the kit.
"""

from __future__ import annotations

from kernelhub.hookspecs import hookimpl
from kernelhub.ops.kplanes import KPLANES, KPLANES_MS, KPLANES_TAPS
from kernelhub.ops.semiconv import SEMICONV
from kernelhub.ops.tikhonov import TIKHONOV
from kernelhub.ops.trilinear import TRILINEAR
from kernelhub.ops.tv import TV_ISO, TV_L1, TV_SQ

__all__ = ["SPECS"]

SPECS = (TV_L1, TV_SQ, TV_ISO, KPLANES, KPLANES_MS, KPLANES_TAPS, TRILINEAR, SEMICONV, TIKHONOV)


@hookimpl
def kernelhub_register_specs(registry) -> None:
    for spec in SPECS:
        registry.add_spec(spec)
