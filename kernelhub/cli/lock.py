"""`kernelhub lock`: write what computes each op here into a lock file, or (--check) say what changed since."""

from __future__ import annotations

import argparse
from pathlib import Path

from rich.console import Console

import kernelhub
from kernelhub import lock
from kernelhub.cli._common import _device, default_device, print_drift
from kernelhub.config import find_config_file


def _default_path() -> Path:
    """``kernelhub.lock`` beside the project's kernelhub.toml (the one in force), else in the working directory."""
    config = find_config_file()
    return (config.parent if config is not None else Path.cwd()) / "kernelhub.lock"


def cmd_lock(args: argparse.Namespace) -> dict:
    hub = kernelhub.get_hub()
    device = default_device(args.device)
    now = lock.snapshot(hub.registry, hub.config, hub.selector.tuning.cache.entries(), device)
    path = Path(args.out) if args.out else _default_path()
    if args.check:
        drift = lock.drift(lock.read(path), now)
        return {"path": str(path), "checked": True, "drift": drift, "failed": bool(drift)}
    lock.write(path, now)
    return {"path": str(path), "checked": False, "device": now["environment"]["device"],
            "backends": sorted(now["backends"]), "ops": len(now["ops"]), "winners": len(now["winners"])}


def render_lock(data: dict, console: Console) -> None:
    if not data["checked"]:
        console.print(f"wrote {data['path']}: {len(data['backends'])} backends ({', '.join(data['backends'])}), "
                      f"{data['ops']} ops, {data['winners']} tuned winners on {data['device']}")
    elif not data["drift"]:
        console.print(f"{data['path']}: the lock holds here (nothing drifted)")
    else:
        console.print(f"[red]{data['path']}: drifted since the lock[/] (`kernelhub lock` writes it again; or install "
                      "the locked versions):")
        print_drift(data["drift"], console)


def args_lock(p: argparse.ArgumentParser) -> None:
    p.add_argument("--out", metavar="FILE",
                   help="the lock file (default: kernelhub.lock beside the kernelhub.toml in force, else here)")
    p.add_argument("--device", type=_device, help="cpu or cuda[:N]: whose tuned winners (default: cuda if present)")
    p.add_argument("--check", action="store_true",
                   help="write nothing: compare the lock with this environment and list what drifted (exit 1 if "
                        "anything did)")
