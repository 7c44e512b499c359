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
