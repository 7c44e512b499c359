"""The recorded tolerances are not below what the documented method gives today."""

import pytest
import torch

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
        assert tol.forward <= tolerances.LOOSEST * tolerances.tolerance_for(dtype, fwd), f"{op} {dtype}: forward too loose"
        assert tol.backward <= tolerances.LOOSEST * tolerances.tolerance_for(dtype, bwd), f"{op} {dtype}: backward too loose"


def test_a_rewrite_keeps_a_larger_error_from_another_host_unless_it_is_too_loose_here():
    f32 = torch.float32  # floor 16 eps = 1.9e-6: errors under 4.8e-7 all give 2e-6
    assert tolerances.merged_error(f32, None, 1e-6) == 1e-6
    assert tolerances.merged_error(f32, 1.2e-6, 1e-6) == 1.2e-6  # the other host rounds worse: kept
    assert tolerances.merged_error(f32, 0.8e-6, 1e-6) == 1e-6  # this host rounds worse: this one
    assert tolerances.merged_error(f32, 2.2e-6, 1e-6) == 1e-6  # 8.8e-6 > 2 x 4e-6: too loose here, dropped
    assert tolerances.merged_error(f32, 4e-7, 1e-9) == 4e-7  # both at the floor


def test_rounding_up_is_not_fooled_by_binary_fractions():
    assert tolerances._round_up(4 * 7.25e-15) == 2.9e-14
    assert tolerances._round_up(2.91e-14) == 3e-14
    assert tolerances._round_up(1.7107e-15, 3) == 1.72e-15
