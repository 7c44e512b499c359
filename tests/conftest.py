import os

import pytest

import kernelhub

# The suite must not pick up a developer's own configuration.
for var in ("KERNELHUB_CONFIG", "KERNELHUB_KILL_SWITCH", "KERNELHUB_DISABLE"):
    os.environ.pop(var, None)


@pytest.fixture(autouse=True)
def fresh_hub(monkeypatch, tmp_path):
    """Each test starts from the built-in defaults, in an empty working directory."""
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("XDG_CONFIG_HOME", str(tmp_path / "xdg"))
    kernelhub.reload()
    yield
    monkeypatch.undo()
    kernelhub.reload()
