// kernelhub_cuda_ext: CUDA kernels for the TV family (forward and analytic backward).
//
// A block is a 32 (w) x 8 (h) tile of one item's plane and a chunk of D planes; each thread walks its
// (h, w) column down the chunk with the planes in registers (see tv_forward_kernel). Forward: each block
// reduces its threads' sums in shared memory (a fixed tree) into its own row of partial sums; torch sums
// that fixed-size array. No atomics, so the
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

constexpr int TW = 32, TH = 8, THREADS = TW * TH;  // a block is a 32 (w) x 8 (h) tile of one item

template <typename A>
__device__ __forceinline__ A sgn(A a) { return A(int(a > A(0)) - int(a < A(0))); }

// The launch: tiles of the (H, W) plane x chunks of D x items, about 16 blocks per multiprocessor.
struct Layout {
  int64_t tiles_w, tiles, chunks, d_chunk;
  int64_t blocks() const { return tiles * chunks; }
};

Layout layout(const at::Tensor& x) {
  const int64_t B = x.size(0), D = x.size(1), H = x.size(2), W = x.size(3);
  int sms = 0;
  C10_CUDA_CHECK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, x.device().index()));
  Layout l;
  l.tiles_w = (W + TW - 1) / TW;
  l.tiles = l.tiles_w * ((H + TH - 1) / TH) * B;
  l.chunks = std::min<int64_t>(D, std::max<int64_t>(1, (16LL * sms + l.tiles - 1) / l.tiles));
  l.d_chunk = (D + l.chunks - 1) / l.chunks;
  l.chunks = (D + l.d_chunk - 1) / l.d_chunk;
  return l;
}

// Each thread owns one (h, w) column of its tile and walks its D chunk, keeping the current and the
// next plane's value in registers (and, in the backward, the previous one): each voxel is read from
// DRAM once; the H and W neighbours are loads of the same plane that hit L1 / L2.
template <int MODE, typename T>
__global__ void tv_forward_kernel(const T* __restrict__ x, typename at::opmath_type<T>* __restrict__ partial,
                                  int64_t D, int64_t H, int64_t W, Layout l, double eps) {
  using A = at::opmath_type<T>;
  const int64_t blk = blockIdx.x, tile = blk % l.tiles, chunk = blk / l.tiles;
  const int64_t per_item = l.tiles_w * ((H + TH - 1) / TH);
  const int64_t b = tile / per_item, t = tile % per_item;
  const int64_t w = (t % l.tiles_w) * TW + threadIdx.x, h = (t / l.tiles_w) * TH + threadIdx.y;
  const int64_t plane = H * W, d0 = chunk * l.d_chunk, d1 = std::min<int64_t>(D, d0 + l.d_chunk);
  A s0 = 0, s1 = 0, s2 = 0;
  if (w < W && h < H) {
    const bool has_h = h + 1 < H, has_w = w + 1 < W;
    const T* p = x + (b * D + d0) * plane + h * W + w;
    A cur = A(p[0]);
    for (int64_t d = d0; d < d1; ++d, p += plane) {
      const bool has_d = d + 1 < D;
      const A nxt = has_d ? A(p[plane]) : cur;
      const A dd = nxt - cur, dh = has_h ? A(p[W]) - cur : A(0), dw = has_w ? A(p[1]) - cur : A(0);
      if constexpr (MODE == TV_L1) {
        s0 += abs(dd);
        s1 += abs(dh);
        s2 += abs(dw);
      } else if constexpr (MODE == TV_SQ) {
        s0 += dd * dd + dh * dh + dw * dw;
      } else {
        if (has_d && has_h && has_w) s0 += sqrt(dd * dd + dh * dh + dw * dw + A(eps));
      }
      cur = nxt;
    }
  }
  __shared__ A red[3][THREADS];
  const int tid = threadIdx.y * TW + threadIdx.x;
  red[0][tid] = s0;
  red[1][tid] = s1;
  red[2][tid] = s2;
  __syncthreads();
  for (int half = THREADS / 2; half > 0; half >>= 1) {  // a fixed tree: deterministic
    if (tid < half)
      for (int k = 0; k < 3; ++k) red[k][tid] += red[k][tid + half];
    __syncthreads();
  }
  if (tid < 3) partial[blk * 3 + tid] = red[tid][0];
}

template <typename A>
__device__ __forceinline__ A rnorm(A dd, A dh, A dw, A eps) { return A(1) / sqrt(dd * dd + dh * dh + dw * dw + eps); }

template <int MODE, typename T>
__global__ void tv_backward_kernel(const T* __restrict__ x, const double* __restrict__ g, T* __restrict__ out,
                                   int64_t D, int64_t H, int64_t W, Layout l, double scale, double eps) {
  using A = at::opmath_type<T>;
  const int64_t blk = blockIdx.x, tile = blk % l.tiles, chunk = blk / l.tiles;
  const int64_t per_item = l.tiles_w * ((H + TH - 1) / TH);
  const int64_t b = tile / per_item, t = tile % per_item;
  const int64_t w = (t % l.tiles_w) * TW + threadIdx.x, h = (t / l.tiles_w) * TH + threadIdx.y;
  if (w >= W || h >= H) return;
  const int64_t plane = H * W, d0 = chunk * l.d_chunk, d1 = std::min<int64_t>(D, d0 + l.d_chunk);
  // the upstream gradient, read here: [3] for L1, [] otherwise (times 2 for SQ, 1 / corners for iso)
  const A g0 = A(g[0] * scale), g1 = MODE == TV_L1 ? A(g[1]) : A(0), g2 = MODE == TV_L1 ? A(g[2]) : A(0);
  const A e = A(eps);
  const bool hm = h >= 1, hp = h + 1 < H, wm = w >= 1, wp = w + 1 < W;
  const T* p = x + (b * D + d0) * plane + h * W + w;
  T* o = out + (b * D + d0) * plane + h * W + w;
  A cur = A(p[0]);
  A prv = d0 >= 1 ? A(p[-plane]) : cur;
  for (int64_t d = d0; d < d1; ++d, p += plane, o += plane) {
    const bool dm = d >= 1, dp = d + 1 < D;
    const A nxt = dp ? A(p[plane]) : cur;
    A grad;
    if constexpr (MODE == TV_ISO) {
      // corners (d,h,w), (d-1,h,w), (d,h-1,w), (d,h,w-1) touch this voxel
      const A c = cur;
      A acc = 0;
      if (dp && hp && wp) {
        const A dd = nxt - c, dh = A(p[W]) - c, dw = A(p[1]) - c;
        acc -= (dd + dh + dw) * rnorm(dd, dh, dw, e);
      }
      if (dm && hp && wp) {
        const T* q = p - plane;
        acc += (c - prv) * rnorm(c - prv, A(q[W]) - prv, A(q[1]) - prv, e);
      }
      if (hm && dp && wp) {
        const T* q = p - W;
        const A bv = A(q[0]);
        acc += (c - bv) * rnorm(A(q[plane]) - bv, c - bv, A(q[1]) - bv, e);
      }
      if (wm && dp && hp) {
        const T* q = p - 1;
        const A bv = A(q[0]);
        acc += (c - bv) * rnorm(A(q[plane]) - bv, A(q[W]) - bv, c - bv, e);
      }
      grad = g0 * acc;
    } else {
      const A c = cur, xdm = dm ? prv : c, xdp = nxt;
      const A xhm = hm ? A(p[-W]) : c, xhp = hp ? A(p[W]) : c;
      const A xwm = wm ? A(p[-1]) : c, xwp = wp ? A(p[1]) : c;
      if constexpr (MODE == TV_L1)
        grad = g0 * (sgn(c - xdm) - sgn(xdp - c)) + g1 * (sgn(c - xhm) - sgn(xhp - c)) +
               g2 * (sgn(c - xwm) - sgn(xwp - c));
      else
        grad = g0 * ((c - xdm) - (xdp - c) + (c - xhm) - (xhp - c) + (c - xwm) - (xwp - c));
    }
    o[0] = static_cast<T>(grad);
    prv = cur;
    cur = nxt;
  }
}

at::Tensor tv_forward_cuda(const at::Tensor& x_, int64_t mode, double eps) {
  TORCH_CHECK(x_.dim() == 4, "kernelhub_cuda_ext::tv_forward: argument 'x' must be [B, D, H, W], got ", x_.sizes());
  TORCH_CHECK(mode >= 0 && mode <= 2, "kernelhub_cuda_ext::tv_forward: argument 'mode' must be 0, 1 or 2");
  c10::cuda::CUDAGuard guard(x_.device());
  const at::Tensor x = x_.contiguous();
  const int64_t B = x.size(0), D = x.size(1), H = x.size(2), W = x.size(3);
  const auto out_dtype = tv_out_dtype(x);
  if (x.numel() == 0) return mode == TV_L1 ? at::zeros({3}, x.options().dtype(out_dtype)) : at::zeros({}, x.options().dtype(out_dtype));
  const Layout l = layout(x);
  const int64_t blocks = l.blocks();
  at::Tensor partial;
  AT_DISPATCH_FLOATING_TYPES_AND2(at::kHalf, at::kBFloat16, x.scalar_type(), "tv_forward_cuda", [&] {
    using A = at::opmath_type<scalar_t>;
    partial = at::empty({blocks, 3}, x.options().dtype(c10::CppTypeToScalarType<A>::value));
    auto stream = c10::cuda::getCurrentCUDAStream();
    const scalar_t* p = x.data_ptr<scalar_t>();
    A* q = partial.data_ptr<A>();
    const dim3 grid(static_cast<unsigned>(blocks)), block(TW, TH);
    if (mode == TV_L1)
      tv_forward_kernel<TV_L1, scalar_t><<<grid, block, 0, stream>>>(p, q, D, H, W, l, eps);
    else if (mode == TV_SQ)
      tv_forward_kernel<TV_SQ, scalar_t><<<grid, block, 0, stream>>>(p, q, D, H, W, l, eps);
    else
      tv_forward_kernel<TV_ISO, scalar_t><<<grid, block, 0, stream>>>(p, q, D, H, W, l, eps);
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
  const int64_t B = x.size(0), D = x.size(1), H = x.size(2), W = x.size(3);
  if (x.numel() == 0) return out;
  const double corners = double(B) * (D - 1) * (H - 1) * (W - 1);
  if (mode == TV_ISO && corners <= 0) return out.zero_();
  const double scale = mode == TV_SQ ? 2.0 : mode == TV_ISO ? 1.0 / corners : 1.0;
  const at::Tensor g = grad.to(at::kDouble).contiguous();  // stays on the device: no host read
  const Layout l = layout(x);
  AT_DISPATCH_FLOATING_TYPES_AND2(at::kHalf, at::kBFloat16, x.scalar_type(), "tv_backward_cuda", [&] {
    auto stream = c10::cuda::getCurrentCUDAStream();
    const scalar_t* p = x.data_ptr<scalar_t>();
    scalar_t* q = out.data_ptr<scalar_t>();
    const double* gp = g.data_ptr<double>();
    const dim3 grid(static_cast<unsigned>(l.blocks())), block(TW, TH);
    if (mode == TV_L1)
      tv_backward_kernel<TV_L1, scalar_t><<<grid, block, 0, stream>>>(p, gp, q, D, H, W, l, scale, eps);
    else if (mode == TV_SQ)
      tv_backward_kernel<TV_SQ, scalar_t><<<grid, block, 0, stream>>>(p, gp, q, D, H, W, l, scale, eps);
    else
      tv_backward_kernel<TV_ISO, scalar_t><<<grid, block, 0, stream>>>(p, gp, q, D, H, W, l, scale, eps);
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
