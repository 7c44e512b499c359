"""`kernelhub bench`: each kernel backend of an op against torch_ref and `torch.compile` of it, and
against the op's memory floor, on one device.

For every op and each sample of the chosen size (the spec's "benchmark" shapes; "medium" with
``quick``), forward and forward + backward (into every differentiable input):

- the floor: the op's least work for the pass (`least_work`: DRAM bytes, bytes gathered
  from cache, atomic adds, arithmetic, maxima and minima, exponentials and logarithms) over the rates measured first
  on the same device (`rates`), the largest: the resource that binds ("binds" in each row);
- the median time and its spread (`kernelhub.timing.timed`: `triton.testing.do_bench` on CUDA,
  `torch.utils.benchmark` on the CPU; the spread is the repeats' interquartile range over the median) of the
  reference's forward in eager mode (the row of the op's reference backend, torch_ref for kernelhub's ops), under
  `torch.compile` ("compiled",
  compiled before any timing, its compile time reported), and each backend through the hub with that
  backend forced. Each one's first call is timed apart ("first_call_s": where the inductor backend
  compiles) and never enters the median;
- on CUDA, the same step's time on the device alone ("graph_ms", and its multiple of the floor, "x_floor_graph"):
  captured as a CUDA graph and replayed after an L2 flush (`kernelhub.timing.graphed`), so the gaps a host slower
  than the device leaves between the kernels are not in it. Where "ms" is well above "graph_ms", the call is
  bound by its host code (dispatch, launches), not by its kernels. None where the step cannot be captured.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Sequence
from typing import Any

import torch

from kernelhub import testing
from kernelhub.args import first_tensor, nbytes
from kernelhub.hub import get_hub
from kernelhub.spec import OpSpec, Work
from kernelhub.timing import device_model, graphed, time_ms, timed

__all__ = ["compiled_reference", "copy_bandwidth", "rates", "plain_work", "least_work", "floor", "RESOURCES",
           "make_step", "run", "plot", "figure"]

# each `kernelhub.spec.Work` field, the rate `rates` measures for it, and the name a row gives it where it binds
RESOURCES = (("dram_bytes", "dram_Bps", "DRAM"), ("gather_bytes", "gather_Bps", "gathers"),
             ("atomics", "atomics_per_s", "atomics"), ("flops", "flops_per_s", "FP32"),
             ("minmax", "minmax_per_s", "max/min"), ("special", "special_per_s", "exp/log"))


def copy_bandwidth(device: torch.device) -> float:
    """Bytes per second of a device-to-device copy (read + write) of 1 GiB (256 MiB on the CPU)."""
    x = torch.randn(2**28 if device.type == "cuda" else 2**26, device=device)
    y = torch.empty_like(x)
    return 2 * nbytes(x) / (time_ms(lambda: y.copy_(x), device) * 1e-3)


def rates(device: torch.device) -> dict[str, float | None]:
    """The device's rates for `floor`, each measured by a plain kernel of its kind (so each is what a good kernel
    reaches at least, not the hardware's peak: a floor from them is a little generous):

    - ``dram_Bps``: `copy_bandwidth`;
    - ``gather_Bps``: rows of 32 float32 (128 bytes) gathered at random from an 8 MiB table (in L2 on a GPU) and
      summed in bags of 64, gathered bytes per second;
    - ``atomics_per_s``: rows of 32 added into a 4 MiB table at random rows, adds per second;
    - ``flops_per_s``: a float32 matrix product (TF32 off), two operations per multiply-add;
    - ``minmax_per_s``: max-plus taps (a max and an add) per second, in registers (`kernelhub._probes.maxplus`);
    - ``special_per_s``: float32 exponentials per second, in registers (`kernelhub._probes.exp2`).

    The gathers and atomic adds are each timed with torch's kernel (``embedding_bag``; ``scatter_add_``) and, where
    triton is installed, with the simplest Triton kernel of the kind (`kernelhub._probes`); the faster counts:
    torch's reach well under the probes' rate on an H200, and a K-Planes kernel beat the floor they gave. The
    max-plus and exponential rates need those probes: without triton they are None.
    On the CPU only the copy and the matrix product are measured (torch's CPU gathers and scatters are no
    measure of a cache's or of atomics' rate, nor the interpreter of a core's): the others are None, and never bind.
    """
    cuda = device.type == "cuda"
    g = torch.Generator(device=device).manual_seed(0)
    m = 4096 if cuda else 1024
    a, b = torch.randn(m, m, device=device, generator=g), torch.randn(m, m, device=device, generator=g)
    tf32 = torch.backends.cuda.matmul.allow_tf32
    torch.backends.cuda.matmul.allow_tf32 = False
    try:
        mm_ms = time_ms(lambda: a @ b, device)
    finally:
        torch.backends.cuda.matmul.allow_tf32 = tf32
    measured: dict[str, float | None] = {"dram_Bps": copy_bandwidth(device), "gather_Bps": None,
                                         "atomics_per_s": None, "flops_per_s": 2 * m**3 / (mm_ms * 1e-3),
                                         "minmax_per_s": None, "special_per_s": None}
    if not cuda:
        return measured
    n = 2**22
    table = torch.randn(2**16, 32, device=device, generator=g)
    idx = torch.randint(0, table.shape[0], (n,), device=device, generator=g)
    offsets = torch.arange(0, n, 64, device=device)
    acc = torch.zeros(2**15, 32, device=device)
    src = torch.randn(n, 32, device=device, generator=g)
    rows = idx % acc.shape[0]
    gathers: list[Callable[[], Any]] = [lambda: torch.nn.functional.embedding_bag(idx, table, offsets, mode="sum")]
    scatters: list[Callable[[], Any]] = [lambda: acc.scatter_add_(0, rows[:, None].expand(n, 32), src)]
    try:
        from kernelhub import _probes
    except ImportError:  # no triton: torch's kernels alone
        pass
    else:
        bags = torch.empty(n // _probes.ROWS, 32, device=device)
        gathers.append(lambda: _probes.gather(bags, table, idx))
        scatters.append(lambda: _probes.scatter(acc, src, rows))
        # 64 resident warps a multiprocessor (16 programs of 4), each chain 512 steps
        chains = torch.empty(torch.cuda.get_device_properties(device).multi_processor_count * 16 * _probes.CHAINS,
                             device=device)
        taps = _probes.maxplus(chains, 1e-3, 64)
        measured["minmax_per_s"] = taps / (time_ms(lambda: _probes.maxplus(chains, 1e-3, 64), device) * 1e-3)
        exps = _probes.exp2(chains, 64)
        measured["special_per_s"] = exps / (time_ms(lambda: _probes.exp2(chains, 64), device) * 1e-3)
    gather_ms = min(time_ms(fn, device) for fn in gathers)
    atomics_ms = min(time_ms(fn, device) for fn in scatters)
    return {**measured, "gather_Bps": n * 128 / (gather_ms * 1e-3), "atomics_per_s": n * 32 / (atomics_ms * 1e-3)}


def plain_work(spec: OpSpec, args: Sequence[Any], out: torch.Tensor, grads_of: Sequence[int] | None) -> Work:
    """The work of an op that reads its tensors and writes its output once (`least_work` where the spec gives no
    ``work``): forward, every tensor argument read and the output written; backward (``grads_of``: the arguments
    that get gradients), the upstream gradient and every tensor argument read again and each gradient written."""
    tensors = sum(nbytes(args[i]) for i in spec.tensor_args)
    if grads_of is None:
        return Work(tensors + nbytes(out))
    return Work(2 * (tensors + nbytes(out)) + sum(nbytes(args[i]) for i in grads_of))


def least_work(spec: OpSpec, args: Sequence[Any], out: torch.Tensor, grads_of: Sequence[int] | None) -> Work:
    """The `kernelhub.spec.Work` of a canonical call's forward (``grads_of`` None) or forward + backward into
    ``grads_of``: the spec's ``work``, else `plain_work`."""
    return spec.work(args, out, grads_of) if spec.work is not None else plain_work(spec, args, out, grads_of)


def floor(work: Any, measured: dict[str, float | None]) -> tuple[float, str]:
    """(milliseconds, the resource that binds): the largest of the `kernelhub.spec.Work`'s amounts over its rate
    (`rates`; a rate not measured, None or absent as in an older record, is left out)."""
    return max((getattr(work, field) / measured[rate] * 1e3, name) for field, rate, name in RESOURCES
               if measured.get(rate))


def make_step(fn: Callable, args: Sequence[Any], grads_of: Sequence[int] | None,
              grad: torch.Tensor) -> Callable[[], Any]:
    """A closure running ``fn`` forward, and backward into ``grads_of`` (None: forward only)."""
    if grads_of is None:
        return lambda: fn(*args)
    call, leaves = testing.fresh_leaves(args, grads_of)

    def step():
        for t in leaves:  # a fresh gradient each time: accumulating into .grad would add a pass
            t.grad = None
        fn(*call).backward(grad)
    return step


def compiled_reference(ref_fn: Callable, args: Sequence[Any], passes: Sequence[Sequence[int] | None]):
    """(reference output, an upstream gradient, torch.compile of ``ref_fn`` already compiled for each pass
    in ``passes`` (gradients into those inputs; None = forward only), seconds that took)."""
    out = ref_fn(*args)
    grad = testing.upstream_grad(out)
    torch._dynamo.reset()
    compiled = torch.compile(ref_fn)
    t0 = time.perf_counter()
    for grads_of in passes:
        make_step(compiled, args, grads_of, grad)()
    if out.is_cuda:
        torch.cuda.synchronize(out.device)
    return out, grad, compiled, time.perf_counter() - t0


def run(ops: Sequence[str], backends: Sequence[str] | None = None, device: str = "cpu",
        quick: bool = False, log: Callable[[str], None] = print, shapes: Sequence[str] | None = None) -> dict:
    """The rows of the table, and the copy bandwidth. ``shapes``: only the samples whose name contains one of
    these strings (one benchmark shape per run where compiles are long)."""
    hub = get_hub()
    dev = torch.device(device)
    measured = rates(dev)
    rows = []
    seen: list[str] = []
    matched = 0
    for op in ops:
        spec = hub.registry.spec(op)
        impls = hub.registry.impls(op)
        ref_fn = impls[spec.reference_backend].forward
        dtype = spec.default_dtype
        names = [b for b in (backends if backends is not None else sorted(impls)) if b in impls
                 and b != spec.reference_backend and hub.registry.unavailable_reason(b) is None
                 and not impls[b].static_reasons(dev.type, dtype) and not impls[b].forced_only]
        for sample in testing.samples(op, "medium" if quick else "benchmark", dtype, device, seed=0):
            seen.append(sample.name)
            if shapes and not any(sub in sample.name for sub in shapes):
                continue
            matched += 1
            args = sample.args
            try:
                out, grad, compiled, compile_s = compiled_reference(ref_fn, args, (None, spec.differentiable))
            except Exception as exc:  # torch.compile of the reference failed, or ran out of memory: no such row
                log(f"{op} {sample.name} compiled: {type(exc).__name__}: {exc}"[:300])
                compiled, compile_s = None, None
                try:
                    out = ref_fn(*args)
                except Exception as exc:
                    log(f"{op} {sample.name} skipped, torch_ref: {type(exc).__name__}: {exc}"[:300])
                    continue
                grad = testing.upstream_grad(out)
            for grads_of in (None, spec.differentiable):
                passname = "fwd" if grads_of is None else "fwd+bwd"
                floor_ms, binds = floor(least_work(spec, args, out, grads_of), measured)
                times, first, spread, graph = {}, {}, {}, {}
                ref = spec.reference_backend  # torch_ref for kernelhub's ops; a third-party op's own reference
                for label, fn in [(ref, ref_fn)] + [("compiled", compiled)] * (compiled is not None) + [
                        (b, get_hub().handle(op, b)) for b in names]:
                    try:
                        step = make_step(fn, args, grads_of, grad)
                        start = time.perf_counter()
                        step()  # the first call, timed on its own: where a backend compiles (inductor)
                        if dev.type == "cuda":
                            torch.cuda.synchronize(dev)
                        first[label] = time.perf_counter() - start
                        times[label], spread[label] = timed(step, dev, quick)
                        log(f"{op} {sample.name} {passname} {label}: {times[label]:.4f} ms "
                            f"(first call {first[label]:.2f} s)")  # progress: a long run shows each row as it lands
                    except Exception as exc:  # a backend that cannot serve this sample, out of memory...
                        log(f"{op} {sample.name} {passname} {label}: {type(exc).__name__}: {exc}"[:300])
                        continue
                    if dev.type == "cuda":
                        try:
                            graph[label] = graphed(step, dev, quick).ms
                        except Exception as exc:  # a call that cannot be captured: no graph time in its row
                            log(f"{op} {sample.name} {passname} {label} graphed: {type(exc).__name__}: {exc}"[:300])
                for label, ms in times.items():
                    rows.append({"op": op, "shape": sample.name, "elements": first_tensor(args).numel(),
                                 "pass": passname, "impl": label, "ms": ms,
                                 "spread": spread[label], "floor_ms": floor_ms, "binds": binds,
                                 "x_floor": ms / floor_ms, "graph_ms": graph.get(label),
                                 "x_floor_graph": graph[label] / floor_ms if label in graph else None,
                                 "vs_torch_ref": times.get(ref, math.nan) / ms, "reference": ref,
                                 "vs_compiled": times.get("compiled", math.nan) / ms, "first_call_s": first[label],
                                 "compile_s": compile_s if label == "compiled" else None})
    if shapes and not matched:
        raise ValueError(f"--shapes {' '.join(shapes)}: no {'medium' if quick else 'benchmark'} sample of "
                         f"{', '.join(ops)} has a name containing it; their names: {', '.join(seen)}")
    dram = measured["dram_Bps"]
    assert dram is not None, "the copy bandwidth is measured on every device"
    return {"device": device_model(dev), "copy_GBps": dram / 1e9, "rates": measured, "rows": rows}


def require_plot() -> None:
    """Raise RuntimeError, with the install hint, where matplotlib (the ``plot`` extra) is missing."""
    try:
        import matplotlib  # noqa: F401
    except ImportError as exc:
        raise RuntimeError("kernelhub bench --plot needs matplotlib: pip install 'kernelhub[plot]'") from exc


def plot(data: dict, path: str) -> None:
    """`figure` of ``data`` written to ``path``; needs matplotlib (`require_plot`)."""
    require_plot()
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    fig = figure(data)
    fig.savefig(path, dpi=110)
    plt.close(fig)


def figure(data: dict):
    """One panel per op, titled with the op: for each of its (shape, pass), bars of each impl's time as a
    multiple of the memory floor (log scale; 1 = the floor); one legend for all."""
    import matplotlib.pyplot as plt

    per_op: dict[str, dict[str, dict[str, float]]] = {}
    for r in data["rows"]:
        per_op.setdefault(r["op"], {}).setdefault(f"{r['shape']}\n{r['pass']}", {})[r["impl"]] = r["x_floor"]
    refs = {r.get("reference", "torch_ref") for r in data["rows"]}
    impls = sorted({r["impl"] for r in data["rows"]}, key=lambda n: (0 if n in refs else {"compiled": 1}.get(n, 2), n))
    colors = {name: f"C{k}" for k, name in enumerate(impls)}
    cols = min(3, max(1, len(per_op)))
    rows = math.ceil(len(per_op) / cols)
    fig, axes = plt.subplots(rows, cols, figsize=(6.0 * cols, 4.2 * rows), squeeze=False)
    for ax, (op, groups) in zip(axes.flat, per_op.items()):
        width = 0.8 / max(1, len(impls))
        for k, name in enumerate(impls):
            xs = [i + k * width for i in range(len(groups))]
            ax.bar(xs, [g.get(name, math.nan) for g in groups.values()], width, label=name, color=colors[name])
        ax.set_xticks([i + 0.4 - width / 2 for i in range(len(groups))],
                      [g.replace("\n", " ") for g in groups], fontsize=6, rotation=30, ha="right")
        ax.set_yscale("log")
        ax.axhline(1.0, color="black", linewidth=0.8)
        ax.set_title(op, fontsize=10)
        ax.set_ylabel("time / memory floor", fontsize=8)
    for ax in list(axes.flat)[len(per_op):]:
        ax.set_visible(False)
    handles = [plt.Rectangle((0, 0), 1, 1, color=colors[n]) for n in impls]
    fig.legend(handles, impls, loc="upper right", fontsize=8, ncol=len(impls))
    fig.suptitle(f"kernelhub bench on {data['device']} (copy {data['copy_GBps']:.0f} GB/s): time / floor, lower is "
                 "better", fontsize=11)
    fig.tight_layout(rect=(0, 0, 1, 0.94))
    return fig
