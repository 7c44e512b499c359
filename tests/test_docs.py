"""The README's example runs, and the main job's demo calls every op."""

import json
import re
import subprocess
import sys
from pathlib import Path

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
    out = subprocess.run([sys.executable, str(REPO / "examples" / "demo.py")], capture_output=True, text=True,
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
    """README.md stays a page (<= 120 lines); docs/benchmarks.md (<= 28 KB: two CPU and three GPU records) and the
    README's tables (winners, host cost) are generated from the recorded results by scripts/bench_report.py, never
    edited by hand; code and docs cite docs/ops.md, not design notes outside the repository."""
    bench_report = _bench_report()
    assert len((REPO / "README.md").read_text().splitlines()) <= 120
    assert (REPO / "docs" / "benchmarks.md").stat().st_size <= 28_000
    assert bench_report.render(check=True) == [], "run: python scripts/bench_report.py render"
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
           "hub:cuda_ext": {"forward_us": 31.0, "step_us": 240.0}, "compiled ref": {"forward_us": 60.0, "step_us": 600.0},
           "_op": "tv_loss_l1_3d", "_call": "TV L1 1x16³", "_chosen": "cuda_ext"}
    data = {"device": "NVIDIA H200", "threads": 16, "versions": {"torch": "2.11"}, "rows": {"tv/tiny": row},
            "runs": [{"date": "2026-11-25", "commit": "abc", "command": "python x"}]}
    text = "\n".join(bench_report.host_report(data))
    line = next(x for x in text.splitlines() if x.startswith("| TV L1 1x16³"))
    assert line == ("| TV L1 1x16³ | cuda_ext | 30 \\| 300 | 20 \\| 150 | 1.50 \\| 2.00 | cuda_ext 1.60 | - | "
                    "60 \\| 600 | 0.50 |"), line
    assert "2026-11-25, commit abc: `python x`." in text
    out = tmp_path / "host.json"
    out.write_text(json.dumps({**data, "format": bench_report.HOST_FORMAT}))
    with pytest.raises(SystemExit, match="NVIDIA H200"):
        bench_report.record_host(out, ["--device", "cpu", "--families", "tv", "--sizes", "tiny"])
