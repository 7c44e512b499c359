"""The tiers stay apart: the fast tier (the README's test command, CI) never collects what only the full tier
(KERNELHUB_TEST_TIER=full) runs, and it still covers every op x backend; the CUDA tier (KERNELHUB_TEST_TIER=cuda)
runs the fast tier's tests marked `cuda`, and a test that uses a CUDA device without the mark cannot hide."""

import os
import sys
from pathlib import Path

import harness
import pytest
import test_conformance as conformance

import kernelhub
from kernelhub import testing


def test_the_tier_switch_is_checked(monkeypatch):
    monkeypatch.setenv("KERNELHUB_TEST_TIER", "quick")
    with pytest.raises(ValueError, match="KERNELHUB_TEST_TIER='quick'; allowed: \\['fast', 'full', 'cuda'\\]"):
        testing.tier()
    monkeypatch.setenv("KERNELHUB_TEST_TIER", "")
    assert testing.tier() == "fast"


@harness.cuda  # each tier checks its own selection
def test_this_session_runs_its_tier_only(tier_selection):
    tier, items, left_out = tier_selection
    marked = [i.nodeid for i in items if i.get_closest_marker("full")]
    if tier == "full":
        assert not left_out
    else:
        assert not marked, f"the {tier} tier collected {len(marked)} full-tier tests, e.g. {marked[:3]}"
    if tier == "cuda":
        unmarked = [i.nodeid for i in items if not i.get_closest_marker("cuda")]
        assert not unmarked, f"the cuda tier collected {len(unmarked)} tests not marked `cuda`, e.g. {unmarked[:3]}"


TIERED = """
import harness, pytest, torch

@pytest.mark.parametrize("device", harness.devices())
def test_marked_by_its_parameter(device):
    pass

@harness.cuda
def test_marked():
    pass

def test_plain():
    pass

@pytest.mark.full("costly")
@harness.cuda
def test_full_and_cuda():
    pass
"""


def _pytest_in(folder, *args, tier="fast"):
    # the inner suite is whole: not the outer run's shard (scripts/gpu_check.sh's SPLIT sets KERNELHUB_TEST_SHARD)
    env = {k: v for k, v in os.environ.items() if k != "KERNELHUB_TEST_SHARD"} | {"KERNELHUB_TEST_TIER": tier}
    return harness.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-p", "no:randomly",
                        "--rootdir", str(folder), *args, str(folder)], timeout=300, cwd=folder, env=env)


def _suite_copy(tmp_path, test_text):
    """A folder with the suite's conftest.py and harness.py and one test file."""
    here = Path(__file__).resolve().parent
    for name in ("conftest.py", "harness.py"):
        (tmp_path / name).write_text((here / name).read_text())
    (tmp_path / "test_x.py").write_text(test_text)
    return tmp_path


def test_the_cuda_tier_runs_the_fast_tiers_tests_marked_cuda(tmp_path):
    folder = _suite_copy(tmp_path, TIERED)
    cuda = _pytest_in(folder, "--collect-only", tier="cuda")
    assert cuda.returncode == 0, cuda.stdout + cuda.stderr
    ids = [line for line in cuda.stdout.splitlines() if "::" in line]
    on_gpu = ["test_x.py::test_marked_by_its_parameter[cuda]"] if harness.CUDA else []
    assert ids == [*on_gpu, "test_x.py::test_marked"], cuda.stdout
    assert "kernelhub test tier: cuda;" in cuda.stdout
    fast = _pytest_in(folder, "--collect-only")
    assert len([line for line in fast.stdout.splitlines() if "::" in line]) == 3 + len(on_gpu), fast.stdout


def test_an_inner_suite_runs_whole_inside_a_sharded_run(tmp_path, monkeypatch):
    """The suites these tests start are not cut by the outer run's shard (the second GPU's half, shard 1/2, once
    left an inner one-test suite with nothing to run)."""
    monkeypatch.setenv("KERNELHUB_TEST_SHARD", "1/2")
    ran = _pytest_in(_suite_copy(tmp_path, "def test_one():\n    pass\n"))
    assert ran.returncode == 0 and "1 passed" in ran.stdout, ran.stdout + ran.stderr


def test_a_test_that_names_a_cuda_device_without_the_mark_fails_the_collection(tmp_path):
    folder = _suite_copy(tmp_path, "import pytest\n@pytest.mark.parametrize('device', ['cpu', 'cuda:1'])\n"
                                   "def test_forgot(device):\n    pass\n")
    ran = _pytest_in(folder)
    assert ran.returncode == 4, ran.stdout + ran.stderr  # a usage error: nothing runs
    assert "1 tests use a CUDA device without the `cuda` mark" in ran.stderr and "test_forgot[cuda:1]" in ran.stderr


@pytest.mark.skipif(not harness.CUDA, reason="the allocation guard watches a GPU host's CUDA memory")
@harness.cuda
def test_a_test_that_allocates_cuda_memory_without_the_mark_fails(tmp_path):
    folder = _suite_copy(tmp_path, "import torch\ndef test_forgot():\n    torch.ones(3, device='cuda')\n")
    ran = _pytest_in(folder)
    assert ran.returncode == 1 and "allocated CUDA memory without the `cuda` mark" in ran.stdout, ran.stdout


def test_a_hung_child_fails_within_its_deadline_with_its_stack(tmp_path):
    """tests/harness.py: a child that outlives its deadline is stopped, and the failure shows where it hung."""
    code = "import time\ndef wait_forever():\n    time.sleep(600)\nwait_forever()\n"
    deadline = 3
    with pytest.raises(pytest.fail.Exception) as failed:
        harness.run([sys.executable, "-c", code], timeout=deadline)
    assert f"did not finish in {deadline} s" in str(failed.value) and "wait_forever" in str(failed.value)


@pytest.mark.skipif(testing.tier() == "full", reason="the fast tier's own selection")
def test_the_fast_tier_leaves_the_costly_cases_of_the_matrix_out():
    fast = [p.values[0] for p in conformance.CASES if not conformance._is_full(p)]
    full_only = [p.values[0] for p in conformance.CASES if conformance._is_full(p)]
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
    checks = [p.values[0] for p in conformance.CHECKS if not conformance._is_full(p)]
    gradchecks = [c for c in checks if c.kind == "gradcheck"]
    assert gradchecks and all(c.fast_mode for c in gradchecks)
    # and the kinds of check the full tier alone adds are the ones named in their markers
    for p in conformance.CASES:
        for mark in p.marks:
            assert mark.name in ("full", "cuda") and (mark.name == "cuda" or mark.args and mark.args[0]), p


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
    done = harness.run([*run, f"--junitxml={xml}", "-k", "plane or TestC", str(tmp_path)], timeout=300, cwd=tmp_path)
    assert done.returncode == 0, done.stdout + done.stderr
    out = tmp_path / "left.txt"
    script = Path(__file__).resolve().parents[1] / "scripts" / "unfinished_tests.py"
    named = harness.run([sys.executable, str(script), "--xml", str(xml), "--out", str(out), "--", "--rootdir",
                            str(tmp_path), str(tmp_path)], timeout=300, cwd=tmp_path)
    assert named.returncode == 0, named.stdout + named.stderr
    assert out.read_text().splitlines() == ["test_x.py::test_p[b]", "test_x.py::test_z"]
    assert "tests with a result: 2 of 4 selected; not finished: 2" in named.stdout
    again = harness.run([*run, f"@{out}"], timeout=300, cwd=tmp_path)  # the next run's way
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
