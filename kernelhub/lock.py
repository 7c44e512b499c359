"""`kernelhub lock`: what computed each op, written down so that a later run can see what changed
(docs/user-guide.md, "Reproducible runs").

The lock file is TOML in a stable, diff-friendly form (`render`: one value a line, tables and keys sorted, no
timestamp): its format, kernelhub's version, the environment (device model, torch, triton, CUDA), each backend
(its distribution, version and `kernelhub.registry.Registry.fingerprint`, the digest of its sources that
`kernelhub list` also flags a changed plugin by), each op's contract version, the configuration in force, and the
tuned winners for the device. `write` replaces the file atomically; `read` checks it and raises `LockError` naming
the file and the line; `drift` lists what differs between a lock and the running process.
"""

from __future__ import annotations

import importlib.metadata
import json
import os
import tempfile
import tomllib
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import torch

from kernelhub.config import Config
from kernelhub.errors import KernelhubError
from kernelhub.registry import ENTRY_POINT_GROUP, FIRST_PARTY_DISTRIBUTIONS, Registry
from kernelhub.timing import device_model

__all__ = ["FORMAT", "LockError", "snapshot", "render", "write", "read", "drift", "drift_here"]

FORMAT = "kernelhub-lock/1"
_SECTIONS: dict[str, type] = {"format": str, "kernelhub": str, "environment": dict, "backends": dict, "ops": dict,
                              "config": dict, "winners": dict}


class LockError(KernelhubError, ValueError):
    """A lock file that cannot be read, is malformed, or is not a kernelhub lock; the message names the file and
    the line."""


def _versions() -> dict[str, str]:
    try:
        triton = importlib.metadata.version("triton")
    except importlib.metadata.PackageNotFoundError:
        triton = "none"
    return {"torch": torch.__version__, "triton": triton, "cuda": torch.version.cuda or "none"}


def _distribution(plugin: str | None, backend: str) -> str:
    """The distribution that installed ``backend``'s plugin (its entry point's), or "" for a plugin added in code."""
    for ep in importlib.metadata.entry_points(group=ENTRY_POINT_GROUP):
        if ep.name == plugin and ep.dist is not None:
            return ep.dist.name
    return FIRST_PARTY_DISTRIBUTIONS.get(backend, "") if plugin == backend else ""


def snapshot(reg: Registry, config: Config, entries: Mapping[str, Any], device: torch.device | str) -> dict:
    """What a lock holds: the registry's backends and ops, the configuration in force, and the tuned winners among
    ``entries`` (the winners file's) of ``device``'s model."""
    model = device_model(device)
    backends = {}
    for name in sorted(reg.backends):
        backends[name] = {"distribution": _distribution(reg.plugin_of(name), name),
                          "version": reg.backends[name].version, "fingerprint": reg.fingerprint(name)}
    winners = {key: e["winner"] for key, e in sorted(entries.items())
               if e.get("device") == model and e.get("winner")}
    return {"format": FORMAT, "kernelhub": importlib.metadata.version("kernelhub"),
            "environment": {"device": model, **_versions()},
            "backends": backends, "ops": {op: reg.spec(op).version for op in sorted(reg.specs)},
            "config": _flat(config.as_dict()), "winners": winners}


def _flat(tree: dict, prefix: str = "") -> dict[str, str]:
    """A nested configuration as one line a setting: dotted keys (``ops.semiconv.priority``), JSON values."""
    out: dict[str, str] = {}
    for key, value in tree.items():
        if isinstance(value, dict) and value:
            out.update(_flat(value, f"{prefix}{key}."))
        else:
            out[f"{prefix}{key}"] = json.dumps(value, sort_keys=True)
    return out


def _value(v: Any) -> str:
    """A TOML value: a string as a literal string where it can be (no quote or control character in it), else a
    basic one."""
    if isinstance(v, str):
        return f"'{v}'" if v.isprintable() and "'" not in v else json.dumps(v)
    return str(v).lower() if isinstance(v, bool) else str(v)


def render(lock: dict) -> str:
    """The lock as text: the top-level keys, then one table per section (a table per backend), keys sorted."""
    lines = ["# kernelhub lock: `kernelhub lock` writes it, docs/user-guide.md says what it pins",
             f"format = {_value(lock['format'])}", f"kernelhub = {_value(lock['kernelhub'])}"]
    for section in ("environment", "ops", "config", "winners"):
        lines += ["", f"[{section}]"] + [f"{json.dumps(k)} = {_value(v)}" for k, v in sorted(lock[section].items())]
    for name, fields in sorted(lock["backends"].items()):
        lines += ["", f"[backends.{json.dumps(name)}]"] + [f"{k} = {_value(v)}" for k, v in sorted(fields.items())]
    return "\n".join(lines) + "\n"


def write(path: str | Path, lock: dict) -> Path:
    """Write ``lock`` to ``path`` atomically (a temporary file in the same directory, then renamed over it)."""
    path = Path(path)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", dir=path.parent)
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            f.write(render(lock))
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    return path


def _line_of(text: str, key: str) -> int:
    """The line of ``text`` where ``key`` (a top-level key or a table) is written, 1 if it is not."""
    for n, line in enumerate(text.splitlines(), 1):
        stripped = line.strip()
        if stripped.startswith((f"{key} ", f"{key}=", f"[{key}]", f"[{key}.")):
            return n
    return 1


def read(path: str | Path) -> dict:
    """The lock at ``path``, checked: TOML, this format, every section of the right kind; else `LockError`."""
    path = Path(path)
    try:
        text = path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise LockError(f"{path}: the kernelhub lock cannot be read: {exc}") from None
    try:
        data = tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:  # its message ends "(at line N, column M)"
        raise LockError(f"{path}: not a valid lock file (TOML): {exc}") from None
    if data.get("format") != FORMAT:
        raise LockError(f"{path}, line {_line_of(text, 'format')}: not a kernelhub lock: it needs "
                        f"format = {FORMAT!r}, found {data.get('format')!r} (`kernelhub lock` writes one)")
    for key, kind in _SECTIONS.items():
        if key not in data:
            raise LockError(f"{path}, line {len(text.splitlines())}: {key!r} is missing (`kernelhub lock` writes "
                            "every section)")
        if not isinstance(data.get(key), kind):
            raise LockError(f"{path}, line {_line_of(text, key)}: {key!r} must be a "
                            f"{'table' if kind is dict else 'string'}, found {type(data.get(key)).__name__}")
    for name, fields in data["backends"].items():
        if not isinstance(fields, dict) or not all(isinstance(fields.get(k), str)
                                                   for k in ("distribution", "version", "fingerprint")):
            raise LockError(f"{path}, line {_line_of(text, 'backends')}: backend {name!r} needs the strings "
                            "distribution, version and fingerprint")
    kinds: tuple[tuple[str, type], ...] = (("ops", int), ("winners", str), ("environment", str), ("config", str))
    for section, kind in kinds:
        bad = [k for k, v in data[section].items() if not isinstance(v, kind) or isinstance(v, bool)]
        if bad:
            raise LockError(f"{path}, line {_line_of(text, section)}: [{section}] {bad[0]!r} must be a "
                            f"{kind.__name__}")
    return data


def drift_here(lock: dict, reg: Registry, config: Config, device: torch.device | str) -> list[str]:
    """`drift` between ``lock`` and this process's registry and configuration on ``device``."""
    return drift(lock, snapshot(reg, config, {}, device))


def drift(lock: dict, now: dict) -> list[str]:
    """What differs between ``lock`` (`read`) and ``now`` (`snapshot` of the running process), one line each: the
    device or a version of the environment, a backend missing, added or changed (version, sources), an op's
    contract version. Empty: the lock holds here."""
    out = []
    for key, value in sorted(lock["environment"].items()):
        if now["environment"].get(key) != value:
            out.append(f"{key}: locked {value!r}, here {now['environment'].get(key)!r}")
    for name, fields in sorted(lock["backends"].items()):
        here = now["backends"].get(name)
        if here is None:
            out.append(f"backend {name!r} ({fields['distribution'] or 'added in code'} {fields['version']}): "
                       "locked, not installed here")
        elif here["version"] != fields["version"]:
            out.append(f"backend {name!r}: locked version {fields['version']}, here {here['version']}")
        elif here["fingerprint"] != fields["fingerprint"]:
            out.append(f"backend {name!r}: its sources changed since the lock (fingerprint {fields['fingerprint']}, "
                       f"here {here['fingerprint']})")
    for name in sorted(set(now["backends"]) - set(lock["backends"])):
        out.append(f"backend {name!r}: installed since the lock")
    for op, version in sorted(lock["ops"].items()):
        if now["ops"].get(op) != version:
            out.append(f"op {op!r}: locked contract version {version}, here {now['ops'].get(op)}")
    return out
