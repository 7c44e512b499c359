"""`kernelhub list`: ops x backends, available or why not, and the tuned winners."""

from __future__ import annotations

import argparse

import torch
from rich.console import Console
from rich.markup import escape
from rich.table import Table

import kernelhub
from kernelhub.cli._common import _SHORT, _short, lock_status, render_lock_status


# -- list -------------------------------------------------------------------
def cmd_list(args: argparse.Namespace) -> dict:
    hub = kernelhub.get_hub()
    reg = hub.registry
    backends = {}
    for name in sorted(set(reg.backends) | {e.plugin for e in reg.plugin_errors}):
        b = reg.backends.get(name)
        reason = reg.unavailable_reason(name)
        backends[name] = {"version": b.version if b else None, "available": reason is None, "reason": reason,
                          "disabled": name in hub.config.disabled, "plugin": reg.plugin_of(name)}
    ops: dict[str, dict] = {}
    for op in sorted(reg.specs):
        ops[op] = {}
        for bname, impl in sorted(reg.impls(op).items()):
            ops[op][bname] = {"devices": list(impl.devices) if impl.devices else ["any"],
                              "dtypes": [_short(d) for d in impl.dtypes], "deterministic": impl.deterministic,
                              "available": reg.unavailable_reason(bname) is None, "version": impl.version,
                              "op_version": reg.spec(op).version}
    errors = [{"plugin": e.plugin, "stage": e.stage, "error": e.error} for e in reg.plugin_errors]
    return {"backends": backends, "ops": ops, "plugin_errors": errors, "config": hub.config.source,
            "winners": _winners(hub), "lock": lock_status(hub), "wide": args.wide}


def _could_serve(hub, op: str, entry: dict) -> list[str]:
    """What a call of ``entry``'s bucket would rank, as far as the entry tells without the call: the backends it timed
    that are still installed, and those installed since it was tuned (its "registered") that are available, not
    disabled, and serve its dtype on its kind of device."""
    impls = hub.registry.impls(op)
    device = "cpu" if str(entry.get("device", "")).startswith("cpu") else "cuda"
    dtype = getattr(torch, str(entry.get("dtype")), None)
    timed = [n for n in entry.get("candidates", {}) if n in impls]
    new = [n for n, impl in impls.items() if n not in entry.get("registered", impls) and
           n not in hub.config.disabled and not hub.registry.unavailable_reason(n) and
           not impl.static_reasons(device, dtype)]
    return timed + new


def _winners(hub) -> dict:
    """The tuned winners per device model; "stale": why an entry is set aside (`kernelhub.tune.Tuning.set_aside`:
    torch or a timed backend changed since, or a backend installed since), else empty."""
    tuning = hub.selector.tuning
    tuning.audit()  # the entries it shows: one warning where some name what is not installed here
    rows: dict[str, list] = {}
    for _, e in sorted(tuning.cache.entries().items()):
        op = e.get("op")
        stale = "" if op not in hub.registry.specs else tuning.set_aside(e, op, _could_serve(hub, op, e)) or ""
        times = {n: c.get("step_ms") for n, c in e["candidates"].items()}
        rows.setdefault(e.get("device", "?"), []).append(
            {"op": e.get("op"), "dtype": e.get("dtype"), "bucket": e.get("bucket"), "winner": e.get("winner"),
             "within_noise": e.get("within_noise", []),
             "step_ms": times, "failed": {n: c["error"] for n, c in e["candidates"].items() if c.get("error")},
             "stale": stale})
    return {"cache": str(tuning.cache.path), "mode": hub.config.tune.mode, "devices": rows}


def render_list(data: dict, console: Console) -> None:
    render_lock_status(data.get("lock"), console)
    t = Table(title="backends")
    for col in ("backend", "version", "status"):
        t.add_column(col)
    for name, b in data["backends"].items():
        status = "[green]available[/]" if b["available"] else f"[red]unavailable[/]: {b['reason']}"
        if b["disabled"]:
            status += " [yellow](disabled by config)[/]"
        t.add_row(name, b["version"] or "-", status)
    console.print(t)
    # one row per (op, backend), the op named on its first: whole names in any width (80 columns: a CI log)
    t = Table(title=f"ops x backends (config: {escape(str(data['config']))})")
    t.add_column("op", no_wrap=True)
    for col in ("backend", "devices", "dtypes"):
        t.add_column(col)
    behind = False
    for op, impls in data["ops"].items():
        for k, (name, i) in enumerate(impls.items()):
            mark = "" if i["available"] else " [red](unavailable)[/]"
            old = f" [yellow](v{i['version']} of v{i['op_version']})[/]" if i["version"] < i["op_version"] else ""
            behind = behind or bool(old)
            t.add_row(op if k == 0 else "", name + mark, " ".join(i["devices"]),
                      " ".join(_SHORT.get(d, d) for d in i["dtypes"]) + old, end_section=k == len(impls) - 1)
    if behind:
        t.caption = ("(v2 of v3): the impl implements version 2 of the op's contract, which is at version 3 now; "
                     "it serves the calls version 2 covers (kernelhub doctor: what it declines)")
    console.print(t)
    for e in data["plugin_errors"]:
        console.print(f"[red]plugin {e['plugin']!r} failed at {e['stage']}:[/] {e['error']}")
    w = data["winners"]
    if not w["devices"]:
        console.print(f"tuned winners: none yet ({w['cache']}; `kernelhub tune` times the backends)")
    for device, rows in w["devices"].items():
        # two lines an entry, whole at 80 columns: the op, then its dtype and shape bucket; every time with --wide
        t = Table(title=f"tuned winners on {device} (mode {w['mode']}, {w['cache']})")
        t.add_column("op / dtype, bucket", no_wrap=True)
        # the bucket cut to what leaves the other columns room (about 46 characters; a semiconv bucket runs to 90)
        room = None if data["wide"] else max([len(r["op"]) for r in rows] + [console.width - 46])
        cut = False
        for col in ("winner, fwd+bwd ms",) + ("every candidate, fwd+bwd ms",) * data["wide"] + ("note",):
            t.add_column(col)
        for r in rows:
            ranked = sorted(((n, ms) for n, ms in r["step_ms"].items() if ms is not None), key=lambda x: x[1])
            note = "; ".join([f"[red]{n} failed[/]" for n in r["failed"]] + (
                [f"[yellow]set aside: {escape(r['stale'])}[/]"] if r["stale"] else []))
            ms = r["step_ms"].get(r["winner"]) if r["winner"] else None  # a hand edit may leave it without a time
            winner = (f"{r['winner']} {ms:.3g}" if ms is not None else f"{r['winner']} -" if r["winner"] else
                      f"none, tied: {', '.join(r['within_noise'])}" if r["within_noise"] else "-")
            times = [", ".join(f"{n} {ms:.4g}" for n, ms in ranked)] * data["wide"]
            call = f"  {_SHORT.get(r['dtype'], r['dtype'])} {r['bucket']}"
            if room is not None and len(call) > room:
                call, cut = call[:room - 1] + "…", True
            t.add_row(f"{r['op']}\n[dim]{call}[/]", winner, *times, note)
        if cut:
            t.caption = "…: a bucket cut to this width; kernelhub list --wide shows it whole"
        console.print(t)
