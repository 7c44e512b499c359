import os

import pytest
import torch

import kernelhub

# Without a GPU the Triton backend's kernels run under Triton's interpreter on CPU tensors
# (forced calls only), so the generated conformance matrix covers their logic in CI.
if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")

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
