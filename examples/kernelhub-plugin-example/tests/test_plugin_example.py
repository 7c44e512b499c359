"""The backend's own tests: kernelhub's conformance kit (kernelhub.testing) over every case it declares."""

import pytest

import kernelhub
from kernelhub import cli, testing

CASES = testing.cases(backend="plugin_example")


def test_the_hub_found_the_backend():
    assert "plugin_example" in kernelhub.get_hub().registry.backends and CASES


@pytest.mark.parametrize("case", CASES, ids=str)
def test_parity(case):
    testing.check_parity(case)


@pytest.mark.parametrize("case", [c for c in CASES if c.size == "small"], ids=str)
def test_noncontiguous(case):
    testing.check_noncontiguous(case)


def test_gradcheck_opcheck_and_bad_inputs():
    testing.check_gradcheck("tv_loss_sq_3d", "plugin_example")
    testing.check_opcheck("tv_loss_sq_3d", "plugin_example")
    testing.check_bad_inputs("tv_loss_sq_3d", "plugin_example")


def test_kernelhub_check_passes():
    assert cli.main(["check", "plugin_example"]) == 0
