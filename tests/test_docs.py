"""The README's example runs, and the main job's demo calls every op."""

import re
import subprocess
import sys
from pathlib import Path

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


def test_the_readme_is_short_and_the_benchmarks_page_is_what_its_script_renders():
    """README.md stays a page (<= 120 lines); docs/benchmarks.md (<= 25 KB) and the README's table of winners are
    generated from the recorded results by scripts/bench_report.py, never edited by hand; code and docs cite
    docs/ops.md, not design notes outside the repository."""
    sys.path.insert(0, str(REPO / "scripts"))
    try:
        import bench_report
    finally:
        sys.path.pop(0)
    assert len((REPO / "README.md").read_text().splitlines()) <= 120
    assert (REPO / "docs" / "benchmarks.md").stat().st_size <= 25_000
    assert bench_report.render(check=True) == [], "run: python scripts/bench_report.py render"
    devices = [r["device"] for r in bench_report._records()]
    assert any(d.startswith("cpu") for d in devices) and any("H200" in d for d in devices), devices
    cited = [str(p.relative_to(REPO)) for p in (*REPO.glob("kernelhub/**/*.py"), *REPO.glob("backends/**/*.py"),
                                                 *REPO.glob("backends/**/*.h"), *REPO.glob("docs/*.md"),
                                                 REPO / "README.md")
             if re.search(r"(?<![\w/])(OPS|DESIGN)\.md", p.read_text())]
    assert not cited, cited
