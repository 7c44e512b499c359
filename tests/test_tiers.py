"""The two tiers stay two: the fast tier (the README's test command, CI) never collects what only the full tier
(KERNELHUB_TEST_TIER=full) runs, and it still covers every op x backend."""

import pytest

import test_conformance as conformance
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
    # the Triton interpreter: no medium sample, and one small sample in the dtypes other than float32 / float64
    interpreted = [c for c in fast if c.backend == "triton" and c.device == "cpu"]
    assert interpreted and not [c for c in interpreted if c.size == "medium"]
    assert all(c.sample is not None for c in interpreted if c.dtype not in conformance.WIDE)
    # gradcheck against one random projection of the Jacobian (fast mode), the full tier against all of it
    checks = [p.values[0] for p in conformance.CHECKS if not p.marks]
    gradchecks = [c for c in checks if c.kind == "gradcheck"]
    assert gradchecks and all(c.fast_mode for c in gradchecks)
    # and the kinds of check the full tier alone adds are the ones named in their markers
    for p in conformance.CASES:
        for mark in p.marks:
            assert mark.name == "full" and mark.args and mark.args[0], p
