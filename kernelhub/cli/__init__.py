"""The ``kernelhub`` command: each subcommand builds a dict, then prints it as a rich table or ``--json``.

Each command is a module of this package (``listing``, ``explain``, ``tune``, ``bench``, ``doctor``, ``check``,
``lock``; what they share is in ``_common``). To add one: in a module of its own, write ``cmd_<name>(args) -> dict``
(the data; a true ``"failed"`` in it exits 1), ``render_<name>(data, console)`` (the tables) and, where it takes
arguments, ``args_<name>(parser)``; then register them with one `Command` record in ``COMMANDS`` below:
``build_parser`` and ``main`` read nothing else (tests/test_cli.py follows this recipe).
"""

from __future__ import annotations

import argparse
import json
from typing import Any, Callable, NamedTuple

from rich.console import Console
from rich.markup import escape

from kernelhub.cli._common import _no_arguments
from kernelhub.cli.bench import args_bench, cmd_bench, render_bench
from kernelhub.cli.check import args_check, cmd_check, render_check
from kernelhub.cli.doctor import cmd_doctor, render_doctor
from kernelhub.cli.explain import args_explain, cmd_explain, render_explain
from kernelhub.cli.listing import cmd_list, render_list
from kernelhub.cli.lock import args_lock, cmd_lock, render_lock
from kernelhub.cli.tune import args_tune, cmd_tune, render_tune
from kernelhub.errors import KernelhubError

__all__ = ["main", "build_parser", "Command", "COMMANDS"]


# -- main -------------------------------------------------------------------
class Command(NamedTuple):
    """One ``kernelhub`` subcommand, all that registers it: ``run`` builds its data from the parsed arguments (a
    true ``"failed"`` in it exits 1), ``render`` prints that data as tables (``--json`` prints it instead),
    ``help`` is its line in ``kernelhub --help`` and its description, ``arguments`` adds its own arguments to its
    parser (every command also takes --json and --wide)."""
    run: Callable[[argparse.Namespace], dict]
    render: Callable[[dict, Console], None]
    help: str
    arguments: Callable[[argparse.ArgumentParser], None] = _no_arguments


COMMANDS: dict[str, Command] = {
    "list": Command(cmd_list, render_list, "ops x backends: available or why not, devices, dtypes"),
    "explain": Command(cmd_explain, render_explain, "which backend serves a call, and why the others do not",
                       args_explain),
    "doctor": Command(cmd_doctor, render_doctor, "versions, devices, compilers, plugin errors, config in force"),
    "tune": Command(cmd_tune, render_tune,
                    "time every eligible backend per op and shape bucket; keep the fastest correct one", args_tune),
    "bench": Command(cmd_bench, render_bench,
                     "each backend against torch_ref, torch.compile of it, and the memory floor", args_bench),
    "check": Command(cmd_check, render_check,
                     "a backend's conformance: parity, non-contiguous inputs, opcheck, gradcheck, bad inputs, fused "
                     "weights and saved tensors where declared, and on CUDA no host sync and graph replay; exits 1 on "
                     "a failure or a part of an op's space no accepted call reached ('not covered')", args_check),
    "lock": Command(cmd_lock, render_lock,
                    "write the backends, their sources' digests, the ops' contract versions, the configuration and "
                    "the tuned winners here into a lock file; --check lists what drifted since", args_lock),
}


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="kernelhub", description="kernelhub: fused kernels chosen per call")
    sub = parser.add_subparsers(dest="command", required=True)
    for name, command in COMMANDS.items():
        p = sub.add_parser(name, help=command.help, description=command.help)
        p.add_argument("--json", action="store_true", help="print JSON instead of a table")
        p.add_argument("--wide", action="store_true",
                       help="print the tables at full width, with every column (default: the terminal's width, "
                            "80 columns in a pipe)")
        command.arguments(p)
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    command = COMMANDS[args.command]
    console = Console(width=400) if args.wide else Console()
    try:
        data = command.run(args)
    except (KernelhubError, KeyError, ValueError, TypeError, RuntimeError) as exc:
        Console(stderr=True).print(f"[red]kernelhub {args.command}: {escape(str(exc))}[/]")
        return 2
    if args.json:
        print(json.dumps(data, indent=2, default=str))
    else:
        command.render(_escaped(data), console)
    return 1 if data.get("failed") else 0  # `check`: a failed or not covered check


def _escaped(data: Any) -> Any:
    """``data`` with every string escaped for rich: what a user typed (an op name, a config value) or a plugin
    reported is printed as it is, never read as markup (``[/]`` raised, ``[plot]`` vanished). The renderers add
    their own markup around these values."""
    if isinstance(data, str):
        return escape(data)
    if isinstance(data, dict):  # keys too: a device or backend name read from a file
        return {_escaped(k): _escaped(v) for k, v in data.items()}
    if isinstance(data, (list, tuple)):
        return type(data)(_escaped(v) for v in data)
    return data

