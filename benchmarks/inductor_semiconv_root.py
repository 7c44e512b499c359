"""Is torch.compile's CUDA code for semiconv's root semifield still wrong? (kernelhub_torch_ref/inductor.py
rejects root semifields on CUDA because of it; re-run this after a torch upgrade to see whether the rejection
can go.)

For semifields root:2, linear and tropical_max, paddings 0 and 1, dilations 1 and 2: the img and kernel
gradients of torch.compile(torch_ref's forward, dynamic=False) in float32 against eager float64, as relative
errors. Usage: python benchmarks/run.py probe-inductor-root [cuda|cpu]
"""

import itertools
import sys

import torch

import kernelhub


def grads(fn, img, ker, rest, dtype):
    i = img.detach().to(dtype).clone().requires_grad_()
    k = ker.detach().to(dtype).clone().requires_grad_()
    out = fn(i, k, *rest)
    out.backward(torch.ones_like(out))
    return i.grad.double(), k.grad.double()


def main(argv: list[str] | None = None) -> None:
    device = (argv or ["cuda"])[0]
    hub = kernelhub.get_hub()
    ref, normalize = hub.registry.impls("semiconv")["torch_ref"].forward, hub.registry.spec("semiconv").normalize
    gen = torch.Generator(device=device).manual_seed(0)
    img = torch.rand(2, 6, 16, 15, device=device, generator=gen, dtype=torch.float64) * 1.9 + 0.1
    ker = torch.rand(6, 3, 3, 3, device=device, generator=gen, dtype=torch.float64) * 1.9 + 0.1
    for sf, pad, dil in itertools.product(["root:2", "linear", "tropical_max"], [0, 1], [1, 2]):
        args = normalize(img, ker, sf, 1, pad, dil, 2, "corr")
        want = grads(ref, args[0], args[1], args[2:], torch.float64)
        torch._dynamo.reset()
        got = grads(torch.compile(ref, dynamic=False), args[0], args[1], args[2:], torch.float32)
        e = [((g - w).abs().max() / w.abs().max()).item() for g, w in zip(got, want)]
        print(f"{sf:13s} padding {pad} dilation {dil}: img gradient error {e[0]:.2e}, kernel gradient error {e[1]:.2e}",
              flush=True)


if __name__ == "__main__":
    main(sys.argv[1:])
