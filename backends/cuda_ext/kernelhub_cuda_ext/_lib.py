"""Load the compiled library once per process (building it on first use) and give its operators
fake implementations, so they trace under torch.compile like any ATen operator."""

from __future__ import annotations

import threading
from pathlib import Path

import torch

from kernelhub_cuda_ext._build import CSRC, BuildError, aot_name, build, check_private, library_dir

__all__ = ["load", "NAME", "aot_library", "loaded_from", "first_use_dir"]

NAME = "kernelhub_cuda_ext"
_LOCK = threading.Lock()
_OUTCOME: list[str | None] = []  # [] = not tried yet; [None] = loaded; [reason] = failed
_CUDA: list[str | None] = []  # once loaded: [None] with the CUDA kernels, [why not] without
_FROM: list[str] = []  # the library loaded


def aot_library() -> Path | None:
    """The library built ahead of time (setup.py) for this torch and these sources, if the package has one."""
    found = sorted(Path(__file__).parent.glob(f"{aot_name(torch.__version__)}.*so"))
    return found[0] if found else None


def loaded_from() -> str | None:
    return _FROM[0] if _FROM else None


def _first_use_sources(no_cuda: str | None) -> tuple[list[Path], bool]:
    """The sources a first use compiles, and whether with CUDA (``no_cuda``: `_no_cuda_reason()`)."""
    return sorted(CSRC.glob("*.cpp")) + (sorted(CSRC.glob("*.cu")) if no_cuda is None else []), no_cuda is None


def first_use_dir(root: Path | None = None) -> Path:
    """Where a first use builds the library (and finds it built) under the cache ``root`` (default: the user's)."""
    sources, with_cuda = _first_use_sources(_no_cuda_reason())
    return library_dir(NAME, sources, with_cuda, root)


def _no_cuda_reason() -> str | None:
    """None when the CUDA sources can be built here, else why not."""
    from torch.utils.cpp_extension import CUDA_HOME
    if not torch.version.cuda:
        return "torch is a CPU build"
    if not torch.cuda.is_available():
        return "no CUDA device"
    if CUDA_HOME is None:
        return "no CUDA toolkit (nvcc) found"
    return None


def cuda_reason() -> str | None:
    """None when the loaded library has the CUDA kernels, else why it has not."""
    reason = load()
    return reason if reason is not None else _CUDA[0]


def _register_fakes() -> None:
    """Shapes and dtypes of each operator's outputs, which are always contiguous (as the kernels make them)."""
    def like(t, shape=None, dtype=None):
        return t.new_empty(t.shape if shape is None else shape, dtype=dtype)  # new_empty: contiguous

    def tv_out(x, mode, weights):  # with weights: their weighted sum, 0-d
        return like(x, (3,) if mode == 0 and weights is None else (),
                    torch.float64 if x.dtype == torch.float64 else torch.float32)

    torch.library.register_fake(f"{NAME}::tv_forward")(lambda x, mode, eps, weights=None: tv_out(x, mode, weights))
    torch.library.register_fake(f"{NAME}::tv_backward")(lambda grad, x, mode, eps, weights=None: like(x))
    torch.library.register_fake(f"{NAME}::trilinear_forward")(
        lambda feats, points: like(feats, (feats.shape[0], feats.shape[2])))
    torch.library.register_fake(f"{NAME}::trilinear_backward")(
        lambda grad, feats, points, need_feats, need_points: (
            like(feats) if need_feats else like(feats, (0,)), like(points) if need_points else like(points, (0,))))
    torch.library.register_fake(f"{NAME}::kplanes_forward")(
        lambda pts, rot, planes, taps, h: like(pts, (taps, pts.shape[0], rot.shape[0] * planes.shape[1])))
    torch.library.register_fake(f"{NAME}::kplanes_backward")(
        lambda grad, pts, rot, planes, taps, h, need_planes, need_pts, need_rot: tuple(
            like(t) if need else like(t, (0,))
            for t, need in ((planes, need_planes), (pts, need_pts), (rot, need_rot))))
    torch.library.register_fake(f"{NAME}::tikhonov_forward")(lambda M, lam: like(M))
    torch.library.register_fake(f"{NAME}::tikhonov_backward")(lambda grad, M, lam: like(M))
    # semiconv: img [B, C, D, H, W] and kernel [O, C/g, KD, KH, KW] as ops.py lifts them -> [B, O, *out_size]. Its
    # saving pair (semiconv_forward_saving, semiconv_backward_saved: CUDA only) runs on the hub's eager fast path
    # alone (`Impl.can` "saves"), never traced: no fakes
    torch.library.register_fake(f"{NAME}::semiconv_forward")(
        lambda img, kernel, semifield, param, groups, stride, padding, dilation, out_size, flip: like(
            img, (img.shape[0], kernel.shape[0], *out_size)))
    torch.library.register_fake(f"{NAME}::semiconv_backward")(
        lambda grad, img, kernel, semifield, param, groups, stride, padding, dilation, need_img, need_kernel, flip: (
            like(img) if need_img else like(img, (0,)), like(kernel) if need_kernel else like(kernel, (0,))))


def load() -> str | None:
    """None once the library is loaded, else why it cannot be (the outcome is kept for the process)."""
    with _LOCK:
        if not _OUTCOME:
            try:
                no_cuda = _no_cuda_reason()
                library = aot = aot_library()
                if aot is not None:  # installed with the package: owned by this user or root
                    try:
                        check_private(aot.parent, owners=(0,))
                        check_private(aot, owners=(0,))
                        torch.ops.load_library(str(aot))
                    except (BuildError, OSError):  # replaceable by others, or not loadable: compile our own
                        library = None
                if library is None:
                    sources, with_cuda = _first_use_sources(no_cuda)
                    library = build(NAME, sources, with_cuda=with_cuda)
                    check_private(library.parent)
                    check_private(library)
                    torch.ops.load_library(str(library))
                _register_fakes()
                if library == aot:  # setup.py compiled the CUDA sources where it could
                    has_cuda = torch._C._dispatch_has_kernel_for_dispatch_key(f"{NAME}::tv_forward", "CUDA")
                    no_cuda = no_cuda or (None if has_cuda else "the ahead-of-time build has none")
                _CUDA.append(no_cuda and f"built without its CUDA kernels: {no_cuda}")
                _FROM.append(str(library))
                _OUTCOME.append(None)
            except BuildError as exc:
                _OUTCOME.append(str(exc))
            except Exception as exc:  # a loader error must not crash the host program
                _OUTCOME.append(f"{type(exc).__name__}: {exc}")
        return _OUTCOME[0]
