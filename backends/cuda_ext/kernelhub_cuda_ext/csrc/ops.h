// kernelhub_cuda_ext: the operator schemas shared by the CPU and CUDA kernels.
//
// The Python side (ops.py) flattens the leading dims and makes inputs contiguous:
//   TV        x [B, D, H, W];   mode 0 = L1 (output [3]), 1 = SQ ([]), 2 = iso ([], the mean)
//   trilinear feats [N, 8, F], points [N, 3]
//   K-Planes  pts [B, 3], rotations [T, 3, 3], planes [3T, C, H, W]; taps 1 or 4
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

inline void kp_check(const char* fn, const at::Tensor& pts, const at::Tensor& rot, const at::Tensor& planes, int64_t taps) {
  TORCH_CHECK(pts.dim() == 2 && pts.size(1) == 3, "kernelhub_cuda_ext::", fn, ": argument 'pts' must be [B, 3]");
  TORCH_CHECK(rot.dim() == 3 && rot.size(1) == 3 && rot.size(2) == 3,
              "kernelhub_cuda_ext::", fn, ": argument 'rotations' must be [T, 3, 3]");
  TORCH_CHECK(planes.dim() == 4 && planes.size(0) == 3 * rot.size(0),
              "kernelhub_cuda_ext::", fn, ": argument 'planes' must be [3T, C, H, W]");
  TORCH_CHECK(taps == 1 || taps == 4, "kernelhub_cuda_ext::", fn, ": argument 'taps' must be 1 or 4");
}

}  // namespace kernelhub_cuda_ext
