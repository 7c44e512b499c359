// semiconv (docs/ops.md): what the CPU (semiconv_cpu.cpp) and CUDA (semiconv_cuda.h) kernels share.
//
// ops.py hands the kernels 3 spatial dims (1-D and 2-D get leading size-1 dims), the kernel as given (for
// kind="conv" the kernels read it flipped: `flip`), and the output size; only the begin padding is needed here. The reduction
// runs over (c, tap) in row-major order: c, then kd, kh, kw. A tap outside the image reads the
// semifield's zero. For max/min the first winner in that order takes the whole gradient of an output;
// a NaN in the window gives a NaN output and no gradient. log and root follow torch's chain rule
// (logsumexp with its "an infinite max shifts by 0" rule; pow, sum, pow).
#pragma once
#include <ATen/ATen.h>
#include <c10/macros/Macros.h>

#include <cmath>
#include <limits>
#include <vector>

namespace kernelhub_cuda_ext {

enum : int64_t { SC_MAX = 0, SC_MIN = 1, SC_LINEAR = 2, SC_ROOT = 3, SC_LOG = 4 };

struct ScGeo {
  int64_t B, C, D, H, W;        // img
  int64_t O, Cg, KD, KH, KW;    // kernel [O, Cg, KD, KH, KW]
  int64_t OD, OH, OW, Og;       // output spatial sizes; output channels per group
  int64_t s[3], p[3], d[3];     // stride, begin padding, dilation
  bool flip;                    // kind="conv": window tap t reads kernel tap taps-1-t (every spatial dim reversed)
  C10_HOST_DEVICE int64_t taps() const { return KD * KH * KW; }
  C10_HOST_DEVICE int64_t ktap(int64_t t) const { return flip ? KD * KH * KW - 1 - t : t; }
};

// the semifield's zero (the padding value)
inline double sc_zero(int64_t sf, double param) {
  const double inf = std::numeric_limits<double>::infinity();
  if (sf == SC_MAX || (sf == SC_LOG && param > 0)) return -inf;
  if (sf == SC_MIN || sf == SC_LOG) return inf;
  return 0.0;
}

template <int SF, typename A>
C10_HOST_DEVICE inline A sc_combine(A x, A k) {  // the semifield's product
  if constexpr (SF == SC_MIN) return x - k;
  else if constexpr (SF == SC_MAX || SF == SC_LOG) return x + k;
  else return x * k;
}

// logsumexp's shift: the max, or 0 where the max is infinite (torch's rule)
template <typename A>
C10_HOST_DEVICE inline A sc_shift(A m) { return std::isinf(m) ? A(0) : m; }

// the output from the window's statistics: best (max/min; log: the max of mu*a), acc (linear, root, log sums)
template <int SF, typename A>
C10_HOST_DEVICE inline A sc_value(A best, A acc, bool nan, A prm) {
  if constexpr (SF == SC_MAX || SF == SC_MIN) return nan ? A(NAN) : best;
  else if constexpr (SF == SC_LINEAR) return acc;
  else if constexpr (SF == SC_ROOT) return std::pow(acc, A(1) / prm);
  else return nan ? A(NAN) : (std::log(acc) + sc_shift(best)) / prm;
}

// d out / d a of one product `a` of a smooth semifield, times the upstream gradient (per output: `gs` is the
// upstream gradient for linear and log, and g * (1/p) * acc^(1/p - 1) for root; `lse` the log's log-sum-exp)
template <int SF, typename A>
C10_HOST_DEVICE inline A sc_smooth_weight(A a, A gs, A prm, A lse) {
  if constexpr (SF == SC_LINEAR) return gs;
  else if constexpr (SF == SC_ROOT) return gs * (prm * std::pow(a, prm - A(1)));
  else return gs * std::exp(prm * a - lse);
}

template <typename A>
C10_HOST_DEVICE inline A sc_root_grad(A g, A acc, A prm) { return g * ((A(1) / prm) * std::pow(acc, A(1) / prm - A(1))); }

// dispatch a runtime semifield to a template parameter
template <typename F>
inline auto sc_dispatch(int64_t sf, F&& f) {
  TORCH_CHECK(sf >= SC_MAX && sf <= SC_LOG, "kernelhub_cuda_ext::semiconv: argument 'semifield' must be 0-4, got ", sf);
  switch (sf) {
    case SC_MAX: return f(std::integral_constant<int, SC_MAX>{});
    case SC_MIN: return f(std::integral_constant<int, SC_MIN>{});
    case SC_LINEAR: return f(std::integral_constant<int, SC_LINEAR>{});
    case SC_ROOT: return f(std::integral_constant<int, SC_ROOT>{});
    default: return f(std::integral_constant<int, SC_LOG>{});
  }
}

// the operators' arguments checked and laid out: img [B, C, D, H, W] and kernel [O, Cg, KD, KH, KW] contiguous
inline ScGeo sc_geo(const char* fn, const at::Tensor& img, const at::Tensor& ker, int64_t groups,
                    at::IntArrayRef stride, at::IntArrayRef pad, at::IntArrayRef dil, at::IntArrayRef out_size,
                    bool flip) {
  TORCH_CHECK(img.dim() == 5 && ker.dim() == 5, "kernelhub_cuda_ext::", fn,
              ": arguments 'img' and 'kernel' must be 5-D (ops.py lifts 1-D and 2-D)");
  TORCH_CHECK(stride.size() == 3 && pad.size() == 3 && dil.size() == 3 && out_size.size() == 3,
              "kernelhub_cuda_ext::", fn, ": stride, padding, dilation and out_size need 3 values each");
  TORCH_CHECK(groups >= 1 && img.size(1) == groups * ker.size(1) && ker.size(0) % groups == 0,
              "kernelhub_cuda_ext::", fn, ": argument 'groups' does not match img and kernel");
  TORCH_CHECK(img.scalar_type() == ker.scalar_type() && img.device() == ker.device(),
              "kernelhub_cuda_ext::", fn, ": img and kernel must share dtype and device");
  TORCH_CHECK(ker.size(1) >= 1 && ker.size(2) >= 1 && ker.size(3) >= 1 && ker.size(4) >= 1,
              "kernelhub_cuda_ext::", fn, ": argument 'img' needs a channel and 'kernel' a tap (an empty window "
              "has no value; docs/ops.md)");
  return ScGeo{img.size(0), img.size(1), img.size(2), img.size(3), img.size(4),
               ker.size(0), ker.size(1), ker.size(2), ker.size(3), ker.size(4),
               out_size[0], out_size[1], out_size[2], ker.size(0) / groups,
               {stride[0], stride[1], stride[2]}, {pad[0], pad[1], pad[2]}, {dil[0], dil[1], dil[2]}, flip};
}

// the backward's geometry: `grad` must be the forward's output, [B, O, OD, OH, OW]
inline ScGeo sc_backward_geo(const at::Tensor& grad, const at::Tensor& img, const at::Tensor& ker, int64_t groups,
                             at::IntArrayRef stride, at::IntArrayRef pad, at::IntArrayRef dil, bool flip) {
  TORCH_CHECK(grad.dim() == 5 && grad.size(0) == img.size(0) && grad.size(1) == ker.size(0),
              "kernelhub_cuda_ext::semiconv_backward: argument 'grad' must be [B, O, OD, OH, OW]");
  return sc_geo("semiconv_backward", img, ker, groups, stride, pad, dil, grad.sizes().slice(2), flip);
}

}  // namespace kernelhub_cuda_ext
