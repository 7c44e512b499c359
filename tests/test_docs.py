"""The README's example runs, and the main job's demo calls every op."""

import json
import os
import re
import sys
from pathlib import Path

import harness
import pytest

import kernelhub

REPO = Path(__file__).resolve().parents[1]


def test_readme_python_blocks_run():
    text = (REPO / "README.md").read_text()
    blocks = re.findall(r"```python\n(.*?)```", text, re.S)
    assert blocks
    exec(compile(blocks[0], "README.md", "exec"), {})


def test_readme_opens_with_two_commands():
    lines = (REPO / "README.md").read_text().splitlines()
    assert lines[0] == "```bash" and lines[3] == "```"
    assert "pytest" in lines[2] and lines[1].endswith("kernelhub tune --quick && kernelhub list")


def test_demo_calls_every_op():
    out = harness.run([sys.executable, str(REPO / "examples" / "demo.py")], timeout=600,
                         check=True).stdout
    backends = "|".join(kernelhub.get_hub().registry.backends)
    for name in kernelhub.op_names():
        assert re.search(rf"^{name}\s+-> ({backends}) ", out, re.M), out


def _bench_report():
    sys.path.insert(0, str(REPO / "scripts"))
    try:
        import bench_report
    finally:
        sys.path.pop(0)
    return bench_report


def test_the_readme_is_short_and_the_benchmarks_page_is_what_its_script_renders():
    """README.md stays a page (<= 120 lines); docs/benchmarks.md (<= 25 KB: the forward + backward tables, a figure per
    GPU record, each host's summary; every table in docs/lab/benchmarks-detail.md) and the README's tables (winners,
    host cost) are generated from the recorded results by scripts/bench_report.py, never edited by hand; code and docs
    cite docs/ops.md, not design notes outside the repository."""
    bench_report = _bench_report()
    assert len((REPO / "README.md").read_text().splitlines()) <= 120
    assert (REPO / "docs" / "benchmarks.md").stat().st_size <= 25_000
    assert bench_report.render(check=True) == [], "run: python scripts/bench_report.py render"
    figures = re.findall(r"\]\((img/[^)]+\.png)\)", (REPO / "docs" / "benchmarks.md").read_text())
    assert figures and all((REPO / "docs" / f).is_file() for f in figures), "run: python scripts/bench_report.py plots"
    devices = [r["device"] for r in bench_report._records()]
    assert any(d.startswith("cpu") for d in devices) and any("H200" in d for d in devices), devices
    hosts = [r["device"] for r in bench_report._records(bench_report.HOST_FORMAT)]
    assert any(d.startswith("cpu") for d in hosts) and any("H200" in d for d in hosts), hosts
    cited = [str(p.relative_to(REPO)) for p in (*REPO.glob("kernelhub/**/*.py"), *REPO.glob("backends/**/*.py"),
                                                 *REPO.glob("backends/**/*.h"), *REPO.glob("docs/*.md"),
                                                 REPO / "README.md")
             if re.search(r"(?<![\w/])(OPS|DESIGN)\.md", p.read_text())]
    assert not cited, cited


def test_a_host_record_renders_the_hub_against_the_glue_around_its_pick(tmp_path):
    """One call of a host record: the hub's pick, its forward | forward+backward µs against the minimal Function
    around that backend's functions and their ratios, each forced backend's ratio, the compiled reference; and a
    record of another device is never merged into (its rows would mix two machines)."""
    bench_report = _bench_report()
    row = {"hub": {"forward_us": 30.0, "step_us": 300.0}, "min:cuda_ext": {"forward_us": 20.0, "step_us": 150.0},
           "hub:cuda_ext": {"forward_us": 31.0, "step_us": 240.0},
           "compiled ref": {"forward_us": 60.0, "step_us": 600.0},
           "_op": "tv_loss_l1_3d", "_call": "TV L1 1x16³", "_chosen": "cuda_ext"}
    data = {"device": "NVIDIA H200", "threads": 16, "versions": {"torch": "2.11"}, "rows": {"tv/tiny": row},
            "runs": [{"date": "2026-11-25", "commit": "abc", "command": "python x"}]}
    text = "\n".join(bench_report.host_report(data))
    line = next(x for x in text.splitlines() if x.startswith("| TV L1 1x16³"))
    assert line == ("| TV L1 1x16³ | cuda_ext | 30 \\| 300 | 20 \\| 150 | 1.50 \\| 2.00 | cuda_ext 1.60 | - | "
                    "60 \\| 600 | 0.50 |"), line
    # a row recorded with the rounds' ratios shows those, not the ratio of the medians
    paired = {**row, "hub": {**row["hub"], "forward_vs_min": 1.25, "step_vs_min": 1.75},
              "hub:cuda_ext": {**row["hub:cuda_ext"], "forward_vs_min": 1.0, "step_vs_min": 1.5}}
    line = next(x for x in bench_report.host_report({**data, "rows": {"tv/tiny": paired}}) if x.startswith("| TV"))
    assert "| 1.25 \\| 1.75 | cuda_ext 1.50 |" in line, line
    assert "2026-11-25, commit abc: `python x`." in text
    out = tmp_path / "host.json"
    out.write_text(json.dumps({**data, "format": bench_report.HOST_FORMAT}))
    with pytest.raises(SystemExit, match="NVIDIA H200"):
        bench_report.record_host(out, ["--device", "cpu", "--families", "tv", "--sizes", "tiny"])


def _git(cwd, *args):
    return harness.run(["git", *args], timeout=60, cwd=cwd, check=True).stdout.strip()


def test_a_record_names_the_tree_that_ran_and_the_commit_it_is(tmp_path, monkeypatch):
    """scripts/bench_report.py records the tree of the files as they are (`_tree`: tracked and untracked, ignored
    ones left out, modes from HEAD), so a record made from a copy whose .git is older (a GPU machine's) can be tied
    to the commit given by KERNELHUB_RECORD_COMMIT; and every recorded run that names a commit and a tree holds that
    commit's tree."""
    bench_report = _bench_report()
    repo = tmp_path / "repo"
    repo.mkdir()
    _git(repo, "init", "-q")
    (repo / ".gitignore").write_text("ignored/\n")
    (repo / "run.sh").write_text("echo hi\n")
    (repo / "run.sh").chmod(0o755)
    _git(repo, "add", "-A")
    _git(repo, "-c", "user.name=t", "-c", "user.email=t@t", "commit", "-q", "-m", "one")
    monkeypatch.setattr(bench_report, "REPO", repo)
    assert bench_report._tree() == _git(repo, "rev-parse", "HEAD^{tree}")
    (repo / "run.sh").chmod(0o644)  # a copy that lost the mode: still the commit's tree
    assert bench_report._tree() == _git(repo, "rev-parse", "HEAD^{tree}")
    (repo / "ignored").mkdir()
    (repo / "ignored" / "x").write_text("x")
    assert bench_report._tree() == _git(repo, "rev-parse", "HEAD^{tree}")
    (repo / "new.py").write_text("print(1)\n")  # what ran is not HEAD: the tree says so
    changed = bench_report._tree()
    assert changed != _git(repo, "rev-parse", "HEAD^{tree}")
    (repo / "run.sh").chmod(0o755)
    _git(repo, "add", "-A")
    _git(repo, "-c", "user.name=t", "-c", "user.email=t@t", "commit", "-q", "-m", "two")
    assert changed == _git(repo, "rev-parse", "HEAD^{tree}")
    monkeypatch.setenv("KERNELHUB_RECORD_COMMIT", "abc1234")
    where = bench_report._where_and_how()
    assert where["commit"] == "abc1234" and where["tree"] == changed

    runs = [r for d in bench_report._records(bench_report.HOST_FORMAT) for r in d["runs"]]
    runs += bench_report._records() + bench_report._records(bench_report.NN_FORMAT)
    runs += bench_report._records(bench_report.CASES_FORMAT) + bench_report._records(bench_report.DEFAULTS_FORMAT)
    runs += bench_report._records(bench_report.TUNE_FORMAT)
    for run in runs:
        commit = run.get("commit", "")
        if "tree" not in run or not re.fullmatch(r"[0-9a-f]{7,40}", commit):
            continue
        found = harness.run(["git", "rev-parse", "--verify", "-q", f"{commit}^{{tree}}"], timeout=60, cwd=REPO)
        if found.returncode == 0:  # a clone without that commit cannot tell
            assert found.stdout.strip() == run["tree"], f"{commit}: the recorded tree is not the commit's"


def inventory_table() -> str:
    """docs/ops.md's inventory as the built-in backends register it: per op and backend, where it runs, its dtypes,
    whether it is deterministic, and what it declares (`Impl.can`) or how selection treats it."""
    from kernelhub.cli._common import _SHORT, _short  # the dtype names `kernelhub list` prints
    from kernelhub.registry import Registry

    registry = Registry().load()
    rows = ["| op | backend | devices | dtypes | deterministic | declares |", "| --- | --- | --- | --- | --- | --- |"]
    for op in sorted(registry.specs):
        impls = registry.impls(op)
        for i, backend in enumerate(b for b in ("torch_ref", "triton", "cuda_ext", "inductor") if b in impls):
            impl = impls[backend]  # the built-in backends only: not a third party's installed here
            d = impl.deterministic
            determinism = ("yes" if d else "no") if isinstance(d, bool) else f"on {', '.join(d)} only"
            notes = sorted(impl.can) + (["chosen only where tuned fastest"] if impl.tuned_only else []) + (
                ["forced calls only"] if impl.forced_only else [])
            rows.append(f"| {'' if i else f'`{op}`'} | {backend} | "
                        f"{' '.join(impl.devices) if impl.devices else 'any'} | "
                        f"{' '.join(_SHORT[_short(t)] for t in impl.dtypes)} | {determinism} | "
                        f"{', '.join(notes) or '-'} |")
    return "\n".join(rows)


def test_the_ops_inventory_is_what_the_backends_register():
    """docs/ops.md's inventory table, between its markers, matches the registry: a backend that changes its
    devices, dtypes, determinism or capabilities changes the table too (the message holds the table to paste)."""
    text = (REPO / "docs" / "ops.md").read_text()
    found = re.search(r"<!-- inventory -->\n(.*?)\n<!-- /inventory -->", text, re.S)
    assert found, "docs/ops.md: no <!-- inventory --> ... <!-- /inventory --> table"
    # in a process of its own without TRITON_INTERPRET (which the tests set: triton's impls then take CPU tensors
    # too), as a user's program registers the backends
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    ran = harness.run([sys.executable, "-c", "import test_docs; print(test_docs.inventory_table())"], env=env,
                         cwd=Path(__file__).parent, timeout=300)
    assert ran.returncode == 0, ran.stderr[-2000:]
    expected = ran.stdout.strip()
    assert found.group(1) == expected, f"docs/ops.md's inventory differs from the registry; it should read:\n{expected}"
