// kernelhub_cuda_ext: CUDA kernels (forward and analytic backward) for the TV family, tilted K-Planes,
// trilinear and Tikhonov.
//
// A block is a 32 (w) x 8 (h) tile of one item's plane and a chunk of D planes; each thread walks its
// (h, w) column down the chunk with the planes in registers (see tv_forward_kernel). Forward: each block
// reduces its threads' sums in shared memory (a fixed tree) into its own row of partial sums, and the last
// block to finish (an integer counter) adds the rows up in a fixed order and writes the result, in the same
// launch: one kernel per forward, and no floating-point atomics, so the result is bitwise identical run to
// run on a given GPU. Launched on the current stream under a device guard; the upstream gradient is read on
// the device (no host synchronisation), in its own dtype and strides (no conversion launched per backward).
#include "ops.h"
#include "kplanes_point.h"
#include "tikhonov_pixel.h"

#include <ATen/Dispatch.h>
#include <ATen/OpMathType.h>
#include <c10/cuda/CUDAException.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>

#include <tuple>

namespace kernelhub_cuda_ext {
namespace {

constexpr int TW = 32, TH = 8, THREADS = TW * TH;  // a block is a 32 (w) x 8 (h) tile of one item
// Forward blocks per multiprocessor to compile for. 8 blocks of 256 threads fill one (2048 threads) when a
// thread keeps to 32 registers, and a streaming kernel needs every warp to keep enough loads in flight: on
// an H200 at 512^3 the L1 forward took 0.34 ms at 34 registers (6 blocks), 0.23 ms at 32. The float64
// kernels and the iso forward need more registers (they would spill) and get 4 blocks, 64 registers. The
// backward kernels are left to the compiler: capped at 32 registers they ran 7-19% slower.
template <typename T, bool LIGHT>
constexpr int blocks_per_sm() { return LIGHT && sizeof(at::opmath_type<T>) == 4 ? 8 : 4; }

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
// next plane's value in registers and requesting plane d + 2 while it works on plane d: each voxel is
// read from DRAM once; the H and W neighbours are loads of the same plane that hit L1 / L2.
template <int MODE, typename T>
__global__ void __launch_bounds__(THREADS, (blocks_per_sm<T, MODE != TV_ISO>()))
    tv_forward_kernel(const T* __restrict__ x, typename at::opmath_type<T>* __restrict__ partial,
                      typename at::opmath_type<T>* __restrict__ out, int* __restrict__ counter,
                      const typename at::opmath_type<T>* __restrict__ wt, int64_t D, int64_t H, int64_t W, Layout l,
                      double eps, double corners) {
  using A = at::opmath_type<T>;
  const int64_t blk = blockIdx.x, tile = blk % l.tiles, chunk = blk / l.tiles;
  const int64_t per_item = l.tiles_w * ((H + TH - 1) / TH);
  const int64_t b = tile / per_item, t = tile % per_item;
  const int64_t w = (t % l.tiles_w) * TW + threadIdx.x, h = (t / l.tiles_w) * TH + threadIdx.y;
  const int64_t plane = H * W, d0 = chunk * l.d_chunk, d1 = std::min<int64_t>(D, d0 + l.d_chunk);
  A s0 = 0, s1 = 0, s2 = 0;
  if (w < W && h < H) {
    const bool has_h = h + 1 < H, has_w = w + 1 < W;
    const int64_t last = std::min<int64_t>(d1, D - 1);  // the last plane this chunk reads
    const T* p = x + (b * D + d0) * plane + h * W + w;
    A cur = A(p[0]);
    A nxt = d0 + 1 <= last ? A(p[plane]) : A(0);
    for (int64_t d = d0; d < d1; ++d, p += plane) {
      const A ahead = d + 2 <= last ? A(p[2 * plane]) : A(0);  // requested a step before it is needed
      const bool has_d = d + 1 < D;
      const A dd = has_d ? nxt - cur : A(0), dh = has_h ? A(p[W]) - cur : A(0), dw = has_w ? A(p[1]) - cur : A(0);
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
      nxt = ahead;
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
  // the last block to finish adds every block's row up (CUDA's threadFenceReduction pattern): each block's
  // row written and fenced before it counts itself done, so the block that counts last sees every row
  __shared__ bool last;
  if (tid == 0) {
    for (int k = 0; k < 3; ++k) partial[blk * 3 + k] = red[k][0];
    __threadfence();
    last = atomicAdd(counter, 1) == int(gridDim.x) - 1;
  }
  __syncthreads();
  if (!last) return;
  __threadfence();
  A t0 = 0, t1 = 0, t2 = 0;
#pragma unroll 1  // not unrolled: that took registers the main loop then lacked (iso: 47 -> 64, 15% slower)
  for (int64_t i = tid; i < int64_t(gridDim.x); i += THREADS) {  // each thread its fixed rows, in order
    t0 += __ldcg(partial + 3 * i);
    t1 += __ldcg(partial + 3 * i + 1);
    t2 += __ldcg(partial + 3 * i + 2);
  }
  red[0][tid] = t0;
  red[1][tid] = t1;
  red[2][tid] = t2;
  __syncthreads();
  for (int half = THREADS / 2; half > 0; half >>= 1) {  // the same fixed tree
    if (tid < half)
      for (int k = 0; k < 3; ++k) red[k][tid] += red[k][tid + half];
    __syncthreads();
  }
  if (tid == 0) {
    // the op's output (iso: the mean over the corners, 0 where there are none), or with weights its weighted sum
    const A r0 = MODE != TV_ISO ? red[0][0] : corners > 0 ? red[0][0] / A(corners) : A(0);
    if (wt != nullptr) {
      out[0] = MODE == TV_L1 ? wt[0] * r0 + wt[1] * red[1][0] + wt[2] * red[2][0] : wt[0] * r0;
    } else {
      out[0] = r0;
      if constexpr (MODE == TV_L1) {
        out[1] = red[1][0];
        out[2] = red[2][0];
      }
    }
    *counter = 0;  // for the next launch on this stream
  }
}

// 1 / sqrt(dd^2 + dh^2 + dw^2 + eps): the hardware reciprocal square root in float32, IEEE in float64
__device__ __forceinline__ float rsqrt_of(float s) { return rsqrtf(s); }
__device__ __forceinline__ double rsqrt_of(double s) { return 1.0 / sqrt(s); }
template <typename A>
__device__ __forceinline__ A rnorm(A dd, A dh, A dw, A eps) { return rsqrt_of(dd * dd + dh * dh + dw * dw + eps); }

// As the forward, with the previous plane's D term carried in a register: L1 carries sign(cur - prv),
// SQ cur - prv, iso the D component of corner (d - 1, h, w).
template <int MODE, typename T>
__global__ void tv_backward_kernel(const T* __restrict__ x, const typename at::opmath_type<T>* __restrict__ g,
                                   int64_t gs, const typename at::opmath_type<T>* __restrict__ wt, T* __restrict__ out,
                                   int64_t D, int64_t H, int64_t W, Layout l, double scale, double eps) {
  using A = at::opmath_type<T>;
  const int64_t blk = blockIdx.x, tile = blk % l.tiles, chunk = blk / l.tiles;
  const int64_t per_item = l.tiles_w * ((H + TH - 1) / TH);
  const int64_t b = tile / per_item, t = tile % per_item;
  const int64_t w = (t % l.tiles_w) * TW + threadIdx.x, h = (t / l.tiles_w) * TH + threadIdx.y;
  if (w >= W || h >= H) return;
  const int64_t plane = H * W, d0 = chunk * l.d_chunk, d1 = std::min<int64_t>(D, d0 + l.d_chunk);
  const int64_t last = std::min<int64_t>(d1, D - 1);
  // the upstream gradient, read here (stride gs): [3] for L1, [] otherwise (times 2 for SQ, 1 / corners for iso);
  // with weights wt, the weighted sum's 0-d gradient times each output element's weight
  const A gu = g[0];
  const A g0 = A(double(wt != nullptr ? wt[0] * gu : gu) * scale);
  const A g1 = MODE == TV_L1 ? (wt != nullptr ? wt[1] * gu : g[gs]) : A(0);
  const A g2 = MODE == TV_L1 ? (wt != nullptr ? wt[2] * gu : g[2 * gs]) : A(0);
  const A e = A(eps);
  const bool hm = h >= 1, hp = h + 1 < H, wm = w >= 1, wp = w + 1 < W;
  const T* p = x + (b * D + d0) * plane + h * W + w;
  T* o = out + (b * D + d0) * plane + h * W + w;
  A cur = A(p[0]);
  A nxt = d0 + 1 <= last ? A(p[plane]) : A(0);
  A carry = 0;
  if (d0 >= 1) {
    const T* q = p - plane;
    const A prv = A(q[0]);
    if constexpr (MODE == TV_L1) carry = sgn(cur - prv);
    else if constexpr (MODE == TV_SQ) carry = cur - prv;
    else if (hp && wp) carry = (cur - prv) * rnorm(cur - prv, A(q[W]) - prv, A(q[1]) - prv, e);
  }
  for (int64_t d = d0; d < d1; ++d, p += plane, o += plane) {
    const A ahead = d + 2 <= last ? A(p[2 * plane]) : A(0);  // requested a step before it is needed
    const bool dp = d + 1 < D;
    const A c = cur;
    A grad;
    if constexpr (MODE == TV_ISO) {
      // corners (d,h,w), (d,h-1,w) and (d,h,w-1) touch this voxel; (d-1,h,w) is carried
      A td = 0, th = 0, tw = 0;
      if (dp && hp && wp) {
        const A dd = nxt - c, dh = A(p[W]) - c, dw = A(p[1]) - c, r = rnorm(dd, dh, dw, e);
        td = dd * r;
        th = dh * r;
        tw = dw * r;
      }
      grad = carry - td - th - tw;
      carry = td;
      if (hm && dp && wp) {
        const T* q = p - W;
        const A bv = A(q[0]);
        grad += (c - bv) * rnorm(A(q[plane]) - bv, c - bv, A(q[1]) - bv, e);
      }
      if (wm && dp && hp) {
        const T* q = p - 1;
        const A bv = A(q[0]);
        grad += (c - bv) * rnorm(A(q[plane]) - bv, A(q[W]) - bv, c - bv, e);
      }
      grad *= g0;
    } else {
      const A fwd_d = dp ? nxt - c : A(0);
      const A back_h = hm ? c - A(p[-W]) : A(0), fwd_h = hp ? A(p[W]) - c : A(0);
      const A back_w = wm ? c - A(p[-1]) : A(0), fwd_w = wp ? A(p[1]) - c : A(0);
      if constexpr (MODE == TV_L1) {
        const A s_d = sgn(fwd_d);
        grad = g0 * (carry - s_d) + g1 * (sgn(back_h) - sgn(fwd_h)) + g2 * (sgn(back_w) - sgn(fwd_w));
        carry = s_d;
      } else {
        grad = g0 * ((carry - fwd_d) + (back_h - fwd_h) + (back_w - fwd_w));
        carry = fwd_d;
      }
    }
    o[0] = static_cast<T>(grad);
    cur = nxt;
    nxt = ahead;
  }
}

// The forward's buffers: the blocks' rows of partial sums and the counter of blocks done, at 0 (the last block
// reads the partials). New for each call, never kept: a kept pair first allocated while
// torch.compile(mode="reduce-overhead") warms a graph up would be memory of the graph's private pool that no
// output holds ("tensors in the cudagraph pool not tracked as outputs"); a captured call replays its own zeroing.
std::pair<at::Tensor, at::Tensor> tv_buffers(const at::Tensor& x, int64_t numel, at::ScalarType dtype) {
  return {at::empty({numel}, x.options().dtype(dtype)), at::zeros({1}, x.options().dtype(at::kInt))};
}

at::Tensor tv_forward_cuda(const at::Tensor& x_, int64_t mode, double eps, const std::optional<at::Tensor>& weights) {
  TORCH_CHECK(x_.dim() == 4, "kernelhub_cuda_ext::tv_forward: argument 'x' must be [B, D, H, W], got ", x_.sizes());
  TORCH_CHECK(mode >= 0 && mode <= 2, "kernelhub_cuda_ext::tv_forward: argument 'mode' must be 0, 1 or 2");
  check_tv_weights("tv_forward", x_, mode, weights);
  c10::cuda::CUDAGuard guard(x_.device());
  const at::Tensor x = x_.contiguous();
  const int64_t B = x.size(0), D = x.size(1), H = x.size(2), W = x.size(3);
  const auto out_dtype = acc_dtype(x);
  const at::Tensor w = weights ? weights->to(out_dtype).contiguous() : at::Tensor();  // as given: no launch
  at::Tensor out = mode == TV_L1 && !weights ? at::empty({3}, x.options().dtype(out_dtype))
                                             : at::empty({}, x.options().dtype(out_dtype));
  if (x.numel() == 0) return out.zero_();
  const Layout l = layout(x);
  const int64_t blocks = l.blocks();
  const double corners = double(B) * (D - 1) * (H - 1) * (W - 1);
  AT_DISPATCH_FLOATING_TYPES_AND2(at::kHalf, at::kBFloat16, x.scalar_type(), "tv_forward_cuda", [&] {
    using A = at::opmath_type<scalar_t>;
    const auto buffers = tv_buffers(x, blocks * 3, out_dtype);
    auto stream = c10::cuda::getCurrentCUDAStream();
    const scalar_t* p = x.data_ptr<scalar_t>();
    A* q = buffers.first.data_ptr<A>();
    A* o = out.data_ptr<A>();
    int* c = buffers.second.data_ptr<int>();
    const A* wp = w.defined() ? w.data_ptr<A>() : nullptr;
    const dim3 grid(static_cast<unsigned>(blocks)), block(TW, TH);
    if (mode == TV_L1)
      tv_forward_kernel<TV_L1, scalar_t><<<grid, block, 0, stream>>>(p, q, o, c, wp, D, H, W, l, eps, corners);
    else if (mode == TV_SQ)
      tv_forward_kernel<TV_SQ, scalar_t><<<grid, block, 0, stream>>>(p, q, o, c, wp, D, H, W, l, eps, corners);
    else
      tv_forward_kernel<TV_ISO, scalar_t><<<grid, block, 0, stream>>>(p, q, o, c, wp, D, H, W, l, eps, corners);
    C10_CUDA_KERNEL_LAUNCH_CHECK();
  });
  return out;
}

at::Tensor tv_backward_cuda(const at::Tensor& grad, const at::Tensor& x_, int64_t mode, double eps,
                            const std::optional<at::Tensor>& weights) {
  TORCH_CHECK(x_.dim() == 4, "kernelhub_cuda_ext::tv_backward: argument 'x' must be [B, D, H, W], got ", x_.sizes());
  TORCH_CHECK(grad.numel() == (mode == TV_L1 && !weights ? 3 : 1),
              "kernelhub_cuda_ext::tv_backward: argument 'grad' must have 3 elements for L1 and 1 otherwise "
              "(1 with weights)");
  check_tv_weights("tv_backward", x_, mode, weights);
  TORCH_CHECK(grad.device() == x_.device() && grad.dim() <= 1,
              "kernelhub_cuda_ext::tv_backward: argument 'grad' must be on x's device, [3] or []");
  c10::cuda::CUDAGuard guard(x_.device());
  const at::Tensor x = x_.contiguous();
  at::Tensor out = at::empty_like(x);
  const int64_t B = x.size(0), D = x.size(1), H = x.size(2), W = x.size(3);
  if (x.numel() == 0) return out;
  const double corners = double(B) * (D - 1) * (H - 1) * (W - 1);
  if (mode == TV_ISO && corners <= 0) return out.zero_();
  const double scale = mode == TV_SQ ? 2.0 : mode == TV_ISO ? 1.0 / corners : 1.0;
  // read on the device (no host read) in its strides; the op's output dtype (what autograd hands back) as it is
  const at::Tensor g = grad.to(acc_dtype(x));
  const int64_t gs = g.dim() == 1 ? g.stride(0) : 0;
  const at::Tensor w = weights ? weights->to(acc_dtype(x)).contiguous() : at::Tensor();
  const Layout l = layout(x);
  AT_DISPATCH_FLOATING_TYPES_AND2(at::kHalf, at::kBFloat16, x.scalar_type(), "tv_backward_cuda", [&] {
    using A = at::opmath_type<scalar_t>;
    auto stream = c10::cuda::getCurrentCUDAStream();
    const scalar_t* p = x.data_ptr<scalar_t>();
    scalar_t* q = out.data_ptr<scalar_t>();
    const A* gp = g.data_ptr<A>();
    const A* wp = w.defined() ? w.data_ptr<A>() : nullptr;
    const dim3 grid(static_cast<unsigned>(l.blocks())), block(TW, TH);
    if (mode == TV_L1)
      tv_backward_kernel<TV_L1, scalar_t><<<grid, block, 0, stream>>>(p, gp, gs, wp, q, D, H, W, l, scale, eps);
    else if (mode == TV_SQ)
      tv_backward_kernel<TV_SQ, scalar_t><<<grid, block, 0, stream>>>(p, gp, gs, wp, q, D, H, W, l, scale, eps);
    else
      tv_backward_kernel<TV_ISO, scalar_t><<<grid, block, 0, stream>>>(p, gp, gs, wp, q, D, H, W, l, scale, eps);
    C10_CUDA_KERNEL_LAUNCH_CHECK();
  });
  return out;
}

// ---- trilinear: a group of threads per point, over its F features ----------------------------
// Corner k = 4i + 2j + l has weight (i ? u : 1-u)(j ? v : 1-v)(l ? w : 1-w), (u, v, w) = (p + 1) / 2.
// The group is the power of two >= F, at most a block (2^shift threads, tri_shift), so a block of TRI_THREADS
// serves TRI_THREADS / group points: with a block per point, F = 32 left 7/8 of the threads idle and the
// backward 8 synchronisations per point (5x triton's time at 2M points, F = 32, on the H200).

constexpr int TRI_LOG = 8, TRI_THREADS = 1 << TRI_LOG;

inline int tri_shift(int64_t F) {
  int s = 0;
  while ((int64_t(1) << s) < F && s < TRI_LOG) ++s;
  return s;
}

template <typename T>
__global__ void __launch_bounds__(TRI_THREADS) trilinear_forward_kernel(
    const T* __restrict__ feats, const T* __restrict__ points, T* __restrict__ out, int64_t N, int64_t F, int shift) {
  using A = at::opmath_type<T>;
  const int group = 1 << shift;
  const int64_t n = (int64_t(blockIdx.x) << (TRI_LOG - shift)) + (threadIdx.x >> shift);
  if (n >= N) return;
  const A u = (A(points[n * 3]) + 1) / 2, v = (A(points[n * 3 + 1]) + 1) / 2, w = (A(points[n * 3 + 2]) + 1) / 2;
  const T* fn = feats + n * 8 * F;
  for (int64_t f = threadIdx.x & (group - 1); f < F; f += group) {
    A s = 0;
#pragma unroll
    for (int k = 0; k < 8; ++k) {
      const A wk = ((k >> 2) ? u : 1 - u) * (((k >> 1) & 1) ? v : 1 - v) * ((k & 1) ? w : 1 - w);
      s += wk * A(fn[k * F + f]);
    }
    out[n * F + f] = static_cast<T>(s);
  }
}

template <typename T>
__global__ void __launch_bounds__(TRI_THREADS) trilinear_backward_kernel(
    const T* __restrict__ grad, const T* __restrict__ feats, const T* __restrict__ points, T* __restrict__ gf,
    T* __restrict__ gp, int64_t N, int64_t F, int shift, bool need_feats, bool need_points) {
  using A = at::opmath_type<T>;
  const int group = 1 << shift;
  const int64_t n = (int64_t(blockIdx.x) << (TRI_LOG - shift)) + (threadIdx.x >> shift);
  const int lane = threadIdx.x & (group - 1);
  A su = 0, sv = 0, sw = 0;
  if (n < N) {
    const A u = (A(points[n * 3]) + 1) / 2, v = (A(points[n * 3 + 1]) + 1) / 2, w = (A(points[n * 3 + 2]) + 1) / 2;
    const T* fn = feats + n * 8 * F;
    for (int64_t f = lane; f < F; f += group) {
      const A g = A(grad[n * F + f]);
#pragma unroll
      for (int k = 0; k < 8; ++k) {
        const int i = k >> 2, j = (k >> 1) & 1, l = k & 1;
        const A fu = i ? u : 1 - u, fv = j ? v : 1 - v, fw = l ? w : 1 - w;
        if (need_feats) gf[(n * 8 + k) * F + f] = static_cast<T>(fu * fv * fw * g);
        if (need_points) {
          const A x = A(fn[k * F + f]) * g;
          su += (i ? A(1) : A(-1)) * fv * fw * x;
          sv += fu * (j ? A(1) : A(-1)) * fw * x;
          sw += fu * fv * (l ? A(1) : A(-1)) * x;
        }
      }
    }
  }
  if (!need_points) return;  // the same for every thread of the block
  __shared__ A red[3][TRI_THREADS];
  red[0][threadIdx.x] = su;
  red[1][threadIdx.x] = sv;
  red[2][threadIdx.x] = sw;
  __syncthreads();
  for (int half = group / 2; half > 0; half >>= 1) {  // a fixed tree within each group: deterministic
    if (lane < half)
      for (int c = 0; c < 3; ++c) red[c][threadIdx.x] += red[c][threadIdx.x + half];
    __syncthreads();
  }
  if (n < N && lane == 0)
    for (int c = 0; c < 3; ++c) gp[n * 3 + c] = static_cast<T>(red[c][threadIdx.x] / 2);  // du/dp = 1/2
}

inline unsigned tri_blocks(int64_t N, int shift) {
  const int64_t per_block = int64_t(1) << (TRI_LOG - shift);
  return static_cast<unsigned>((N + per_block - 1) / per_block);
}

at::Tensor trilinear_forward_cuda(const at::Tensor& feats_, const at::Tensor& points_) {
  TORCH_CHECK(feats_.dim() == 3 && feats_.size(1) == 8, "kernelhub_cuda_ext::trilinear_forward: argument 'feats' must be [N, 8, F]");
  TORCH_CHECK(points_.dim() == 2 && points_.size(1) == 3 && points_.size(0) == feats_.size(0),
              "kernelhub_cuda_ext::trilinear_forward: argument 'points' must be [N, 3]");
  c10::cuda::CUDAGuard guard(feats_.device());
  const at::Tensor feats = feats_.contiguous(), points = points_.contiguous();
  const int64_t N = feats.size(0), F = feats.size(2);
  at::Tensor out = at::empty({N, F}, feats.options());
  if (out.numel() == 0) return out;
  const int shift = tri_shift(F);
  AT_DISPATCH_FLOATING_TYPES_AND2(at::kHalf, at::kBFloat16, feats.scalar_type(), "trilinear_forward_cuda", [&] {
    trilinear_forward_kernel<scalar_t><<<tri_blocks(N, shift), TRI_THREADS, 0, c10::cuda::getCurrentCUDAStream()>>>(
        feats.data_ptr<scalar_t>(), points.data_ptr<scalar_t>(), out.data_ptr<scalar_t>(), N, F, shift);
    C10_CUDA_KERNEL_LAUNCH_CHECK();
  });
  return out;
}

std::tuple<at::Tensor, at::Tensor> trilinear_backward_cuda(const at::Tensor& grad_, const at::Tensor& feats_,
                                                           const at::Tensor& points_, bool need_feats, bool need_points) {
  c10::cuda::CUDAGuard guard(feats_.device());
  const at::Tensor grad = grad_.contiguous(), feats = feats_.contiguous(), points = points_.contiguous();
  const int64_t N = feats.size(0), F = feats.size(2);
  at::Tensor gf = need_feats ? at::empty_like(feats) : at::empty({0}, feats.options());
  at::Tensor gp = need_points ? at::empty_like(points) : at::empty({0}, points.options());
  if (N == 0 || (!need_feats && !need_points)) return {gf, gp};
  const int shift = tri_shift(F);
  AT_DISPATCH_FLOATING_TYPES_AND2(at::kHalf, at::kBFloat16, feats.scalar_type(), "trilinear_backward_cuda", [&] {
    trilinear_backward_kernel<scalar_t><<<tri_blocks(N, shift), TRI_THREADS, 0, c10::cuda::getCurrentCUDAStream()>>>(
        grad.data_ptr<scalar_t>(), feats.data_ptr<scalar_t>(), points.data_ptr<scalar_t>(),
        need_feats ? gf.data_ptr<scalar_t>() : nullptr, need_points ? gp.data_ptr<scalar_t>() : nullptr, N, F,
        shift, need_feats, need_points);
    C10_CUDA_KERNEL_LAUNCH_CHECK();
  });
  return {gf, gp};
}

// ---- tilted K-Planes: a tile of points per block, their per-point work done once (kplanes_point.h) ----
// For each t (and tap), one thread per point of the tile rotates it and finds its planes' neighbours and
// weights (kp_tap) into shared memory; then the block's threads run over (point, channel), LW lanes per
// point (LW = C rounded up to a power of two, at most 32), reading the corners from shared memory. (A warp
// per point, the first version, made all 32 lanes repeat the per-point arithmetic: on an H200 it issued
// about 4.9x triton's instructions and ran its forward 3.6x slower.) The planes are read channels-last
// ([3T, H, W, C], one copy per call), so a neighbour's channels are one coalesced load. Backward: the
// planes gradient is added with atomics into a channels-last buffer (not deterministic); the coordinate
// gradient of a point is reduced over its lanes by a fixed butterfly, its pts gradient accumulated in
// shared memory by the point's first lane and written once, the rotations gradient summed over the tile's
// points in a fixed order into one partial row per block and t (deterministic for a given GPU).

constexpr int KP_THREADS = 256, KP_TILE = 32;  // threads and points per block

template <typename A>
struct KpTile {
  KpCorners<A> k[KP_TILE][3];  // each point's neighbours in its three planes of the current t (and tap)
  A pp[KP_TILE][3];            // the tap's point
};

// thread p < np: point b0 + p's corners for (t, tap) into the tile
template <typename T, typename A>
__device__ __forceinline__ void kp_tile_corners(KpTile<A>& s, const T* pts, const T* rot, int64_t b0, int np,
                                                int t, int tap, A h, int H, int W, int C) {
  const int p = threadIdx.x;
  if (p >= np) return;
  const int64_t b = b0 + p;
  const A pt[3] = {A(pts[b * 3]), A(pts[b * 3 + 1]), A(pts[b * 3 + 2])};
  A R[9];
  kp_tap(pt, rot, t, tap, h, H, W, C, R, s.pp[p], s.k[p][0], s.k[p][1], s.k[p][2]);
}

template <typename A>
__device__ __forceinline__ A kp_lanes_sum(A x, int LW) {  // within each aligned group of LW lanes, fixed order
  for (int m = LW / 2; m > 0; m >>= 1) x += __shfl_xor_sync(0xffffffffu, x, m);
  return x;
}

int kp_lanes(int64_t C) {  // lanes per point: C rounded up to a power of two, at most 32 (measured on an H200
  int lw = 1;              // at C = 32 against C / 4 lanes with four channels each: forward 0.98 against 1.11 ms)
  while (lw < 32 && lw < C) lw *= 2;
  return lw;
}

template <typename T>
__global__ void __launch_bounds__(KP_THREADS) kplanes_forward_kernel(
    const T* __restrict__ pts, const T* __restrict__ rot, const T* __restrict__ pl, T* __restrict__ out,
    int64_t B, int NT, int C, int H, int W, int taps, double h, int LW) {
  using A = at::opmath_type<T>;
  __shared__ KpTile<A> s;
  const int64_t b0 = static_cast<int64_t>(blockIdx.x) * KP_TILE;
  const int np = static_cast<int>(B - b0 < KP_TILE ? B - b0 : KP_TILE);
  const int lane = threadIdx.x % LW, row = threadIdx.x / LW, rows = KP_THREADS / LW;
  for (int t = 0; t < NT; ++t) {
    for (int tap = 0; tap < taps; ++tap) {
      kp_tile_corners(s, pts, rot, b0, np, t, tap, A(h), H, W, C);
      __syncthreads();
      for (int p = row; p < np; p += rows) {
        T* o = out + (static_cast<int64_t>(tap) * B + b0 + p) * NT * C + static_cast<int64_t>(t) * C;
        for (int c = lane; c < C; c += LW) o[c] = static_cast<T>(kp_value(pl, s.k[p][0], s.k[p][1], s.k[p][2], c));
      }
      __syncthreads();
    }
  }
}

template <typename A>
struct KpAtomicAdd {
  A* gpl;
  __device__ void operator()(int64_t offset, A value) const { atomicAdd(gpl + offset, value); }
};

// grad element (tap, b, t*C + c) at tap * gs0 + b * gs1 + (t*C + c) * gs2; gpl [3T, H, W, C], gpts [B, 3],
// grot [gridDim.x, T, 9] partials, all in the accumulation type A
template <typename T>
__global__ void __launch_bounds__(KP_THREADS) kplanes_backward_kernel(
    const T* __restrict__ grad, const T* __restrict__ pts, const T* __restrict__ rot, const T* __restrict__ pl,
    at::opmath_type<T>* __restrict__ gpl, at::opmath_type<T>* __restrict__ gpts, at::opmath_type<T>* __restrict__ grot,
    int64_t B, int NT, int C, int H, int W, int taps, double h, int64_t gs0, int64_t gs1, int64_t gs2,
    bool need_planes, bool need_pts, bool need_rot, int LW) {
  using A = at::opmath_type<T>;
  __shared__ KpTile<A> s;
  __shared__ A gp_s[KP_TILE][3], dr_s[KP_TILE][9];  // per point: pts gradient; this t's rotations gradient
  const int64_t b0 = static_cast<int64_t>(blockIdx.x) * KP_TILE;
  const int np = static_cast<int>(B - b0 < KP_TILE ? B - b0 : KP_TILE);
  const int lane = threadIdx.x % LW, row = threadIdx.x / LW, rows = KP_THREADS / LW;
  for (int i = threadIdx.x; i < KP_TILE * 3; i += KP_THREADS) gp_s[i / 3][i % 3] = A(0);
  for (int i = threadIdx.x; i < KP_TILE * 9; i += KP_THREADS) dr_s[i / 9][i % 9] = A(0);
  for (int t = 0; t < NT; ++t) {
    A R[9];
    for (int k = 0; k < 9; ++k) R[k] = A(rot[t * 9 + k]);
    for (int tap = 0; tap < taps; ++tap) {
      kp_tile_corners(s, pts, rot, b0, np, t, tap, A(h), H, W, C);
      __syncthreads();
      // a warp-uniform loop (the lanes' sums shuffle): every row runs KP_TILE / rows rounds
      for (int p0 = 0; p0 < KP_TILE; p0 += rows) {
        const int p = p0 + row;
        const bool active = p < np;
        A dq[3] = {0, 0, 0};
        if (active) {
          const T* g = grad + tap * gs0 + (b0 + p) * gs1 + static_cast<int64_t>(t) * C * gs2;
          for (int c = lane; c < C; c += LW)
            kp_channel_backward(pl, s.k[p][0], s.k[p][1], s.k[p][2], c, A(g[c * gs2]), need_planes, dq,
                                KpAtomicAdd<A>{gpl});
        }
        if (!need_pts && !need_rot) continue;
        for (int i = 0; i < 3; ++i) dq[i] = kp_lanes_sum(dq[i], LW);
        if (active && lane == 0) {  // the point's first lane alone updates its rows
          A gp[3] = {gp_s[p][0], gp_s[p][1], gp_s[p][2]};
          kp_point_grads(R, s.pp[p], dq, gp, need_rot ? dr_s[p] : static_cast<A*>(nullptr));
          for (int j = 0; j < 3; ++j) gp_s[p][j] = gp[j];
        }
      }
      __syncthreads();
    }
    if (need_rot) {  // this t's partial: the tile's points summed in a fixed order
      if (threadIdx.x < 9) {
        A sum = 0;
        for (int p = 0; p < np; ++p) sum += dr_s[p][threadIdx.x];
        grot[(static_cast<int64_t>(blockIdx.x) * NT + t) * 9 + threadIdx.x] = sum;
      }
      __syncthreads();
      for (int i = threadIdx.x; i < KP_TILE * 9; i += KP_THREADS) dr_s[i / 9][i % 9] = A(0);
    }
  }
  if (need_pts)
    for (int i = threadIdx.x; i < np * 3; i += KP_THREADS) gpts[b0 * 3 + i] = gp_s[i / 3][i % 3];
}

int kp_blocks(int64_t B) { return static_cast<int>((B + KP_TILE - 1) / KP_TILE); }

at::Tensor kplanes_forward_cuda(const at::Tensor& pts, const at::Tensor& rot, const at::Tensor& planes,
                                int64_t taps, double h) {
  c10::cuda::CUDAGuard guard(pts.device());
  const KpArgs a = kp_args("kplanes_forward", pts, rot, planes, taps);
  at::Tensor out = at::empty({taps, a.B, a.T * a.C}, a.pts.options());
  if (out.numel() == 0) return out;
  AT_DISPATCH_FLOATING_TYPES(a.pts.scalar_type(), "kplanes_forward_cuda", [&] {
    kplanes_forward_kernel<scalar_t><<<kp_blocks(a.B), KP_THREADS, 0, c10::cuda::getCurrentCUDAStream()>>>(
        a.pts.data_ptr<scalar_t>(), a.rot.data_ptr<scalar_t>(), a.planes.data_ptr<scalar_t>(), out.data_ptr<scalar_t>(),
        a.B, static_cast<int>(a.T), static_cast<int>(a.C), static_cast<int>(a.H), static_cast<int>(a.W),
        static_cast<int>(taps), h, kp_lanes(a.C));
    C10_CUDA_KERNEL_LAUNCH_CHECK();
  });
  return out;
}

std::tuple<at::Tensor, at::Tensor, at::Tensor> kplanes_backward_cuda(
    const at::Tensor& grad, const at::Tensor& pts, const at::Tensor& rot, const at::Tensor& planes, int64_t taps,
    double h, bool need_planes, bool need_pts, bool need_rot) {
  c10::cuda::CUDAGuard guard(pts.device());
  const KpArgs a = kp_args("kplanes_backward", pts, rot, planes, taps, &grad);
  const auto opts = a.pts.options().dtype(acc_dtype(a.pts));
  const int blocks = kp_blocks(a.B);
  at::Tensor gpl = at::zeros({need_planes ? 3 * a.T : 0, a.H, a.W, a.C}, opts);
  at::Tensor gp = at::zeros({need_pts ? a.B : 0, 3}, opts);
  at::Tensor gr = at::zeros({need_rot ? blocks : 0, a.T, 9}, opts);  // one partial per block
  if (a.B > 0 && a.C > 0 && (need_planes || need_pts || need_rot)) {
    AT_DISPATCH_FLOATING_TYPES(a.pts.scalar_type(), "kplanes_backward_cuda", [&] {
      using A = at::opmath_type<scalar_t>;
      kplanes_backward_kernel<scalar_t><<<blocks, KP_THREADS, 0, c10::cuda::getCurrentCUDAStream()>>>(
          grad.data_ptr<scalar_t>(), a.pts.data_ptr<scalar_t>(), a.rot.data_ptr<scalar_t>(),
          a.planes.data_ptr<scalar_t>(), need_planes ? gpl.data_ptr<A>() : nullptr,
          need_pts ? gp.data_ptr<A>() : nullptr, need_rot ? gr.data_ptr<A>() : nullptr, a.B, static_cast<int>(a.T),
          static_cast<int>(a.C), static_cast<int>(a.H), static_cast<int>(a.W), static_cast<int>(taps), h,
          grad.stride(0), grad.stride(1), grad.stride(2), need_planes, need_pts, need_rot, kp_lanes(a.C));
      C10_CUDA_KERNEL_LAUNCH_CHECK();
    });
  }
  return kp_grads(planes, pts, rot, gpl, gp, need_rot ? gr.sum(0) : gr, need_planes, need_pts, need_rot);
}

// ---- Tikhonov: 8 lanes of a warp per pixel, each with tikhonov_pixel.h (shared with the CPU kernel) ----
// Lane k of a pixel's 8 handles entries k, k + 8, ...: for a contiguous M a warp's load covers 4 pixels'
// contiguous runs of 8 entries, for the permuted view (pixels adjacent in memory) entry k of 4 adjacent
// pixels for each k; either way a complex64 load uses every byte of its sectors. The pixel's sums are
// completed by 3 xor-shuffles. (A lane per pixel for the permuted view, each warp loading entry z of 32
// adjacent pixels, was measured slower on an H200: 1.54-1.61 ms against 0.97 ms at 2048^2 x 2 x 9 complex64.)

constexpr int TIK_LANES = 8;

struct LaneShare {
  int64_t first, step = TIK_LANES;
  __device__ void sum(double* v, int n) const {
    for (int off = TIK_LANES / 2; off > 0; off >>= 1)
      for (int k = 0; k < n; ++k) v[k] += __shfl_xor_sync(0xffffffffu, v[k], off, TIK_LANES);
  }
};

// This thread's pixel and lane. A group past the last pixel takes Z = 0 entries of pixel 0: it loads and
// stores nothing but still reaches the shuffles with the rest of its warp.
struct TikLane {
  int64_t pixel, Z;  // the pixel, and its number of entries (0 past the end)
  LaneShare share;
  __device__ TikLane(int64_t P, int64_t Z_) {
    const int64_t t = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
    pixel = t / TIK_LANES < P ? t / TIK_LANES : 0;
    Z = t / TIK_LANES < P ? Z_ : 0;
    share.first = t % TIK_LANES;
  }
};

constexpr int TIK_THREADS = 128, TIK_HELD = 4;
constexpr int TIK_WARP_PIXELS = 32 / TIK_LANES;                    // a warp's pixels: 4
constexpr int TIK_STAGE = TIK_WARP_PIXELS * 2 * TIK_LANES * TIK_HELD;  // their values at most (Z <= 32): 256

// Staged (complex, a contiguous M and upstream gradient, Z <= TIK_LANES * TIK_HELD): a warp's 4 pixels are one
// contiguous run of 8 Z values, which the warp copies into its own part of shared memory with consecutive lanes on
// consecutive values, then each lane reads its entries from there in each pass (N = 0: none held in registers) and
// writes its outputs over them (a lane reads and writes only its own entries z), which go back the same way. A pixel's
// 2 Z values (168 bytes at Z = 21 in float32) are not a whole number of 32-byte sectors, so the lanes' own runs of 8
// entries straddle sectors and a warp's load requested about twice the sectors it used (Nsight Compute: the memory
// pipeline at 66-71%, DRAM at 28-46%); the copy requests each sector once. Only __syncwarp orders the copy and the
// algebra: the other warps of the block, and of the multiprocessor, keep their loads in flight meanwhile.
// On an H200 at 115000 x 2 x 21 staging made complex64 faster and float32 slower (its pixels are half as long: the
// copies through shared memory cost more than the straddled sectors), so float and double stay in place
// (docs/lab/benchmarks-history.md#measurements-behind-the-code).
// The first n (<= TIK_STAGE) values of src to dst, every load of the lane issued before its stores.
template <typename T>
__device__ __forceinline__ void warp_copy(T* __restrict__ dst, const T* __restrict__ src, int n) {
  T v[TIK_STAGE / 32];
  KERNELHUB_UNROLL
  for (int j = 0; j < TIK_STAGE / 32; ++j) {
    const int i = (threadIdx.x & 31) + 32 * j;
    if (i < n) v[j] = src[i];
  }
  KERNELHUB_UNROLL
  for (int j = 0; j < TIK_STAGE / 32; ++j) {
    const int i = (threadIdx.x & 31) + 32 * j;
    if (i < n) dst[i] = v[j];
  }
}

// Stage k of Stages of this warp: TIK_STAGE values of shared memory (raw bytes: a complex type's constructor is not
// allowed on a __shared__ array).
template <typename T, int Stages>
__device__ __forceinline__ T* tik_stage(int k) {
  __shared__ alignas(T) unsigned char raw[Stages * (TIK_THREADS / 32) * TIK_STAGE * sizeof(T)];
  return reinterpret_cast<T*>(raw) + (k * (TIK_THREADS / 32) + threadIdx.x / 32) * TIK_STAGE;
}

// The staged kernels' view of the warp: its first pixel, its number of values in the run (0 past the end), and the
// strides of a contiguous pixel in the stage.
struct TikWarp {
  int64_t first;
  int n, local;
  PixelStrides strides;
  __device__ TikWarp(int64_t P, int64_t Z) {
    first = (int64_t(blockIdx.x) * blockDim.x + (threadIdx.x & ~31)) / TIK_LANES;
    n = first < P ? int((P - first < TIK_WARP_PIXELS ? P - first : TIK_WARP_PIXELS) * 2 * Z) : 0;
    local = (threadIdx.x & 31) / TIK_LANES;
    strides = {2 * Z, Z, 1};
  }
};

// M and the upstream gradient through their strides (tikhonov_pixel.h); the output is contiguous. UnitZ:
// every input's z stride is 1 (the common contiguous case, compiled without a multiply per entry: measured
// 6-8% faster on an H200 at 115000 x 2 x 21 complex64, forward and forward + backward). N: each lane's entries
// held in registers, read once with all its loads in flight (Z <= TIK_LANES * TIK_HELD), or 0: read per pass.
// Staged (N > 0, contiguous inputs): through the warp's shared memory, above.
template <typename T, bool UnitZ, int N, bool Staged>
__global__ void tikhonov_forward_kernel(const T* __restrict__ m, PixelStrides ms, T* __restrict__ o, int64_t P,
                                        int64_t Z, double lam) {
  const TikLane l(P, Z);
  if constexpr (Staged && N > 0) {
    T* s = tik_stage<T, 1>(0);
    const TikWarp w(P, Z);
    warp_copy(s, m + w.first * 2 * Z, w.n);
    __syncwarp();
    const PixelEntries<PixelRows<T, true>> x(PixelRows<T, true>(s, w.strides, w.local), l.Z, l.share.first,
                                             TIK_LANES);
    tikhonov_pixel_forward(x, s + w.local * 2 * Z, s + w.local * 2 * Z + Z, lam, l.share);
    __syncwarp();
    warp_copy(o + w.first * 2 * Z, s, w.n);
  } else {
    T* w = o + l.pixel * 2 * Z;
    const PixelEntries<PixelRows<T, UnitZ>, N> x(PixelRows<T, UnitZ>(m, ms, l.pixel), l.Z, l.share.first, TIK_LANES);
    tikhonov_pixel_forward(x, w, w + Z, lam, l.share);
  }
}

template <typename T, bool UnitZ, int N, bool Staged>
__global__ void tikhonov_backward_kernel(const T* __restrict__ g, PixelStrides gs, const T* __restrict__ m,
                                         PixelStrides ms, T* __restrict__ o, int64_t P, int64_t Z, double lam) {
  const TikLane l(P, Z);
  if constexpr (Staged && N > 0) {
    T* sg = tik_stage<T, 2>(0);
    T* sm = tik_stage<T, 2>(1);
    const TikWarp w(P, Z);
    warp_copy(sg, g + w.first * 2 * Z, w.n);
    warp_copy(sm, m + w.first * 2 * Z, w.n);
    __syncwarp();
    using Entries = PixelEntries<PixelRows<T, true>>;
    const Entries y(PixelRows<T, true>(sg, w.strides, w.local), l.Z, l.share.first, TIK_LANES);
    const Entries x(PixelRows<T, true>(sm, w.strides, w.local), l.Z, l.share.first, TIK_LANES);
    tikhonov_pixel_backward(y, x, sg + w.local * 2 * Z, sg + w.local * 2 * Z + Z, lam, l.share);
    __syncwarp();
    warp_copy(o + w.first * 2 * Z, sg, w.n);
  } else {
    T* d = o + l.pixel * 2 * Z;
    using Entries = PixelEntries<PixelRows<T, UnitZ>, N>;
    const Entries y(PixelRows<T, UnitZ>(g, gs, l.pixel), l.Z, l.share.first, TIK_LANES);
    const Entries x(PixelRows<T, UnitZ>(m, ms, l.pixel), l.Z, l.share.first, TIK_LANES);
    tikhonov_pixel_backward(y, x, d, d + Z, lam, l.share);
  }
}


unsigned tik_blocks(int64_t P) { return static_cast<unsigned>((P * TIK_LANES + TIK_THREADS - 1) / TIK_THREADS); }

// Calls f(std::integral_constant<int, TIK_HELD>()) where Z <= TIK_LANES * TIK_HELD, else f(... 0 ...).
template <typename F>
void with_held(int64_t Z, F&& f) {
  if (Z <= TIK_LANES * TIK_HELD)
    f(std::integral_constant<int, TIK_HELD>());
  else
    f(std::integral_constant<int, 0>());
}

at::Tensor tikhonov_forward_cuda(const at::Tensor& M, double lam) {
  TORCH_CHECK(M.dim() == 3 && M.size(1) == 2, "kernelhub_cuda_ext::tikhonov_forward: argument 'M' must be [P, 2, Z]");
  c10::cuda::CUDAGuard guard(M.device());
  const int64_t P = M.size(0), Z = M.size(2);
  at::Tensor out = at::empty(M.sizes(), M.options());
  if (P == 0) return out;
  AT_DISPATCH_FLOATING_AND_COMPLEX_TYPES(M.scalar_type(), "tikhonov_forward_cuda", [&] {
    with_flag(M.stride(2) == 1, [&](auto unit_z) {
      with_held(Z, [&](auto held) {
        with_flag(held.value > 0 && M.is_complex() && M.is_contiguous(), [&](auto staged) {
          tikhonov_forward_kernel<scalar_t, unit_z.value, held.value, staged.value>
              <<<tik_blocks(P), TIK_THREADS, 0, c10::cuda::getCurrentCUDAStream()>>>(
                  M.data_ptr<scalar_t>(), pixel_strides(M), out.data_ptr<scalar_t>(), P, Z, lam);
        });
      });
    });
    C10_CUDA_KERNEL_LAUNCH_CHECK();
  });
  return out;
}

at::Tensor tikhonov_backward_cuda(const at::Tensor& grad, const at::Tensor& M, double lam) {
  c10::cuda::CUDAGuard guard(M.device());
  const int64_t P = M.size(0), Z = M.size(2);
  at::Tensor out = at::empty(M.sizes(), M.options());
  if (P == 0) return out;
  AT_DISPATCH_FLOATING_AND_COMPLEX_TYPES(M.scalar_type(), "tikhonov_backward_cuda", [&] {
    with_flag(M.stride(2) == 1 && grad.stride(2) == 1, [&](auto unit_z) {
      with_held(Z, [&](auto held) {
        with_flag(held.value > 0 && M.is_complex() && M.is_contiguous() && grad.is_contiguous(), [&](auto staged) {
          tikhonov_backward_kernel<scalar_t, unit_z.value, held.value, staged.value>
              <<<tik_blocks(P), TIK_THREADS, 0, c10::cuda::getCurrentCUDAStream()>>>(
                  grad.data_ptr<scalar_t>(), pixel_strides(grad), M.data_ptr<scalar_t>(), pixel_strides(M),
                  out.data_ptr<scalar_t>(), P, Z, lam);
        });
      });
    });
    C10_CUDA_KERNEL_LAUNCH_CHECK();
  });
  return out;
}

}  // namespace

TORCH_LIBRARY_IMPL(kernelhub_cuda_ext, CUDA, m) {
  m.impl("tv_forward", &tv_forward_cuda);
  m.impl("tv_backward", &tv_backward_cuda);
  m.impl("trilinear_forward", &trilinear_forward_cuda);
  m.impl("trilinear_backward", &trilinear_backward_cuda);
  m.impl("kplanes_forward", &kplanes_forward_cuda);
  m.impl("kplanes_backward", &kplanes_backward_cuda);
  m.impl("tikhonov_forward", &tikhonov_forward_cuda);
  m.impl("tikhonov_backward", &tikhonov_backward_cuda);
}

}  // namespace kernelhub_cuda_ext
