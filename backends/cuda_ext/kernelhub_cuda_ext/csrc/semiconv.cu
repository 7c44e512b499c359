// semiconv on CUDA: the forwards (semiconv_cuda.h has the kernels; semiconv_backward.cu the backwards).
#include "semiconv_cuda.h"

namespace kernelhub_cuda_ext {
namespace {

// the forward, and with `save` (a forward whose backward follows) each output's first winner for the tiled
// backward's SAVED form ([B, O, OH, OW] uint8) where both tiled kernels take the call; else an empty tensor
std::tuple<at::Tensor, at::Tensor> semiconv_forward_impl(const at::Tensor& img_, const at::Tensor& ker_, int64_t sf,
                                                         double param, int64_t groups, at::IntArrayRef stride,
                                                         at::IntArrayRef pad, at::IntArrayRef dil,
                                                         at::IntArrayRef out_size, bool flip, bool save) {
  c10::cuda::CUDAGuard guard(img_.device());
  const at::Tensor img = img_.contiguous(), ker = ker_.contiguous();
  const ScGeo g = sc_geo("semiconv_forward", img, ker, groups, stride, pad, dil, out_size, flip);
  check_channel_size("semiconv_forward", g);
  auto out = at::empty({g.B, g.O, g.OD, g.OH, g.OW}, img.options());
  auto win = at::empty({0}, img.options().dtype(at::kByte));
  if (out.numel() == 0) return {out, win};
  AT_DISPATCH_FLOATING_TYPES_AND2(at::kHalf, at::kBFloat16, img.scalar_type(), "semiconv_forward_cuda", [&] {
    using A = at::opmath_type<scalar_t>;
    sc_dispatch(sf, [&](auto SF) {
      constexpr int sfv = decltype(SF)::value;
      if constexpr (sfv == SC_MAX || sfv == SC_MIN) {
        if (const TtPlan plan = tt_plan(g, sf, false, sizeof(A)); plan.bytes) {
          if (save && tt_plan(g, sf, true, sizeof(A)).bytes) win = at::empty({g.B, g.O, g.OH, g.OW}, win.options());
          tt_dispatch_kw(g.KW, [&](auto KW) {
            const auto kernel = win.numel() ? tt_forward_kernel<sfv, decltype(KW)::value, scalar_t, true>
                                            : tt_forward_kernel<sfv, decltype(KW)::value, scalar_t, false>;
            tt_allow_shared(kernel, plan.bytes);
            kernel<<<static_cast<unsigned>(g.B * g.O * plan.tiles_h * plan.tiles_w), TT_THREADS, plan.bytes,
                     c10::cuda::getCurrentCUDAStream()>>>(img.data_ptr<scalar_t>(), ker.data_ptr<scalar_t>(),
                                                          out.data_ptr<scalar_t>(),
                                                          win.numel() ? win.data_ptr<uint8_t>() : nullptr, g,
                                                          plan.tiles_h, plan.tiles_w);
            C10_CUDA_KERNEL_LAUNCH_CHECK();
          });
          return;
        }
      }
      semiconv_forward_kernel<decltype(SF)::value, scalar_t><<<sc_grid(g), SC_THREADS, 0,
                                                               c10::cuda::getCurrentCUDAStream()>>>(
          img.data_ptr<scalar_t>(), ker.data_ptr<scalar_t>(), out.data_ptr<scalar_t>(), g, A(sc_zero(sf, param)),
          A(param));
      C10_CUDA_KERNEL_LAUNCH_CHECK();
    });
  });
  return {out, win};
}

at::Tensor semiconv_forward_cuda(const at::Tensor& img, const at::Tensor& ker, int64_t sf, double param,
                                 int64_t groups, at::IntArrayRef stride, at::IntArrayRef pad, at::IntArrayRef dil,
                                 at::IntArrayRef out_size, bool flip) {
  return std::get<0>(semiconv_forward_impl(img, ker, sf, param, groups, stride, pad, dil, out_size, flip, false));
}

std::tuple<at::Tensor, at::Tensor> semiconv_forward_saving_cuda(const at::Tensor& img, const at::Tensor& ker,
                                                                int64_t sf, double param, int64_t groups,
                                                                at::IntArrayRef stride, at::IntArrayRef pad,
                                                                at::IntArrayRef dil, at::IntArrayRef out_size,
                                                                bool flip) {
  return semiconv_forward_impl(img, ker, sf, param, groups, stride, pad, dil, out_size, flip, true);
}

}  // namespace

TORCH_LIBRARY_IMPL(kernelhub_cuda_ext, CUDA, m) {
  m.impl("semiconv_forward", &semiconv_forward_cuda);
  m.impl("semiconv_forward_saving", &semiconv_forward_saving_cuda);
}

}  // namespace kernelhub_cuda_ext
