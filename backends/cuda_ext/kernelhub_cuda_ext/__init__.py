"""kernelhub's cuda_ext backend: C++ CPU kernels (and CUDA kernels where a toolkit and a GPU are present),
compiled on first use into a private per-user cache (see _build.py)."""

__version__ = "0.1.0"
