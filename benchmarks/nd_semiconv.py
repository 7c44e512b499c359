"""kernelhub.nn.SemiConv against pytorch_nd_semiconv's GenericConv, forward + backward, on one GPU.

The call of the kernelhub.nn target: a ``QuadraticKernelIso2D`` 5x5 kernel, tropical max, depthwise, image
``[16, 32, 256, 256]`` float32 (128 MiB, larger than L2), ``padding="same"``. Every path of pytorch_nd_semiconv
that works here is timed (``BroadcastSemifield`` eager and under ``torch.compile``; ``SelectSemifield``'s
Numba-compiled CUDA kernels, ``dynamic()`` and ``lazy_fixed()``); a path that fails is listed with its error.
Each is checked against kernelhub's float64 torch_ref first (values and both gradients) and timed with
``kernelhub.timing.timed`` (``triton.testing.do_bench``, median, after warm-up; a fresh gradient each step). The
floor is the bytes a forward + backward must move (image and output in the forward; upstream gradient, image and
image gradient in the backward) over the measured copy bandwidth.

Usage (a GPU machine with pytorch_nd_semiconv installed): python benchmarks/run.py peers [--json PATH]
[--paths SelectSemifield] (its Numba path calls ``np.row_stack``, gone from numpy 2.4: run that path with an older
numpy, as scripts/gpu_check.sh's ``nn`` step does where ``.whl/numpy`` holds one)
"""

from __future__ import annotations

import argparse
import json
import traceback

import torch

import kernelhub
from kernelhub import bench, timing
from kernelhub import nn as khnn

B, C, H, W, K = 16, 32, 256, 256, 5


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--json")
    p.add_argument("--paths", help="time only the paths whose name contains this (and the hub's choice)")
    args = p.parse_args(argv)
    import pytorch_nd_semiconv as pnds

    dev = torch.device("cuda")
    torch.manual_seed(0)
    x = torch.randn(B, C, H, W, device=dev)
    g = torch.randn(B, C, H, W, device=dev)
    kernel = pnds.QuadraticKernelIso2D(1, C, K).to(dev)  # scale-space init
    conv_args = dict(padding="same", groups=C)

    # the expected values: kernelhub's torch_ref in float64 on a slice of the batch (its products materialise)
    xs = x[:2].double().requires_grad_()
    ks = kernel().detach().double().requires_grad_()
    ref_op = kernelhub.op("semiconv", backend="torch_ref")
    want = ref_op(xs, ks, "tropical_max", 1, "same", 1, C, "conv", False)
    want.backward(g[:2].double())
    want_x, want_k = xs.grad, ks.grad

    def ours(backend):
        k = khnn.QuadraticKernelIso2D(1, C, K).to(dev)
        k.load_state_dict(kernel.state_dict())
        return khnn.SemiConv(k, "tropical_max", backend=backend, **conv_args), k

    def theirs(make_conv, compiled=False):
        k = pnds.QuadraticKernelIso2D(1, C, K).to(dev)
        k.load_state_dict(kernel.state_dict())
        m = pnds.GenericConv(k, make_conv(), **conv_args)
        return (torch.compile(m) if compiled else m), k

    paths = {
        "kernelhub SemiConv (hub's choice)": lambda: ours(None),
        "kernelhub SemiConv, triton": lambda: ours("triton"),
        "kernelhub SemiConv, cuda_ext": lambda: ours("cuda_ext"),
        "kernelhub SemiConv, inductor": lambda: ours("inductor"),
        "pnds BroadcastSemifield eager": lambda: theirs(lambda: pnds.BroadcastSemifield.tropical_max().dynamic()),
        "pnds BroadcastSemifield torch.compile": lambda: theirs(
            lambda: pnds.BroadcastSemifield.tropical_max().dynamic(), compiled=True),
        "pnds SelectSemifield dynamic (Numba CUDA)": lambda: theirs(
            lambda: pnds.SelectSemifield.tropical_max().dynamic()),
        "pnds SelectSemifield lazy_fixed (Numba CUDA)": lambda: theirs(
            lambda: pnds.SelectSemifield.tropical_max().lazy_fixed()),
    }
    if args.paths:
        paths = {n: f for i, (n, f) in enumerate(paths.items()) if i == 0 or args.paths in n}
    bw = bench.copy_bandwidth(dev)
    floor_ms = 5 * x.numel() * x.element_size() / bw * 1e3
    rows = []
    print(f"{torch.cuda.get_device_name()}: copy {bw / 1e9:.0f} GB/s; floor of a forward + backward {floor_ms:.3f} ms")
    for name, make in paths.items():
        row = {"path": name}
        try:
            module, k = make()
            xi = x.clone().requires_grad_()

            def step():
                xi.grad = None
                for q in k.parameters():
                    q.grad = None
                module(xi).backward(g)
            step()
            torch.cuda.synchronize()
            # parity on the first two images against the float64 reference: relative errors (norm of the
            # difference over the reference's), a path off by more than 1e-3 is marked wrong and not timed
            xi2 = x[:2].clone().requires_grad_()
            for q in k.parameters():
                q.grad = None
            out = module(xi2)
            out.backward(g[:2])
            param = next(iter(k.parameters()))  # log_std: its expected gradient through the kernel module
            want_p = torch.autograd.grad(k().double(), param, want_k)[0]

            def rel(a, b):
                return ((a.double() - b).norm() / b.norm()).item()
            err = {"out": rel(out, want), "img_grad": rel(xi2.grad, want_x), "log_std_grad": rel(param.grad, want_p)}
            if max(err.values()) > 1e-3:
                raise AssertionError(f"wrong result: relative errors {err}")
            row.update(ms=timing.time_ms(step, dev), parity=err)
            print(f"{name:46s} {row['ms']:8.3f} ms  {row['ms'] / floor_ms:6.2f}x floor   relative error vs float64: "
                  + ", ".join(f"{n} {v:.1e}" for n, v in err.items()))
        except Exception as e:  # a path that does not work here: listed with its error
            row["error"] = f"{type(e).__name__}: {str(e).splitlines()[0][:200] if str(e) else ''}"
            print(f"{name:46s} FAILED {row['error']}")
            traceback.print_exc(limit=2)
        finally:
            torch.cuda.empty_cache()
        rows.append(row)
    theirs_ok = [r for r in rows if r["path"].startswith("pnds") and "ms" in r]
    hub = rows[0]
    if theirs_ok and "ms" in hub:
        best = min(theirs_ok, key=lambda r: r["ms"])
        print(f"hub's SemiConv {hub['ms']:.3f} ms against pytorch_nd_semiconv's fastest working path ({best['path']}) "
              f"{best['ms']:.3f} ms: {best['ms'] / hub['ms']:.1f}x")
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"device": torch.cuda.get_device_name(), "numpy": __import__("numpy").__version__,
                       "copy_GBps": bw / 1e9, "floor_ms": floor_ms,
                       "shape": [B, C, H, W], "kernel": K, "rows": rows}, f, indent=1)


if __name__ == "__main__":
    main()
