"""Fast without tuning: the untuned hub (the shipped kernelhub.toml, `[tune] mode = "off"`) against each GPU backend
forced, forward + backward, at every op's benchmark samples, the host sizes of benchmarks/host_overhead.py, and the
sizes around the shipped size ranges (``SWEEP``). Each row: the backend the hub picked and what decided it
(`kernelhub.explain`), each one's median ms, and the hub's time over the fastest's, all timed against each other in
interleaved rounds (`kernelhub.timing.rounds`, CUDA events; three times the rounds for a call under 1 ms, which
is host-bound on a GPU host and whose rounds vary most). Target (docs/benchmarks.md): hub / fastest <= 1.05.
``--control`` times a second hub handle in the same rounds: hub / hub again, the same code against itself, is what
the rounds' noise alone makes of a ratio at that call (an A/A control).

    python benchmarks/run.py defaults --device cuda [--ops OP ...] [--only benchmark host sweep] [--control]
        [--json FILE]

torch_ref and inductor are not timed: on the GPU they are several times slower than cuda_ext and triton at every
recorded size (docs/benchmarks.md), and inductor compiles per shape.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
from pathlib import Path

import torch

# the shipped configuration with the tuned winners ignored: what a user who never ran `kernelhub tune` gets
_cfg = Path(tempfile.mkdtemp()) / "kernelhub.toml"
_cfg.write_text('[tune]\nmode = "off"\n')
os.environ["KERNELHUB_CONFIG"] = str(_cfg)

import kernelhub  # noqa: E402
from kernelhub import testing, timing  # noqa: E402
from kernelhub.bench import make_step  # noqa: E402
from kernelhub.ops import kplanes  # noqa: E402

sys.path.insert(0, str(Path(__file__).parent))
from host_overhead import FAMILIES, _semiconv  # noqa: E402

BACKENDS = ("cuda_ext", "triton")


def _tv(*shape):
    return lambda dev, g: (torch.randn(shape, generator=g).to(dev),)


def _kp(kind, b, t=4, c=32, res=200):
    def make(dev, g):
        pts, rot, planes = kplanes._make(torch.float32, dev, torch.Generator(device=dev).manual_seed(0), b, t, c,
                                         res, res, scales=2 if kind == "ms" else 1)
        return kplanes._args(kind, pts, rot, planes)
    return make


# the sizes around each size range of the shipped configuration: op -> [(label, make(device, generator))]
SWEEP = {
    **{op: [(f"{b}x256³", _tv(b, 256, 256, 256)) for b in (1, 2, 4, 6, 8)]
       for op in ("tv_loss_l1_3d", "tv_loss_sq_3d", "tv_loss_iso_3d")},
    # K-Planes at the benchmark's planes and at the host sizes' (T 2, C 16, 128²): the points alone decide a size
    # range, and at small B the two kinds of call have put different backends ahead
    **{f"kplanes_interp_tilted{suffix}": [(f"B{b} T4 C32 200²", _kp(kind, b)) for b in (4096, 16384, 65536, 262144)]
       + [(f"B{b} T2 C16 128²", _kp(kind, b, 2, 16, 128)) for b in (4096, 16384, 65536)]
       for suffix, kind in (("", ""), ("_ms", "ms"), ("_taps", "taps"))},
    # depthwise tropical max (semiconv's case tropical_2d_depthwise) from the host-bound sizes up
    "semiconv": [(f"{b}x{c}x{hw}² {k}x{k}", _semiconv(b, c, hw, k))
                 for b, c, hw, k in ((1, 4, 32, 3), (1, 4, 32, 5), (2, 8, 64, 3), (4, 16, 64, 3), (4, 16, 128, 3),
                                     (8, 16, 128, 3))],
}


def calls(op: str, device: torch.device, only: set[str]):
    """(kind, label, args) of every call measured for ``op``."""
    g = torch.Generator().manual_seed(0)
    if "benchmark" in only:
        for s in testing.samples(op, "benchmark", torch.float32, device, seed=0):
            yield "benchmark", s.name, s.args
    if "host" in only:
        for name, sizes in FAMILIES.values():
            if name == op:
                for size, make in sizes.items():
                    yield "host", size, make(device, g)
    if "sweep" in only:
        for label, make in SWEEP.get(op, []):
            yield "sweep", label, make(device, g)


SHORT_MS = 1.0  # a call whose forward + backward takes less than this gets SHORT_ROUNDS times the rounds
SHORT_ROUNDS = 3


def measure(op: str, args, device: torch.device, repeat: int, control: bool = False) -> dict:
    spec = kernelhub.get_hub().registry.spec(op)
    args = spec.normalize(*args)
    decision = kernelhub.explain(op, *args)
    out = kernelhub.op(op)(*testing.with_grad(op, args))
    grad = testing.upstream_grad(out)
    steps = {}
    again = [("hub again", kernelhub.op(op))] if control else []  # a second handle: the A/A control
    for label, fn in [("hub", kernelhub.op(op))] + [(b, kernelhub.op(op, backend=b)) for b in BACKENDS] + again:
        step = make_step(fn, args, spec.differentiable, grad)
        try:
            step()
            steps[label] = step
        except Exception as exc:  # a backend that cannot serve this call
            print(f"  {op}: {label}: {type(exc).__name__}: {str(exc).splitlines()[0][:120]}", file=sys.stderr)
    if "hub" in steps and timing.time_ms(steps["hub"], device, quick=True) < SHORT_MS:
        repeat *= SHORT_ROUNDS  # a short call is host-bound on a GPU host: its rounds' ratios vary most
    times = timing.rounds(steps, device, repeat)
    ms = {label: statistics.median(t) for label, t in times.items()}
    forced = [b for b in BACKENDS if b in ms]
    fastest = min(forced, key=ms.get)
    why = next((c.reasons[0] for c in decision.candidates if c.backend == decision.chosen), "")
    row = {"elements": spec.size_of(args), "picked": decision.chosen, "why": why, "ms": ms,
           "fastest": fastest,
           "hub_vs_fastest": timing.paired(times, "hub", fastest)[0],
           "picked_vs_fastest": timing.paired(times, decision.chosen, fastest)[0] if decision.chosen in ms else None}
    if "hub again" in times:
        row["hub_vs_hub_again"] = timing.paired(times, "hub", "hub again")[0]
    return row


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--device", default="cuda")
    p.add_argument("--ops", nargs="*", default=None)
    p.add_argument("--only", nargs="*", default=["benchmark", "host", "sweep"])
    p.add_argument("--repeat", type=int, default=15)
    p.add_argument("--control", action="store_true", help="also time a second hub handle (hub / hub again: A/A)")
    p.add_argument("--json", default=None)
    a = p.parse_args(argv)
    device = torch.device(a.device)
    hub = kernelhub.reload()  # the configuration above, also where kernelhub was imported before this module
    rows = []
    for op in a.ops or sorted(hub.registry.specs):
        for kind, label, args in calls(op, device, set(a.only)):
            try:
                row = {"op": op, "kind": kind, "call": label, **measure(op, args, device, a.repeat, a.control)}
            except torch.OutOfMemoryError as exc:
                print(f"  {op} {label}: {exc}"[:200], file=sys.stderr)
                continue
            rows.append(row)
            times = " ".join(f"{k} {v:.4g}" for k, v in row["ms"].items())
            aa = f" hub/hub again {row['hub_vs_hub_again']:.3f}" if "hub_vs_hub_again" in row else ""
            print(f"{op:28s} {kind:9s} {label:28s} picks {row['picked']:9s} fastest {row['fastest']:9s} "
                  f"hub/fastest {row['hub_vs_fastest']:.2f}{aa}  ms: {times}", flush=True)
            del args  # this call's tensors freed before the next is made (the host and sweep sizes are made one by one)
            if device.type == "cuda":
                torch.cuda.empty_cache()
    worst = max(rows, key=lambda r: r["hub_vs_fastest"], default=None)
    if worst:
        print(f"worst hub/fastest: {worst['hub_vs_fastest']:.2f} ({worst['op']} {worst['call']}); "
              f"{sum(r['hub_vs_fastest'] <= 1.05 for r in rows)} of {len(rows)} calls within 1.05x")
    if a.json:
        Path(a.json).write_text(json.dumps({"device": timing.device_model(device), "torch": torch.__version__,
                                            "rows": rows}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
