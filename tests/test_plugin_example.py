"""examples/kernelhub-plugin-example, a third-party backend distribution, is installed with pip and passes its
own tests (kernelhub's conformance kit) and `kernelhub check`. It is installed into a temporary directory
that only the subprocesses see, so it does not join the selection tests of this environment."""

import importlib.util
import os
import sys
from pathlib import Path

import harness

REPO = Path(__file__).resolve().parents[1]
EXAMPLE = REPO / "examples" / "kernelhub-plugin-example"


def test_plugin_example_installs_and_passes_its_tests_and_kernelhub_check(tmp_path):
    site = tmp_path / "site"
    # offline where setuptools is here (the GPU machine has no package index); isolated builds otherwise
    isolation = ["--no-build-isolation"] if importlib.util.find_spec("setuptools") else []
    harness.run([sys.executable, "-m", "pip", "install", "-q", "--no-deps", *isolation, "--target", str(site),
                 str(EXAMPLE)], timeout=600, check=True, cwd=tmp_path)
    assert (site / "kernelhub_plugin_example" / "plugin.py").exists()
    path = os.pathsep.join([str(site), os.environ.get("PYTHONPATH", "")]).rstrip(os.pathsep)
    env = {**os.environ, "PYTHONPATH": path}
    tests = harness.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", str(EXAMPLE / "tests")],
                        timeout=600, cwd=tmp_path, env=env)
    assert tests.returncode == 0, tests.stdout[-3000:] + tests.stderr[-2000:]
    assert " passed" in tests.stdout and "failed" not in tests.stdout
    check = harness.run([sys.executable, "-m", "kernelhub.cli", "check", "plugin_example", "--json"], timeout=600,
                        cwd=tmp_path, env=env)
    assert check.returncode == 0, check.stdout[-3000:] + check.stderr[-2000:]
    assert '"fail": 0' in check.stdout and '"pass": ' in check.stdout
