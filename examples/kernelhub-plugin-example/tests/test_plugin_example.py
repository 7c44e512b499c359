"""The backend's own tests: kernelhub's conformance suite (`kernelhub.testing.suite`), the same checks
`kernelhub check plugin_example` runs."""

import pytest

import kernelhub
from kernelhub import cli, testing

CHECKS = testing.suite("plugin_example")


def test_the_hub_found_the_backend():
    assert "plugin_example" in kernelhub.get_hub().registry.backends and CHECKS


@pytest.mark.parametrize("check", CHECKS, ids=str)
def test_conformance(check):
    check.run()


def test_kernelhub_check_passes():
    assert cli.main(["check", "plugin_example"]) == 0
