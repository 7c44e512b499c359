"""The ``kernelhub`` command: what each command shows and refuses, at 80 columns and in JSON, and the recipe for a new
command in kernelhub/cli/__init__.py (a module of its own, one `Command` record in ``COMMANDS``). Some commands are
also tested with their subject: test_tune.py (tune, bench), test_third_party_spec.py (check of a plugin's op)."""
from __future__ import annotations

import argparse
import importlib.metadata
import json
import os
import sys

import harness
import pytest
import torch

import kernelhub
from kernelhub import cli, testing

# the CLI's tables are shown among the test backends and torch_ref: cuda_ext's CPU kernels are left out
pytestmark = pytest.mark.usefixtures("only_test_backends")


def _hello(args: argparse.Namespace) -> dict:
    return {"greeting": f"hello {args.name}", "failed": args.fail}


def _render_hello(data: dict, console) -> None:
    console.print(f"{data['greeting']}!")


def _args_hello(p: argparse.ArgumentParser) -> None:
    p.add_argument("name")
    p.add_argument("--fail", action="store_true")


def test_a_new_command_is_one_record_in_commands(monkeypatch, capsys):
    """kernelhub/cli/__init__.py's docstring, followed: a run, a render and an arguments function registered with one
    `Command` record give a subcommand with its help line, its arguments, --json and --wide, a table by default,
    and exit 1 where its data says it failed."""
    monkeypatch.setitem(cli.COMMANDS, "hello", cli.Command(_hello, _render_hello, "greets a name", _args_hello))
    with pytest.raises(SystemExit):
        cli.main(["--help"])
    assert "greets a name" in capsys.readouterr().out
    assert cli.main(["hello", "you"]) == 0
    assert capsys.readouterr().out.strip() == "hello you!"
    assert cli.main(["hello", "you", "--json"]) == 0
    assert json.loads(capsys.readouterr().out) == {"greeting": "hello you", "failed": False}
    assert cli.main(["hello", "you", "--wide", "--fail"]) == 1
    with pytest.raises(SystemExit):
        cli.main(["hello"])  # its own argument, required
    assert "name" in capsys.readouterr().err


def test_every_command_is_a_complete_record():
    """Each registered command has its run, render and help, and a parser that takes its arguments and the common
    options."""
    parser = cli.build_parser()
    subcommands = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    assert set(subcommands.choices) == set(cli.COMMANDS)
    for name, command in cli.COMMANDS.items():
        assert isinstance(command, cli.Command) and callable(command.run) and callable(command.render), name
        assert command.help and subcommands.choices[name].description == command.help, name
        options = {o for a in subcommands.choices[name]._actions for o in a.option_strings}
        assert {"--json", "--wide"} <= options, name


@pytest.mark.parametrize("argv, says", [
    (["explain", "tv_loss[/]"], "tv_loss[/]"), (["check", "x[/red]"], "x[/red]")])
def test_cli_arguments_are_never_read_as_markup(argv, says, capsys):
    rc = cli.main(argv)
    assert rc != 0
    captured = capsys.readouterr()
    assert says in captured.out + captured.err



@pytest.mark.parametrize("argv, says", [
    (["tune", "tv_loss_sq_3d", "--dtype", "int64", "--quick"], "int64"),
    (["bench", "tv_loss_sq_3d", "--backends", "nope", "--quick"], "nope"),
    (["explain", "tv_loss_sq_3d", "--shape", "9223372036854775808,2,2"], "--shape")])
def test_cli_refuses_what_it_cannot_do_naming_it(argv, says, capsys):
    try:
        rc = cli.main(argv)
    except SystemExit as exc:  # a usage error: argparse's exit 2
        rc = exc.code
    captured = capsys.readouterr()
    assert rc != 0 and says in captured.out + captured.err, captured


def test_doctor_reports_the_installed_versions(capsys):
    """Every runtime dependency pyproject.toml declares, with its installed version (numpy was named by the user
    guide but neither declared nor listed, and torch warned without it on every command)."""
    import re
    import tomllib
    from pathlib import Path

    assert cli.main(["doctor", "--json"]) == 0
    versions = json.loads(capsys.readouterr().out)["versions"]
    project = tomllib.loads((Path(__file__).resolve().parents[1] / "pyproject.toml").read_text())["project"]
    declared = [re.match(r"[A-Za-z0-9_.-]+", d).group(0) for d in project["dependencies"]]
    assert "numpy" in declared
    for dist in declared:  # rich has no __version__ attribute: it once read "not importable"
        assert versions[dist] == (torch.__version__ if dist == "torch" else importlib.metadata.version(dist)), versions



@pytest.mark.parametrize("command", [["explain", "tv_loss_l1_3d", "--shape", "4,5,6"], ["tune", "tv_loss_l1_3d"],
                                     ["bench", "tv_loss_l1_3d"], ["check", "torch_ref"]])
@pytest.mark.parametrize("device, says", [harness.cuda_param("cuda:99", "'cuda:99': this machine has"),
                                          ("bogus", "'bogus' is not a device"),
                                          ("meta", "'meta': the commands run on cpu or cuda")])
def test_cli_refuses_a_device_this_machine_lacks_naming_the_option(capsys, command, device, says):
    """Every command's --device is checked before anything runs: a usage error (exit 2) naming the option, where
    torch's own was a note about its CUDA library (explain) or a traceback (bench)."""
    with pytest.raises(SystemExit) as exc:
        cli.main([*command, "--device", device])
    assert exc.value.code == 2
    err = capsys.readouterr().err
    assert "argument --device" in err and says in err, err



def test_cli_explain_describes_every_op_list_arguments_included(tmp_path):
    """`kernelhub explain` on the command line, as a user runs it (a subprocess at 80 columns): each op's tensor
    arguments take one --shape each, in order, and a list argument (the multiscale planes) one per tensor in it,
    which the call shows; too few shapes is a usage error that names the arguments, not a call with made-up planes."""
    env = dict(os.environ, COLUMNS="80")
    base = [sys.executable, "-m", "kernelhub.cli", "explain", "kplanes_interp_tilted_ms", "--shape", "512,3",
            "--shape", "2,3,3"]
    done = harness.run([*base, "--shape", "6,8,32,32", "--shape", "6,8,16,16", "--json"], timeout=300, env=env,
                       cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    data = json.loads(done.stdout)
    assert "[float32[6, 8, 32, 32]@cpu, float32[6, 8, 16, 16]@cpu]" in data["call"] and data["chosen"]
    shown = harness.run([*base, "--shape", "6,8,32,32"], timeout=300, env=env, cwd=tmp_path)
    assert shown.returncode == 0 and max(map(len, shown.stdout.splitlines())) <= 80, shown.stdout
    short = harness.run(base, timeout=300, env=env, cwd=tmp_path)
    assert short.returncode == 2
    assert "planes (a list: one --shape per tensor in it); got 2" in " ".join(short.stderr.split()), short.stderr
    for op in kernelhub.op_names():  # every op, with its first small sample's shapes
        sample = testing.samples(op, "small", torch.float32 if torch.float32 in
                                 kernelhub.get_hub().registry.spec(op).dtypes else torch.complex64, "cpu")[0]
        shapes = [t.shape for a in sample.args for t in (a if isinstance(a, (list, tuple)) else [a])
                  if isinstance(t, torch.Tensor)]
        argv = ["explain", op, "--json"] + [x for s in shapes for x in ("--shape", ",".join(map(str, s)))]
        if op == "semiconv":
            argv += ["--arg", f"groups={sample.args[6]}"]
        assert cli.main(argv) == 0, op



def test_cli_check_of_a_wrong_gradient_stays_readable(plugin, tmp_path):
    """A plugin author's wrong gradient under `kernelhub check` (a subprocess at 80 columns): each failing check one
    row of a short line naming the worst Jacobian entry, its index and both values, not gradcheck's whole matrix
    (907 lines once); --verbose and the JSON give the whole message."""
    plugin("wrong_grad", "wronggrad")
    env = dict(os.environ, COLUMNS="80", PYTHONPATH=os.pathsep.join([str(tmp_path / "site"), *sys.path]))
    argv = [sys.executable, "-m", "kernelhub.cli", "check", "wronggrad", "--op", "tv_loss_sq_3d"]
    table = harness.run(argv, timeout=600, env=env, cwd=tmp_path)
    assert table.returncode == 1, table.stderr
    lines = table.stdout.splitlines()
    assert len(lines) < 150 and max(map(len, lines)) <= 80, table.stdout
    text = " ".join(table.stdout.replace("│", " ").split())
    assert "gradcheck of tv_loss_sq_3d on wronggrad" in text and "analytical" in text and "numerical" in text, text
    assert "d output[0] / d volume[" in text and "numerical:tensor" not in text
    data = json.loads(harness.run([*argv, "--json"], timeout=600, env=env, cwd=tmp_path).stdout)
    failed = [r for r in data["rows"] if r["status"] == "fail"]
    assert any("gradcheck" in r["check"] for r in failed)
    assert all("\n" not in r["detail"] for r in failed) and any("numerical:tensor" in r["full"] for r in failed)
    verbose = harness.run([*argv, "--verbose"], timeout=600, env=env, cwd=tmp_path)
    assert "numerical:tensor" in verbose.stdout and "analytical:tensor" in verbose.stdout



def test_cli_explain(capsys, plugin, tmp_path):
    plugin("fast")
    harness.write_config(tmp_path, 'priority = ["fast", "torch_ref"]\n[compile]\npriority = ["fast"]')
    assert cli.main(["explain", "tv_loss_l1_3d", "--shape", "4,5,6", "--json"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert data["chosen"] == "fast"
    assert data["compiled"] == "the operator, which selects when it runs, as above"  # fast's impl is not traceable
    assert cli.main(["explain", "tv_loss_l1_3d", "--shape", "4,5,6"]) == 0
    out = capsys.readouterr().out
    assert "lost to fast" in out
    assert "in a torch.compile graph ([compile] priority): " in out
    assert cli.main(["explain", "tv_loss_l1_3d", "--shape", "4,5,6", "--dtype", "float64"]) == 0
    out = capsys.readouterr().out
    assert "rejected" in out and "dtype torch.float64 not in" in out
    # arguments left out take the op's defaults (groups 1, tropical_max, ...), not a sample's
    assert cli.main(["explain", "semiconv", "--shape", "1,2,8,8", "--shape", "2,2,3,3", "--json"]) == 0
    call = json.loads(capsys.readouterr().out)["call"]
    assert "'tropical_max', [1, 1], [0, 0, 0, 0], [1, 1], 1, 'conv', False" in call
    assert cli.main(["explain", "semiconv", "--shape", "1,2,8,8", "--shape", "2,1,3,3", "--arg", "groups=2"]) == 0
    capsys.readouterr()
    assert cli.main(["explain", "semiconv", "--shape", "1,2,8,8", "--shape", "2,1,3,3"]) == 2
    assert "C/groups = 2 input" in capsys.readouterr().err  # errors go to stderr



def test_cli_check_passes_a_correct_backend_and_fails_a_wrong_one(capsys, plugin):
    plugin("atomic", "atomic")
    plugin("wrong", "wrong")
    kernelhub.reload()
    assert cli.main(["check", "atomic", "--json"]) == 0
    data = json.loads(capsys.readouterr().out)
    checks = {r["check"] for r in data["rows"]}
    # every check the kit has for a float32-only CPU impl ran and passed; no float64, so no opcheck/gradcheck
    assert {"parity float32 small", "parity float32 edge", "parity float32 medium", "non-contiguous float32",
            "bad inputs"} == checks and data["fail"] == 0 and data["pass"] == len(data["rows"]) == 5
    assert cli.main(["check", "wrong"]) == 1
    out = capsys.readouterr().out
    assert "FAIL" in out and "forward error" in out
    assert cli.main(["check", "no_such_backend"]) == 2
    assert "unknown backend" in capsys.readouterr().err



def test_cli_check_runs_opcheck_and_gradcheck_where_float64_is_declared(capsys):
    # two ops (--op); the user guide's last block runs `kernelhub check torch_ref` on every op
    assert cli.main(["check", "torch_ref", "--op", "tv_loss_l1_3d", "--op", "tikhonov_inverse_2xn", "--json"]) == 0
    data = json.loads(capsys.readouterr().out)
    checks = {(r["op"], r["check"]) for r in data["rows"]}
    assert {r["op"] for r in data["rows"]} == {"tv_loss_l1_3d", "tikhonov_inverse_2xn"}
    assert {(op, f"{c} float64") for op in ("tv_loss_l1_3d", "tikhonov_inverse_2xn")
            for c in ("opcheck", "gradcheck")} <= checks
    assert data["fail"] == 0 and data["pass"] > 10



def test_cli_check_refuses_an_op_the_backend_does_not_serve(capsys):
    assert cli.main(["check", "torch_ref", "--op", "no_such_op"]) == 2
    assert "--op 'no_such_op'" in " ".join(capsys.readouterr().err.split())



def test_list_and_tune_print_whole_names_in_80_columns(monkeypatch, capsys):
    """A CI log, a pipe, a laptop terminal: `kernelhub list`'s op names and `kernelhub tune`'s calls come whole
    (no "kplanes_inte…", no call folded over five lines of a cell), and no line is wider than the terminal."""
    monkeypatch.setenv("COLUMNS", "80")
    assert cli.main(["list"]) == 0
    out = capsys.readouterr().out
    assert max(map(len, out.splitlines())) <= 80 and "…" not in out
    for op in kernelhub.get_hub().registry.specs:
        assert f" {op} " in out
    call = "float32[4, 64, 64, 64]@cuda:0, " * 3 + "'tropical_max'"
    data = {"device": "cuda:0 NVIDIA H200", "cache": "/home/user/.cache/kernelhub/winners.json", "skipped": [],
            "not_timed": [], "failed": [],
            "tuned": [{"op": "kplanes_interp_tilted_taps", "call": call, "winner": "triton", "within_noise": [],
                       "candidates": {"triton": {"error": "", "first_call_s": 0.5, "forward_ms": 0.25, "step_ms": 1.0},
                                      "cuda_ext": {"error": "", "first_call_s": 2.0, "forward_ms": 0.5,
                                                   "step_ms": 1.6}}}]}
    from rich.console import Console
    console = Console(width=80, record=True)
    cli.render_tune(data, console)
    text = console.export_text()
    assert max(map(len, text.splitlines())) <= 80
    assert "kplanes_interp_tilted_taps(float32[4, 64, 64, 64]@cuda:0," in text and "1.60x slower" in text



@pytest.mark.parametrize("columns", ["80", None])  # a terminal of 80 columns; a pipe (rich then uses 80)
def test_the_tuned_winners_table_keeps_every_op_whole_in_80_columns_and_wide_shows_every_time(monkeypatch, capsys,
                                                                                               columns):
    if columns is None:
        monkeypatch.delenv("COLUMNS", raising=False)
    else:
        monkeypatch.setenv("COLUMNS", columns)
    data = cli.cmd_list(cli.build_parser().parse_args(["list"]))
    ops = sorted(kernelhub.get_hub().registry.specs)
    row = lambda op: {"op": op, "dtype": "float32", "bucket": "1048576x4 4x4x4 16x32x256x256",  # noqa: E731
                      "winner": "triton", "within_noise": [], "failed": {}, "stale": "cuda_ext changed",
                      "step_ms": {"triton": 0.5123, "cuda_ext": 0.7345, "torch_ref": 12.5}}
    semiconv = {**row("semiconv"), "bucket": "2x8x32x32 8x1x8x8 'tropical_max' [1, 1] [2, 2, 2, 2] [1, 1] 8 'conv' "
                                              "False False False"}  # a real one, from the README's main job
    data["winners"] = {"cache": "/home/user/.cache/kernelhub/tuning.json", "mode": "cached",
                       "devices": {"NVIDIA H200": [row(op) for op in ops] + [semiconv]}}
    monkeypatch.setitem(cli.COMMANDS, "list",
                        cli.COMMANDS["list"]._replace(run=lambda args: {**data, "wide": args.wide}))
    assert cli.main(["list"]) == 0
    out = capsys.readouterr().out
    table = out[out.index("tuned winners on"):]
    assert max(map(len, out.splitlines())) <= 80 and "…" not in out[:out.index("tuned winners on")]
    lines = [line for line in table.splitlines() if line.startswith("│")]
    for op in ops:  # the op whole, its winner and its note beside it
        assert any(f"│ {op} " in line and "triton 0.512" in line and "set aside:" in line for line in lines), op
    assert len(lines) <= 2 * (len(ops) + 1)  # each entry on at most two lines
    assert "8x1x8x8 'tropical" in table and "False False False" not in table  # the long bucket cut, not wrapped
    assert "cuda_ext 0.7345" not in table
    assert cli.main(["list", "--wide"]) == 0
    wide = capsys.readouterr().out
    assert "triton 0.5123, cuda_ext 0.7345, torch_ref 12.5" in wide and "set aside: cuda_ext changed" in wide
    assert "[1, 1] 8 'conv' False False False" in wide
