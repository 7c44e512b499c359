#pragma once
// semiconv on CUDA, what its translation units share: the generic and the tiled kernels, their launch plans and
// the tiled backward's launch. The units, compiled side by side: semiconv.cu (the forwards), semiconv_backward.cu
// (the backwards, with the generic kernel), semiconv_backward_search.cu and semiconv_backward_saved.cu (the tiled
// backward's two forms, most of the compile time).
// semiconv on CUDA (semiconv.h has the contract). A thread per output walks its window in (c, tap) order,
// reading the image through L1 (neighbouring threads share most of their taps). A block serves a chunk of
// the outputs of one (b, oc), so the kernel's gradient for that oc is summed in shared memory and added to
// global memory once per block. The backward recomputes each window (nothing is saved by the forward): for
// max/min the first winner gets the whole gradient (one atomic add to img, one to the kernel), for the
// smooth semifields every tap gets its share (the kernel's summed over a warp first). The atomics make the
// gradients' last bits vary run to run.
// 2-D max/min calls with unit stride and dilation take tiled kernels instead (below: tt_forward_kernel and
// tt_backward_kernel). Launched on the current stream under a device guard; no host synchronisation.
#include "ops.h"
#include "semiconv.h"

#include <ATen/Dispatch.h>
#include <ATen/OpMathType.h>
#include <c10/cuda/CUDAException.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>

#include <algorithm>
#include <type_traits>

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

// -- max/min on 2-D images with unit stride and dilation: tiles in shared memory ------------------------------
// The walk above reads every tap of every window through L1, with its index arithmetic: at 5x5 that is 25 loads
// and their masks per output. Here a block loads a 64x64 tile of the image (plus the window's halo, the
// semifield's zero outside the image) into shared memory once, and each thread computes a 4x4 block of outputs
// from registers: per kernel row and output row it reads one row segment (4 + KW - 1 values, vector loads) and
// does the 4 x KW products and max/min from it, so a tap costs an add and a max (a compare-to-value and a
// multiply-add more in the backward, tt_winners). KW is a compile-time constant (1-7: the segment lives in
// registers), KH is not.
//
// The backward gathers instead of scattering: a block owns a tile of the image's gradient and recomputes the
// winners of every output whose window reaches into it (the tile plus KH - 1 rows and KW - 1 columns of outputs:
// 64x64 outputs for a (64 - KH + 1) x (64 - KW + 1) tile, or 68x68 for a 64x64 one at 5x5: tt_backward_kernel),
// adds their upstream gradients in shared memory and writes the tile once (no zero fill, no global atomics). The
// kernel's gradient is summed per window index and lane in shared memory from the outputs the block owns (the first
// tile-size rows and columns of what it computes, all of them in the last tile of a row or column), one global
// atomic per index and block. The backward takes
// depthwise-like calls (one input channel per output channel, Cg == 1); the forward any Cg.
// Taken when every window holds an image pixel (padding below the kernel size on each side), so every output
// lies in a tile's span.
constexpr int TT_SIDE = 64;                        // outputs per block side
constexpr int TT_PER = 4;                          // outputs per thread side
constexpr int TT_LANES = TT_SIDE / TT_PER;         // threads per block side
constexpr int TT_THREADS = TT_LANES * TT_LANES;    // 256
constexpr int TT_MAX_KW = 7, TT_MAX_KH = 16;
constexpr int64_t TT_DEFAULT_SHARED = 48 * 1024;   // dynamic shared memory a kernel gets without opting in

template <typename A>
constexpr int tt_vec() { return 16 / int(sizeof(A)); }  // values per 16-byte shared load
// a shared row of `cols` values, rounded up to whole 16-byte vectors
template <typename A>
constexpr int tt_round_pitch(int cols) { return (cols + tt_vec<A>() - 1) / tt_vec<A>() * tt_vec<A>(); }
template <int KW, typename A>
constexpr int tt_pitch() { return tt_round_pitch<A>(TT_SIDE + KW - 1); }
template <int KW, typename A>
constexpr int tt_segment() { return (TT_PER + KW - 1 + tt_vec<A>() - 1) / tt_vec<A>() * tt_vec<A>(); }

// max or min, NaN where either is NaN
template <int SF, typename A>
__device__ __forceinline__ A tt_pick(A a, A b) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
  if constexpr (std::is_same_v<A, float>) {
    float r;
    if constexpr (SF == SC_MAX) asm("max.NaN.f32 %0, %1, %2;" : "=f"(r) : "f"(a), "f"(b));
    else asm("min.NaN.f32 %0, %1, %2;" : "=f"(r) : "f"(a), "f"(b));
    return r;
  }
#endif
  if (a != a || b != b) return a + b;
  return SF == SC_MAX ? (a > b ? a : b) : (a < b ? a : b);
}

// rows [y0, y0 + rows) and columns [x0, x0 + RW) of one H x W channel into shared memory (pitch P), `zero`
// outside the channel. Of the block's WARPS whole warps (a last partial one loads nothing), a warp takes rows (warp,
// warp + WARPS, ...), its lanes the columns (no division per element), two rows at a time with every load issued
// before the stores (a few memory latencies per tile, not one per element). Returns whether this thread loaded a
// NaN.
template <int RW, int P, typename T, typename A>
__device__ __forceinline__ bool tt_load(A* __restrict__ s, const T* __restrict__ xc, int y0, int x0, int rows, int H,
                                        int W, A zero) {
  constexpr int ROWS = 2, COLS = (RW + 31) / 32;
  const int WARPS = int(blockDim.x) / 32, lane = threadIdx.x % 32;
  bool nan = false;
  if (int(threadIdx.x) >= WARPS * 32) return false;
  for (int r0 = threadIdx.x / 32; r0 < rows; r0 += ROWS * WARPS) {
    A v[ROWS][COLS];
#pragma unroll
    for (int i = 0; i < ROWS; ++i) {
      const int r = r0 + i * WARPS, y = y0 + r;
      const bool row_in = r < rows && y >= 0 && y < H;
#pragma unroll
      for (int j = 0; j < COLS; ++j) {
        const int c = lane + 32 * j, xx = x0 + c;
        v[i][j] = row_in && c < RW && xx >= 0 && xx < W ? static_cast<A>(xc[y * W + xx]) : zero;
      }
    }
#pragma unroll
    for (int i = 0; i < ROWS; ++i) {
      const int r = r0 + i * WARPS;
#pragma unroll
      for (int j = 0; j < COLS; ++j) {
        const int c = lane + 32 * j;
        if (r < rows && c < RW) s[r * P + c] = v[i][j];
        nan |= v[i][j] != v[i][j];
      }
    }
  }
  return nan;
}

// the row segment a thread's 4 outputs read (16-byte aligned: the pitch and 4 are multiples of the vector)
template <int N, typename A>
__device__ __forceinline__ void tt_segment_load(A (&v)[N], const A* p) {
  using V = std::conditional_t<sizeof(A) == 4, float4, double2>;
  constexpr int L = tt_vec<A>();
#pragma unroll
  for (int j = 0; j < N / L; ++j) {
    const V q = reinterpret_cast<const V*>(p)[j];
    const A* e = reinterpret_cast<const A*>(&q);
#pragma unroll
    for (int i = 0; i < L; ++i) v[j * L + i] = e[i];
  }
}

// f(r, c, t, a) for every product a = x (*) k of a thread's 4x4 outputs (row r, column c of its block), each output's
// window taps t in window order; ks is one channel's kernel in window order, the tile (pitch P) starts at the
// outputs' first window row and column
template <int SF, int KW, int P, typename A, typename F>
__device__ __forceinline__ void tt_products(const A* __restrict__ xs, const A* __restrict__ ks, int KH, int tx, int ty,
                                            F&& f) {
  constexpr int N = tt_segment<KW, A>();
  for (int kh = 0; kh < KH; ++kh) {
    A kv[KW];
#pragma unroll
    for (int kw = 0; kw < KW; ++kw) kv[kw] = ks[kh * KW + kw];
#pragma unroll
    for (int r = 0; r < TT_PER; ++r) {
      A v[N];
      tt_segment_load(v, xs + (ty * TT_PER + r + kh) * P + tx * TT_PER);
#pragma unroll
      for (int c = 0; c < TT_PER; ++c)
#pragma unroll
        for (int kw = 0; kw < KW; ++kw) f(r, c, kh * KW + kw, sc_combine<SF>(v[c + kw], kv[kw]));
    }
  }
}

template <typename T>
struct alignas(TT_PER * sizeof(T)) TtQuad { T v[TT_PER]; };

constexpr int TT_NO_WINNER = 255;  // a saved winner: the window holds a NaN (no gradient); window indices are < 112

// the first winner (window tap index, in window order) of each of a thread's 4x4 outputs, whether a NaN was in the
// window, and the output (m): the strict comparison keeps the first winner (a window of the semifield's zero keeps
// tap 0), the max/min with NaN propagation marks a NaN
template <int SF, int KW, int P, typename A>
__device__ __forceinline__ void tt_winners_nan(const A* __restrict__ xs, const A* __restrict__ ks, int KH, int tx,
                                               int ty, int (&win)[TT_PER][TT_PER], bool (&nan)[TT_PER][TT_PER],
                                               A (&m)[TT_PER][TT_PER]) {
  const A zero = SF == SC_MAX ? A(-INFINITY) : A(INFINITY);
  A best[TT_PER][TT_PER];
#pragma unroll
  for (int r = 0; r < TT_PER; ++r)
#pragma unroll
    for (int c = 0; c < TT_PER; ++c) { best[r][c] = zero; win[r][c] = 0; m[r][c] = zero; }
  tt_products<SF, KW, P>(xs, ks, KH, tx, ty, [&](int r, int c, int t, A a) {
    m[r][c] = tt_pick<SF>(m[r][c], a);
    const bool better = SF == SC_MAX ? a > best[r][c] : a < best[r][c];
    best[r][c] = better ? a : best[r][c];
    win[r][c] = better ? t : win[r][c];
  });
#pragma unroll
  for (int r = 0; r < TT_PER; ++r)
#pragma unroll
    for (int c = 0; c < TT_PER; ++c) nan[r][c] = m[r][c] != m[r][c];
}

// the same where no NaN can occur (no NaN in the tile, a finite kernel; best: the output), with no predicate per
// tap: `better` as 1 or 0 (one compare-to-value), the best by a max/min, and the winner's index kept as a value of A
// moved by a multiply-add (exact: small integers), so a tap is two ALU instructions and three on the FMA pipe
// instead of three ALU ones (a compare to a predicate and two selects; the ALU pipe has half the FMA pipe's lanes)
template <int SF, int KW, int P, typename A>
__device__ __forceinline__ void tt_winners(const A* __restrict__ xs, const A* __restrict__ ks, int KH, int tx, int ty,
                                           int (&win)[TT_PER][TT_PER], A (&best)[TT_PER][TT_PER]) {
  const A zero = SF == SC_MAX ? A(-INFINITY) : A(INFINITY);
  A w[TT_PER][TT_PER];
#pragma unroll
  for (int r = 0; r < TT_PER; ++r)
#pragma unroll
    for (int c = 0; c < TT_PER; ++c) { best[r][c] = zero; w[r][c] = A(0); }
  tt_products<SF, KW, P>(xs, ks, KH, tx, ty, [&](int r, int c, int t, A a) {
    const A better = (SF == SC_MAX ? a > best[r][c] : a < best[r][c]) ? A(1) : A(0);
    best[r][c] = SF == SC_MAX ? fmax(best[r][c], a) : fmin(best[r][c], a);
    w[r][c] = fma(better, A(t) - w[r][c], w[r][c]);
  });
#pragma unroll
  for (int r = 0; r < TT_PER; ++r)
#pragma unroll
    for (int c = 0; c < TT_PER; ++c) win[r][c] = int(w[r][c]);
}

// six blocks a multiprocessor where the accumulation type is 4 bytes (40 registers: 8-13% less time at 3x3 and 5x5
// than four blocks of 60, docs/lab/benchmarks-history.md); double keeps the registers it needs. WIN (a forward whose
// backward follows, Cg == 1: the plan of tt_backward_kernel): each output's first winner is searched as the backward
// does (tt_winners) and written to `win` (TT_NO_WINNER for a window with a NaN), for tt_backward_kernel's SAVED
// form, which then does no search of its own: the search costs the forward less than the backward (5x5 on
// 16x32x256², H200: forward 0.15 -> 0.26 ms, backward 0.60 -> 0.29). Three blocks: at six the search spills (0.41).
template <int SF, int KW, typename T, bool WIN = false>
__global__ void __launch_bounds__(TT_THREADS, sizeof(at::opmath_type<T>) == 4 ? (WIN ? 3 : 6) : 1)
tt_forward_kernel(const T* __restrict__ x, const T* __restrict__ k, T* __restrict__ out, uint8_t* __restrict__ win,
                  ScGeo g, int tiles_h, int tiles_w) {
  using A = at::opmath_type<T>;
  constexpr int P = tt_pitch<KW, A>();
  extern __shared__ __align__(16) unsigned char smem[];
  const int KH = int(g.KH), Cg = int(g.Cg), taps = KH * KW, H = int(g.H), W = int(g.W);
  A* xs = reinterpret_cast<A*>(smem);      // (64 + KH - 1) rows of P
  A* ks = xs + (TT_SIDE + KH - 1) * P;      // this oc's kernel, Cg * taps in window order
  int64_t blk = blockIdx.x;
  const int tw = int(blk % tiles_w), th = int(blk / tiles_w % tiles_h);
  const int64_t bo = blk / tiles_w / tiles_h, b = bo / g.O, oc = bo % g.O, grp = oc / g.Og;
  const int tx = threadIdx.x % TT_LANES, ty = threadIdx.x / TT_LANES;
  const int oh0 = th * TT_SIDE, ow0 = tw * TT_SIDE;
  const A zero = SF == SC_MAX ? A(-INFINITY) : A(INFINITY);
  bool special = false;  // a NaN product needs a NaN in the tile or a kernel entry that is NaN or infinite
  for (int i = threadIdx.x; i < Cg * taps; i += TT_THREADS) {
    ks[i] = static_cast<A>(k[(oc * g.Cg + i / taps) * taps + g.ktap(i % taps)]);
    special |= !::isfinite(ks[i]);
  }
  A acc[TT_PER][TT_PER];
#pragma unroll
  for (int r = 0; r < TT_PER; ++r)
#pragma unroll
    for (int c = 0; c < TT_PER; ++c) acc[r][c] = zero;
  int w[TT_PER][TT_PER];
  bool nan[TT_PER][TT_PER] = {};
  for (int c = 0; c < Cg; ++c) {
    __syncthreads();  // the previous channel's tile is read (and the kernel written)
    special |= tt_load<TT_SIDE + KW - 1, P>(xs, x + (b * g.C + grp * g.Cg + c) * H * W, oh0 - int(g.p[1]),
                                            ow0 - int(g.p[2]), TT_SIDE + KH - 1, H, W, zero);
    if constexpr (WIN) {  // one channel
      if (__syncthreads_or(special)) tt_winners_nan<SF, KW, P>(xs, ks, KH, tx, ty, w, nan, acc);
      else tt_winners<SF, KW, P>(xs, ks, KH, tx, ty, w, acc);
    } else {
      __syncthreads();
      tt_products<SF, KW, P>(xs, ks + c * taps, KH, tx, ty, [&](int r, int cc, int, A a) {
        acc[r][cc] = tt_pick<SF>(acc[r][cc], a);
      });
    }
  }
  const int ow = ow0 + tx * TT_PER;
  const bool whole = g.OW % TT_PER == 0;  // a thread's 4 outputs of a row: one aligned vector store, or none
#pragma unroll
  for (int r = 0; r < TT_PER; ++r) {
    const int64_t oh = oh0 + ty * TT_PER + r;
    if (oh >= g.OH) break;
    T* o = out + (bo * g.OH + oh) * g.OW + ow;
    if (whole && ow < g.OW) {
      TtQuad<T> q;
#pragma unroll
      for (int cc = 0; cc < TT_PER; ++cc) q.v[cc] = static_cast<T>(acc[r][cc]);
      *reinterpret_cast<TtQuad<T>*>(o) = q;
    } else {
#pragma unroll
      for (int cc = 0; cc < TT_PER; ++cc)
        if (ow + cc < g.OW) o[cc] = static_cast<T>(acc[r][cc]);
    }
    if constexpr (WIN) {
      TtQuad<uint8_t> q;
#pragma unroll
      for (int cc = 0; cc < TT_PER; ++cc) q.v[cc] = uint8_t(nan[r][cc] ? TT_NO_WINNER : w[r][cc]);
      uint8_t* wo = win + (bo * g.OH + oh) * g.OW + ow;
      if (whole && ow < g.OW) {
        *reinterpret_cast<TtQuad<uint8_t>*>(wo) = q;
      } else {
#pragma unroll
        for (int cc = 0; cc < TT_PER; ++cc)
          if (ow + cc < g.OW) wo[cc] = q.v[cc];
      }
    }
  }
}

// The backward's block computes the winners of 4LX x 4LY outputs (LX threads across, a compile-time constant; LY
// down), whose windows cover a footprint of FH = 4LY + KH - 1 rows and 4LX + KW - 1 columns of the image: xs holds
// the image there and gs its gradient, both on pitch P, so output (lr, lc)'s winner t adds at gs[lr * P + lc +
// toff[t]] with no bounds check. The block owns the image tile at footprint rows [KH - 1, KH - 1 + TH), columns
// [KW - 1, KW - 1 + TW) (TH = 4LY - KH + 1, TW = 4LX - KW + 1): every output whose window reaches into it is
// computed here. Two shapes (tt_plan picks the one with fewer threads in all): LX = LY = 16 (256 threads, tiles of
// 64 - k + 1), and WIDE: image tiles of at least 64 (LX = tt_wide_lanes(KW), LY likewise: 289 threads at 5x5),
// which cover a power-of-two image evenly. SAVED: the winners come from the forward (tt_forward_kernel's WIN, `win`
// [B, O, OH, OW]), loaded per output channel after toff (CH x CW bytes) instead of the image (no search, no image
// read; `saved_bytes` of shared memory).
constexpr int TT_WIDE_THREADS = 18 * 20;  // LX * LY of the wide shape at KW = 7, KH = 16
constexpr int tt_wide_lanes(int k) { return (TT_SIDE + k - 1 + TT_PER - 1) / TT_PER; }
template <int KW, int LX, typename A>
constexpr int tt_bpitch() { return tt_round_pitch<A>(TT_PER * LX + KW - 1); }

// SAVED (no search, no image tile) takes more blocks a multiprocessor with fewer registers: at three it held 55
// registers and took 0.36 ms for the 5x5 call on 16x32x256² (H200), at five 0.29
template <int SF, int KW, bool WIDE, typename T, bool SAVED = false, int LX = WIDE ? tt_wide_lanes(KW) : TT_LANES>
__global__ void __launch_bounds__(WIDE ? TT_WIDE_THREADS : TT_THREADS, SAVED ? (WIDE ? 5 : 6) : (WIDE ? 3 : 4))
tt_backward_kernel(const T* __restrict__ go, const T* __restrict__ x, const T* __restrict__ k,
                   const uint8_t* __restrict__ saved, T* __restrict__ gx, at::opmath_type<T>* __restrict__ gk, ScGeo g,
                   int tiles_h, int tiles_w, int LY) {
  using A = at::opmath_type<T>;
  constexpr int CW = TT_PER * LX, TW = CW - KW + 1, P = tt_bpitch<KW, LX, A>();
  extern __shared__ __align__(16) unsigned char smem[];
  const int KH = int(g.KH), taps = KH * KW, H = int(g.H), W = int(g.W), OH = int(g.OH), OW = int(g.OW);
  const int CH = TT_PER * LY, TH = CH - KH + 1, FH = CH + KH - 1;
  A* xs = reinterpret_cast<A*>(smem);       // the footprint's image, FH rows of P (SAVED: none)
  A* gs = SAVED ? xs : xs + FH * P;         // its gradient
  A* gos = gs + FH * P;                     // the upstream gradient of the CH x CW outputs computed (0 outside)
  A* ks = gos + CH * CW;                    // the kernel of the current oc in window order
  A* bins = ks + taps;                      // its gradient per window index and lane, [taps][32]: a warp's lanes
                                            // never share an address (shared float atomics are compare-and-swap
                                            // loops: 32 lanes on one address serialise, and one tap often wins most
                                            // windows)
  int* toff = reinterpret_cast<int*>(bins + taps * 32);  // window tap t's offset in the footprint
  uint8_t* ws = reinterpret_cast<uint8_t*>(toff + taps);  // SAVED: the winners of the CH x CW outputs
  const int64_t blk = blockIdx.x;
  const int tw = int(blk % tiles_w), th = int(blk / tiles_w % tiles_h);
  const int64_t bc = blk / tiles_w / tiles_h, b = bc / g.C, ch = bc % g.C;  // Cg == 1: the channel is the group
  const int tx = threadIdx.x % LX, ty = threadIdx.x / LX, lane = threadIdx.x % 32;
  const int i0 = th * TH, j0 = tw * TW;
  const int oh_s = i0 + int(g.p[1]) - (KH - 1), ow_s = j0 + int(g.p[2]) - (KW - 1);  // the outputs computed
  const bool last_h = th == tiles_h - 1, last_w = tw == tiles_w - 1;
  const A zero = SF == SC_MAX ? A(-INFINITY) : A(INFINITY);
  const bool x_nan = !SAVED && tt_load<CW + KW - 1, P>(xs, x + bc * H * W, i0 - (KH - 1), j0 - (KW - 1), FH, H, W,
                                                      zero);
  for (int i = threadIdx.x; i < taps; i += blockDim.x) toff[i] = (i / KW) * P + i % KW;
  if (gx != nullptr)
    for (int i = threadIdx.x; i < FH * P; i += blockDim.x) gs[i] = A(0);
  bool col_ok[TT_PER], own_c[TT_PER];  // this thread's output columns: inside the output; counted for the kernel
#pragma unroll
  for (int cc = 0; cc < TT_PER; ++cc) {
    const int lc = tx * TT_PER + cc, ow = ow_s + lc;
    col_ok[cc] = ow >= 0 && ow < OW;
    own_c[cc] = lc < TW || last_w;
  }
  for (int64_t og = 0; og < g.Og; ++og) {
    const int64_t oc = ch * g.Og + og, bo = b * g.O + oc;
    if (og > 0) __syncthreads();  // the previous oc's upstream gradient, kernel and bins are read
    tt_load<CW, CW>(gos, go + bo * OH * OW, oh_s, ow_s, CH, OH, OW, A(0));
    if constexpr (SAVED) tt_load<CW, CW>(ws, saved + bo * OH * OW, oh_s, ow_s, CH, OH, OW, uint8_t(TT_NO_WINNER));
    bool k_special = false;
    for (int i = threadIdx.x; i < taps && !SAVED; i += blockDim.x) {
      ks[i] = static_cast<A>(k[oc * taps + g.ktap(i)]);
      k_special |= !::isfinite(ks[i]);
    }
    if (gk != nullptr)
      for (int i = threadIdx.x; i < taps * 32; i += blockDim.x) bins[i] = A(0);
    // a NaN product needs a NaN in the tile or a kernel entry that is NaN or infinite (inf + -inf)
    const bool special = __syncthreads_or(x_nan || k_special);
    int win[TT_PER][TT_PER];
    bool nan[TT_PER][TT_PER] = {};
    A best[TT_PER][TT_PER];  // the windows' outputs (the forward's), not needed here
    if constexpr (!SAVED) {
      if (special) tt_winners_nan<SF, KW, P>(xs, ks, KH, tx, ty, win, nan, best);
      else tt_winners<SF, KW, P>(xs, ks, KH, tx, ty, win, best);
    }
#pragma unroll
    for (int r = 0; r < TT_PER; ++r) {
      const int lr = ty * TT_PER + r, oh = oh_s + lr;
      const bool row_ok = oh >= 0 && oh < OH, own_r = lr < TH || last_h;
      A gv[TT_PER];
      tt_segment_load(gv, gos + lr * CW + tx * TT_PER);
      TtQuad<uint8_t> saved_row = {};  // SAVED: this row's winners
      if constexpr (SAVED) saved_row = *reinterpret_cast<const TtQuad<uint8_t>*>(ws + lr * CW + tx * TT_PER);
#pragma unroll
      for (int cc = 0; cc < TT_PER; ++cc) {
        const int t = SAVED ? int(saved_row.v[cc]) : win[r][cc];
        if (!row_ok || !col_ok[cc] || (SAVED ? t == TT_NO_WINNER : nan[r][cc])) continue;  // outside the output,
                                                                                           // or a NaN in the window
        if (gx != nullptr) atomicAdd(gs + lr * P + tx * TT_PER + cc + toff[t], gv[cc]);
        if (gk != nullptr && own_r && own_c[cc]) atomicAdd(bins + t * 32 + lane, SF == SC_MIN ? -gv[cc] : gv[cc]);
      }
    }
    __syncthreads();
    if (gk != nullptr)
      for (int i = threadIdx.x; i < taps; i += blockDim.x) {
        A sum = 0;
        for (int l = 0; l < 32; ++l) sum += bins[i * 32 + l];
        atomicAdd(gk + oc * taps + g.ktap(i), sum);
      }
  }
  __syncthreads();
  if (gx != nullptr)
    for (int i = threadIdx.x; i < TH * TW; i += blockDim.x) {
      const int ly = i / TW, lx = i % TW, iy = i0 + ly, ix = j0 + lx;
      if (iy < H && ix < W) gx[bc * H * W + iy * W + ix] = static_cast<T>(gs[(ly + KH - 1) * P + lx + KW - 1]);
    }
}

// tiles of `side` along a dim of n elements
inline int64_t tt_tiles(int64_t n, int64_t side) { return (n + side - 1) / side; }

// how the tiled kernels take a call: their dynamic shared memory, grid of tiles and (backward) shape, or bytes 0
// where they do not take it; `backward` asks for the backward's, `elem` is the accumulation type's size
struct TtPlan {
  int64_t bytes = 0;
  int tiles_h = 0, tiles_w = 0;
  bool wide = false;  // the backward's wide shape (image tiles of at least 64)
  int lx = TT_LANES, ly = TT_LANES;  // the backward's threads across and down
  int64_t saved_bytes = 0;  // the backward's with saved winners: no image tile, the winners instead
};

TtPlan tt_plan(const ScGeo& g, int64_t sf, bool backward, int64_t elem) {
  if ((sf != SC_MAX && sf != SC_MIN) || g.D != 1 || g.KD != 1 || g.OD != 1 || g.H < 2 || g.p[0] != 0) return {};
  if (g.s[1] != 1 || g.s[2] != 1 || g.d[1] != 1 || g.d[2] != 1 || g.KW > TT_MAX_KW || g.KH > TT_MAX_KH) return {};
  // every window holds an image pixel: padding below the kernel size on each side
  if (g.p[1] > g.KH - 1 || g.p[2] > g.KW - 1 || g.OH > g.H + g.p[1] || g.OW > g.W + g.p[2]) return {};
  if (backward && g.Cg != 1) return {};
  const int64_t vec = 16 / elem, taps = g.KH * g.KW;
  const auto pitch_of = [&](int64_t cols) { return (cols + vec - 1) / vec * vec; };  // tt_round_pitch's
  TtPlan plan;
  if (backward) {
    // the shape with fewer threads in all (whole warps counted) over the image: at 256 x 256 and 5x5, 5 x 5 tiles
    // of 60 (256 threads each) or 4 x 4 of 64 (289, ten warps)
    const int64_t wx = tt_wide_lanes(int(g.KW)), wy = tt_wide_lanes(int(g.KH));
    const auto tiles = [&](int64_t lx, int64_t ly) {
      return tt_tiles(g.H, TT_PER * ly - g.KH + 1) * tt_tiles(g.W, TT_PER * lx - g.KW + 1);
    };
    plan.wide = tiles(wx, wy) * ((wx * wy + 31) / 32) < tiles(TT_LANES, TT_LANES) * (TT_THREADS / 32);
    if (plan.wide) plan = TtPlan{0, 0, 0, true, int(wx), int(wy)};
    plan.tiles_h = int(tt_tiles(g.H, TT_PER * plan.ly - g.KH + 1));
    plan.tiles_w = int(tt_tiles(g.W, TT_PER * plan.lx - g.KW + 1));
    const int64_t fh = TT_PER * plan.ly + g.KH - 1, cw = TT_PER * plan.lx;
    plan.bytes = elem * (2 * fh * pitch_of(cw + g.KW - 1) + TT_PER * plan.ly * cw + 33 * taps) +
                 int64_t(sizeof(int)) * taps;
    plan.saved_bytes = plan.bytes - elem * fh * pitch_of(cw + g.KW - 1) + TT_PER * plan.ly * cw;
  } else {
    plan.tiles_h = int(tt_tiles(g.OH, TT_SIDE));
    plan.tiles_w = int(tt_tiles(g.OW, TT_SIDE));
    plan.bytes = elem * ((TT_SIDE + g.KH - 1) * pitch_of(TT_SIDE + g.KW - 1) + g.Cg * taps);
  }
  if ((backward ? g.B * g.C : g.B * g.O) * plan.tiles_h * plan.tiles_w >= (int64_t(1) << 31)) return {};  // 1 grid dim
  int device = 0, optin = 0;
  C10_CUDA_CHECK(cudaGetDevice(&device));
  C10_CUDA_CHECK(cudaDeviceGetAttribute(&optin, cudaDevAttrMaxSharedMemoryPerBlockOptin, device));
  if (plan.bytes > optin) return {};
  return plan;
}

// a launch of `kernel` with `bytes` of dynamic shared memory: past the default, the kernel opts in (on the
// current device: a cheap call, made on each such launch rather than tracked per device)
template <typename K>
void tt_allow_shared(K kernel, int64_t bytes) {
  if (bytes > TT_DEFAULT_SHARED)
    C10_CUDA_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, int(bytes)));
}

template <typename F>
void tt_dispatch_kw(int64_t kw, F&& f) {
  switch (kw) {
    case 1: return f(std::integral_constant<int, 1>{});
    case 2: return f(std::integral_constant<int, 2>{});
    case 3: return f(std::integral_constant<int, 3>{});
    case 4: return f(std::integral_constant<int, 4>{});
    case 5: return f(std::integral_constant<int, 5>{});
    case 6: return f(std::integral_constant<int, 6>{});
    default: return f(std::integral_constant<int, 7>{});
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

}  // namespace

// how a tiled backward is launched: its shape (tt_plan's), threads, dynamic shared memory
struct TtLaunch {
  bool wide;
  int tiles_h, tiles_w, threads, ly;
  int64_t bytes;
};

namespace {

// the tiled backward for the call's dtype, semifield (max or min) and kernel width, in its SAVED form (reading
// semiconv_forward_saving's winners, `saved`) or its search form
template <bool SAVED>
void tt_backward_launch(const at::Tensor& grad, const at::Tensor& saved, const at::Tensor& img, const at::Tensor& ker,
                        at::Tensor& gx, at::Tensor& gk, const ScGeo& g, int64_t sf, const TtLaunch& l, bool need_img,
                        bool need_kernel) {
  AT_DISPATCH_FLOATING_TYPES_AND2(at::kHalf, at::kBFloat16, img.scalar_type(), "semiconv_backward_cuda", [&] {
    using A = at::opmath_type<scalar_t>;
    sc_dispatch(sf, [&](auto SF) {
      constexpr int sfv = decltype(SF)::value;
      if constexpr (sfv == SC_MAX || sfv == SC_MIN) {
        tt_dispatch_kw(g.KW, [&](auto KW) {
          constexpr int kw = decltype(KW)::value;
          const auto kernel = l.wide ? tt_backward_kernel<sfv, kw, true, scalar_t, SAVED>
                                     : tt_backward_kernel<sfv, kw, false, scalar_t, SAVED>;
          tt_allow_shared(kernel, l.bytes);
          kernel<<<static_cast<unsigned>(g.B * g.C * l.tiles_h * l.tiles_w), l.threads, l.bytes,
                   c10::cuda::getCurrentCUDAStream()>>>(
              grad.data_ptr<scalar_t>(), img.data_ptr<scalar_t>(), ker.data_ptr<scalar_t>(),
              SAVED ? saved.data_ptr<uint8_t>() : nullptr, need_img ? gx.data_ptr<scalar_t>() : nullptr,
              need_kernel ? gk.data_ptr<A>() : nullptr, g, l.tiles_h, l.tiles_w, l.ly);
          C10_CUDA_KERNEL_LAUNCH_CHECK();
        });
      }
    });
  });
}

}  // namespace

// tt_backward_launch<true> and <false>, each compiled in a translation unit of its own (semiconv_backward_saved.cu,
// semiconv_backward_search.cu: their kernels take most of semiconv's compile time; the units compile side by side),
// each unit's function defined by TT_BACKWARD_FORM
#define TT_BACKWARD_ARGS                                                                                      \
  const at::Tensor& grad, const at::Tensor& saved, const at::Tensor& img, const at::Tensor& ker, at::Tensor& gx, \
      at::Tensor& gk, const ScGeo& g, int64_t sf, const TtLaunch& l, bool need_img, bool need_kernel
#define TT_BACKWARD_FORM(NAME, SAVED)                                                  \
  void NAME(TT_BACKWARD_ARGS) {                                                        \
    tt_backward_launch<SAVED>(grad, saved, img, ker, gx, gk, g, sf, l, need_img, need_kernel); \
  }
void tt_backward_saved(TT_BACKWARD_ARGS);
void tt_backward_search(TT_BACKWARD_ARGS);

}  // namespace kernelhub_cuda_ext
