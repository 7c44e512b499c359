"""Per-call cost of the hub against minimal glue around the same kernels, for every op family.

For each family (TV L1, trilinear, K-Planes, semiconv, Tikhonov) at a tiny, a medium and a large size,
microseconds per call, calls issued back to back with no synchronisation between them, each round timed by the
clock (between two CUDA events on CUDA: `kernelhub.timing.rounds`, the tuner's timing), median of the rounds, of:

  eager ref     - the torch_ref math called directly, plain autograd (kernelhub_torch_ref's functions)
  compiled ref  - torch.compile of that function (compiled before timing)
  hub           - kernelhub.op(name): whatever the selector picks here
  hub:B         - kernelhub.op(name, backend=B), for every backend that serves the call
  min:B         - backend B's own forward / backward functions (its registered Impl) in a minimal
                  torch.autograd.Function: the floor for Python glue around B's kernels (the hub calls the
                  forward without any Function where no input requires grad, so its forward can beat it)

once for the forward (inputs without grad) and once for forward + backward (torch.autograd.grad of the
output against the differentiable inputs). The summary gives hub:B / min:B for each backend, and hub /
compiled ref. Rows are timed in rounds, each round over every row in a new (seeded) order, median of the rounds;
each row also keeps its best round (``forward_best_us``, ``step_best_us``; the summary's second hub:B / min:B
line), which a host's noise disturbs least, and the hub's rows the median of their rounds' ratios to the minimal
Function (``forward_vs_min``, ``step_vs_min``; the summary's last line), which a drift of the host's speed from
round to round leaves alone.

    python benchmarks/run.py host [--device cuda] [--families tv trilinear] [--sizes tiny medium]
                                       [--json FILE] [--repeat 15]
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import types
import warnings

import torch

import kernelhub
from kernelhub import testing, timing
from kernelhub.timing import device_model

# family -> (op, {size: a function (device, generator) -> canonical args})


def _tv(shape):
    return lambda dev, g: (torch.randn(shape, generator=g).to(dev),)


def _trilinear(n, f):
    return lambda dev, g: (torch.randn(n, 8, f, generator=g).to(dev),  # noqa: E731
                           (torch.rand(n, 3, generator=g) * 2 - 1).to(dev))


def _kplanes(b, t, c, res):
    def make(dev, g):
        rot = torch.linalg.qr(torch.randn(t, 3, 3, generator=g))[0]
        return ((torch.rand(b, 3, generator=g) * 2 - 1).to(dev), rot.to(dev),
                torch.randn(3 * t, c, res, res, generator=g).to(dev))
    return make


def _semiconv(b, c, hw, k):
    return lambda dev, g: (torch.randn(b, c, hw, hw, generator=g).to(dev),  # noqa: E731
                           torch.randn(c, 1, k, k, generator=g).to(dev), "tropical_max", [1, 1], [1, 1],
                           [1, 1], c, "corr")


def _tikhonov(n, z):
    return lambda dev, g: (torch.randn(n, 2, z, generator=g, dtype=torch.complex64).to(dev), 0.1)


FAMILIES = {
    "tv": ("tv_loss_l1_3d", {"tiny": _tv((1, 16, 16, 16)), "medium": _tv((4, 64, 64, 64)),
                             "large": _tv((2, 256, 256, 256)), "xlarge": _tv((4, 256, 256, 256))}),
    "trilinear": ("trilinear_interp", {"tiny": _trilinear(256, 8), "medium": _trilinear(65536, 16),
                                       "large": _trilinear(1 << 21, 32)}),
    "kplanes": ("kplanes_interp_tilted", {"tiny": _kplanes(256, 2, 8, 32), "medium": _kplanes(16384, 2, 16, 128),
                                          "large": _kplanes(1 << 20, 4, 32, 256)}),
    "semiconv": ("semiconv", {"tiny": _semiconv(1, 4, 32, 3), "medium": _semiconv(8, 16, 128, 5),
                              "large": _semiconv(16, 32, 256, 7)}),
    "tikhonov": ("tikhonov_inverse_2xn", {"tiny": _tikhonov(1024, 5), "medium": _tikhonov(128 * 128, 9),
                                          "large": _tikhonov(1024 * 1024, 9)}),
}
# (a size only some families have, "xlarge", is left out of the others)
# what each call is, in words (the recorded results carry it, for docs/benchmarks.md)
CALLS = {
    "tv": {"tiny": "TV L1 1x16³", "medium": "TV L1 4x64³", "large": "TV L1 2x256³", "xlarge": "TV L1 4x256³"},
    "trilinear": {"tiny": "trilinear 256 points, F 8", "medium": "trilinear 65536 points, F 16",
                  "large": "trilinear 2M points, F 32"},
    "kplanes": {"tiny": "K-Planes 256 points, T 2, C 8, 32²", "medium": "K-Planes 16384 points, T 2, C 16, 128²",
                "large": "K-Planes 1M points, T 4, C 32, 256²"},
    "semiconv": {"tiny": "semiconv 1x4x32², 3x3", "medium": "semiconv 8x16x128², 5x5",
                 "large": "semiconv 16x32x256², 7x7"},
    "tikhonov": {"tiny": "Tikhonov 1024 pixels, Z 5", "medium": "Tikhonov 16384 pixels, Z 9",
                 "large": "Tikhonov 1M pixels, Z 9"},
}


def minimal(impl, spec):
    """``impl``'s forward and backward in the least glue autograd allows (tensor arguments only); an impl that
    saves for its backward (`Impl.can` "saves": cuda_ext's semiconv) saves here too, as the hub's glue has it do."""
    diff = spec.differentiable

    class Minimal(torch.autograd.Function):
        @staticmethod
        def forward(ctx, *args):
            ctx.save_for_backward(*[a for a in args if isinstance(a, torch.Tensor)])
            ctx.args = args
            if not impl.saves:
                return impl.forward(*args)
            out, ctx.saved = impl.forward(*args, saving=True)
            return out

        @staticmethod
        def backward(ctx, grad):
            args = ctx.args
            needs = [ctx.needs_input_grad[i] for i in diff]
            saved = ctx.saved if impl.saves else None
            grads = (impl.backward(grad, *args, needs=needs) if saved is None
                     else impl.backward(grad, *args, needs=needs, saved=saved))
            out = [None] * len(args)
            for i, gr in zip(diff, grads):
                out[i] = gr
            return tuple(out)

    return Minimal.apply


def timed_rounds(fns: dict, device: torch.device, repeat: int, budget_s: float = 0.05, best: dict | None = None,
                 rounds: dict | None = None) -> dict:
    """Microseconds per call of each callable, the median over ``repeat`` interleaved rounds of
    `kernelhub.timing.rounds` (the tuner's timing: back-to-back calls filling ``budget_s``, each round in a new
    order; CUDA events on CUDA). ``best`` (a dict): filled with each callable's best round, the least disturbed one
    (on a GPU host whose per-call times wander, the two tell apart what the code costs and what the host's noise
    does); ``rounds`` (a dict): with each callable's list of rounds, for ratios taken round by round (`paired`)."""
    times = {label: [ms * 1e3 for ms in t] for label, t in timing.rounds(fns, device, repeat, budget_s * 1e3).items()}
    if best is not None:
        best.update({label: min(t) for label, t in times.items()})
    if rounds is not None:
        rounds.update(times)
    return {label: statistics.median(t) for label, t in times.items()}


def paired(rounds: dict, label: str, base: str) -> float:
    """The median over the rounds of ``label``'s time / ``base``'s in the same round (`kernelhub.timing.paired`): a
    ratio that a drift of the host's speed from round to round (the same for both rows of a round) leaves alone,
    where the ratio of the two medians takes each row's noise on its own."""
    return timing.paired(rounds, label, base)[0]


def rows_for(op: str, args: tuple, device: torch.device, repeat: int, compile_ref: bool,
             chosen: str | None = None) -> dict:
    """Each row's forward and forward+backward: medians, best rounds, and for ``hub`` (against ``min:<chosen>``)
    and each ``hub:B`` (against ``min:B``) the median of the rounds' ratios (`paired`): ``forward_vs_min``,
    ``step_vs_min``."""
    from kernelhub_torch_ref.plugin import DIFFERENTIATE, FORWARDS

    hub = kernelhub.get_hub()
    spec = hub.registry.spec(op)
    args = spec.normalize(*args)  # the canonical form every backend's functions take
    diff = spec.differentiable
    leaves_args = testing.with_grad(op, args)
    leaves = [leaves_args[i] for i in diff]
    grad = testing.upstream_grad(kernelhub.op(op)(*args))

    fns: dict[str, tuple] = {}  # label -> (forward callable, forward+backward callable)

    def add(label, f, f_grad=None):
        f_grad = f_grad or f
        fns[label] = (lambda: f(*args),
                      lambda: torch.autograd.grad(f_grad(*leaves_args), leaves, grad, allow_unused=True))

    add("eager ref", FORWARDS[op], DIFFERENTIATE.get(op, FORWARDS[op]))
    if compile_ref:
        compiled = torch.compile(DIFFERENTIATE.get(op, FORWARDS[op]))
        add("compiled ref", compiled)
    add("hub", kernelhub.op(op))
    for name, impl in sorted(hub.registry.impls(op).items()):
        try:
            kernelhub.op(op, backend=name)(*leaves_args)  # compiles or raises here, not in the timing
        except Exception as exc:
            print(f"  {op}: {name} skipped ({type(exc).__name__}: {str(exc).splitlines()[0][:100]})",
                  file=sys.stderr)
            continue
        add(f"hub:{name}", kernelhub.op(op, backend=name))
        add(f"min:{name}", minimal(impl, spec))
    runnable = {}
    for label, (fwd, step) in fns.items():
        try:
            with torch.no_grad():
                fwd()
            step()
            runnable[label] = (fwd, step)
        except Exception as exc:
            print(f"  {op}: {label} failed ({type(exc).__name__}: {str(exc).splitlines()[0][:100]})", file=sys.stderr)
    f_best, s_best, f_rounds, s_rounds = {}, {}, {}, {}
    with torch.no_grad():
        f_us = timed_rounds({k: v[0] for k, v in runnable.items()}, device, repeat, best=f_best, rounds=f_rounds)
    s_us = timed_rounds({k: v[1] for k, v in runnable.items()}, device, repeat, best=s_best, rounds=s_rounds)
    rows = {label: {"forward_us": f_us[label], "step_us": s_us[label], "forward_best_us": f_best[label],
                    "step_best_us": s_best[label]} for label in runnable}
    for label in rows:
        base = f"min:{chosen}" if label == "hub" else "min:" + label[4:] if label.startswith("hub:") else None
        if base in rows:
            rows[label].update(forward_vs_min=paired(f_rounds, label, base), step_vs_min=paired(s_rounds, label, base))
    return rows


def compiled_step_rows(op: str, args: tuple, device: torch.device, repeat: int, mode: str = "default",
                       forced: bool = True) -> dict:
    """Wall us per forward + backward of a step ``(op(*args) * w).sum()`` compiled with torch.compile (fullgraph,
    inductor), calling the reference, the hub (its default choice; the graph holds the op's operator) and the hub
    with each other backend forced, against the eager hub step; and, for each backend but inductor, the backend's
    functions in the minimal autograd.Function (`minimal`) compiled the same way: what torch.compile costs around
    those functions with no hub at all (``forced`` False: the reference, the hub and the eager hub only). The step
    takes the real part of a complex output. ``mode``: torch.compile's (with "reduce-overhead" each compiled step
    replays CUDA graphs, the eager hub step stays eager)."""
    from kernelhub_torch_ref.plugin import DIFFERENTIATE, FORWARDS

    hub = kernelhub.get_hub()
    spec = hub.registry.spec(op)
    args = testing.with_grad(op, spec.normalize(*args))
    leaves = testing.leaves(op, args)
    w = torch.randn_like(kernelhub.op(op)(*args).detach())

    def step(f):
        def fn(*a):
            return (f(*a) * w).sum().real
        # a code object of its own per step: dynamo keeps its compiled code per code object, so steps sharing one
        # would pile up as that object's cache entries (a call checks the guards of the entries before its own;
        # past torch._dynamo.config.recompile_limit, 8, a step would silently run eagerly)
        return types.FunctionType(fn.__code__.replace(), fn.__globals__, fn.__name__, fn.__defaults__, fn.__closure__)

    torch._dynamo.reset()
    steps = {"eager hub": step(kernelhub.op(op))}
    candidates = {"compiled ref": DIFFERENTIATE.get(op, FORWARDS[op]), "compiled hub": kernelhub.op(op)}
    chosen = kernelhub.explain(op, *args).chosen
    for name, impl in sorted(hub.registry.impls(op).items()) if forced else ():
        if hub.registry.unavailable_reason(name) or name in ("torch_ref", chosen) or \
                hub.selector.decide(op, args, name).chosen != name:
            continue
        candidates[f"compiled hub:{name}"] = kernelhub.op(op, backend=name)
        if name != "inductor":
            candidates[f"compiled min:{name}"] = minimal(impl, spec)
    for label, f in candidates.items():
        steps[label] = torch.compile(step(f), fullgraph=True, mode=mode)
    fns = {}
    for label, f in steps.items():
        def fn(f=f):
            return torch.autograd.grad(f(*args), leaves, allow_unused=True)
        try:
            fn()  # compiles here, not in the timing
            fns[label] = fn
        except Exception as exc:
            print(f"  {op}: {label} failed ({type(exc).__name__}: {str(exc).splitlines()[0][:100]})", file=sys.stderr)
    rounds: dict = {}
    r = timed_rounds(fns, device, repeat, rounds=rounds)
    if "compiled hub" in rounds and "compiled ref" in rounds:
        ratio, slower = timing.paired(rounds, "compiled hub", "compiled ref")
        r["_hub_vs_ref"] = [ratio, slower, len(rounds["compiled hub"])]
    return r


def launch_rows(device: torch.device, repeat: int) -> dict:
    """Wall us per call of a trivial Triton kernel (one load and store of 1024 floats) launched by Triton
    (``kernel[grid](...)``) and by the triton backend's `launch`, against each triton impl's forward and
    backward functions at the tiny size (no autograd, no hub): what a launcher costs beyond its launches. Returns
    those times and each function's number of device kernels (`kernels_launched`)."""
    import triton
    import triton.language as tl
    from kernelhub_triton._launch import Bound, launch

    @triton.jit
    def trivial(x_ptr, n, BLOCK: tl.constexpr):
        offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
        tl.store(x_ptr + offs, tl.load(x_ptr + offs, mask=offs < n) + 1.0, mask=offs < n)

    x = torch.randn(1024, device=device)
    bound = Bound(trivial, BLOCK=1024)
    sync = lambda: torch.cuda.synchronize(device)  # noqa: E731
    fns = {"trivial kernel[grid]": lambda: trivial[(1,)](x, 1024, BLOCK=1024),
           "trivial launch()": lambda: launch(bound, (1,), x, 1024),
           "one torch op (x.add_)": lambda: x.add_(1.0)}
    hub = kernelhub.get_hub()
    for fam, (op, sizes) in FAMILIES.items():
        impl = hub.registry.impls(op).get("triton")
        if impl is None:
            continue
        spec = hub.registry.spec(op)
        args = spec.normalize(*sizes["tiny"](device, torch.Generator().manual_seed(0)))
        out = impl.forward(*args)
        grad = testing.upstream_grad(out)
        needs = [True] * len(spec.differentiable)
        fns[f"{fam} triton forward"] = lambda impl=impl, args=args: impl.forward(*args)
        fns[f"{fam} triton backward"] = lambda impl=impl, args=args, grad=grad, needs=needs: impl.backward(
            grad, *args, needs=needs)
    for fn in fns.values():
        fn()
    us = timed_rounds(fns, device, repeat)
    kernels = {label: kernels_launched(fn, sync) for label, fn in fns.items()}
    print("launchers (tiny sizes, the functions alone): wall us per call")
    base = us["trivial kernel[grid]"]
    for label, v in us.items():
        print(f"  {label:28s} {v:8.1f}   {v / base:5.2f}x a trivial kernel[grid]; {kernels[label]} kernels: "
              f"{v / max(kernels[label], 1) / base:5.2f}x a trivial kernel[grid] per kernel")
    return us, kernels


def kernels_launched(fn, sync) -> int:
    """How many kernels (and memsets or copies) one call of ``fn`` puts on the GPU, by the profiler's device
    events: a launcher's cost is judged per launch (each Triton launch against a trivial one)."""
    from torch.autograd import DeviceType
    from torch.profiler import ProfilerActivity, profile

    sync()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        fn()
        sync()
    return sum(1 for e in prof.events() if e.device_type == DeviceType.CUDA)


def parse(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    p.add_argument("--families", nargs="+", default=list(FAMILIES), choices=list(FAMILIES))
    p.add_argument("--sizes", nargs="+", default=["tiny", "medium", "large"],
                   choices=["tiny", "medium", "large", "xlarge"], help="xlarge: TV only")
    p.add_argument("--repeat", type=int, default=15)
    p.add_argument("--no-compile", action="store_true", help="leave out torch.compile of the reference")
    p.add_argument("--json", help="write the results here")
    p.add_argument("--launch", action="store_true", help="also time the triton launchers against a trivial launch")
    p.add_argument("--compiled-steps", action="store_true",
                   help="time compiled steps calling the hub against ones calling the reference instead of the rows")
    p.add_argument("--compile-mode", default="default", choices=["default", "reduce-overhead"],
                   help="torch.compile's mode for --compiled-steps (reduce-overhead: CUDA graphs)")
    p.add_argument("--no-forced", action="store_true",
                   help="--compiled-steps: leave out the hub with each backend forced and the minimal Functions")
    return p.parse_args(argv)


def main(argv: list[str] | None = None, record: dict | None = None) -> int:
    """Run the rows and print them; with ``--json`` write them there after each call's rows (a run cut short
    keeps what it measured). ``record`` (scripts/bench_report.py record-host): the dict to fill in and write,
    with where and how the rows were measured and any rows of an earlier run."""
    args = parse(argv)
    device = torch.device(args.device)
    warnings.simplefilter("ignore")
    results = record if record is not None else {}
    results.update(device=device_model(args.device), torch=torch.__version__, threads=torch.get_num_threads())
    results.setdefault("rows", {})

    def save():
        if args.json:
            with open(args.json, "w") as f:
                json.dump(results, f, indent=1)
                f.write("\n")

    if args.launch and device.type == "cuda":
        results["launch"], results["launch_kernels"] = launch_rows(device, args.repeat)
        save()
    for fam in args.families:
        op, sizes = FAMILIES[fam]
        for size in (s for s in args.sizes if s in sizes):
            call = sizes[size](device, torch.Generator().manual_seed(0))
            chosen = kernelhub.explain(op, *call).chosen
            about = {"_op": op, "_call": CALLS[fam][size], "_chosen": chosen}
            if args.compiled_steps:
                r = compiled_step_rows(op, call, device, args.repeat, args.compile_mode, not args.no_forced)
                hub = kernelhub.get_hub()
                traced = hub.selector.traced(op, hub.registry.spec(op).normalize(*call))
                about["_traced"] = traced.backend if traced is not None else "the operator"
                print(f"{fam}/{size} ({op}; hub picks {chosen}, its compiled graph traces {about['_traced']}): "
                      f"compiled steps ({args.compile_mode}), wall us per forward+backward")
                for label, v in r.items():
                    if not label.startswith("_"):
                        print(f"  {label:24s} {v:10.1f}   {v / r['compiled ref']:5.2f}x compiled ref"
                              if "compiled ref" in r else f"  {label:24s} {v:10.1f}", flush=True)
                if "_hub_vs_ref" in r:
                    ratio, slower, n = r["_hub_vs_ref"]
                    print(f"  compiled hub / compiled ref, round by round: {ratio:.3f}x (median), slower in "
                          f"{slower}/{n} rounds", flush=True)
                mode = "" if args.compile_mode == "default" else f"-{args.compile_mode}"
                results["rows"][f"{fam}/{size}/compiled{mode}"] = {**r, **about}
                save()
                continue
            r = rows_for(op, call, device, args.repeat, not args.no_compile, chosen)
            print(f"{fam}/{size} ({op}; hub picks {chosen}): wall us per call, forward | forward+backward")
            for label, v in r.items():
                print(f"  {label:16s} {v['forward_us']:10.1f} | {v['step_us']:10.1f}")
            for stat in ("", "_best"):
                ratios = []
                for label in r:
                    if label.startswith("hub:") and "min:" + label[4:] in r:
                        m = r["min:" + label[4:]]
                        ratios.append(f"{label[4:]} {r[label][f'forward{stat}_us'] / m[f'forward{stat}_us']:.2f}x | "
                                      f"{r[label][f'step{stat}_us'] / m[f'step{stat}_us']:.2f}x")
                if ratios:
                    print(f"  hub:B / min:B{' (best rounds)' if stat else ''}    " + "; ".join(ratios))
            ratios = [f"{label} {v['forward_vs_min']:.2f}x | {v['step_vs_min']:.2f}x" for label, v in r.items()
                      if "step_vs_min" in v]
            if ratios:
                print("  / min, round by round (median)  " + "; ".join(ratios))
            if "compiled ref" in r:
                print(f"  hub / compiled   {r['hub']['forward_us'] / r['compiled ref']['forward_us']:.2f}x | "
                      f"{r['hub']['step_us'] / r['compiled ref']['step_us']:.2f}x", flush=True)
            results["rows"][f"{fam}/{size}"] = {**r, **about}
            save()
    return 0


if __name__ == "__main__":
    sys.exit(main())
