"""`kernelhub check`: a backend's conformance, by op and check."""

from __future__ import annotations

import argparse

from rich.console import Console
from rich.table import Table

import kernelhub
from kernelhub import testing
from kernelhub.cli._common import _device
from kernelhub.errors import KernelhubError


# -- check ------------------------------------------------------------------
def _outcome(check, allow: list[str]) -> dict:
    """One check as a row: its status (pass, fail, not covered, skip), the whole message, and the calls it reached
    (accepted / declined / run)."""
    try:
        reached = check.run(allow)
    except testing.NotCovered as exc:
        return {"status": "not covered", "detail": str(exc), "calls": exc.reached.counts}
    except BaseException as exc:  # noqa: BLE001 - a check's every way to fail is a row, not a crash
        if isinstance(exc, KeyboardInterrupt):
            raise
        if testing.is_skip(exc):
            return {"status": "skip", "detail": str(exc), "calls": ""}
        full = f"{type(exc).__name__}: {getattr(exc, 'full', exc)}"  # a gradcheck's: both Jacobians
        first = (f"{type(exc).__name__}: {exc}".splitlines() or [""])[0]
        short = first if len(first) <= 400 else first[:399] + "…"
        more = " (--verbose: the whole message)" if short != full and "--verbose" not in short else ""
        return {"status": "fail", "detail": short + more, "calls": "", "full": full}
    detail = "; ".join(filter(None, (reached.declines(), reached.not_in))) if reached else ""
    return {"status": "pass", "detail": detail, "calls": reached.counts if reached else ""}


STATUSES = ("pass", "fail", "not covered", "skip")


def cmd_check(args: argparse.Namespace) -> dict:
    """The conformance kit for one backend: every check of `kernelhub.testing.suite` on every impl it registers."""
    hub = kernelhub.get_hub()
    name, device = args.backend, args.device
    if name not in hub.registry.backends:
        raise KernelhubError(f"unknown backend {name!r}; installed: {sorted(hub.registry.backends)}")
    rows = []
    reason = hub.registry.unavailable_reason(name)
    if reason is not None:
        rows.append({"op": "-", "check": "available", "status": "fail", "detail": reason, "calls": ""})
    served = [op for op in sorted(hub.registry.specs) if name in hub.registry.impls(op)]
    unknown = [op for op in args.op or () if op not in served]
    if unknown:
        raise KernelhubError(f"--op {unknown[0]!r}: backend {name!r} has no impl of it; it serves {served}")
    ops = [op for op in served if not args.op or op in args.op] if reason is None else []
    allow = list(args.allow_partial or ())
    for op in ops:
        impl = hub.registry.impls(op)[name]
        if impl.devices is not None and device not in impl.devices:
            rows.append({"op": op, "check": "-", "status": "skip", "detail": f"serves {list(impl.devices)} only",
                         "calls": ""})
            continue
        unmeasured = hub.registry.spec(op).unmeasured
        if unmeasured:  # parity then judges each call by its own tolerance: say so, beside the checks
            rows.append({"op": op, "check": "tolerances", "status": "skip", "calls": "",
                         "detail": f"none measured for {', '.join(str(d).removeprefix('torch.') for d in unmeasured)}: "
                                   "parity used per-call tolerances (`python -m kernelhub.testing.tolerances` "
                                   "measures them; docs/backend-guide.md, section 7)"})
        for check in testing.suite(name, device, ops=[op]):
            rows.append({"op": op, "check": check.label, **_outcome(check, allow)})
    counts = {k: sum(r["status"] == k for r in rows) for k in STATUSES}
    return {"backend": name, "device": device, "allow_partial": allow, "rows": rows, **counts,
            "failed": counts["fail"] + counts["not covered"], "verbose": getattr(args, "verbose", False)}


def render_check(data: dict, console: Console) -> None:
    t = Table(title=f"kernelhub check {data['backend']} on {data['device']}: {data['pass']} passed, "
                    f"{data['fail']} failed, {data['not covered']} not covered, {data['skip']} skipped"
                    + (f" (--allow-partial {' '.join(data['allow_partial'])})" if data["allow_partial"] else ""))
    for col in ("op", "check", "status", "calls", "detail"):
        t.add_column(col, overflow="fold")
    style = {"pass": "[green]pass[/]", "fail": "[red]FAIL[/]", "not covered": "[red]not covered[/]",
             "skip": "[yellow]skip[/]"}
    for r in data["rows"]:  # escaped by `main` (sample names are in brackets)
        t.add_row(r["op"], r["check"], style[r["status"]], r["calls"], r["detail"])
    console.print(t)
    for r in data["rows"] if data.get("verbose") else ():
        if r.get("full"):
            console.print(f"\n[red]{r['op']} {r['check']}[/]:\n{r['full']}", soft_wrap=True)



def args_check(p: argparse.ArgumentParser) -> None:
    p.add_argument("backend", help="a backend name, e.g. cuda_ext or your plugin's")
    p.add_argument("--device", type=_device, choices=("cpu", "cuda"), default="cpu")
    p.add_argument("--op", action="append", metavar="OP",
                   help="check only this op (repeat for several; default: every op the backend serves)")
    p.add_argument("--allow-partial", action="append", metavar="TAG",
                   help="a part of an op's space the backend declines on purpose, as the 'not covered' "
                        "rows name it (fnmatch pattern, e.g. 'semifield=log' or 'dims=*'; repeat for "
                        "several): its checks pass without it")
    p.add_argument("--verbose", action="store_true",
                   help="after the table, each failure's whole message (a gradcheck's two Jacobians); the "
                        "table gives its first line, and --json both")
