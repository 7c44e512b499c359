"""Call every kernelhub op once through the hub, forward and backward, and print which backend ran."""

import torch

import kernelhub
from kernelhub import testing

device = "cuda" if torch.cuda.is_available() else "cpu"
print(f"device: {device}")
for name in kernelhub.op_names():
    spec = kernelhub.get_hub().registry.spec(name)
    dtype = torch.float32 if torch.float32 in spec.dtypes else spec.dtypes[0]
    sample = testing.samples(name, "small", dtype, device)[0]
    out = kernelhub.op(name)(*testing.with_grad(name, sample.args))
    out.abs().sum().backward()
    chosen = kernelhub.explain(name, *sample.args).chosen
    print(f"{name:28s} -> {chosen:10s} out {str(out.dtype).removeprefix('torch.')}{list(out.shape)}")
