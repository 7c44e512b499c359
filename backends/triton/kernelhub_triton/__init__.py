"""kernelhub's Triton backend. Registered through the entry point group ``kernelhub.backends``.

One module per op family (``tv.py``, ``trilinear.py``, ``tikhonov.py``), each holding its
``@triton.jit`` kernels, then their launchers, then the forward/backward the plugin
registers. Kernel modules import triton; ``plugin.py`` does not, so a machine without
triton still lists the backend, as unavailable with the reason.
"""

__version__ = "0.1.0"
