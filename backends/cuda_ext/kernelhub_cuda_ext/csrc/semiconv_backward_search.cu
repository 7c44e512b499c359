// semiconv on CUDA: the tiled backward's search form, which finds each output's winner again
// (semiconv_cuda.h), in a translation unit of its own so that semiconv's parts compile side by side.
#include "semiconv_cuda.h"

namespace kernelhub_cuda_ext {
TT_BACKWARD_FORM(tt_backward_search, false)
}  // namespace kernelhub_cuda_ext
