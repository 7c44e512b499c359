"""`kernelhub check` on a partial backend (tests/partial_semiconv: 2-D depthwise tropical semiconv, the rest
declined): the correct one passes once its declines are named with --allow-partial, and every copy with a
planted mistake fails. The kit finds the calls such a backend accepts by drawing from semiconv's sample space
(`kernelhub.testing.reach`)."""

import json
import sys
import tomllib
from pathlib import Path

import pytest

import kernelhub
from kernelhub import cli

HERE = Path(__file__).parent / "partial_semiconv"
sys.path.insert(0, str(HERE))
import kernelhub_partial_semiconv as partial  # noqa: E402

# what the partial backend leaves out of semiconv's space, as the 'not covered' rows name it
DECLINED = ["semifield=linear", "semifield=root", "semifield=log", "dims=[13]", "stride>1", "dilation>1",
            "group_broadcasting", "padding=asymmetric"]
ALLOW = [a for tag in DECLINED for a in ("--allow-partial", tag)]


def _check(capsys, mistake, *argv):
    with kernelhub.scoped(extra_plugins=[("partial", partial.plugin(mistake))]):
        code = cli.main(["check", "partial", *argv])
    out = capsys.readouterr().out
    return code, (json.loads(out) if "--json" in argv else out)


def test_the_correct_partial_backend_passes_with_its_declines_named(capsys):
    code, data = _check(capsys, None, "--json", *ALLOW)
    rows = {r["check"]: r for r in data["rows"]}
    assert code == 0 and data["fail"] == data["not covered"] == 0 and data["pass"] == len(rows) == 11, rows
    # every check ran calls the impl accepts, found among many it declines; the edge one reached the ties
    for name in ("parity float32 small", "parity float64 edge", "opcheck float64", "gradcheck float64",
                 "non-contiguous float32"):
        accepted = int(rows[name]["calls"].split()[0])
        assert accepted >= 3 and "declined" in rows[name]["detail"], rows[name]
    assert "'2-D images only'" in rows["parity float32 small"]["detail"]


def test_without_allow_partial_what_it_declines_is_not_covered(capsys):
    code, data = _check(capsys, None, "--json")
    short = [r for r in data["rows"] if r["status"] == "not covered"]
    assert code == 1 and data["fail"] == 0 and short
    detail = " ".join(r["detail"] for r in short)
    for tag in ("semifield=log", "semifield=linear", "dims=1", "dims=3", "stride>1", "padding=asymmetric"):
        assert tag in detail
    assert "semifield=tropical_min" not in detail and "ties=" not in detail  # those it reached


@pytest.mark.parametrize("mistake", sorted(partial.MISTAKES))
def test_a_planted_mistake_fails_the_check(capsys, mistake):
    code, data = _check(capsys, mistake, "--json", *ALLOW)
    failed = [r for r in data["rows"] if r["status"] == "fail"]
    assert code == 1 and failed, partial.MISTAKES[mistake]
    if mistake == "column_major_ties":  # caught by the ties, in both dtypes
        assert {r["check"] for r in failed} == {"parity float32 edge", "parity float64 edge"}
        assert all("[drawn_ties=" in r["detail"] for r in failed)


def test_the_table_keeps_sample_names_and_whole_details(capsys, monkeypatch):
    monkeypatch.setenv("COLUMNS", "1000")  # rich folds long cells at the terminal's width
    code, out = _check(capsys, "erosion_origin", *ALLOW)
    assert code == 1 and "[drawn_semifield=tropical_min" in out and "not covered" in out  # the title's count
    _, data = _check(capsys, "erosion_origin", "--json", *ALLOW)
    long = max((r["detail"] for r in data["rows"]), key=len)
    assert len(long) > 300 and long.count("declined") <= 1  # whole, not cut to a line or 300 characters


def test_it_is_a_distribution_whose_entry_point_is_the_module():
    meta = tomllib.loads((HERE / "pyproject.toml").read_text())
    assert meta["project"]["entry-points"]["kernelhub.backends"] == {"partial": "kernelhub_partial_semiconv"}
    assert partial.kernelhub_register_impls is not None
