// semiconv on CUDA: the tiled backward's search form, which finds each output's winner again (semiconv_cuda.h), in
// a translation unit of its own so that semiconv's parts compile side by side.
#include "semiconv_cuda.h"

namespace kernelhub_cuda_ext {

void tt_backward_search(const at::Tensor& grad, const at::Tensor& saved, const at::Tensor& img, const at::Tensor& ker,
                        at::Tensor& gx, at::Tensor& gk, const ScGeo& g, int64_t sf, const TtLaunch& l, bool need_img,
                        bool need_kernel) {
  tt_backward_launch<false>(grad, saved, img, ker, gx, gk, g, sf, l, need_img, need_kernel);
}

}  // namespace kernelhub_cuda_ext
