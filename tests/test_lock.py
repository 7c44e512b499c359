"""`kernelhub lock` (kernelhub/lock.py, kernelhub/cli/lock.py): the lock file written, read back, checked against
the environment (what drifted, named), and a malformed or foreign file refused naming the file and the line."""

from __future__ import annotations

import copy
import json
import os
import re
import subprocess
import sys

import harness
import pytest
import torch

import kernelhub
from kernelhub import cli, lock


def _now():
    hub = kernelhub.get_hub()
    return lock.snapshot(hub.registry, hub.config, hub.selector.tuning.cache.entries(), "cpu")


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
    lock --check` and, with the lock in force, `kernelhub doctor` in other processes name the backend and that its
    sources changed (the fingerprint `kernelhub list` uses); an unchanged environment passes the check."""
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
    doctor = harness.run([sys.executable, "-m", "kernelhub.cli", "doctor"], timeout=300, cwd=tmp_path,
                         env=dict(env, KERNELHUB_LOCK=str(path)), check=True)  # the lock in force: doctor says
    assert "drifted here" in doctor.stdout and "backend 'fast': its sources changed" in " ".join(doctor.stdout.split())


@pytest.fixture
def locked_hub(tmp_path, monkeypatch):
    """``locked_hub(winners, **changes)``: a lock of this process naming ``winners`` (op -> (args, backend)), with
    ``changes`` applied to its snapshot (section -> {key: value}), in force through ``KERNELHUB_LOCK`` and a reload
    (strict where ``strict=True``); the hub it gives. The global hub is rebuilt without it afterwards."""
    from kernelhub.winners import entry_key

    def make(winners, strict=False, **changes):
        snap = _now()
        snap["winners"] = {entry_key(op, args): name for op, (args, name) in winners.items()}
        for section, values in changes.items():
            snap[section].update(values)
        path = lock.write(tmp_path / "kernelhub.lock", snap)
        monkeypatch.setenv("KERNELHUB_LOCK", str(path))
        if strict:
            (tmp_path / "kernelhub.toml").write_text("[lock]\nstrict = true\n")
            monkeypatch.setenv("KERNELHUB_CONFIG", str(tmp_path / "kernelhub.toml"))
        return kernelhub.reload()

    yield make
    monkeypatch.delenv("KERNELHUB_LOCK", raising=False)
    monkeypatch.delenv("KERNELHUB_CONFIG", raising=False)
    kernelhub.reload()


def _volume(n):
    return torch.randn(1, n, n, n)


def test_a_call_the_lock_names_is_served_by_the_locked_impl_and_explain_says_so(locked_hub):
    """Before the tuned winners and the priorities: the locked backend serves the call's bucket (its value and
    gradient the reference's), `explain` names the lock; a call of a bucket the lock does not name keeps the usual
    order."""
    small, other = _volume(8), _volume(12)
    usual = kernelhub.explain("tv_loss_l1_3d", small).chosen
    name = "torch_ref" if usual != "torch_ref" else "cuda_ext"
    hub = locked_hub({"tv_loss_l1_3d": ((small,), name)})
    decision = hub.selector.decide("tv_loss_l1_3d", (small,))
    assert decision.chosen == name
    assert "locked:" in str(kernelhub.explain("tv_loss_l1_3d", small))
    assert hub.selector.decide("tv_loss_l1_3d", (other,)).chosen == usual
    traced = hub.selector.traced("tv_loss_l1_3d", (small,))  # torch.compile: the locked backend, or the operator
    impl = hub.registry.impls("tv_loss_l1_3d")[name]
    assert traced is (impl if "traceable" in impl.can else None)
    torch.testing.assert_close(kernelhub.op("tv_loss_l1_3d")(small),
                               kernelhub.op("tv_loss_l1_3d", backend="torch_ref")(small))

def test_a_drifted_lock_warns_once_and_strict_mode_raises_at_the_call_naming_the_backend(locked_hub):
    small = _volume(8)
    usual = kernelhub.explain("tv_loss_l1_3d", small).chosen
    name = "torch_ref" if usual != "torch_ref" else "cuda_ext"
    changed = {name: {**_now()["backends"][name], "fingerprint": "before"}}
    hub = locked_hub({"tv_loss_l1_3d": ((small,), name)}, backends=changed)
    with pytest.warns(RuntimeWarning) as caught:
        assert hub.selector.decide("tv_loss_l1_3d", (small,)).chosen == usual
    text = " ".join(str(w.message) for w in caught)
    assert "drifted here" in text and f"backend {name!r}: its sources changed" in text
    hub = locked_hub({"tv_loss_l1_3d": ((small,), name)}, strict=True, backends=changed)
    with pytest.raises(kernelhub.errors.LockDriftError, match=f"names backend {name!r}.*kernelhub lock` again"):
        with pytest.warns(RuntimeWarning):
            kernelhub.op("tv_loss_l1_3d")(small)


def test_a_lock_from_another_device_is_reported_as_such(locked_hub, capsys):
    """Its winners name another device's buckets: no call here is served from it, and the drift says whose it was."""
    small = _volume(8)
    usual = kernelhub.explain("tv_loss_l1_3d", small).chosen
    hub = locked_hub({}, environment={"device": "NVIDIA H200"})
    with pytest.warns(RuntimeWarning, match="device: locked 'NVIDIA H200'"):
        assert hub.selector.decide("tv_loss_l1_3d", (small,)).chosen == usual
    assert cli.main(["doctor"]) == 0
    assert "device: locked 'NVIDIA H200'" in " ".join(capsys.readouterr().out.split())


DDP_RANK = """
import json, os, sys, torch, torch.distributed as dist
import kernelhub
dist.init_process_group("gloo", init_method="file://" + sys.argv[1], rank=int(sys.argv[2]), world_size=2)
volume = torch.randn(1, 8, 8, 8)
served = kernelhub.get_hub().selector.decide("tv_loss_l1_3d", (volume,)).chosen
names = [None, None]
dist.all_gather_object(names, served)
print(json.dumps(names))
dist.destroy_process_group()
"""


def test_ddp_ranks_with_one_lock_serve_the_same_impl(tmp_path):
    """Two CPU processes over gloo, one lock naming a backend other than the usual pick: each rank serves it."""
    from kernelhub.winners import entry_key

    volume = _volume(8)
    usual = kernelhub.explain("tv_loss_l1_3d", volume).chosen
    name = "torch_ref" if usual != "torch_ref" else "cuda_ext"
    snap = _now()
    snap["winners"] = {entry_key("tv_loss_l1_3d", (volume,)): name}
    path = lock.write(tmp_path / "kernelhub.lock", snap)
    env = dict(os.environ, KERNELHUB_LOCK=str(path))
    script = tmp_path / "rank.py"
    script.write_text(DDP_RANK)
    procs = [subprocess.Popen([sys.executable, str(script), str(tmp_path / "store"), str(r)], stdout=subprocess.PIPE,
                              stderr=subprocess.PIPE, text=True, env=harness.child_env(env)) for r in range(2)]
    outs = [harness.wait(p, 300, f"rank {r}") for r, p in enumerate(procs)]
    for p, (out, err) in zip(procs, outs):
        assert p.returncode == 0, err[-2000:]
        assert json.loads(out.strip().splitlines()[-1]) == [name, name]


def test_the_lock_setting_is_checked_and_a_relative_file_is_beside_the_config(tmp_path):
    from kernelhub.config import ConfigError, load_config
    from kernelhub.registry import declared_backend_names

    toml = tmp_path / "kernelhub.toml"
    toml.write_text("[lock]\nfile = 'runs/kernelhub.lock'\nstrict = true\n")
    config = load_config(declared_backend_names(), toml)
    assert config.lock.file == str(tmp_path / "runs" / "kernelhub.lock") and config.lock.strict
    assert config.as_dict()["lock"] == {"file": config.lock.file, "strict": True}
    for text, says in (("[lock]\nfile = 3\n", "[lock].file"), ("[lock]\nstrict = 'yes'\n", "[lock].strict"),
                       ("[lock]\npath = 'x'\n", "[lock]")):
        toml.write_text(text)
        with pytest.raises(ConfigError, match=re.escape(says)):
            load_config(declared_backend_names(), toml)


def test_a_lock_of_another_contract_version_of_the_op_is_set_aside(locked_hub):
    small = _volume(8)
    usual = kernelhub.explain("tv_loss_l1_3d", small).chosen
    name = "torch_ref" if usual != "torch_ref" else "cuda_ext"
    version = kernelhub.get_hub().registry.spec("tv_loss_l1_3d").version
    hub = locked_hub({"tv_loss_l1_3d": ((small,), name)}, ops={"tv_loss_l1_3d": version + 1})
    with pytest.warns(RuntimeWarning, match="op 'tv_loss_l1_3d': locked contract version"):
        assert hub.selector.decide("tv_loss_l1_3d", (small,)).chosen == usual
