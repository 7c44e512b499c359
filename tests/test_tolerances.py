"""The recorded tolerances follow the documented method on this host; an op without them loads, marked
unmeasured, fails this check, and passes it once the tool has measured it into the file it was told."""

import dataclasses

import pytest
import torch
from test_third_party_spec import SPEC as CUBE
from test_third_party_spec import _plugin as cube_plugin

import kernelhub
from kernelhub.ops.tolerances import MEASURED_ERRORS, read_errors, tolerances_from
from kernelhub.testing import tolerances


@pytest.mark.parametrize("op", kernelhub.op_names())
def test_recorded_tolerances_follow_the_measurement(op):
    assert tolerances.check_recorded(kernelhub.get_hub().registry.spec(op)) == []


def test_an_unmeasured_op_loads_fails_its_check_and_passes_once_measured_where_told(tmp_path, capsys):
    unmeasured = dataclasses.replace(CUBE, tolerances={})
    kernelhub.reload(extra_plugins=[("cube_plugin", cube_plugin(unmeasured))])
    spec = kernelhub.get_hub().registry.spec("cube_sum")
    assert spec.unmeasured == (torch.float32, torch.float64)
    x = torch.randn(3, 4, dtype=torch.float64, requires_grad=True)
    kernelhub.op("cube_sum")(x).backward()  # it runs
    problems = tolerances.check_recorded(spec)
    assert len(problems) == 2 and all("unmeasured" in p for p in problems)

    before = MEASURED_ERRORS.read_bytes()
    out = tmp_path / "cube_errors.json"
    assert tolerances.main(["--ops", "cube_sum", "--out", str(out)]) == 0
    assert MEASURED_ERRORS.read_bytes() == before  # the package's own file is left alone
    hosts, errors = read_errors(out)
    assert set(errors) == {"cube_sum"} and set(errors["cube_sum"]) == {torch.float32, torch.float64}
    assert hosts[-1].endswith(tolerances.host())
    measured = dataclasses.replace(CUBE, tolerances=tolerances_from(out, "cube_sum"))
    kernelhub.reload(extra_plugins=[("cube_plugin", cube_plugin(measured))])
    assert kernelhub.get_hub().registry.spec("cube_sum").unmeasured == ()
    assert tolerances.check_recorded(kernelhub.get_hub().registry.spec("cube_sum")) == []
    # a tolerance that is too tight or too loose fails too
    tight = dataclasses.replace(measured, tolerances={d: kernelhub.Tolerance(t.forward / 10, t.backward)
                                                      for d, t in measured.tolerances.items()})
    assert any("below" in p for p in tolerances.check_recorded(tight))
    loose = dataclasses.replace(measured, tolerances={d: kernelhub.Tolerance(t.forward * 10, t.backward)
                                                      for d, t in measured.tolerances.items()})
    assert any("too loose" in p for p in tolerances.check_recorded(loose))


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
