"""The registry as plugins meet it (kernelhub/registry.py): a plugin that fails to import or to validate is skipped,
reported by `kernelhub list` and `doctor`, and rolled back whole; strict mode makes it fatal. The structure of the
registry's inputs is tested in test_contracts.py (hooks, versions) and test_hostile.py (plugins that misbehave)."""
import json

import pytest
import torch

import kernelhub
from kernelhub import cli
from kernelhub.errors import PluginValidationError


def test_plugin_failing_to_import_is_skipped_and_reported(install, tmp_path, capsys):
    install("broken", "raise ImportError('libfoo.so: cannot open shared object file')\n")
    hub = kernelhub.reload()
    assert [(e.plugin, e.stage) for e in hub.registry.plugin_errors] == [("broken", "import")]
    assert kernelhub.op("tv_loss_l1_3d")(torch.ones(2, 2, 2)).tolist() == [0.0, 0.0, 0.0]
    for command in ("list", "doctor"):
        assert cli.main([command, "--json"]) == 0
        data = json.loads(capsys.readouterr().out)
        assert any(e["plugin"] == "broken" and "libfoo.so" in e["error"] for e in data["plugin_errors"])
        assert cli.main([command]) == 0
        assert "libfoo.so" in capsys.readouterr().out
    # strict mode makes it fatal
    (tmp_path / "kernelhub.toml").write_text("strict = true\n")
    with pytest.raises(PluginValidationError, match="broken"):
        kernelhub.reload()



def test_plugin_failing_validation_is_skipped(plugin):
    plugin("invalid", "invalid")
    hub = kernelhub.reload()
    (err,) = hub.registry.plugin_errors
    assert err.plugin == "invalid" and "PluginValidationError" in err.error and "torch.int32" in err.error
    assert "invalid" not in hub.registry.backends  # rolled back whole
