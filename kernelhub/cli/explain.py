"""`kernelhub explain`: which backend serves a call, and why the others do not."""

from __future__ import annotations

import argparse

import torch
from rich.console import Console
from rich.markup import escape
from rich.table import Table

import kernelhub
from kernelhub.cli._common import EXPLAIN_REAL_BYTES, _device, _dtype, _example_args, _shape
from kernelhub.tune import VERSUS_KEY


# -- explain ----------------------------------------------------------------
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



def args_explain(p: argparse.ArgumentParser) -> None:
    p.add_argument("op", help="op name, e.g. tv_loss_l1_3d")
    p.add_argument("--shape", action="append", type=_shape,
                   help="shape of each tensor argument in order, e.g. --shape 64,64,64 (repeat per tensor; a "
                        "list argument takes one per tensor in it)")
    p.add_argument("--arg", action="append", metavar="NAME=VALUE",
                   help="a non-tensor argument, e.g. --arg semifield=log:2 --arg groups=1")
    p.add_argument("--dtype", type=_dtype, default=torch.float32)
    p.add_argument("--device", type=_device, default="cpu")
