"""What every launcher here shares: accumulation dtype, grid sizing, and `Bound` with `launch`, the one way a
kernel is launched."""

from __future__ import annotations

import inspect

import torch
import triton.language as tl

from kernelhub.spec import layout_cache

try:
    from triton import knobs as _knobs  # triton >= 3.4: the launch hooks live here
except ImportError:  # older triton: every launch takes Triton's own path
    _knobs = None


_ACC = {torch.float64: tl.float64, torch.complex128: tl.float64}


def acc_type(dtype: torch.dtype):
    """fp32 accumulation for half and single inputs, fp64 for double (docs/ops.md). One dict lookup: a tuple
    membership test compares dtypes in Python, and each launch asks once or twice."""
    return _ACC.get(dtype, tl.float32)


def cdiv(a: int, b: int) -> int:
    """``triton.cdiv`` for the launchers' host code: Triton's is a constexpr function, several times dearer a
    call, and a launch makes several (docs/lab/benchmarks-history.md#measurements-behind-the-code); this is the
    same integer arithmetic."""
    return -(-a // b)


def next_power_of_2(n: int) -> int:
    """``triton.next_power_of_2`` for host code (see `cdiv`): the smallest power of two >= n, 0 for 0."""
    return 1 << (n - 1).bit_length() if n > 0 else 0


class Bound:
    """A kernel with the arguments one layout fixes, by name: sizes the launcher's layout cache derived, the
    compile-time constants, launch options (num_warps). A launcher keeps one per layout (`layout_cache`) and
    launches it with `launch`, passing positionally only what each call brings (tensors, per-call scalars): the
    kernel's leading parameters. A launch then keys on the Bound as an object (its hash is its identity) and the
    call's own arguments, and a kept kernel gets the Bound's part as one tuple fixed at the key's first launch
    (`_tail`): no keyword dict built, hashed or picked from per call (a measurable part of a small launch:
    docs/lab/benchmarks-history.md#measurements-behind-the-code)."""

    def __init__(self, kernel, **kwargs):
        self.kernel = kernel
        self.kwargs = kwargs

    def __repr__(self) -> str:
        return f"Bound({getattr(self.kernel, '__name__', self.kernel)}, {self.kwargs})"


# launch's compiled kernels: (Bound, device index, each call argument's specialization) -> (compiled kernel, the
# kernel's parameters after the call's arguments, as the Bound and the defaults give them)
_HANDLES: dict[tuple, tuple] = {}
_MAX_HANDLES = 4096


def _key(bound: Bound, device: int, args: tuple) -> tuple[tuple, list]:
    """What Triton specialises a launch on beyond the Bound, and the arguments as `launch` hands them to a kept
    kernel. The key: the Bound (fixed values, by identity), the device, and per argument: a tensor's dtype, device
    index and 16-byte alignment, an integer's value (Triton looks at == 1, divisibility by 16 and the width; the
    value covers them all), a float's type (floats are not specialised), any other value as it is. The arguments:
    each tensor as its address (an int), which Triton's C launcher takes as it is; given the tensor, it calls the
    tensor's ``data_ptr`` and asks the driver (``cuPointerGetAttribute``) whether the address is a device one, per
    tensor and launch. A key is kept only after its first launch, which takes Triton's own path, so that question
    is asked once per key: where Triton refuses a tensor (a CPU tensor, say), that launch raises and its key,
    which holds each tensor's device, is never kept.

    One loop per call, no function call per argument (each is host time on every launch). So the launchers pass
    per-call floats positionally (a Bound's value is fixed with it: a float there, an
    eps say, would make a Bound per value)."""
    key: list = [bound, device]
    values: list = []
    for a in args:
        if isinstance(a, torch.Tensor):
            address = a.data_ptr()
            values.append(address)
            key.append((a.dtype, a.get_device(), address % 16 == 0))
        else:
            values.append(a)
            key.append(float if type(a) is float else a)
    return tuple(key), values


def _tail(bound: Bound, n: int) -> tuple:
    """The kernel's parameters after its first ``n`` (the call's arguments), in signature order, from the Bound's
    values and the parameters' defaults: what a kept kernel gets after the call's arguments."""
    params = list(inspect.signature(bound.kernel.fn).parameters.values())[n:]
    return tuple(bound.kwargs[p.name] if p.name in bound.kwargs else p.default for p in params)


def launch(bound: Bound, grid: tuple, *args) -> None:
    """``bound.kernel[grid](*args, **bound.kwargs)`` on the device of ``args[0]`` (a tensor), complex tensors as
    their real views (`_real`), with Triton's per-call work done once per key.

    Triton's own launch binds the arguments to the signature, computes the specialisation key and looks the
    compiled kernel up on every call; on a host that is most of a small kernel's time
    (docs/lab/benchmarks-history.md#measurements-behind-the-code). Here the compiled kernel Triton returned
    for the first call of a key (`_key`) is kept with the Bound's part of its arguments (`_tail`), and later calls
    of the key hand it the arguments and the current stream directly, as Triton's own launch does after its
    lookup, each tensor as its address (`_key`). The first call of a key, CPU tensors (Triton's interpreter), a
    triton without ``triton.knobs``, a launch on a device that is not the current one and a launch while a launch
    hook is set (`_hooked`) take Triton's path. A launch on a torch.compile graph's tensors (a functional tensor:
    the impl is traced into the graph, `kernelhub.spec.Impl.can` "traceable") is recorded with ``wrap_triton``, and
    inductor launches the kernel from its own code.
    """
    t = args[0]
    if type(t) is not torch.Tensor:  # traced into a torch.compile graph (`Impl.can` "traceable"): inductor launches it
        # (its Triton wrapper takes the launch options num_warps and num_stages, not maxnreg)
        torch.library.wrap_triton(bound.kernel)[grid](*_real(args), **{k: v for k, v in bound.kwargs.items()
                                                                        if k != "maxnreg"})
        return
    if not t.is_cuda or _knobs is None:
        bound.kernel[grid](*_real(args), **bound.kwargs)
        return
    device = t.get_device()
    key, values = _key(bound, device, args)
    entry = _HANDLES.get(key)
    if entry is None or _current_device() != device or _hooked(_knobs.runtime):
        with torch.cuda.device(device):  # Triton launches on the current device
            compiled = bound.kernel[grid](*_real(args), **bound.kwargs)
        if entry is None and compiled is not None:
            if len(_HANDLES) >= _MAX_HANDLES:
                _HANDLES.clear()
            _HANDLES[key] = (compiled, _tail(bound, len(args)))
        return
    compiled, tail = entry
    g = (*grid, 1, 1)
    compiled.run(g[0], g[1], g[2], _current_stream(device), compiled.function, compiled.packed_metadata, None, None,
                 None, *values, *tail)


def _real(args: tuple) -> list:
    """The arguments as Triton's own launch takes them: a complex tensor as its real view (Triton has no complex
    types; a kernel reads the real and imaginary parts interleaved, with strides in real elements). A kept kernel
    gets the complex tensor's address, which is its real view's: so a launcher passes complex tensors as they are,
    without a view per call (host time on every launch)."""
    return [torch.view_as_real(a) if isinstance(a, torch.Tensor) and a.is_complex() else a for a in args]


def _hooked(runtime) -> bool:
    """Whether a launch hook is set (a profiler's, say): then every launch takes Triton's path, which gives the
    hooks the launch metadata they read (computed from the tensors themselves). Older triton keeps None or a
    function per hook, newer a chain of functions (``HookChain``), empty where none was added."""
    enter, leave = runtime.launch_enter_hook, runtime.launch_exit_hook
    return (enter is not None and bool(getattr(enter, "calls", True))) or \
        (leave is not None and bool(getattr(leave, "calls", True)))


_current_stream = getattr(torch._C, "_cuda_getCurrentRawStream", None) or (  # what Triton's launch uses
    lambda device: torch.cuda.current_stream(device).cuda_stream)
_current_device = getattr(torch._C, "_cuda_getDevice", None) or torch.cuda.current_device  # no lazy-init check


def reduction(t: torch.Tensor, numel: int, dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
    """For a kernel whose programs write partial results that the same launch's last program finishes (the one
    that counts the others done): a flat buffer of ``numel`` elements of ``dtype`` for the partials and an int32
    counter at 0, on ``t``'s device, new for each call. Never kept between calls: a buffer that outlived its call
    would be memory of a CUDA graph's private pool that no output holds where it was first allocated while
    ``torch.compile(mode="reduce-overhead")`` warmed a graph up ("tensors in the cudagraph pool not tracked as
    outputs"), and a captured call replays its own counter's zeroing."""
    return torch.empty(numel, dtype=dtype, device=t.device), torch.zeros(1, dtype=torch.int32, device=t.device)


@layout_cache(maxsize=None)
def _sm_count(index: int) -> int:
    return torch.cuda.get_device_properties(index).multi_processor_count  # a constant to dynamo


def sm_count(t: torch.Tensor) -> int:
    """Multiprocessors of ``t``'s GPU (a fixed small number under the interpreter)."""
    return _sm_count(t.device.index if t.device.index is not None else torch.cuda.current_device()) \
        if t.is_cuda else 4
