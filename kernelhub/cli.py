"""The ``kernelhub`` command: each subcommand builds a dict, then prints it as a rich table or ``--json``.

To add a command: write ``cmd_<name>(args) -> dict`` (the data; a true ``"failed"`` in it exits 1),
``render_<name>(data, console)`` (the tables) and, where it takes arguments, ``args_<name>(parser)``, and register
them with one `Command` record in ``COMMANDS``: ``build_parser`` and ``main`` read nothing else
(tests/test_cli.py follows this recipe).
"""

from __future__ import annotations

import argparse
import ast
import importlib.metadata
import inspect
import json
import math
import platform
import shutil
import sys
from typing import Any, Callable, NamedTuple

import torch
from rich.console import Console
from rich.markup import escape
from rich.table import Table

import kernelhub
from kernelhub import testing
from kernelhub.args import describe_args
from kernelhub.errors import KernelhubError
from kernelhub.registry import FIRST_PARTY_BACKENDS
from kernelhub.tune import VERSUS_KEY, versus

__all__ = ["main", "build_parser", "Command", "COMMANDS"]


def _dtype(name: str) -> torch.dtype:
    dtype = getattr(torch, name.removeprefix("torch."), None)
    if not isinstance(dtype, torch.dtype):
        raise argparse.ArgumentTypeError(f"unknown dtype {name!r}")
    return dtype


def _device(name: str) -> str:
    """``--device``: cpu, or a CUDA device this machine has (argparse names the option in its error: torch's
    own, on a machine without that device, is a long note about its CUDA library or a traceback)."""
    try:
        device = torch.device(name)
    except RuntimeError as exc:
        raise argparse.ArgumentTypeError(f"{name!r} is not a device ({exc})") from None
    if device.type == "cuda":
        count = torch.cuda.device_count() if torch.cuda.is_available() else 0
        if (device.index or 0) >= count:
            raise argparse.ArgumentTypeError(f"{name!r}: this machine has {count} CUDA device(s)"
                                             + ("" if torch.version.cuda else f" (torch {torch.__version__} is a "
                                                                              "build without CUDA)"))
    elif device.type != "cpu":
        raise argparse.ArgumentTypeError(f"{name!r}: the commands run on cpu or cuda[:N]")
    return name


def _short(dtype: torch.dtype) -> str:
    return str(dtype).removeprefix("torch.")


# dtype names as the tables print them
_SHORT = {"float16": "f16", "bfloat16": "bf16", "float32": "f32", "float64": "f64", "complex64": "c64",
          "complex128": "c128"}


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
            "winners": _winners(hub), "wide": args.wide}


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


# -- explain ----------------------------------------------------------------
EXPLAIN_REAL_BYTES = 1 << 28  # `explain` allocates real tensors up to this much, fake ones (no memory) above


def _example_args(op: str, shapes: list[list[int]], values: list[str], dtype: torch.dtype, device: str,
                  fake_above: int | None = None) -> tuple:
    """Arguments for ``op``: tensors of the given shapes, other arguments from ``values`` (NAME=VALUE) or else the
    op's defaults (the spec's first small sample where an argument has none; with no shapes, that whole sample);
    validated by the spec like a real call. Where the tensors would take more than ``fake_above`` bytes they are
    fake tensors (shapes, no memory)."""
    spec = kernelhub.get_hub().registry.spec(op)
    nbytes = sum(math.prod(shape) for shape in shapes) * torch.empty((), dtype=dtype).element_size()
    if fake_above is not None and nbytes > fake_above:
        from torch._subclasses.fake_tensor import FakeTensorMode

        with FakeTensorMode():
            return _example_args(op, shapes, values, dtype, device)
    gen = torch.Generator(device=device).manual_seed(0)
    template = spec.samples("small", dtype, torch.device(device), gen)[0].args
    kwargs = {a.name: v for a, v in zip(spec.args, template)}
    if shapes:  # a call of the user's: what the op does when an argument is left out
        params = inspect.signature(spec.normalize).parameters
        kwargs.update({a.name: params[a.name].default for a in spec.args if not a.is_tensor and a.name in params
                       and params[a.name].default is not inspect.Parameter.empty})
        for i, group in _shapes_by_argument(op, spec, shapes).items():
            like = template[i][0] if spec.args[i].kind == "tensors" else template[i]
            made = [torch.randn(shape, generator=gen, device=device).to(like.dtype) for shape in group]
            kwargs[spec.args[i].name] = made if spec.args[i].kind == "tensors" else made[0]
    for item in values:
        name, _, text = item.partition("=")
        if name not in kwargs:
            raise ValueError(f"{op} has no argument {name!r}; arguments: {list(kwargs)}")
        try:
            kwargs[name] = ast.literal_eval(text)
        except (ValueError, SyntaxError):
            kwargs[name] = text
    return spec.normalize(**kwargs)


def _shapes_by_argument(op: str, spec, shapes: list[list[int]]) -> dict[int, list[list[int]]]:
    """``--shape``s in the order of the op's tensor arguments: one each, and a list argument ("tensors": the
    multiscale planes) the ones left over, one per tensor in the list (at least one)."""
    tensors = [i for i, a in enumerate(spec.args) if a.is_tensor]
    lists = [i for i in tensors if spec.args[i].kind == "tensors"]
    names = ", ".join(spec.args[i].name + (" (a list: one --shape per tensor in it)" if i in lists else "")
                      for i in tensors)
    singles = len(tensors) - len(lists)
    if (len(shapes) != singles) if not lists else (len(lists) > 1 or len(shapes) <= singles):
        want = f"{len(tensors)}" if not lists else f"{singles + 1} or more"
        raise ValueError(f"{op} takes {want} tensor shape(s), in order: {names}; got {len(shapes)}")
    grouped, k = {}, 0
    for i in tensors:
        n = len(shapes) - singles if i in lists else 1
        grouped[i], k = shapes[k:k + n], k + n
    return grouped


def cmd_explain(args: argparse.Namespace) -> dict:
    call = _example_args(args.op, args.shape or [], args.arg or [], args.dtype, args.device,
                         fake_above=EXPLAIN_REAL_BYTES)
    selector = kernelhub.get_hub().selector
    return {**selector.peek(args.op, call).as_dict(), "compiled": selector.compiled(args.op, call)}


def render_explain(data: dict, console: Console) -> None:
    t = Table(title=f"{data['op']}({data['call']}) -> {data['chosen']}")
    for col in ("backend", "status", "why"):
        t.add_column(col)
    colour = {"accepted": "green", "lost": "yellow", "rejected": "red"}
    for c in data["candidates"]:
        why = "; ".join(c["reasons"])
        if c["lost_to"]:
            why = f"lost to {c['lost_to']}: {why}"
        t.add_row(c["backend"], f"[{colour[c['status']]}]{c['status']}[/]", why)
    console.print(t)
    console.print(f"in a torch.compile graph (\\[compile] priority): {data['compiled']}")
    if any(" rounds" in why for c in data["candidates"] for why in c["reasons"]):
        console.print(f"[dim]{escape(VERSUS_KEY)}[/]")


# -- tune -------------------------------------------------------------------
def _tune_calls(args: argparse.Namespace) -> list[tuple[str, tuple]]:
    """(op, canonical args) to tune: the ops' benchmark samples (--quick: medium ones), or --shape."""
    reg = kernelhub.get_hub().registry
    ops = args.ops or sorted(reg.specs)
    if args.shape and len(ops) != 1:
        raise ValueError("--shape describes one op's tensors: name exactly one op")
    calls = []
    for op in ops:
        spec = reg.spec(op)
        dtype = args.dtype or spec.default_dtype
        if dtype not in spec.dtypes:
            if args.ops:  # an op the user named: say why it is not tuned
                raise ValueError(f"--dtype: {op} takes {[str(d).removeprefix('torch.') for d in spec.dtypes]}, "
                                 f"not {str(dtype).removeprefix('torch.')}")
            continue
        if args.shape:
            calls.append((op, _example_args(op, args.shape, args.arg or [], dtype, args.device)))
        else:
            samples = testing.samples(op, "medium" if args.quick else "benchmark", dtype, args.device)
            calls += [(op, s.args) for s in (samples[:1] if args.quick else samples)]
    return calls


def cmd_tune(args: argparse.Namespace) -> dict:
    from rich.progress import Progress

    hub = kernelhub.get_hub()
    args.device = args.device or ("cuda" if torch.cuda.is_available() else "cpu")
    if args.prune or args.dry_run:
        if not args.prune or args.ops or args.shape or args.arg or args.quick:
            raise ValueError("--prune takes --dry-run only (no ops, --shape, --arg or --quick): it tunes nothing")
        cache = hub.selector.tuning.cache
        try:
            pruned = hub.selector.tuning.prune(dry_run=args.dry_run)
        except OSError as exc:
            raise ValueError(f"the winners file cannot be pruned: {exc}") from None
        return {"device": args.device, "cache": str(cache.path), "tuned": [], "skipped": [], "not_timed": [],
                "failed": [], "pruned": pruned, "dry_run": args.dry_run}
    plan = []
    skipped = []
    left_out: set[str] = set()
    for op, call in _tune_calls(args):
        eligible = [i.backend for i in hub.selector.untuned(op, call).eligible]
        if args.quick:  # no compiling in a smoke run: those backends stay out of the entry (never winners)
            compiles = [n for n in eligible if hub.registry.impls(op)[n].tuned_only]
            eligible = [n for n in eligible if n not in compiles]
            left_out.update(compiles)
        if len(eligible) < 2:
            skipped.append({"op": op, "call": describe_args(call),
                            "why": f"only {eligible or 'no backend'} can serve it"})
        else:
            plan.append((op, call, eligible))
    rows = []
    with Progress(console=Console(stderr=True), transient=True, disable=not sys.stderr.isatty()) as progress:
        task = progress.add_task("tuning", total=sum(len(e) for _, _, e in plan))
        for op, call, eligible in plan:
            progress.update(task, description=escape(f"{op} {describe_args(call)}"))
            entry = hub.selector.tuning.tune(op, call, eligible, quick=args.quick,
                                             progress=lambda name: progress.advance(task))
            rows.append(entry)
    hub.selector.forget()
    cache = hub.selector.tuning.cache
    failed = [f"the winners were not written to {cache.path}: {cache.write_error}"] \
        if rows and cache.write_error else []
    return {"device": args.device, "cache": str(cache.path), "tuned": rows, "skipped": skipped,
            "not_timed": sorted(left_out), "failed": failed}


def render_tune(data: dict, console: Console) -> None:
    if "pruned" in data:
        verb = "would remove" if data["dry_run"] else "removed"
        console.print(f"{data['cache']}: {verb} {len(data['pruned'])} stale item(s)")
        for line in data["pruned"]:
            console.print(f"  {line}")
        return
    # one small table per tuned call under its name: whole op names and calls in any width (80 columns: a CI log)
    console.print(f"tuned on {data['device']} -> {escape(str(data['cache']))}")
    for e in data["tuned"]:
        close = e.get("within_noise", [])
        fastest = e["winner"] or (close[0] if close else None)
        t = Table(title=f"{e['op']}({escape(e['call'])})", title_justify="left")
        for col in ("backend", "first call s", "forward ms", "fwd+bwd ms", "outcome"):
            t.add_column(col)
        for name, c in sorted(e["candidates"].items(), key=lambda x: x[1].get("step_ms") or 1e30):
            how = versus(c) or (f"{c['step_ms'] / e['candidates'][fastest]['step_ms']:.2f}x slower"
                                if not c["error"] and name != fastest else "")
            outcome = (f"[red]{escape(c['error'])}[/]" if c["error"] else
                       "[green]winner[/]" if name == e["winner"] else
                       "[yellow]within noise[/]" + (f" ({how})" if how else "") if name in close else
                       how)
            t.add_row(name, f"{c['first_call_s']:.3g}" if c.get("first_call_s") is not None else "-",
                      f"{c['forward_ms']:.4g}" if c.get("forward_ms") is not None else "-",
                      f"{c['step_ms']:.4g}" if c.get("step_ms") is not None else "-", outcome)
        console.print(t)
    if any(c.get("vs_fastest") for e in data["tuned"] for c in e["candidates"].values()):
        console.print(f"[dim]{escape(VERSUS_KEY)}[/]")
    for skipped in data["skipped"]:
        console.print(f"[dim]not tuned: {skipped['op']}({escape(skipped['call'])}): {escape(skipped['why'])}[/]")
    if data["not_timed"]:
        console.print(f"--quick did not time {', '.join(data['not_timed'])} (compiles on first use; "
                      "`kernelhub tune` without --quick does)")
    for message in data["failed"]:
        console.print(f"[red]{message}[/]")


# -- bench ------------------------------------------------------------------
def cmd_bench(args: argparse.Namespace) -> dict:
    from kernelhub import bench

    hub = kernelhub.get_hub()
    device = args.device or ("cuda" if torch.cuda.is_available() else "cpu")
    ops = args.ops or sorted(hub.registry.specs)
    for op in ops:
        hub.registry.spec(op)  # an unknown op is an error before any timing
    unknown = sorted(set(args.backends or ()) - set(hub.registry.backends))
    if unknown:
        raise ValueError(f"--backends: unknown backend(s) {unknown}; registered: {sorted(hub.registry.backends)}")
    if args.plot:
        bench.require_plot()  # before the timings, not after them
    data = bench.run(ops, args.backends, device, quick=args.quick, log=lambda m: Console(stderr=True).print(escape(m)),
                     shapes=args.shapes)
    if args.plot:
        bench.plot(data, args.plot)
        data["plot"] = args.plot
    return {**data, "wide": args.wide}


def render_bench(data: dict, console: Console) -> None:
    # one small table per (op, sample) under its name: whole op and backend names in any width (80 columns: a CI
    # log), what binds each pass's floor under it; the repeats' spread, the first call's seconds and the graph
    # replay's milliseconds with --wide
    r = data.get("rates")
    rates = "".join([f"; cache gathers {r['gather_Bps'] / 1e9:.0f} GB/s" if r and r["gather_Bps"] else "",
                     f", atomics {r['atomics_per_s'] / 1e9:.1f}/ns" if r and r["atomics_per_s"] else "",
                     f", FP32 {r['flops_per_s'] / 1e12:.2f} TFLOP/s" if r else "",
                     f", max-plus taps {r['minmax_per_s'] / 1e12:.2f}/ps" if r and r.get("minmax_per_s") else "",
                     f", exp {r['special_per_s'] / 1e12:.2f}/ps" if r and r.get("special_per_s") else ""])
    wide = data.get("wide", False)
    graphs = any(r.get("graph_ms") is not None for r in data["rows"])  # CUDA: the device's time alone
    console.print(f"kernelhub bench on {data['device']} (copy bandwidth {data['copy_GBps']:.0f} GB/s{rates}); x floor: "
                  "the time over the op's least work at these rates (docs/ops.md); vs eager, vs compiled: the time of "
                  "the op's reference backend (its row: torch_ref for kernelhub's ops), eager and under torch.compile, "
                  "over this one"
                  + ("; graphed: x floor of the step replayed as a CUDA graph after an L2 flush, the device's time "
                     "alone (where x floor is well above it, host time binds)" if graphs else ""))
    numbers = (("ms",) + ("spread",) * wide + ("x floor",) + ("graph ms",) * (graphs and wide)
               + ("graphed",) * graphs + ("vs eager", "vs compiled") + ("first call s",) * wide)
    groups: dict[tuple[str, str], list[dict]] = {}
    for row in data["rows"]:
        groups.setdefault((row["op"], row["shape"]), []).append(row)
    for (op, shape), rows in groups.items():
        binds = {r["pass"]: r["binds"] for r in rows if r.get("binds")}
        t = Table(title=f"{op} {shape}", title_justify="left", caption_justify="left",
                  caption="floor binds: " + ", ".join(f"{p} {b}" for p, b in binds.items()) if binds else None)
        t.add_column("pass", no_wrap=True)
        t.add_column("impl", no_wrap=True)
        for col in numbers:
            t.add_column(col, justify="right", no_wrap=True)
        for r in rows:
            cells = {"ms": f"{r['ms']:.4g}", "spread": f"{r['spread']:.0%}", "x floor": f"{r['x_floor']:.2f}x",
                     "vs eager": f"{r['vs_torch_ref']:.2f}x", "vs compiled": f"{r['vs_compiled']:.2f}x",
                     "first call s": f"{r['first_call_s']:.3g}",
                     "graph ms": "-" if r.get("graph_ms") is None else f"{r['graph_ms']:.4g}",
                     "graphed": "-" if r.get("x_floor_graph") is None else f"{r['x_floor_graph']:.2f}x"}
            t.add_row(r["pass"], r["impl"], *[cells[c] for c in numbers])
        console.print(t)
    if data.get("plot"):
        console.print(f"plot written to {data['plot']}")


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
    if not data["plugin_errors"]:
        console.print("plugin errors: none")
    for e in data["plugin_errors"]:
        console.print(f"[red]plugin {e['plugin']!r} failed at {e['stage']}:[/] {e['error']}")


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


def _shape(text: str) -> list[int]:
    """``--shape 4,64,64``: sizes >= 0 whose product is below 2**63 (the largest element count torch indexes)."""
    try:
        dims = [int(x) for x in text.split(",") if x.strip()]
    except ValueError:
        raise argparse.ArgumentTypeError(f"--shape must be sizes separated by commas, e.g. 4,64,64, got {text!r}") \
            from None
    if any(d < 0 for d in dims) or math.prod(dims) >= 2 ** 63 or any(d >= 2 ** 63 for d in dims):
        raise argparse.ArgumentTypeError(f"--shape sizes must be >= 0 with fewer than 2**63 elements, got {text!r}")
    return dims


def args_explain(p: argparse.ArgumentParser) -> None:
    p.add_argument("op", help="op name, e.g. tv_loss_l1_3d")
    p.add_argument("--shape", action="append", type=_shape,
                   help="shape of each tensor argument in order, e.g. --shape 64,64,64 (repeat per tensor; a "
                        "list argument takes one per tensor in it)")
    p.add_argument("--arg", action="append", metavar="NAME=VALUE",
                   help="a non-tensor argument, e.g. --arg semifield=log:2 --arg groups=1")
    p.add_argument("--dtype", type=_dtype, default=torch.float32)
    p.add_argument("--device", type=_device, default="cpu")


def args_tune(p: argparse.ArgumentParser) -> None:
    p.add_argument("ops", nargs="*", help="ops to tune (default: all)")
    p.add_argument("--device", type=_device, help="cpu or cuda[:N] (default: cuda if present, else cpu)")
    p.add_argument("--dtype", type=_dtype, help="default: float32 (complex64 for complex-only ops)")
    p.add_argument("--shape", action="append", type=_shape,
                   help="tune this call instead of the benchmark shapes: the shape of each tensor "
                        "argument in order (repeat per tensor; a list argument takes one per tensor in it; "
                        "one op only)")
    p.add_argument("--arg", action="append", metavar="NAME=VALUE",
                   help="a non-tensor argument of --shape's call")
    p.add_argument("--quick", action="store_true",
                   help="a smoke run: each op's first medium sample, short timings, and no backend that "
                        "compiles on first use (inductor)")
    p.add_argument("--prune", action="store_true",
                   help="tune nothing: remove from the winners file the entries of ops and the candidates of "
                        "backends not installed here (a plugin removed)")
    p.add_argument("--dry-run", action="store_true", help="with --prune: list what it would remove")


def args_bench(p: argparse.ArgumentParser) -> None:
    p.add_argument("ops", nargs="*", help="ops to time (default: all)")
    p.add_argument("--backends", nargs="+",
                   help="backends to time besides the reference (default: all that serve the device)")
    p.add_argument("--device", type=_device, help="cpu or cuda[:N] (default: cuda if present, else cpu)")
    p.add_argument("--quick", action="store_true", help="the spec's medium samples and short timings")
    p.add_argument("--shapes", nargs="+", metavar="SUBSTRING",
                   help="only the samples whose name contains one of these, e.g. B614400_T4")
    p.add_argument("--plot", metavar="FILE.png", help="also draw the table (needs matplotlib: kernelhub[plot])")


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


def _no_arguments(p: argparse.ArgumentParser) -> None:
    """A command with only the common options (--json, --wide)."""


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


if __name__ == "__main__":
    sys.exit(main())
