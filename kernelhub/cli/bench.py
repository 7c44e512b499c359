"""`kernelhub bench`: each backend against torch_ref, torch.compile of it and the floor."""

from __future__ import annotations

import argparse

from rich.console import Console
from rich.markup import escape
from rich.table import Table

import kernelhub
from kernelhub.cli._common import _device, default_device


# -- bench ------------------------------------------------------------------
def cmd_bench(args: argparse.Namespace) -> dict:
    from kernelhub import bench

    hub = kernelhub.get_hub()
    device = default_device(args.device)
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



def args_bench(p: argparse.ArgumentParser) -> None:
    p.add_argument("ops", nargs="*", help="ops to time (default: all)")
    p.add_argument("--backends", nargs="+",
                   help="backends to time besides the reference (default: all that serve the device)")
    p.add_argument("--device", type=_device, help="cpu or cuda[:N] (default: cuda if present, else cpu)")
    p.add_argument("--quick", action="store_true", help="the spec's medium samples and short timings")
    p.add_argument("--shapes", nargs="+", metavar="SUBSTRING",
                   help="only the samples whose name contains one of these, e.g. B614400_T4")
    p.add_argument("--plot", metavar="FILE.png", help="also draw the table (needs matplotlib: kernelhub[plot])")
