"""The ``kernelhub`` command as a maintainer extends it: kernelhub/cli.py's recipe for a new command (one `Command`
record in ``COMMANDS``) is all it takes. The commands themselves are tested with what they show: test_selector.py
(list, explain), test_tune.py (tune, bench), test_hostile.py (doctor), test_third_party_spec.py (check)."""
from __future__ import annotations

import argparse
import json

import pytest

from kernelhub import cli


def _hello(args: argparse.Namespace) -> dict:
    return {"greeting": f"hello {args.name}", "failed": args.fail}


def _render_hello(data: dict, console) -> None:
    console.print(f"{data['greeting']}!")


def _args_hello(p: argparse.ArgumentParser) -> None:
    p.add_argument("name")
    p.add_argument("--fail", action="store_true")


def test_a_new_command_is_one_record_in_commands(monkeypatch, capsys):
    """kernelhub/cli.py's docstring, followed: a run, a render and an arguments function registered with one
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
