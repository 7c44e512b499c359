"""`kernelhub tune`: time every eligible backend per op and shape bucket, keep the fastest correct one."""

from __future__ import annotations

import argparse
import sys

from rich.console import Console
from rich.markup import escape
from rich.table import Table

import kernelhub
from kernelhub import testing
from kernelhub.args import describe_args
from kernelhub.cli._common import _device, _dtype, _example_args, _shape, default_device
from kernelhub.tune import VERSUS_KEY, versus


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
    args.device = default_device(args.device)
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
