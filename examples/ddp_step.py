"""Data-parallel training through kernelhub: DDP steps of a K-Planes field with TV regularisation, checked against
the same steps in one process.

    torchrun --nproc_per_node 2 examples/ddp_step.py                 # NCCL, one GPU per rank
    torchrun --nproc_per_node 2 examples/ddp_step.py --device cpu    # gloo, on the CPU

The model: tilted K-Planes features (``kplanes_interp_tilted``) read out by a linear head, plus a density volume
fitted to a target and regularised by ``tv_loss_l1_3d`` (per-axis weights) and ``tv_loss_sq_3d``. Each rank
takes its half of the points; DDP averages the gradients, which is the gradient of the full batch's loss.

What it checks, on rank 0 (exit status 1 if either fails):

- the parameters after ``--steps`` DDP steps equal those of the same steps run in one process on the full
  batch: per parameter, the largest difference is at most ``--utol`` of the largest change training made
  (float64 by default, 1e-6: only the order of the sums differs; a rank's gradient left out or not averaged
  would make it about 1);
- winners are tuned once and shared: selection runs in online mode on one winners file (``--cache``); each
  shape bucket the ranks reach together is timed by one rank, and the others use its entry (they wait on the
  file's lock, then read it: `kernelhub.tune.Tuning.tune_shared`).
"""

from __future__ import annotations

import argparse
import dataclasses
import gc
import json
import os
import sys
import tempfile

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel

import kernelhub
from kernelhub.config import TuneConfig

OPS = ("kplanes_interp_tilted", "tv_loss_l1_3d", "tv_loss_sq_3d")
TV_WEIGHTS = (1.0, 0.5, 0.5)  # D, H, W


class Field(torch.nn.Module):
    def __init__(self, T: int, C: int, R: int, D: int, dtype: torch.dtype, device: torch.device) -> None:
        super().__init__()
        g = torch.Generator().manual_seed(0)  # every rank and the single process start from the same parameters

        def rand(*shape, scale=1.0):
            return (torch.randn(shape, generator=g, dtype=torch.float64) * scale).to(dtype=dtype, device=device)
        self.planes = torch.nn.Parameter(1.0 + rand(3 * T, C, R, R, scale=0.1))
        self.rotations = torch.nn.Parameter(torch.eye(3, dtype=dtype, device=device) + rand(T, 3, 3, scale=0.05))
        self.head = torch.nn.Parameter(rand(T * C, scale=0.1))
        self.volume = torch.nn.Parameter(rand(D, D, D, scale=0.1))

    def forward(self, pts: torch.Tensor) -> torch.Tensor:
        return kernelhub.op("kplanes_interp_tilted")(pts, self.rotations, self.planes) @ self.head

    def regulariser(self, target_volume: torch.Tensor) -> torch.Tensor:
        n = self.volume.numel()
        tv = kernelhub.op("tv_loss_l1_3d")(self.volume) @ torch.tensor(TV_WEIGHTS, dtype=self.volume.dtype,
                                                                        device=self.volume.device)
        return ((self.volume - target_volume).square().mean() + 1e-2 * tv / n
                + 1e-3 * kernelhub.op("tv_loss_sq_3d")(self.volume) / n)


def data(points: int, D: int, dtype: torch.dtype, device: torch.device):
    g = torch.Generator().manual_seed(1)
    pts = torch.rand(points, 3, generator=g, dtype=torch.float64) * 2 - 1
    target = torch.sin(3 * pts[:, 0]) * torch.cos(2 * pts[:, 1]) + pts[:, 2]
    volume = torch.rand(D, D, D, generator=g, dtype=torch.float64)
    return pts.to(dtype=dtype, device=device), target.to(dtype=dtype, device=device), volume.to(dtype=dtype,
                                                                                                  device=device)


def train(model, step_model, pts, target, volume, steps: int, lr: float) -> None:
    opt = torch.optim.SGD(model.parameters(), lr=lr)
    for _ in range(steps):
        opt.zero_grad(set_to_none=True)
        loss = (step_model(pts) - target).square().mean() + model.regulariser(volume)
        loss.backward()
        opt.step()


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--device", choices=("cuda", "cpu"), default="cuda" if torch.cuda.is_available() else "cpu")
    p.add_argument("--dtype", choices=("float64", "float32"), default="float64")
    p.add_argument("--points", type=int, default=65536)
    p.add_argument("--T", type=int, default=2)
    p.add_argument("--C", type=int, default=16)
    p.add_argument("--res", type=int, default=128, help="plane resolution R (planes are R x R)")
    p.add_argument("--D", type=int, default=64, help="the density volume is D^3")
    p.add_argument("--steps", type=int, default=3)
    p.add_argument("--lr", type=float, default=0.1)
    p.add_argument("--utol", type=float,
                   help="max |DDP - single| / max |single - initial| allowed per parameter: the difference as a "
                        "fraction of what training changed (default 1e-6 in float64, where only the order of the sums "
                        "differs; 1e-3 in float32, where the K-Planes backward adds with atomics)")
    p.add_argument("--cache", help="the winners file the ranks share (default: a new one in the temp directory)")
    p.add_argument("--json", help="write rank 0's report here")
    args = p.parse_args(argv)

    rank, world = int(os.environ.get("RANK", 0)), int(os.environ.get("WORLD_SIZE", 1))
    local = int(os.environ.get("LOCAL_RANK", 0))
    if args.device == "cuda":
        device = torch.device("cuda", local)
        torch.cuda.set_device(device)
    else:
        device = torch.device("cpu")
    dist.init_process_group("nccl" if args.device == "cuda" else "gloo", rank=rank, world_size=world,
                            **({"device_id": device} if args.device == "cuda" else {}))
    cache = [args.cache or os.path.join(tempfile.mkdtemp(prefix="kernelhub-ddp-"), "tuning.json")]
    dist.broadcast_object_list(cache, src=0)
    hub = kernelhub.get_hub()
    kernelhub.reload(config=dataclasses.replace(hub.config, tune=TuneConfig(mode="online", cache=cache[0])))
    dtype = getattr(torch, args.dtype)
    utol = args.utol if args.utol is not None else (1e-6 if dtype == torch.float64 else 1e-3)

    pts, target, volume = data(args.points, args.D, dtype, device)
    shard = slice(rank * args.points // world, (rank + 1) * args.points // world)
    model = Field(args.T, args.C, args.res, args.D, dtype, device)
    ddp = DistributedDataParallel(model, device_ids=[device] if args.device == "cuda" else None)
    train(model, ddp, pts[shard], target[shard], volume, args.steps, args.lr)
    tuned = list(kernelhub.get_hub().selector.tuning.tuned_here)
    chosen = {op: kernelhub.explain(op, *a).chosen for op, a in (
        ("kplanes_interp_tilted", (pts[shard], model.rotations, model.planes)), ("tv_loss_l1_3d", (model.volume,)),
        ("tv_loss_sq_3d", (model.volume,)))}
    params = {n: t.detach() for n, t in model.named_parameters()}
    reports = [None] * world
    dist.all_gather_object(reports, {"rank": rank, "device": str(device), "tuned": tuned, "chosen": chosen})
    rc = 0
    if rank == 0:
        single = Field(args.T, args.C, args.res, args.D, dtype, device)
        train(single, single, pts, target, volume, args.steps, args.lr)
        init = dict(Field(args.T, args.C, args.res, args.D, dtype, device).named_parameters())
        diffs, moved = {}, {}
        for n, t in single.named_parameters():
            moved[n] = (t.detach() - init[n].detach()).abs().max().item()
            diffs[n] = (params[n] - t.detach()).abs().max().item() / moved[n] if moved[n] > 0 else float("inf")
        all_tuned = [k for r in reports for k in r["tuned"]]
        report = {"world": world, "device": args.device, "dtype": args.dtype, "steps": args.steps,
                  "ranks": reports, "diff_over_update": diffs, "update_max_abs": moved,
                  "tuned": len(all_tuned), "tuned_once": len(all_tuned) == len(set(all_tuned)),
                  "same_choices": all(r["chosen"] == reports[0]["chosen"] for r in reports)}
        for r in reports:
            print(f"rank {r['rank']} on {r['device']}: tuned {len(r['tuned'])} bucket(s); chose {r['chosen']}")
        print(f"parameters after {args.steps} {args.dtype} steps, max |DDP - single| / max |single - initial|: "
              + ", ".join(f"{n} {d:.2e}" for n, d in diffs.items()) + f" (tolerance {utol:g})")
        print(f"each bucket tuned once across ranks: {report['tuned_once']} ({len(all_tuned)} tuned, "
              f"{len(set(all_tuned))} distinct); same backends on every rank: {report['same_choices']}")
        ok = max(diffs.values()) <= utol and report["tuned_once"] and report["same_choices"]
        print("OK" if ok else "FAILED")
        if args.json:
            with open(args.json, "w") as f:
                json.dump(report, f, indent=1)
        rc = 0 if ok else 1
    # Free DDP (its reducer holds the process group) before destroying the group: left to the interpreter's exit,
    # gloo aborted the process ("terminate called without an active exception") in about 1 run of 4 of a minimal
    # DDP script on 2 CPU cores, and in 0 of 24 with this order.
    del ddp
    gc.collect()
    dist.destroy_process_group()
    return rc


if __name__ == "__main__":
    sys.exit(main())
