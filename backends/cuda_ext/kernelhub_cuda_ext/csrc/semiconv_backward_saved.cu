// semiconv on CUDA: the tiled backward's SAVED form, which reads semiconv_forward_saving's winners
// (semiconv_cuda.h), in a translation unit of its own so that semiconv's parts compile side by side.
#include "semiconv_cuda.h"

namespace kernelhub_cuda_ext {
TT_BACKWARD_FORM(tt_backward_saved, true)
}  // namespace kernelhub_cuda_ext
