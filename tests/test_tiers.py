"""The two tiers stay two: the fast tier (the README's test command, CI) never collects what only the full tier
(KERNELHUB_TEST_TIER=full) runs, and it still covers every op x backend."""

import subprocess
import sys
from pathlib import Path

import pytest
import test_conformance as conformance

import kernelhub
from kernelhub import testing


def test_the_tier_switch_is_checked(monkeypatch):
    monkeypatch.setenv("KERNELHUB_TEST_TIER", "quick")
    with pytest.raises(ValueError, match="KERNELHUB_TEST_TIER='quick'; allowed: \\['fast', 'full'\\]"):
        testing.tier()
    monkeypatch.setenv("KERNELHUB_TEST_TIER", "")
    assert testing.tier() == "fast"


def test_this_session_runs_its_tier_only(tier_selection):
    tier, items, left_out = tier_selection
    marked = [i.nodeid for i in items if i.get_closest_marker("full")]
    if tier == "full":
        assert not left_out
    else:
        assert not marked, f"the fast tier collected {len(marked)} full-tier tests, e.g. {marked[:3]}"


@pytest.mark.skipif(testing.tier() == "full", reason="the fast tier's own selection")
def test_the_fast_tier_leaves_the_costly_cases_of_the_matrix_out():
    fast = [p.values[0] for p in conformance.CASES if not p.marks]
    full_only = [p.values[0] for p in conformance.CASES if p.marks]
    assert fast and full_only
    # inductor: one sample per case (each shape bucket is a compile), float32 and float64 only
    assert all(c.sample is not None and c.size == "small" and c.dtype in conformance.WIDE
               for c in fast if c.backend == "inductor")
    # the Triton interpreter: no medium sample, and one small sample in the dtypes other than float32 / float64;
    # its cases exist where it runs (TRITON_INTERPRET=1, which tests/conftest.py sets where no GPU is)
    interpreted = [c for c in fast if c.backend == "triton" and c.device == "cpu"]
    triton = kernelhub.get_hub().registry.impls("tv_loss_l1_3d").get("triton")
    assert bool(interpreted) == (triton is not None and "cpu" in triton.devices)
    assert not [c for c in interpreted if c.size == "medium"]
    assert all(c.sample is not None for c in interpreted if c.dtype not in conformance.WIDE)
    # gradcheck against one random projection of the Jacobian (fast mode), the full tier against all of it
    checks = [p.values[0] for p in conformance.CHECKS if not p.marks]
    gradchecks = [c for c in checks if c.kind == "gradcheck"]
    assert gradchecks and all(c.fast_mode for c in gradchecks)
    # and the kinds of check the full tier alone adds are the ones named in their markers
    for p in conformance.CASES:
        for mark in p.marks:
            assert mark.name == "full" and mark.args and mark.args[0], p


def test_a_stopped_runs_unfinished_tests_are_named_for_the_next_run(tmp_path):
    """scripts/unfinished_tests.py (what scripts/gpu_check.sh runs after a stopped run) names exactly the selected
    tests without a result in the run's JUnit XML: ids with spaces, parameters and classes included."""
    (tmp_path / "test_x.py").write_text(
        "import pytest\n"
        "@pytest.mark.parametrize('p', ['a plane', 'b'])\n"
        "def test_p(p): pass\n"
        "class TestC:\n"
        "    def test_m(self): pass\n"
        "def test_z(): pass\n")
    xml = tmp_path / "run.xml"
    run = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "--rootdir", str(tmp_path)]
    done = subprocess.run([*run, f"--junitxml={xml}", "-k", "plane or TestC", str(tmp_path)], cwd=tmp_path,
                          capture_output=True, text=True)
    assert done.returncode == 0, done.stdout + done.stderr
    out = tmp_path / "left.txt"
    script = Path(__file__).resolve().parents[1] / "scripts" / "unfinished_tests.py"
    named = subprocess.run([sys.executable, str(script), "--xml", str(xml), "--out", str(out), "--", "--rootdir",
                            str(tmp_path), str(tmp_path)], cwd=tmp_path, capture_output=True, text=True)
    assert named.returncode == 0, named.stdout + named.stderr
    assert out.read_text().splitlines() == ["test_x.py::test_p[b]", "test_x.py::test_z"]
    assert "tests with a result: 2 of 4 selected; not finished: 2" in named.stdout
    again = subprocess.run([*run, f"@{out}"], cwd=tmp_path, capture_output=True, text=True)  # the next run's way
    assert "2 passed" in again.stdout, again.stdout + again.stderr


def test_a_test_of_an_xdist_group_counts_as_finished(tmp_path):
    """pytest-xdist's ``--dist loadgroup`` (scripts/gpu_check.sh's) names a test marked ``xdist_group`` in the
    JUnit XML with ``@group`` appended: scripts/unfinished_tests.py counts it as finished, and keeps an ``@`` that
    is part of a parameter's id."""
    import importlib.util

    path = Path(__file__).resolve().parents[1] / "scripts" / "unfinished_tests.py"
    spec = importlib.util.spec_from_file_location("unfinished_tests", path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    xml = tmp_path / "run.xml"
    xml.write_text('<testsuites><testsuite><testcase classname="tests.test_a" name="test_big[triton]@gpu_memory"/>'
                   '<testcase classname="tests.test_a" name="test_solo@gpu_memory"/>'
                   '<testcase classname="tests.test_a" name="test_at[x@cpu]"/></testsuite></testsuites>')
    ids = ["tests/test_a.py::test_big[triton]", "tests/test_a.py::test_big[cuda_ext]", "tests/test_a.py::test_solo",
           "tests/test_a.py::test_at[x@cpu]", "tests/test_a.py::test_at[x]"]
    assert mod.unfinished(ids, str(xml)) == ["tests/test_a.py::test_big[cuda_ext]", "tests/test_a.py::test_at[x]"]
