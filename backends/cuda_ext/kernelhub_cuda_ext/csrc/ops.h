// kernelhub_cuda_ext: the operator schemas shared by the CPU and CUDA kernels.
//
// The Python side (ops.py) flattens the leading dims and makes inputs contiguous:
//   TV        x [B, D, H, W];   mode 0 = L1 (output [3]), 1 = SQ ([]), 2 = iso ([], the mean)
//   trilinear feats [N, 8, F], points [N, 3]
//   K-Planes  pts [B, 3], rotations [T, 3, 3], planes [3T, C, H, W] (CUDA only)
//   Tikhonov  M [P, 2, Z], real or complex
// Reductions are deterministic: fixed-size chunks whose partial sums are added in order.
#pragma once
#include <torch/library.h>
#include <ATen/ATen.h>

namespace kernelhub_cuda_ext {

constexpr int64_t TV_L1 = 0, TV_SQ = 1, TV_ISO = 2;

inline at::ScalarType tv_out_dtype(const at::Tensor& x) {
  return x.scalar_type() == at::kDouble ? at::kDouble : at::kFloat;
}

}  // namespace kernelhub_cuda_ext
