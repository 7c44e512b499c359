"""Ahead-of-time build of the kernels, when torch is importable at build time.

`pip install --no-build-isolation ./backends/cuda_ext` (torch installed, a C++ compiler present; with
torch's CUDA build and nvcc, the CUDA kernels too) compiles
`kernelhub_cuda_ext/_C_<torch version>_<source digest>.so` (kernelhub_cuda_ext/_build.py's aot_name),
which the backend loads instead of compiling on first use (a library of that name already in the package
directory is kept: the name holds the torch version and the sources' digest). In an isolated build (plain `pip install`)
torch is not importable here, and a failing compile is only a warning (the extension is optional): the
package then ships its sources and compiles them on first use (kernelhub_cuda_ext/_build.py).
"""

import glob
import importlib.util
import os

from setuptools import setup


def aot_extension() -> dict:
    try:
        import torch
        from torch.utils import cpp_extension
    except Exception:  # an isolated build: no torch here
        return {}
    csrc = os.path.join("kernelhub_cuda_ext", "csrc")
    sources = sorted(glob.glob(os.path.join(csrc, "*.cpp")))
    cuda = bool(torch.version.cuda) and cpp_extension.CUDA_HOME is not None
    # no -march=native: the library may move; no contracted multiply-adds, as in _build.py's flags
    args = {"cxx": ["-O3", "-fopenmp", "-fno-math-errno", "-ffp-contract=off"]}
    if cuda:
        sources += sorted(glob.glob(os.path.join(csrc, "*.cu")))
        args["nvcc"] = ["-O3"]
    make = cpp_extension.CUDAExtension if cuda else cpp_extension.CppExtension
    name = _build_module().aot_name(torch.__version__)
    if glob.glob(os.path.join("kernelhub_cuda_ext", f"{name}.*so")):  # built already, for this torch and sources
        return {}
    ext = make(f"kernelhub_cuda_ext.{name}", sources,
               depends=sorted(glob.glob(os.path.join(csrc, "*.h"))), extra_compile_args=args,
               extra_link_args=["-fopenmp"])
    ext.optional = True  # a compile error is a warning; the first use compiles instead
    return {"ext_modules": [ext],
            "cmdclass": {"build_ext": cpp_extension.BuildExtension.with_options(no_python_abi_suffix=True)}}


def _build_module():
    """kernelhub_cuda_ext/_build.py, loaded by path: the package itself need not be importable here."""
    spec = importlib.util.spec_from_file_location("_kernelhub_cuda_ext_build",
                                                  os.path.join("kernelhub_cuda_ext", "_build.py"))
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


setup(**aot_extension())
