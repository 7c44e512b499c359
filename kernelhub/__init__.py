"""kernelhub: fused kernels for scientific imaging and neural fields, chosen per call.

>>> import torch, kernelhub
>>> volume = torch.randn(8, 9, 10)
>>> sums = kernelhub.op("tv_loss_l1_3d")(volume)      # [3] per-axis sums
>>> kernelhub.explain("tv_loss_l1_3d", volume).chosen
'torch_ref'
"""

from __future__ import annotations

from typing import Any

from kernelhub.errors import (
    ConfigError,
    KernelhubError,
    NoImplementationError,
    PluginValidationError,
    StrictModeError,
    WrongOutputError,
)
from kernelhub.hookspecs import hookimpl
from kernelhub.hub import get_hub, reload, scoped
from kernelhub.ops._checks import accumulation_dtype
from kernelhub.select import Decision
from kernelhub.spec import Arg, Backend, Case, Impl, OpSpec, SampleInput, Tolerance

__version__ = "0.1.0"
__all__ = [
    "op", "explain", "op_names", "reload", "scoped", "get_hub", "hookimpl", "accumulation_dtype",
    "OpSpec", "Impl", "Backend", "Arg", "Case", "SampleInput", "Tolerance", "Decision",
    "KernelhubError", "PluginValidationError", "ConfigError", "NoImplementationError", "StrictModeError",
    "WrongOutputError",
]


def op(name: str, backend: str | None = None):
    """The callable for op ``name``; with ``backend``, that backend is forced (an error says why it can't serve).

    >>> import torch, kernelhub
    >>> kernelhub.op("tv_loss_sq_3d")(torch.ones(2, 3, 4)).item()
    0.0
    """
    return get_hub().handle(name, backend)


def explain(name: str, *args: Any, **kwargs: Any) -> Decision:
    """Which backend would serve ``kernelhub.op(name)(*args, **kwargs)``, and why each other did not."""
    return get_hub().explain(name, *args, **kwargs)


def op_names() -> list[str]:
    """Names of every registered op."""
    return sorted(get_hub().registry.specs)
