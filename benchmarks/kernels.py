"""Time each kernel backend against torch eager and torch.compile of the reference, on a GPU.

For every op a backend implements and each benchmark shape of its spec (float32; complex64 for
Tikhonov), in one process:

- the floor: the op's least work for the pass (DRAM bytes, cache gathers, atomics, arithmetic:
  `kernelhub.bench.least_work`) over the rates measured here first, the binding one
  (`kernelhub.bench.floor`);
- the median time of the reference in eager mode, the reference under torch.compile (compile
  time excluded, reported), and each kernel backend, for the forward and for forward+backward,
  two ways: "call" (`kernelhub.timing.timed`: triton.testing.do_bench, L2 flushed before every call, after
  warm-up; the Python and autograd cost of launching counts wherever it exceeds the GPU time) and "graph"
  (`kernelhub.timing.graphed`: the same step captured in a CUDA graph and replayed after an L2 flush, so
  GPU time only, as in a captured training step; `kernelhub bench`'s "graphed");
- peak memory allocated by one such call beyond its inputs.

Usage: python benchmarks/run.py kernels [--backends triton cuda_ext] [--ops ...] [--shapes ...] [--dtype float32]
       [--sweep tv iso tv-forward tikhonov semiconv] [--no-baselines] [--json FILE]
(the K-Planes taps rows "4_calls" and "2_calls" use whichever backend the hub picks for those calls)
"""

from __future__ import annotations

import argparse
import json
import math

import torch

import kernelhub
from kernelhub import testing, timing
from kernelhub.bench import compiled_reference, floor, least_work, rates

# per op: the inputs that get gradients, one entry per pass (None = forward only); the floor of each pass is the
# op's least work (`kernelhub.bench.least_work`) over the rates measured here first (`kernelhub.bench.floor`)
MODES = {
    "tv_loss_l1_3d": [None, (0,)],
    "tv_loss_sq_3d": [None, (0,)],
    "tv_loss_iso_3d": [None, (0,)],
    # K-Planes: the planes' gradient (a training step with fixed rays) and every gradient
    "kplanes_interp_tilted": [None, (2,), (0, 1, 2)],
    "kplanes_interp_tilted_ms": [None, (2,), (0, 1, 2)],
    "kplanes_interp_tilted_taps": [None, (2,), (0, 1, 2)],
    "trilinear_interp": [None, (0,), (0, 1)],
    "tikhonov_inverse_2xn": [None, (0,)],
    "semiconv": [None, (0, 1)],
}


def _closed_form(M, lam):
    from kernelhub_torch_ref.tikhonov import closed_form
    return closed_form(M, lam)


def _four_calls(pts, rotations, planes, h):
    """The taps without the taps op: four calls of kplanes_interp_tilted (the hub's choice)."""
    fn = kernelhub.op("kplanes_interp_tilted")
    eye = torch.eye(3, dtype=pts.dtype, device=pts.device)
    return torch.stack([fn(pts, rotations, planes)] + [fn(pts + h * eye[i], rotations, planes) for i in range(3)])


def _two_calls(pts, rotations, planes, h):
    """A base call for the data term plus a separate taps call for the TV term (the hub's choices)."""
    base = kernelhub.op("kplanes_interp_tilted")(pts, rotations, planes)
    taps = kernelhub.op("kplanes_interp_tilted_taps")(pts, rotations, planes, h)
    return torch.cat([base[None], taps[1:]])


def _max_pool(img, kernel, semifield, stride, padding, dilation, groups, kind):
    """Max pooling over semiconv's window (F.max_pool2d for 2-D): the speed a dilation layer replaces."""
    pool = (torch.nn.functional.max_pool1d, torch.nn.functional.max_pool2d,
            torch.nn.functional.max_pool3d)[img.ndim - 3]
    return pool(img, kernel.shape[2:], stride, padding[0::2], dilation)


# further baselines worth a row: Tikhonov's closed form in plain torch (the reference is an SVD); the K-Planes
# taps as four calls, and as a base call plus a taps call; max pooling beside semiconv
EXTRA = {"tikhonov_inverse_2xn": [("closed_form", _closed_form)], "semiconv": [("max_pool", _max_pool)],
         "kplanes_interp_tilted_taps": [("4_calls", _four_calls), ("2_calls", _two_calls)]}


def make_step(fn, args, grads_of, grad):
    """A closure running fn forward (and backward into the chosen inputs)."""
    if grads_of is None:
        return (lambda: fn(*args)), []
    call, leaves = testing.fresh_leaves(args, grads_of)  # a list argument (the multiscale planes): each tensor

    def step():
        out = fn(*call)
        out.backward(grad)
    return step, leaves


def bench(step, leaves) -> tuple[float, float, float]:
    """(call ms, graph ms or nan where the step cannot be captured, peak MiB)."""
    step()
    torch.cuda.synchronize()
    for t in leaves:
        t.grad = None
    base = torch.cuda.memory_allocated()
    torch.cuda.reset_peak_memory_stats()
    step()
    torch.cuda.synchronize()
    peak = (torch.cuda.max_memory_allocated() - base) / 2**20
    ms = timing.time_ms(step, torch.device("cuda"), grad_to_none=leaves)
    try:
        graph_ms = timing.graphed(timing.dropping_grads(step, leaves), torch.device("cuda")).ms
    except Exception as exc:  # e.g. the SVD reference synchronises, which capture forbids
        print(f"  (no CUDA graph: {type(exc).__name__}: {str(exc).splitlines()[0][:120]})")
        torch.cuda.synchronize()
        graph_ms = math.nan
    return ms, graph_ms, peak


def run(ops, backends, shapes=None, dtype=None, baselines=True) -> tuple[list[dict], list[str]]:
    """The rows, and the calls that failed: any backend's error, and any reference's other than running out of
    memory (eager torch_ref at some benchmark sizes: that comparison is then missing, not failed). ``baselines``
    False: the kernel backends alone, no eager or compiled reference timed (nor compiled: the minutes of a
    candidate's A/B go to the kernels)."""
    hub = kernelhub.get_hub()
    failures = []
    measured = rates(torch.device("cuda"))
    print(f"copy bandwidth: {measured['dram_Bps'] / 1e12:.2f} TB/s (read + write, 1 GiB device-to-device); "
          f"cache gathers {measured['gather_Bps'] / 1e12:.2f} TB/s, atomics {measured['atomics_per_s'] / 1e9:.0f}/ns, "
          f"FP32 {measured['flops_per_s'] / 1e12:.1f} TFLOP/s, max-plus taps {measured['minmax_per_s'] / 1e12:.2f}/ps, "
          f"exp {measured['special_per_s'] / 1e12:.2f}/ps", flush=True)
    rows = [{"op": "copy", "bandwidth_TBps": measured["dram_Bps"] / 1e12, "rates": measured}]
    for op in ops:
        spec = hub.registry.spec(op)
        impls = hub.registry.impls(op)
        ref_fn = impls[spec.reference_backend].forward
        sample_dtype = (dtype if dtype in spec.dtypes else torch.complex64 if torch.complex64 in spec.dtypes
                        else torch.float32)
        for sample in testing.samples(op, "benchmark", sample_dtype, "cuda", seed=0):
            if shapes and not any(sub in sample.name for sub in shapes):
                continue
            args = sample.args
            out, grad, compiled, compile_s = compiled_reference(ref_fn, args, MODES[op] if baselines else ())
            for grads_of in MODES[op]:
                mode = "fwd" if grads_of is None else "fwd+bwd " + ",".join(spec.args[i].name for i in grads_of)
                floor_ms, binds = floor(least_work(spec, args, out, grads_of), measured)
                timings = {}
                references = [("eager", ref_fn), ("compiled", compiled), *EXTRA.get(op, [])] if baselines else []
                for label, fn in references + [
                        (b, kernelhub.op(op, backend=b)) for b in backends
                        if b in impls and "cuda" in (impls[b].devices or ("cuda",))]:
                    step, leaves = make_step(fn, args, grads_of, grad)
                    try:
                        timings[label] = bench(step, leaves)
                    except Exception as exc:
                        print(f"  {op} {sample.name} {mode} {label}: {type(exc).__name__}: {exc}"[:300])
                        torch.cuda.empty_cache()
                        if label in backends or not isinstance(exc, torch.cuda.OutOfMemoryError):
                            failures.append(f"{op} {sample.name} {mode} {label}: {type(exc).__name__}")
                def vs(label, k):
                    return timings[label][k] if label in timings else math.nan

                for label, (ms, graph_ms, peak) in timings.items():
                    row = {"op": op, "shape": sample.name, "mode": mode, "impl": label, "ms": ms,
                           "graph_ms": graph_ms, "floor_ms": floor_ms, "binds": binds, "x_floor": ms / floor_ms,
                           "graph_x_floor": graph_ms / floor_ms, "peak_MiB": peak,
                           "speedup_vs_eager": vs("eager", 0) / ms, "speedup_vs_compiled": vs("compiled", 0) / ms,
                           "graph_speedup_vs_eager": vs("eager", 1) / graph_ms,
                           "graph_speedup_vs_compiled": vs("compiled", 1) / graph_ms,
                           "compile_s": compile_s if label == "compiled" else None}
                    rows.append(row)
                    print(f"{op:20s} {sample.name:14s} {mode:21s} {label:9s} call {ms:8.4f} ms {row['x_floor']:6.2f}x "
                          f"floor ({floor_ms:.4f}, {binds}) {row['speedup_vs_eager']:6.1f}x eager "
                          f"{row['speedup_vs_compiled']:5.2f}x compiled | graph {graph_ms:8.4f} ms "
                          f"{row['graph_x_floor']:5.2f}x floor {row['graph_speedup_vs_eager']:6.1f}x eager "
                          f"{row['graph_speedup_vs_compiled']:5.2f}x compiled | peak {peak:7.1f} MiB", flush=True)
            del args, out, grad
            torch.cuda.empty_cache()
    return rows, failures


def sweep_tv(iso_only: bool = False) -> None:
    """GPU time (CUDA graph) of the TV kernels' launch configurations (tv.LAUNCH: voxels per tile, warps, programs
    per multiprocessor for the forward and the backward, the tile's widest row), forward alone and forward +
    backward, at every benchmark shape. Narrower rows make taller tiles: fewer of the (h - 1, w) and (h + 1, w)
    neighbours fall in another program's rows. Fewer programs per multiprocessor: fewer, longer D chunks, and
    fewer partial waves where a kernel's registers let fewer programs be resident (the iso kernels). ``iso_only``:
    the iso loss's configurations alone."""
    from kernelhub_triton import tv
    keep, keep_regs = dict(tv.LAUNCH), dict(tv.BWD_REGS)
    general = [(512, 4, 32, 32, 256), (512, 4, 16, 16, 256), (512, 8, 8, 8, 256), (256, 4, 32, 32, 256),
               (1024, 8, 16, 16, 256), (512, 4, 32, 32, 128), (512, 8, 8, 8, 128), (1024, 8, 8, 8, 128)]
    # iso's last entry: the backward's registers at most (tv.BWD_REGS; None: the compiler's choice) with the
    # backward's programs a multiprocessor they let fit; 256 voxels at 8 warps: one voxel a thread, where 512 hold two
    iso = [(512, 8, 6, b, 256, r) for r, bs in ((None, (2, 3)), (64, (3, 4)), (56, (4,)), (48, (4, 5, 6)))
           for b in bs] + [(512, 8, f, 5, 256, 48) for f in (4, 8)] + [
        (256, 8, 8, b, 256, r) for r, bs in ((None, (3, 4)), (48, (5, 6))) for b in bs]
    for sample in testing.samples("tv_loss_l1_3d", "benchmark", torch.float32, "cuda"):
        v = sample.args[0]
        for config in ([] if iso_only else general) + iso:
            line = []
            for op, mode in (("tv_loss_l1_3d", tv.L1), ("tv_loss_sq_3d", tv.SQ), ("tv_loss_iso_3d", tv.ISO)):
                if config in iso and mode != tv.ISO:
                    continue
                tv.LAUNCH[mode] = config[:5]
                tv.BWD_REGS[mode] = config[5] if len(config) > 5 else keep_regs[mode]
                tv._layout.cache_clear()
                fn = kernelhub.op(op, backend="triton")
                step, leaves = make_step(fn, (v,), (0,), torch.ones_like(fn(v)))
                fwd, _ = make_step(fn, (v,), None, None)
                line.append(f"{op.split('_')[2]} {bench(fwd, [])[1]:.4f} {bench(step, leaves)[1]:.4f}")
            regs = f" bwd regs {config[5]}" if len(config) > 5 else ""
            print(f"sweep tv {sample.name:12s} tile {config[0]:5d} warps {config[1]:3d} programs/SM {config[2]:3d} "
                  f"{config[3]:3d} row {config[4]:4d}{regs}: fwd, fwd+bwd ms " + "  ".join(line), flush=True)
    tv.LAUNCH.update(keep)
    tv.BWD_REGS.update(keep_regs)
    tv._layout.cache_clear()


def sweep_tv_forward() -> None:
    """GPU time (CUDA graph) of the TV forwards alone by programs per multiprocessor (tv.LAUNCH's third entry): how
    many programs write a partial sum that the last one adds up, against how long each one's D chunk is."""
    from kernelhub_triton import tv
    keep = dict(tv.LAUNCH)
    for sample in testing.samples("tv_loss_l1_3d", "benchmark", torch.float32, "cuda"):
        v = sample.args[0]
        for op, mode in (("tv_loss_l1_3d", tv.L1), ("tv_loss_sq_3d", tv.SQ), ("tv_loss_iso_3d", tv.ISO)):
            line = []
            for per_sm in (2, 4, 6, 8, 9, 10, 12, 16, 24, 35, 48):
                tv.LAUNCH[mode] = keep[mode][:2] + (per_sm,) + keep[mode][3:]
                tv._layout.cache_clear()
                fn = kernelhub.op(op, backend="triton")
                programs = tv._layout(tuple(v.shape), tv.sm_count(v), mode, v.dtype, False)[0]
                line.append(f"{per_sm}:{programs}:{bench(*make_step(fn, (v,), None, None))[1] * 1e3:.1f}")
            print(f"sweep tv forward {sample.name:12s} {op.split('_')[2]:3s} programs/SM:programs:us " + " ".join(line),
                  flush=True)
    tv.LAUNCH.update(keep)
    tv._layout.cache_clear()


def sweep_tikhonov() -> None:
    """GPU time (CUDA graph) of the Tikhonov kernels' pixels per program and warps at 115000 x 2 x 21."""
    from kernelhub_triton import tikhonov
    M = testing.samples("tikhonov_inverse_2xn", "benchmark", torch.complex64, "cuda")[0].args[0]
    keep = (tikhonov.BLOCK_P, tikhonov.NUM_WARPS)
    fn = kernelhub.op("tikhonov_inverse_2xn", backend="triton")
    g = testing.upstream_grad(fn(M, 0.3))
    for bp in (2, 4, 8, 16):
        for warps in (1, 2, 4):
            tikhonov.BLOCK_P, tikhonov.NUM_WARPS = bp, warps
            ms_f = bench(lambda: fn(M, 0.3), [])[1]
            step, leaves = make_step(fn, (M, 0.3), (0,), g)
            ms_b = bench(step, leaves)[1]
            print(f"sweep tikhonov pixels/program {bp:3d} warps {warps}: fwd {ms_f:.4f} ms  fwd+bwd {ms_b:.4f} ms",
                  flush=True)
    tikhonov.BLOCK_P, tikhonov.NUM_WARPS = keep


def sweep_semiconv() -> None:
    """GPU time (CUDA graph) of triton's semiconv launch configurations at every benchmark sample, forward alone
    and forward + backward (the saving forward and the backward from its winners or statistics). max/min's row
    kernels: outputs a program computes at a time (RB x BW), the widest row BW, warps, rows a program (dense calls
    too: DENSE is lifted), the kernel-gradient pass's warps and the row kernels' registers at most; then a dense
    call's forwards by output channels at once, and the kernel's gradient by atomics into copies; linear, root, log:
    outputs (forward) or image positions (gather) a program serves, the forward's warps and the gather's."""
    from kernelhub_triton import semiconv as sc
    names = ("ROW_BLOCK", "ROW_WIDTH", "ROW_WARPS", "ROWS", "DENSE", "BLOCK", "NUM_WARPS", "GATHER_WARPS", "GRAD_WARPS",
             "ROW_REGS", "MAX_BINS", "KERNEL_COPIES", "DENSE_CHANNELS", "DENSE_BLOCK", "DENSE_WARPS", "DENSE_REGS")
    keep = {n: getattr(sc, n) for n in names}
    # max/min: (outputs at a time, widest row, warps, rows a program, the kernel-gradient pass's warps, the row
    # kernels' registers at most)
    rows = [(256, 256, 4, 8, 8, None), (256, 256, 4, 8, 4, None), (256, 256, 4, 8, 8, 64), (256, 256, 4, 8, 8, 48),
            (128, 128, 4, 8, 8, None), (256, 256, 8, 8, 8, None), (256, 128, 4, 16, 8, None),
            (256, 128, 4, 16, 8, 64), (512, 256, 8, 8, 8, None), (512, 256, 8, 8, 4, None), (128, 128, 2, 8, 8, None)]
    smooth = [(512, 4, 8), (512, 4, 4), (512, 8, 8), (256, 4, 8), (1024, 8, 8), (1024, 4, 8)]
    fn = kernelhub.op("semiconv", backend="triton")

    def measure(sample, forward=True):
        """(forward ms or None, forward+backward ms) at the settings as they stand, from a fresh layout."""
        sc._call_of.cache_clear()
        fwd = bench(*make_step(fn, sample.args, None, None))[1] if forward else None
        g = testing.upstream_grad(fn(*sample.args))
        return fwd, bench(*make_step(fn, sample.args, (0, 1), g))[1]

    def restore():
        for n, v in keep.items():
            setattr(sc, n, v)
        sc._call_of.cache_clear()

    for sample in testing.samples("semiconv", "benchmark", torch.float32, "cuda"):
        tropical = sample.name.startswith("tropical")
        for config in rows if tropical else smooth:
            if tropical:
                sc.ROW_BLOCK, sc.ROW_WIDTH, sc.ROW_WARPS, sc.ROWS, sc.GRAD_WARPS, sc.ROW_REGS = config
                sc.DENSE = 2**31  # every call on the configuration swept
            else:
                sc.BLOCK, sc.NUM_WARPS, sc.GATHER_WARPS = config
            fwd, both = measure(sample)
            print(f"sweep semiconv {sample.name:36s} {'rows' if tropical else 'block/warps/gather'} {config}: "
                  f"fwd {fwd:.4f} ms  fwd+bwd {both:.4f} ms", flush=True)
        restore()
        # a dense call's forwards: (output channels at once, outputs at a time, warps, registers at most)
        dense = tropical and sample.args[1].shape[1] >= sc.DENSE
        for config in ((4, 512, 8, None), (4, 512, 8, 64), (4, 512, 8, 56), (4, 512, 8, 72), (2, 512, 8, 64),
                       (4, 256, 4, 64), (8, 512, 8, 64), (8, 256, 8, 96)) if dense else ():
            sc.DENSE_CHANNELS, sc.DENSE_BLOCK, sc.DENSE_WARPS, sc.DENSE_REGS = config
            fwd, both = measure(sample)
            print(f"sweep semiconv {sample.name:36s} dense forwards {config}: fwd {fwd:.4f} ms  fwd+bwd {both:.4f} ms",
                  flush=True)
        restore()
        # max/min's kernel gradient by one atomic an output in the row kernels, into KERNEL_COPIES copies: the
        # shipped path of a window of more than MAX_BINS indices; smaller windows (the one-hot pass) forced onto it
        window = math.prod(sample.args[1].shape[1:])
        tries = [(sc.MAX_BINS, c) for c in (1, 8, 32, 128)] if window > sc.MAX_BINS else [
            (1, c) for c in (32, 128, 512)]
        for bins, copies in tries if tropical else ():
            sc.MAX_BINS, sc.KERNEL_COPIES = bins, copies
            both = measure(sample, forward=False)[1]
            print(f"sweep semiconv {sample.name:36s} kernel gradient by atomics, {copies:3d} copies: fwd+bwd "
                  f"{both:.4f} ms", flush=True)
        restore()


def write_rows(rows: list[dict], path: str | None) -> None:
    if path:
        with open(path, "w") as f:
            json.dump(rows, f, indent=1)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--backends", nargs="*", default=["triton", "cuda_ext"])
    parser.add_argument("--ops", nargs="*", default=list(MODES))
    parser.add_argument("--json", help="write the rows here")
    parser.add_argument("--no-baselines", dest="baselines", action="store_false",
                        help="the kernel backends alone: no eager or compiled reference (a candidate's A/B)")
    parser.add_argument("--dtype", choices=["float32", "complex64"], help="the samples' dtype where the op takes it "
                        "(default: complex64 where it does, else float32)")
    parser.add_argument("--shapes", nargs="*", help="only the benchmark samples whose name contains one of these "
                        "(e.g. B614400_T4)")
    parser.add_argument("--sweep", nargs="*", choices=["tv", "iso", "tv-forward", "tikhonov", "semiconv"],
                        help="first time these launch configurations (none named: tv and tikhonov; iso: TV iso's "
                             "alone; tv-forward: the TV forwards by programs per multiprocessor; "
                             "semiconv: triton's launch configurations)")
    args = parser.parse_args(argv)
    print(f"device: {torch.cuda.get_device_name()}, torch {torch.__version__}", flush=True)
    sweeps = args.sweep if args.sweep else ["tv", "tikhonov"] if args.sweep is not None else []
    if "tv" in sweeps or "iso" in sweeps:
        sweep_tv(iso_only="tv" not in sweeps)
    if "tv-forward" in sweeps:
        sweep_tv_forward()
    if "tikhonov" in sweeps:
        sweep_tikhonov()
    if "semiconv" in sweeps:
        sweep_semiconv()
    rows, failures = run(args.ops, args.backends, args.shapes, args.dtype and getattr(torch, args.dtype),
                         args.baselines)
    write_rows(rows, args.json)
    for failure in failures:
        print(f"FAILED {failure}", flush=True)
    return 1 if failures else 0


if __name__ == "__main__":
    raise SystemExit(main())
