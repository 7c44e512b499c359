"""`kernelhub doctor`: versions, devices, compilers, plugin errors, the configuration in force."""

from __future__ import annotations

import argparse
import importlib.metadata
import json
import platform
import shutil

import torch
from rich.console import Console
from rich.table import Table

import kernelhub
from kernelhub.cli._common import lock_status, render_lock_status
from kernelhub.registry import FIRST_PARTY_BACKENDS


# -- doctor -----------------------------------------------------------------
def cmd_doctor(args: argparse.Namespace) -> dict:
    hub = kernelhub.get_hub()
    cuda = torch.cuda.is_available()
    devices = ["cpu"] + [f"cuda:{i} {torch.cuda.get_device_name(i)}" for i in range(torch.cuda.device_count())]
    versions = {"python": platform.python_version(), "torch": torch.__version__, "kernelhub": kernelhub.__version__,
                "cuda (torch build)": torch.version.cuda}
    for mod in ("triton", "pluggy", "rich", "filelock", "numpy"):
        try:
            __import__(mod)  # rich has no __version__: the distribution's metadata has it
            versions[mod] = importlib.metadata.version(mod)
        except Exception as exc:
            versions[mod] = f"not importable ({type(exc).__name__})"
    compilers = {name: shutil.which(name) for name in ("c++", "nvcc", "ninja")}
    return {
        "versions": versions,
        "devices": devices,
        "cuda_available": cuda,
        "compilers": compilers,
        "config": hub.config.as_dict(),
        "backends": {n: {"version": b.version, "plugin": hub.registry.plugin_of(n),
                         "unavailable_reason": hub.registry.unavailable_reason(n)}
                     for n, b in sorted(hub.registry.backends.items())},
        "plugin_errors": [{"plugin": e.plugin, "stage": e.stage, "error": e.error, "traceback": e.traceback}
                          for e in hub.registry.plugin_errors],
        "contracts": _contracts(hub.registry),
        "lock": lock_status(hub),
    }


def _contracts(reg) -> list[dict]:
    """Each third-party impl's op contract version against the op's current one (docs/backend-guide.md, "When an
    op's contract changes")."""
    rows = []
    for op in sorted(reg.specs):
        spec = reg.spec(op)
        for name, impl in sorted(reg.impls(op).items()):
            if name not in FIRST_PARTY_BACKENDS:
                later = [f"v{c.version}: {c.doc}" for c in spec.changes
                         if impl.version is not None and c.version > impl.version]
                rows.append({"op": op, "backend": name, "implements": impl.version, "current": spec.version,
                             "missing": later})
    return rows


def _op_settings(c: dict) -> list[str]:
    """An op's settings as `kernelhub.toml` reads them, a line each: its priority, pin, size ranges and cases."""
    lines = [f"priority {json.dumps(c['priority'])}"] if c.get("priority") else []
    lines += [f"pin {c['pin']!r}"] if c.get("pin") else []
    for r in c.get("sizes", []):
        where = f" on {r['device']!r}" if r.get("device") else ""
        size = f"from {r['min_elements']:,} elements" if r["min_elements"] > 1 else "from the smallest size"
        lines.append(f"{size}{where}: " + (f"priority {json.dumps(r['priority'])}" if r["priority"] else
                                           "no range (the op's priority and cases)"))
    lines += [f"case {name}: priority {json.dumps(v['priority'])}" for name, v in c.get("cases", {}).items()]
    return lines


def render_doctor(data: dict, console: Console) -> None:
    t = Table(title="environment", show_header=False)
    for k, v in data["versions"].items():
        t.add_row(k, str(v))
    t.add_row("devices", ", ".join(data["devices"]))
    for k, v in data["compilers"].items():
        t.add_row(f"compiler {k}", v or "[yellow]not found[/]")
    console.print(t)
    t = Table(title="backends")
    for col in ("backend", "version", "plugin", "status"):
        t.add_column(col)
    for n, b in data["backends"].items():
        t.add_row(n, b["version"], b["plugin"], "[green]available[/]" if b["unavailable_reason"] is None
                  else f"[red]unavailable[/]: {b['unavailable_reason']}")
    console.print(t)
    cfg = data["config"]
    t = Table(title=f"config in force: {cfg['source']}", show_header=False)
    for k in ("overrides", "kill_switch", "strict", "disabled", "priority"):
        t.add_row(k, json.dumps(cfg[k]))
    for op, c in cfg["ops"].items():  # a line per setting of each op: where it differs from the global order
        t.add_row(f"ops.{op}", "\n".join(_op_settings(c)) or "-")
    console.print(t)
    if data["contracts"]:
        t = Table(title="third-party impls: the op contract each implements")
        for col in ("op", "backend", "implements", "op's version", "what it declines"):
            t.add_column(col)
        for r in data["contracts"]:
            old = r["implements"] < r["current"]
            t.add_row(r["op"], r["backend"], f"{'[yellow]' if old else ''}v{r['implements']}{'[/]' if old else ''}",
                      f"v{r['current']}", "; ".join(r["missing"]) or "-")
        console.print(t)
    render_lock_status(data.get("lock"), console)
    if not data["plugin_errors"]:
        console.print("plugin errors: none")
    for e in data["plugin_errors"]:
        console.print(f"[red]plugin {e['plugin']!r} failed at {e['stage']}:[/] {e['error']}")
