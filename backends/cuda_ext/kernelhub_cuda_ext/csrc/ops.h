// kernelhub_cuda_ext: the operator schemas shared by the CPU and CUDA kernels.
//
// The Python side (ops.py) flattens the leading dims and makes inputs contiguous:
//   TV        x [B, D, H, W];   mode 0 = L1 (output [3]), 1 = SQ ([]), 2 = iso ([], the mean); optional
//             weights of that output's shape: the output's weighted sum instead ([])
//   trilinear feats [N, 8, F], points [N, 3]
//   K-Planes  pts [B, 3], rotations [T, 3, 3], planes [3T, C, H, W]; taps 1 or 4
//   Tikhonov  M [P, 2, Z], real or complex
// Reductions are deterministic: fixed-size chunks whose partial sums are added in order.
#pragma once
#include <torch/library.h>
#include <ATen/ATen.h>

namespace kernelhub_cuda_ext {

constexpr int64_t TV_L1 = 0, TV_SQ = 1, TV_ISO = 2;

// the accumulation dtype (and the TV losses' output dtype): double for double, float otherwise
inline at::ScalarType acc_dtype(const at::Tensor& x) {
  return x.scalar_type() == at::kDouble ? at::kDouble : at::kFloat;
}

// TV's optional weights (a weighted handle's, kernelhub's OpHandle.weighted): the op's output shape ([3] for L1,
// [] otherwise) on x's device; with them the op returns the 0-d weighted sum of its output and its backward takes
// that sum's 0-d upstream gradient
inline void check_tv_weights(const char* fn, const at::Tensor& x, int64_t mode,
                             const std::optional<at::Tensor>& weights) {
  TORCH_CHECK(!weights || (weights->device() == x.device() && weights->numel() == (mode == TV_L1 ? 3 : 1) &&
                           weights->dim() == (mode == TV_L1 ? 1 : 0)),
              "kernelhub_cuda_ext::", fn, ": argument 'weights' must be on x's device, [3] for L1 and [] otherwise");
}

// K-Planes inputs checked and laid out for the kernels (kplanes_point.h): pts and rotations contiguous,
// the planes channels-last [3T, H, W, C]; `grad`, when given, must be [taps, B, T*C] (any strides)
struct KpArgs {
  at::Tensor pts, rot, planes;
  int64_t B, T, C, H, W;
};

inline KpArgs kp_args(const char* fn, const at::Tensor& pts, const at::Tensor& rot, const at::Tensor& planes,
                      int64_t taps, const at::Tensor* grad = nullptr) {
  TORCH_CHECK(pts.dim() == 2 && pts.size(1) == 3, "kernelhub_cuda_ext::", fn, ": argument 'pts' must be [B, 3]");
  TORCH_CHECK(rot.dim() == 3 && rot.size(1) == 3 && rot.size(2) == 3,
              "kernelhub_cuda_ext::", fn, ": argument 'rotations' must be [T, 3, 3]");
  TORCH_CHECK(planes.dim() == 4 && planes.size(0) == 3 * rot.size(0),
              "kernelhub_cuda_ext::", fn, ": argument 'planes' must be [3T, C, H, W]");
  TORCH_CHECK(taps == 1 || taps == 4, "kernelhub_cuda_ext::", fn, ": argument 'taps' must be 1 or 4");
  KpArgs a{pts.contiguous(), rot.contiguous(), planes.permute({0, 2, 3, 1}).contiguous(),
           pts.size(0), rot.size(0), planes.size(1), planes.size(2), planes.size(3)};
  TORCH_CHECK(grad == nullptr || (grad->dim() == 3 && grad->size(0) == taps && grad->size(1) == a.B &&
                                  grad->size(2) == a.T * a.C),
              "kernelhub_cuda_ext::", fn, ": argument 'grad' must be [taps, B, T*C]");
  return a;
}

// the backward's outputs from the kernels' accumulators: the planes gradient (channels-last) back to
// [3T, C, H, W] in the planes' own layout (channels-last planes take the accumulator as it is, NCHW ones a copy),
// pts [B, 3] and rotations [T, 3, 3], each in its input's dtype; an empty tensor where not needed
inline std::tuple<at::Tensor, at::Tensor, at::Tensor> kp_grads(const at::Tensor& planes, const at::Tensor& pts,
                                                               const at::Tensor& rot, const at::Tensor& gpl,
                                                               const at::Tensor& gp, const at::Tensor& gr,
                                                               bool need_planes, bool need_pts, bool need_rot) {
  const auto layout = planes.is_contiguous(at::MemoryFormat::ChannelsLast) ? at::MemoryFormat::ChannelsLast
                                                                           : at::MemoryFormat::Contiguous;
  return {need_planes ? gpl.permute({0, 3, 1, 2}).to(planes.scalar_type()).contiguous(layout)
                      : at::empty({0}, planes.options()),
          need_pts ? gp.to(pts.scalar_type()) : at::empty({0}, pts.options()),
          need_rot ? gr.view({rot.size(0), 3, 3}).to(rot.scalar_type()) : at::empty({0}, rot.options())};
}

}  // namespace kernelhub_cuda_ext
