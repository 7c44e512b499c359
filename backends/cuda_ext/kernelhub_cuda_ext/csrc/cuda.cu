// kernelhub_cuda_ext: CUDA kernels for the TV family (forward and analytic backward).
//
// One warp per row of W voxels (a row is (b, d, h)), lanes striding over w, rows grid-strided over a
// fixed grid: coalesced loads, one 64-bit division per row, not per voxel. The neighbours in D and H are
// other rows (read through L1 / L2). Forward: each block reduces its threads' sums in shared memory (a
// fixed tree) into its own row of partial sums; torch sums that fixed-size array. No atomics, so the
// result is bitwise identical run to run on a given GPU. Launched on the current stream under a device
// guard; the upstream gradient is read on the device (no host synchronisation).
#include "ops.h"

#include <ATen/Dispatch.h>
#include <ATen/OpMathType.h>
#include <c10/cuda/CUDAException.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>

namespace kernelhub_cuda_ext {
namespace {

constexpr int THREADS = 256;
constexpr int WARPS = THREADS / 32;

template <typename A>
__device__ __forceinline__ A sgn(A a) { return A(int(a > A(0)) - int(a < A(0))); }

int fixed_blocks(const at::Tensor& x, int64_t rows) {
  int sms = 0;
  C10_CUDA_CHECK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, x.device().index()));
  return static_cast<int>(std::max<int64_t>(1, std::min<int64_t>(8LL * sms, (rows + WARPS - 1) / WARPS)));
}

template <int MODE, typename T>
__global__ void tv_forward_kernel(const T* __restrict__ x, typename at::opmath_type<T>* __restrict__ partial,
                                  int64_t D, int64_t H, int64_t W, int64_t rows, double eps) {
  using A = at::opmath_type<T>;
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  const int64_t plane = H * W;
  A s0 = 0, s1 = 0, s2 = 0;
  for (int64_t r = int64_t(blockIdx.x) * WARPS + warp; r < rows; r += int64_t(gridDim.x) * WARPS) {
    const int64_t h = r % H, d = (r / H) % D;
    const T* row = x + r * W;
    const bool has_d = d + 1 < D, has_h = h + 1 < H;
    for (int64_t w = lane; w < W; w += 32) {
      const A c = static_cast<A>(row[w]);
      const bool has_w = w + 1 < W;
      const A dd = has_d ? static_cast<A>(row[w + plane]) - c : A(0);
      const A dh = has_h ? static_cast<A>(row[w + W]) - c : A(0);
      const A dw = has_w ? static_cast<A>(row[w + 1]) - c : A(0);
      if constexpr (MODE == TV_L1) {
        s0 += abs(dd);
        s1 += abs(dh);
        s2 += abs(dw);
      } else if constexpr (MODE == TV_SQ) {
        s0 += dd * dd + dh * dh + dw * dw;
      } else {
        if (has_d && has_h && has_w) s0 += sqrt(dd * dd + dh * dh + dw * dw + A(eps));
      }
    }
  }
  __shared__ A red[3][THREADS];
  red[0][threadIdx.x] = s0;
  red[1][threadIdx.x] = s1;
  red[2][threadIdx.x] = s2;
  __syncthreads();
  for (int half = THREADS / 2; half > 0; half >>= 1) {
    if (threadIdx.x < half)
      for (int k = 0; k < 3; ++k) red[k][threadIdx.x] += red[k][threadIdx.x + half];
    __syncthreads();
  }
  if (threadIdx.x < 3) partial[int64_t(blockIdx.x) * 3 + threadIdx.x] = red[threadIdx.x][0];
}

template <typename A>
__device__ __forceinline__ A rnorm(A dd, A dh, A dw, A eps) { return A(1) / sqrt(dd * dd + dh * dh + dw * dw + eps); }

template <int MODE, typename T>
__global__ void tv_backward_kernel(const T* __restrict__ x, const double* __restrict__ g, T* __restrict__ out,
                                   int64_t D, int64_t H, int64_t W, int64_t rows, double scale, double eps) {
  using A = at::opmath_type<T>;
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  const int64_t plane = H * W;
  // the upstream gradient, read here: [3] for L1, [] otherwise (times 2 for SQ, 1 / corners for iso)
  const A g0 = A(g[0]) * A(scale), g1 = MODE == TV_L1 ? A(g[1]) : A(0), g2 = MODE == TV_L1 ? A(g[2]) : A(0);
  const A e = A(eps);
  for (int64_t r = int64_t(blockIdx.x) * WARPS + warp; r < rows; r += int64_t(gridDim.x) * WARPS) {
    const int64_t h = r % H, d = (r / H) % D;
    const T* row = x + r * W;
    const bool dm = d >= 1, dp = d + 1 < D, hm = h >= 1, hp = h + 1 < H;
    for (int64_t w = lane; w < W; w += 32) {
      const bool wm = w >= 1, wp = w + 1 < W;
      const A c = static_cast<A>(row[w]);
      A grad;
      if constexpr (MODE == TV_ISO) {
        // corners (d,h,w), (d-1,h,w), (d,h-1,w), (d,h,w-1) touch this voxel
        A acc = 0;
        if (dp && hp && wp) {
          const A dd = A(row[w + plane]) - c, dh = A(row[w + W]) - c, dw = A(row[w + 1]) - c;
          acc -= (dd + dh + dw) * rnorm(dd, dh, dw, e);
        }
        if (dm && hp && wp) {
          const T* b = row + w - plane;
          const A bv = A(b[0]);
          acc += (c - bv) * rnorm(c - bv, A(b[W]) - bv, A(b[1]) - bv, e);
        }
        if (hm && dp && wp) {
          const T* b = row + w - W;
          const A bv = A(b[0]);
          acc += (c - bv) * rnorm(A(b[plane]) - bv, c - bv, A(b[1]) - bv, e);
        }
        if (wm && dp && hp) {
          const T* b = row + w - 1;
          const A bv = A(b[0]);
          acc += (c - bv) * rnorm(A(b[plane]) - bv, A(b[W]) - bv, c - bv, e);
        }
        grad = g0 * acc;
      } else {
        const A xdm = dm ? A(row[w - plane]) : c, xdp = dp ? A(row[w + plane]) : c;
        const A xhm = hm ? A(row[w - W]) : c, xhp = hp ? A(row[w + W]) : c;
        const A xwm = wm ? A(row[w - 1]) : c, xwp = wp ? A(row[w + 1]) : c;
        if constexpr (MODE == TV_L1)
          grad = g0 * (sgn(c - xdm) - sgn(xdp - c)) + g1 * (sgn(c - xhm) - sgn(xhp - c)) +
                 g2 * (sgn(c - xwm) - sgn(xwp - c));
        else
          grad = g0 * ((c - xdm) - (xdp - c) + (c - xhm) - (xhp - c) + (c - xwm) - (xwp - c));
      }
      out[r * W + w] = static_cast<T>(grad);
    }
  }
}

at::Tensor tv_forward_cuda(const at::Tensor& x_, int64_t mode, double eps) {
  TORCH_CHECK(x_.dim() == 4, "kernelhub_cuda_ext::tv_forward: argument 'x' must be [B, D, H, W], got ", x_.sizes());
  TORCH_CHECK(mode >= 0 && mode <= 2, "kernelhub_cuda_ext::tv_forward: argument 'mode' must be 0, 1 or 2");
  c10::cuda::CUDAGuard guard(x_.device());
  const at::Tensor x = x_.contiguous();
  const int64_t B = x.size(0), D = x.size(1), H = x.size(2), W = x.size(3), rows = B * D * H;
  const auto out_dtype = tv_out_dtype(x);
  if (x.numel() == 0) return mode == TV_L1 ? at::zeros({3}, x.options().dtype(out_dtype)) : at::zeros({}, x.options().dtype(out_dtype));
  const int blocks = fixed_blocks(x, rows);
  at::Tensor partial;
  AT_DISPATCH_FLOATING_TYPES_AND2(at::kHalf, at::kBFloat16, x.scalar_type(), "tv_forward_cuda", [&] {
    using A = at::opmath_type<scalar_t>;
    partial = at::empty({blocks, 3}, x.options().dtype(c10::CppTypeToScalarType<A>::value));
    auto stream = c10::cuda::getCurrentCUDAStream();
    const scalar_t* p = x.data_ptr<scalar_t>();
    A* q = partial.data_ptr<A>();
    if (mode == TV_L1)
      tv_forward_kernel<TV_L1, scalar_t><<<blocks, THREADS, 0, stream>>>(p, q, D, H, W, rows, eps);
    else if (mode == TV_SQ)
      tv_forward_kernel<TV_SQ, scalar_t><<<blocks, THREADS, 0, stream>>>(p, q, D, H, W, rows, eps);
    else
      tv_forward_kernel<TV_ISO, scalar_t><<<blocks, THREADS, 0, stream>>>(p, q, D, H, W, rows, eps);
    C10_CUDA_KERNEL_LAUNCH_CHECK();
  });
  const at::Tensor total = partial.sum(0).to(out_dtype);  // a fixed-size array in a fixed order
  if (mode == TV_L1) return total;
  if (mode == TV_SQ) return total.sum();
  const double corners = double(B) * (D - 1) * (H - 1) * (W - 1);
  return corners > 0 ? total[0] / corners : at::zeros({}, x.options().dtype(out_dtype));
}

at::Tensor tv_backward_cuda(const at::Tensor& grad, const at::Tensor& x_, int64_t mode, double eps) {
  TORCH_CHECK(x_.dim() == 4, "kernelhub_cuda_ext::tv_backward: argument 'x' must be [B, D, H, W], got ", x_.sizes());
  TORCH_CHECK(grad.numel() == (mode == TV_L1 ? 3 : 1),
              "kernelhub_cuda_ext::tv_backward: argument 'grad' must have 3 elements for L1 and 1 otherwise");
  c10::cuda::CUDAGuard guard(x_.device());
  const at::Tensor x = x_.contiguous();
  at::Tensor out = at::empty_like(x);
  const int64_t B = x.size(0), D = x.size(1), H = x.size(2), W = x.size(3), rows = B * D * H;
  if (x.numel() == 0) return out;
  const double corners = double(B) * (D - 1) * (H - 1) * (W - 1);
  if (mode == TV_ISO && corners <= 0) return out.zero_();
  const double scale = mode == TV_SQ ? 2.0 : mode == TV_ISO ? 1.0 / corners : 1.0;
  const at::Tensor g = grad.to(at::kDouble).contiguous();  // stays on the device: no host read
  const int blocks = fixed_blocks(x, rows);
  AT_DISPATCH_FLOATING_TYPES_AND2(at::kHalf, at::kBFloat16, x.scalar_type(), "tv_backward_cuda", [&] {
    auto stream = c10::cuda::getCurrentCUDAStream();
    const scalar_t* p = x.data_ptr<scalar_t>();
    scalar_t* q = out.data_ptr<scalar_t>();
    const double* gp = g.data_ptr<double>();
    if (mode == TV_L1)
      tv_backward_kernel<TV_L1, scalar_t><<<blocks, THREADS, 0, stream>>>(p, gp, q, D, H, W, rows, scale, eps);
    else if (mode == TV_SQ)
      tv_backward_kernel<TV_SQ, scalar_t><<<blocks, THREADS, 0, stream>>>(p, gp, q, D, H, W, rows, scale, eps);
    else
      tv_backward_kernel<TV_ISO, scalar_t><<<blocks, THREADS, 0, stream>>>(p, gp, q, D, H, W, rows, scale, eps);
    C10_CUDA_KERNEL_LAUNCH_CHECK();
  });
  return out;
}

}  // namespace

TORCH_LIBRARY_IMPL(kernelhub_cuda_ext, CUDA, m) {
  m.impl("tv_forward", &tv_forward_cuda);
  m.impl("tv_backward", &tv_backward_cuda);
}

}  // namespace kernelhub_cuda_ext
