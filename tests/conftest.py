import os
from pathlib import Path

import pytest
import torch

import kernelhub
from kernelhub.config import TuneConfig

DEFAULT_CACHE_PATH = TuneConfig.cache_path  # for the test of the default location itself

# Without a GPU the Triton backend's kernels run under Triton's interpreter on CPU tensors
# (forced calls only), so the generated conformance matrix covers their logic in CI.
if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")

# The suite must not pick up a developer's own configuration.
for var in ("KERNELHUB_CONFIG", "KERNELHUB_KILL_SWITCH", "KERNELHUB_DISABLE"):
    os.environ.pop(var, None)


@pytest.fixture(autouse=True)
def fresh_hub(monkeypatch, tmp_path):
    """Each test starts from the built-in defaults, in an empty working directory, with no tuned winners
    (the default winners file moves to the test's directory; the cuda_ext build cache stays shared)."""
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("XDG_CONFIG_HOME", str(tmp_path / "xdg"))
    monkeypatch.setattr(TuneConfig, "cache_path",
                        lambda self: Path(self.cache).expanduser() if self.cache else tmp_path / "tuning.json")
    kernelhub.reload()
    yield
    monkeypatch.undo()
    kernelhub.reload()
