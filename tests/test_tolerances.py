"""The recorded tolerances are not below what the documented method gives today."""

import pytest

import kernelhub
from kernelhub.testing import tolerances


@pytest.mark.parametrize("op", kernelhub.op_names())
def test_recorded_tolerances_follow_the_measurement(op):
    spec = kernelhub.get_hub().registry.spec(op)
    for dtype in spec.dtypes:
        fwd, bwd = tolerances.measured_error(op, dtype)
        tol = spec.tolerances[dtype]
        assert tolerances.tolerance_for(dtype, fwd) <= tol.forward, (op, dtype, fwd)
        assert tolerances.tolerance_for(dtype, bwd) <= tol.backward, (op, dtype, bwd)
        assert tol.forward <= 2 * tolerances.tolerance_for(dtype, fwd), f"{op} {dtype}: tolerance looser than measured"
