"""kernelhub's reference backend: each op written literally from docs/ops.md in plain PyTorch.

Clarity over speed: this is the ground truth the testing kit runs in float64, and the
fallback for every device and dtype. Half-precision inputs are computed in float32
("fp32 accumulation"), float64 in float64.
"""

__version__ = "0.1.0"
