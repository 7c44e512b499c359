// semiconv on CUDA (semiconv.h has the contract). A thread per output walks its window in (c, tap) order,
// reading the image through L1 (neighbouring threads share most of their taps). A block serves a chunk of
// the outputs of one (b, oc), so the kernel's gradient for that oc is summed in shared memory and added to
// global memory once per block. The backward recomputes each window (nothing is saved by the forward): for
// max/min the first winner gets the whole gradient (one atomic add to img, one to the kernel), for the
// smooth semifields every tap gets its share (the kernel's summed over a warp first). The atomics make the
// gradients' last bits vary run to run.
// Launched on the current stream under a device guard; no host synchronisation.
#include "ops.h"
#include "semiconv.h"

#include <ATen/Dispatch.h>
#include <ATen/OpMathType.h>
#include <c10/cuda/CUDAException.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>

#include <algorithm>

namespace kernelhub_cuda_ext {
namespace {

constexpr int SC_THREADS = 256;
constexpr int64_t SC_CHUNK = 8 * SC_THREADS;  // outputs of one (b, oc) per block
constexpr int64_t SC_SHARED_BYTES = 48 * 1024;  // the kernel gradient of one oc in shared memory up to this size

// f(img index or -1 where the tap reads padding, kernel index) for the window of output (b, oc, od, oh, ow).
// Positions within one image channel are 32-bit (ops.py rejects larger channels); the channel's offset is 64-bit.
template <typename F>
__device__ __forceinline__ void window_taps(const ScGeo& g, int64_t b, int64_t oc, int64_t od, int64_t oh,
                                            int64_t ow, F&& f) {
  const int D = int(g.D), H = int(g.H), W = int(g.W), KD = int(g.KD), KH = int(g.KH), KW = int(g.KW);
  const int z0 = int(od * g.s[0] - g.p[0]), y0 = int(oh * g.s[1] - g.p[1]), x0 = int(ow * g.s[2] - g.p[2]);
  const int dz = int(g.d[0]), dy = int(g.d[1]), dx = int(g.d[2]);
  const int64_t grp = oc / g.Og;
  for (int64_t c = 0; c < g.Cg; ++c) {
    const int64_t kc = (oc * g.Cg + c) * g.taps();
    int64_t t = 0;  // the tap in window order
    const int64_t chan = (b * g.C + grp * g.Cg + c) * g.D * g.H * g.W;
    for (int kd = 0; kd < KD; ++kd) {
      const int z = z0 + kd * dz;
      for (int kh = 0; kh < KH; ++kh) {
        const int y = y0 + kh * dy;
        const bool row_in = z >= 0 && z < D && y >= 0 && y < H;
        const int row = (z * H + y) * W;
        for (int kw = 0; kw < KW; ++kw, ++t) {
          const int xx = x0 + kw * dx;
          f(row_in && xx >= 0 && xx < W ? chan + row + xx : int64_t(-1), kc + g.ktap(t));
        }
      }
    }
  }
}

// the sum over a warp's 32 lanes (every lane must call it)
template <typename A>
__device__ __forceinline__ A warp_sum(A v) {
  for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
  return v;
}

// one output's window statistics: best (max/min; log: the max of mu*a), acc (sums), nan; for max/min the
// first winner's img index (-1: padding) and kernel index
template <typename A>
struct Window {
  A best, acc;
  bool nan;
  int64_t win_x, win_k;
};

template <int SF, typename T, typename A>
__device__ __forceinline__ Window<A> window_stats(const ScGeo& g, const T* __restrict__ x, const T* __restrict__ k,
                                                  int64_t b, int64_t oc, int64_t od, int64_t oh, int64_t ow, A zero,
                                                  A prm) {
  Window<A> w{SF == SC_MIN ? A(INFINITY) : A(-INFINITY), A(0), false, -1, -1};
  window_taps(g, b, oc, od, oh, ow, [&](int64_t xi, int64_t ki) {
    const A a = sc_combine<SF>(xi >= 0 ? static_cast<A>(x[xi]) : zero, static_cast<A>(k[ki]));
    if constexpr (SF == SC_MAX || SF == SC_MIN) {
      w.nan |= a != a;
      if (w.win_k < 0 || (SF == SC_MAX ? a > w.best : a < w.best)) { w.best = a; w.win_x = xi; w.win_k = ki; }
    } else if constexpr (SF == SC_LINEAR) {
      w.acc += a;
    } else if constexpr (SF == SC_ROOT) {
      w.acc += std::pow(a, prm);
    } else {
      const A v = prm * a;
      w.nan |= v != v;
      w.best = v > w.best ? v : w.best;
    }
  });
  if constexpr (SF == SC_LOG) {  // the sum of exp(mu a - shift), a second walk
    const A shift = sc_shift(w.best);
    window_taps(g, b, oc, od, oh, ow, [&](int64_t xi, int64_t ki) {
      w.acc += std::exp(prm * sc_combine<SF>(xi >= 0 ? static_cast<A>(x[xi]) : zero, static_cast<A>(k[ki])) - shift);
    });
  }
  return w;
}

template <int SF, typename T>
__global__ void __launch_bounds__(SC_THREADS) semiconv_forward_kernel(const T* __restrict__ x, const T* __restrict__ k,
                                                                      T* __restrict__ out, ScGeo g,
                                                                      at::opmath_type<T> zero, at::opmath_type<T> prm) {
  using A = at::opmath_type<T>;
  const int64_t per = g.OD * g.OH * g.OW, end = std::min(per, (int64_t(blockIdx.x) + 1) * SC_CHUNK);
  for (int64_t bo = blockIdx.y; bo < g.B * g.O; bo += gridDim.y) {
    const int64_t b = bo / g.O, oc = bo % g.O;
    for (int64_t r = blockIdx.x * SC_CHUNK + threadIdx.x; r < end; r += SC_THREADS) {
      const int64_t ow = r % g.OW, oh = (r / g.OW) % g.OH, od = r / (g.OW * g.OH);
      const Window<A> w = window_stats<SF, T, A>(g, x, k, b, oc, od, oh, ow, zero, prm);
      out[bo * per + r] = static_cast<T>(sc_value<SF>(w.best, w.acc, w.nan, prm));
    }
  }
}

template <int SF, typename T>
__global__ void __launch_bounds__(SC_THREADS) semiconv_backward_kernel(
    const T* __restrict__ go, const T* __restrict__ x, const T* __restrict__ k, at::opmath_type<T>* __restrict__ gx,
    at::opmath_type<T>* __restrict__ gk, ScGeo g, at::opmath_type<T> zero, at::opmath_type<T> prm, bool need_img,
    bool need_kernel, bool shared_gk) {
  using A = at::opmath_type<T>;
  extern __shared__ unsigned char smem[];
  A* sgk = reinterpret_cast<A*>(smem);
  const int64_t per = g.OD * g.OH * g.OW, end = std::min(per, (int64_t(blockIdx.x) + 1) * SC_CHUNK);
  const int64_t ktaps = g.Cg * g.taps();
  for (int64_t bo = blockIdx.y; bo < g.B * g.O; bo += gridDim.y) {
    const int64_t b = bo / g.O, oc = bo % g.O;
    const int64_t kbase = oc * ktaps;  // oc's taps in the kernel gradient: shared index = kernel index - kbase
    if (shared_gk) {
      for (int64_t i = threadIdx.x; i < ktaps; i += SC_THREADS) sgk[i] = A(0);
      __syncthreads();
    }
    // every lane of a warp runs every step (a lane past the chunk's end takes a valid position with no gradient),
    // so the smooth semifields can sum each tap's kernel gradient over the warp before one shared atomic
    for (int64_t base = blockIdx.x * SC_CHUNK; base < end; base += SC_THREADS) {
      const bool active = base + threadIdx.x < end;
      const int64_t r = active ? base + threadIdx.x : base;
      const int64_t ow = r % g.OW, oh = (r / g.OW) % g.OH, od = r / (g.OW * g.OH);
      const A gv = active ? static_cast<A>(go[bo * per + r]) : A(0);
      const Window<A> w = window_stats<SF, T, A>(g, x, k, b, oc, od, oh, ow, zero, prm);
      if constexpr (SF == SC_MAX || SF == SC_MIN) {
        if (w.nan || !active) continue;  // a NaN in the window: no gradient
        if (need_img && w.win_x >= 0) atomicAdd(gx + w.win_x, gv);
        if (need_kernel) atomicAdd(shared_gk ? sgk + (w.win_k - kbase) : gk + w.win_k, SF == SC_MIN ? -gv : gv);
      } else {
        const A gs = SF == SC_ROOT ? sc_root_grad(gv, w.acc, prm) : gv;
        const A lse = SF == SC_LOG ? (w.nan ? A(NAN) : std::log(w.acc) + sc_shift(w.best)) : A(0);
        window_taps(g, b, oc, od, oh, ow, [&](int64_t xi, int64_t ki) {
          const A xv = xi >= 0 ? static_cast<A>(x[xi]) : zero, kv = static_cast<A>(k[ki]);
          const A wt = sc_smooth_weight<SF>(sc_combine<SF>(xv, kv), gs, prm, lse);
          const A dx = SF == SC_LOG ? wt : wt * kv, dk = SF == SC_LOG ? wt : wt * xv;
          if (need_img && xi >= 0 && active) atomicAdd(gx + xi, dx);
          if (need_kernel) {
            const A dk_warp = warp_sum(active ? dk : A(0));
            if (threadIdx.x % 32 == 0) atomicAdd(shared_gk ? sgk + (ki - kbase) : gk + ki, dk_warp);
          }
        });
      }
    }
    if (shared_gk) {
      __syncthreads();
      for (int64_t i = threadIdx.x; i < ktaps; i += SC_THREADS) atomicAdd(gk + kbase + i, sgk[i]);
      __syncthreads();
    }
  }
}

// positions within one image channel are 32-bit here (the plugin's not_supported_reasons keeps larger ones away)
void check_channel_size(const char* fn, const ScGeo& g) {
  TORCH_CHECK(g.D * g.H * g.W < (int64_t(1) << 31), "kernelhub_cuda_ext::", fn, ": an image channel of 2^31 "
              "elements or more (positions within a channel are 32-bit on CUDA)");
}

dim3 sc_grid(const ScGeo& g) {
  const int64_t chunks = (g.OD * g.OH * g.OW + SC_CHUNK - 1) / SC_CHUNK;
  return dim3(static_cast<unsigned>(chunks), static_cast<unsigned>(std::min<int64_t>(g.B * g.O, 65535)));
}

at::Tensor semiconv_forward_cuda(const at::Tensor& img_, const at::Tensor& ker_, int64_t sf, double param,
                                 int64_t groups, at::IntArrayRef stride, at::IntArrayRef pad, at::IntArrayRef dil,
                                 at::IntArrayRef out_size, bool flip) {
  c10::cuda::CUDAGuard guard(img_.device());
  const at::Tensor img = img_.contiguous(), ker = ker_.contiguous();
  const ScGeo g = sc_geo("semiconv_forward", img, ker, groups, stride, pad, dil, out_size, flip);
  check_channel_size("semiconv_forward", g);
  auto out = at::empty({g.B, g.O, g.OD, g.OH, g.OW}, img.options());
  if (out.numel() == 0) return out;
  AT_DISPATCH_FLOATING_TYPES_AND2(at::kHalf, at::kBFloat16, img.scalar_type(), "semiconv_forward_cuda", [&] {
    using A = at::opmath_type<scalar_t>;
    sc_dispatch(sf, [&](auto SF) {
      semiconv_forward_kernel<decltype(SF)::value, scalar_t><<<sc_grid(g), SC_THREADS, 0,
                                                               c10::cuda::getCurrentCUDAStream()>>>(
          img.data_ptr<scalar_t>(), ker.data_ptr<scalar_t>(), out.data_ptr<scalar_t>(), g, A(sc_zero(sf, param)),
          A(param));
      C10_CUDA_KERNEL_LAUNCH_CHECK();
    });
  });
  return out;
}

std::tuple<at::Tensor, at::Tensor> semiconv_backward_cuda(const at::Tensor& grad_, const at::Tensor& img_,
                                                          const at::Tensor& ker_, int64_t sf, double param,
                                                          int64_t groups, at::IntArrayRef stride, at::IntArrayRef pad,
                                                          at::IntArrayRef dil, bool need_img, bool need_kernel,
                                                          bool flip) {
  c10::cuda::CUDAGuard guard(img_.device());
  const at::Tensor img = img_.contiguous(), ker = ker_.contiguous(), grad = grad_.contiguous();
  const ScGeo g = sc_backward_geo(grad, img, ker, groups, stride, pad, dil, flip);
  check_channel_size("semiconv_backward", g);
  auto gx = at::zeros(need_img ? img.sizes() : at::IntArrayRef{0}, img.options().dtype(acc_dtype(img)));
  auto gk = at::zeros(need_kernel ? ker.sizes() : at::IntArrayRef{0}, img.options().dtype(acc_dtype(img)));
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

}  // namespace

TORCH_LIBRARY_IMPL(kernelhub_cuda_ext, CUDA, m) {
  m.impl("semiconv_forward", &semiconv_forward_cuda);
  m.impl("semiconv_backward", &semiconv_backward_cuda);
}

}  // namespace kernelhub_cuda_ext
