"""`kernelhub lock` (kernelhub/lock.py, kernelhub/cli/lock.py): the lock file written, read back, checked against
the environment (what drifted, named), and a malformed or foreign file refused naming the file and the line."""

from __future__ import annotations

import copy
import json
import os
import sys

import harness
import pytest

import kernelhub
from kernelhub import cli, lock


def _now():
    return lock.snapshot(kernelhub.get_hub(), "cpu")


def test_a_lock_reads_back_as_written_and_holds_where_nothing_changed(tmp_path):
    """What `snapshot` holds survives `render` and `read` whole: every backend with its distribution, version and
    sources' digest, each op's contract version, the configuration one setting a line, the environment; and the
    same process finds no drift."""
    now = _now()
    path = lock.write(tmp_path / "kernelhub.lock", now)
    back = lock.read(path)
    assert back == now
    assert lock.drift(back, _now()) == []
    assert set(back["backends"]) == set(kernelhub.get_hub().registry.backends)
    assert back["backends"]["torch_ref"]["distribution"] == "kernelhub-torch-ref"
    assert back["ops"]["semiconv"] == kernelhub.get_hub().registry.spec("semiconv").version
    assert json.loads(back["config"]["kill_switch"]) is False and "ops.semiconv.priority" in back["config"]
    assert [p.name for p in tmp_path.iterdir()] == ["kernelhub.lock"]  # written by rename: no temporary left
    assert lock.render(back) == path.read_text()  # stable: the same lock renders the same text


def test_drift_names_what_changed_since_the_lock():
    """Each change is one line naming it: another device or torch, a backend missing, installed since, of another
    version or with changed sources, an op's contract version."""
    locked = _now()
    now = copy.deepcopy(locked)
    now["environment"]["device"] = "NVIDIA H200"
    now["environment"]["torch"] = "9.9.9"
    now["backends"]["triton"]["version"] = "9.9"
    now["backends"]["torch_ref"]["fingerprint"] += "x"
    del now["backends"]["inductor"]
    now["backends"]["newcomer"] = {"distribution": "x", "version": "1", "fingerprint": "1"}
    now["ops"]["semiconv"] += 1
    lines = "\n".join(lock.drift(locked, now))
    for says in ("device: locked", "NVIDIA H200", "torch: locked", "backend 'triton': locked version",
                 "backend 'torch_ref': its sources changed", "backend 'inductor'", "not installed here",
                 "backend 'newcomer': installed since the lock", "op 'semiconv': locked contract version"):
        assert says in lines, (says, lines)
    assert len(lock.drift(locked, now)) == 7


@pytest.mark.parametrize("text, says", [
    ("format = 'kernelhub-lock/1'\n[ops\n", "at line 2"),  # not TOML: tomllib's line and column
    ("[tool.poetry]\nname = 'x'\n", "line 1: not a kernelhub lock"),  # a foreign file
    ("kernelhub = '0.1.0'\nformat = 'other/2'\n", "line 2: not a kernelhub lock"),
    ("format = 'kernelhub-lock/1'\nkernelhub = '0.1.0'\nenvironment = 3\n", "line 3: 'environment' must be a table"),
    ("format = 'kernelhub-lock/1'\nkernelhub = '0.1.0'\n", "'environment' is missing"),
])
def test_a_malformed_or_foreign_lock_is_an_error_naming_the_file_and_line_and_changes_nothing(tmp_path, text, says):
    path = tmp_path / "kernelhub.lock"
    path.write_text(text)
    with pytest.raises(lock.LockError, match=str(path)) as err:
        lock.read(path)
    assert says in str(err.value)
    assert cli.main(["lock", "--out", str(path), "--check"]) == 2
    assert path.read_text() == text


def test_a_lock_entry_of_the_wrong_kind_is_named(tmp_path):
    now = _now()
    text = lock.render(now).replace(f'"semiconv" = {now["ops"]["semiconv"]}', '"semiconv" = "three"')
    path = tmp_path / "kernelhub.lock"
    path.write_text(text)
    with pytest.raises(lock.LockError, match=r"\[ops\] 'semiconv' must be a int"):
        lock.read(path)
    with pytest.raises(lock.LockError, match="cannot be read"):
        lock.read(tmp_path / "missing.lock")


def test_the_command_writes_the_lock_and_check_exits_1_where_it_drifted(tmp_path, capsys):
    path = tmp_path / "kernelhub.lock"
    assert cli.main(["lock", "--out", str(path), "--device", "cpu"]) == 0
    assert f"wrote {path}" in capsys.readouterr().out.replace("\n", "")
    assert cli.main(["lock", "--out", str(path), "--check", "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["drift"] == []
    text = path.read_text()
    fingerprint = lock.read(path)["backends"]["triton"]["fingerprint"]
    path.write_text(text.replace(f"fingerprint = '{fingerprint}'", "fingerprint = 'other'"))
    assert cli.main(["lock", "--out", str(path), "--check"]) == 1
    out = " ".join(capsys.readouterr().out.split())
    assert "drifted since the lock" in out and "backend 'triton': its sources changed" in out


def test_a_plugin_whose_sources_change_after_the_lock_is_named_as_drifted(plugin, tmp_path):
    """The held-out test plugin installed as a distribution, locked in a fresh process; its module edited; `kernelhub
    lock --check` in another process names the backend and that its sources changed (the fingerprint `kernelhub
    list` uses), and an unchanged environment passes the check."""
    module = plugin("fast")
    site = str(tmp_path / "site")
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([site, os.environ.get("PYTHONPATH", "")]))
    path = tmp_path / "kernelhub.lock"
    command = [sys.executable, "-m", "kernelhub.cli", "lock", "--out", str(path), "--device", "cpu"]
    harness.run(command, timeout=300, env=env, cwd=tmp_path, check=True)
    assert lock.read(path)["backends"]["fast"]["distribution"] == module
    harness.run([*command, "--check"], timeout=300, env=env, cwd=tmp_path, check=True)
    source = tmp_path / "site" / f"{module}.py"
    source.write_text(source.read_text() + "\n# edited after the lock\n")
    ran = harness.run([*command, "--check"], timeout=300, env=env, cwd=tmp_path)
    assert ran.returncode == 1, ran.stderr
    assert "backend 'fast': its sources changed" in " ".join(ran.stdout.split()), ran.stdout
