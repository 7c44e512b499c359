"""Every code block of the user guide and the backend-author guide runs, in order, as a reader would run it.

Each guide runs in an empty directory of its own, with its own config and cache directories (shared by the
two guides); the cache holds a copy of the test session's cuda_ext build, so no block compiles it again. Block kinds:

- ``python``: run as a program (``python -c``), in that directory;
- ``bash``: run by ``bash -euo pipefail`` there, with this interpreter's ``bin`` first on PATH;
- any block whose first line is ``# file: NAME``: written to ``NAME`` there (later blocks use it; a Python
  file is also compiled here).

Anything else fails the test, so a block cannot be left unrun, with one exception: a ``python`` block that imports
a package of the test extra that is not installed here (``OPTIONAL``: the README's test command installs it, a GPU
machine without a package index may lack it) is left out, every other block still runs, and the test then ends
as skipped, naming the blocks left out, never as passed. ``pip install`` in a guide installs into a
directory on the blocks' PYTHONPATH (``PIP_TARGET``), without dependencies (they are installed already) and
without build isolation where setuptools is here, so the test environment itself is never changed.
"""

import importlib.util
import os
import re
import sys
from pathlib import Path

import harness
import pytest

REPO = Path(__file__).resolve().parents[1]
GUIDES = ("user-guide.md", "backend-guide.md")
BLOCK = re.compile(r"^```(\w*)\n(.*?)^```$", re.S | re.M)
FILE = re.compile(r"#\s*file:\s*(\S+)")
OPTIONAL = ("pytorch_nd_semiconv",)  # the test extra's packages a guide's block may import


def missing_package(code: str) -> str | None:
    """The first package of `OPTIONAL` that ``code`` imports and this interpreter cannot find, else None."""
    for name in OPTIONAL:
        if re.search(rf"^\s*(import|from)\s+{name}\b", code, re.M) and importlib.util.find_spec(name) is None:
            return name
    return None


def blocks(text: str) -> list[tuple[str, str, int]]:
    """(kind, code, line) of each fenced block."""
    return [(m[1], m[2], text.count("\n", 0, m.start()) + 1) for m in BLOCK.finditer(text)]


@pytest.fixture(scope="module")
def shared(tmp_path_factory, seed_cuda_ext_cache):
    home = tmp_path_factory.mktemp("guide-home")
    seed_cuda_ext_cache(home / "cache")  # the session's cuda_ext build: the blocks load it, none compiles
    return home


def _env(home: Path, site: Path) -> dict:
    env = {k: v for k, v in os.environ.items() if not k.startswith("KERNELHUB_")}
    env.update(XDG_CACHE_HOME=str(home / "cache"), XDG_CONFIG_HOME=str(home / "config"), COLUMNS="120",
               PATH=os.pathsep.join([str(Path(sys.executable).parent), env.get("PATH", "")]),
               PYTHONPATH=os.pathsep.join([str(site), env.get("PYTHONPATH", "")]).rstrip(os.pathsep),
               PIP_TARGET=str(site), PIP_NO_DEPS="1", PIP_DISABLE_PIP_VERSION_CHECK="1")
    if importlib.util.find_spec("setuptools"):
        env["PIP_NO_BUILD_ISOLATION"] = "0"  # pip's inverted spelling: 0 turns build isolation off
    return env


def test_blocks_are_found():
    text = (REPO / "docs" / "user-guide.md").read_text()
    assert blocks("a\n```bash\nls\n```\n```python\n# file: x.py\nx = 1\n```\n") == [
        ("bash", "ls\n", 2), ("python", "# file: x.py\nx = 1\n", 5)]
    assert len(blocks(text)) >= 8


def test_a_block_needing_a_package_not_installed_is_named(monkeypatch):
    monkeypatch.setattr(sys.modules[__name__], "OPTIONAL", ("no_such_package_here", "pytest"))
    assert missing_package("import torch\nimport no_such_package_here as p\n") == "no_such_package_here"
    assert missing_package("from no_such_package_here.sub import x\n") == "no_such_package_here"
    assert missing_package("import pytest\nprint('no_such_package_here')\n") is None  # installed; only named


@pytest.mark.parametrize("guide", GUIDES)
def test_every_block_of_the_guide_runs(guide, tmp_path, shared):
    text = (REPO / "docs" / guide).read_text()
    work, site = tmp_path / "work", tmp_path / "site"
    work.mkdir()
    env = _env(shared, site)
    found = blocks(text)
    assert found, guide
    left_out = []
    for kind, code, line in found:
        where = f"docs/{guide}:{line}"
        first = code.splitlines()[0] if code.strip() else ""
        if m := FILE.fullmatch(first.strip()):
            path = work / m[1]
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(code)
            if kind == "python":
                compile(code, where, "exec")
            continue
        if kind == "python":
            if name := missing_package(code):
                left_out.append(f"{where} (imports {name}, not installed here)")
                continue
            cmd = [sys.executable, "-c", code]
        elif kind == "bash":
            cmd = ["bash", "-euo", "pipefail", "-c", code]
        else:
            pytest.fail(f"{where}: a {kind or 'plain'} block that is neither a file nor python nor bash")
        proc = harness.run(cmd, cwd=work, env=env, timeout=900)
        assert proc.returncode == 0, f"{where} failed ({proc.returncode}):\n{code}\n{proc.stdout[-3000:]}\n" \
                                     f"{proc.stderr[-3000:]}"
    if left_out:
        pytest.skip(f"every other block ran; left out: {', '.join(left_out)}")
