// semiconv on CUDA: the backwards (semiconv_cuda.h has the kernels; semiconv.cu the forwards), the tiled ones
// launched from semiconv_backward_search.cu and semiconv_backward_saved.cu.
#include "semiconv_cuda.h"

namespace kernelhub_cuda_ext {
namespace {

// the backward; `saved`: semiconv_forward_saving's winners of this call (an empty tensor: none, the search runs)
std::tuple<at::Tensor, at::Tensor> semiconv_backward_impl(const at::Tensor& grad_, const at::Tensor& saved,
                                                          const at::Tensor& img_, const at::Tensor& ker_, int64_t sf,
                                                          double param, int64_t groups, at::IntArrayRef stride,
                                                          at::IntArrayRef pad, at::IntArrayRef dil, bool need_img,
                                                          bool need_kernel, bool flip) {
  c10::cuda::CUDAGuard guard(img_.device());
  const at::Tensor img = img_.contiguous(), ker = ker_.contiguous(), grad = grad_.contiguous();
  const ScGeo g = sc_backward_geo(grad, img, ker, groups, stride, pad, dil, flip);
  check_channel_size("semiconv_backward", g);
  auto gk = at::zeros(need_kernel ? ker.sizes() : at::IntArrayRef{0}, img.options().dtype(acc_dtype(img)));
  const TtPlan plan = grad.numel() > 0 && (need_img || need_kernel)
                          ? tt_plan(g, sf, true, int64_t(c10::elementSize(acc_dtype(img)))) : TtPlan{};
  const bool use_saved = saved.defined() && saved.numel() > 0;
  TORCH_CHECK(!use_saved || (plan.bytes && saved.scalar_type() == at::kByte && saved.is_contiguous() &&
                             saved.device() == img.device() && saved.numel() == g.B * g.O * g.OH * g.OW),
              "kernelhub_cuda_ext::semiconv_backward_saved: `saved` is not semiconv_forward_saving's winners of this "
              "call");
  if (plan.bytes) {  // the tiled backward writes every element of img's gradient, in img's dtype
    auto gx = at::empty(need_img ? img.sizes() : at::IntArrayRef{0}, img.options());
    const TtLaunch launch{plan.wide, plan.tiles_h, plan.tiles_w, plan.lx * plan.ly, plan.ly,
                          use_saved ? plan.saved_bytes : plan.bytes};
    (use_saved ? tt_backward_saved : tt_backward_search)(grad, saved, img, ker, gx, gk, g, sf, launch, need_img,
                                                         need_kernel);
    return {need_img ? gx : at::empty({0}, img.options()),
            need_kernel ? gk.to(ker.scalar_type()) : at::empty({0}, ker.options())};
  }
  auto gx = at::zeros(need_img ? img.sizes() : at::IntArrayRef{0}, img.options().dtype(acc_dtype(img)));
  if (grad.numel() > 0 && (need_img || need_kernel)) {
    AT_DISPATCH_FLOATING_TYPES_AND2(at::kHalf, at::kBFloat16, img.scalar_type(), "semiconv_backward_cuda", [&] {
      using A = at::opmath_type<scalar_t>;
      const int64_t smem = g.Cg * g.taps() * int64_t(sizeof(A));
      const bool shared_gk = need_kernel && smem <= SC_SHARED_BYTES;
      sc_dispatch(sf, [&](auto SF) {
        semiconv_backward_kernel<decltype(SF)::value, scalar_t><<<sc_grid(g), SC_THREADS, shared_gk ? smem : 0,
                                                                  c10::cuda::getCurrentCUDAStream()>>>(
            grad.data_ptr<scalar_t>(), img.data_ptr<scalar_t>(), ker.data_ptr<scalar_t>(),
            need_img ? gx.data_ptr<A>() : nullptr, need_kernel ? gk.data_ptr<A>() : nullptr, g,
            A(sc_zero(sf, param)), A(param), need_img, need_kernel, shared_gk);
        C10_CUDA_KERNEL_LAUNCH_CHECK();
      });
    });
  }
  return {need_img ? gx.to(img.scalar_type()) : at::empty({0}, img.options()),
          need_kernel ? gk.to(ker.scalar_type()) : at::empty({0}, ker.options())};
}

std::tuple<at::Tensor, at::Tensor> semiconv_backward_cuda(const at::Tensor& grad, const at::Tensor& img,
                                                          const at::Tensor& ker, int64_t sf, double param,
                                                          int64_t groups, at::IntArrayRef stride, at::IntArrayRef pad,
                                                          at::IntArrayRef dil, bool need_img, bool need_kernel,
                                                          bool flip) {
  return semiconv_backward_impl(grad, at::Tensor(), img, ker, sf, param, groups, stride, pad, dil, need_img,
                                need_kernel, flip);
}

}  // namespace

TORCH_LIBRARY_IMPL(kernelhub_cuda_ext, CUDA, m) {
  m.impl("semiconv_backward", &semiconv_backward_cuda);
  m.impl("semiconv_backward_saved", &semiconv_backward_impl);
}

}  // namespace kernelhub_cuda_ext
