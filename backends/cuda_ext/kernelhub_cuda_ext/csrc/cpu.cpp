// kernelhub_cuda_ext: operator schemas and the C++ CPU kernels (parallel over the machine's cores
// with at::parallel_for, OpenMP underneath; inner loops over contiguous rows are SIMD loops).
#include "ops.h"
#include "kplanes_point.h"
#include "tikhonov_pixel.h"

#include <ATen/Dispatch.h>
#include <ATen/OpMathType.h>
#include <ATen/Parallel.h>
#include <c10/util/complex.h>

#include <cmath>
#include <vector>

namespace kernelhub_cuda_ext {
namespace {

template <typename T>
using acc_t = at::opmath_type<T>;  // float for half, bfloat16 and float; double for double

template <typename A>
inline A sgn(A a) {  // torch.sign for finite a (0 at 0)
  return A(int(a > 0) - int(a < 0));  // int first: vectorises far better than float selects (AVX-512)
}

// ---- TV forward --------------------------------------------------------------------------
// Rows of W voxels; row r is (b, d, h) with h = r % H, d = (r / H) % D. Each chunk of rows gets
// its own three partial sums (in double), and the chunks are added in order: deterministic for
// any thread count.

template <typename A>
inline A tv_term(A d, bool l1) { return l1 ? std::abs(d) : d * d; }

// NR consecutive rows starting at r into the per-column accumulators (one load and store of each
// accumulator per NR rows).
template <int MODE, int NR, typename T, typename A>
inline void tv_forward_step(const T* x, int64_t D, int64_t H, int64_t W, int64_t r, A e, A* __restrict ad,
                            A* __restrict ah, A* __restrict aw) {
  constexpr bool l1 = MODE == TV_L1;
  const int64_t plane = H * W;
  const T* __restrict row[NR];
  const T* __restrict nd[NR];
  const T* __restrict nh[NR];
  bool corner[NR];  // iso: the row has corners (d + 1 and h + 1 exist)
  bool has_d[NR], has_h[NR];  // whether the D / H neighbour exists; the term is dropped if not (x - x is NaN for NaN)
  for (int k = 0; k < NR; ++k) {
    const int64_t h = (r + k) % H, d = ((r + k) / H) % D;
    row[k] = x + (r + k) * W;
    nd[k] = row[k] + (d + 1 < D ? plane : 0);  // the row itself where there is no neighbour (a valid address)
    nh[k] = row[k] + (h + 1 < H ? W : 0);
    has_d[k] = d + 1 < D;
    has_h[k] = h + 1 < H;
    corner[k] = d + 1 < D && h + 1 < H;
  }
  if constexpr (MODE == TV_ISO) {  // a row at a time: rows without corners are skipped
    for (int k = 0; k < NR; ++k) {
      if (!corner[k]) continue;
      const T* __restrict rk = row[k];
      const T* __restrict dk = nd[k];
      const T* __restrict hk = nh[k];
#pragma omp simd
      for (int64_t w = 0; w < W - 1; ++w) {
        const A c = static_cast<A>(rk[w]);
        const A dd = static_cast<A>(dk[w]) - c, dh = static_cast<A>(hk[w]) - c, dw = static_cast<A>(rk[w + 1]) - c;
        ad[w] += std::sqrt(dd * dd + dh * dh + dw * dw + e);
      }
    }
  } else {
#pragma omp simd
    for (int64_t w = 0; w < W - 1; ++w) {
      A sd = 0, sh = 0, sw = 0;
      for (int k = 0; k < NR; ++k) {
        const A c = static_cast<A>(row[k][w]);
        const A td = tv_term(static_cast<A>(nd[k][w]) - c, l1), th = tv_term(static_cast<A>(nh[k][w]) - c, l1);
        sd += has_d[k] ? td : A(0);
        sh += has_h[k] ? th : A(0);
        sw += tv_term(static_cast<A>(row[k][w + 1]) - c, l1);
      }
      ad[w] += sd;
      ah[w] += sh;
      aw[w] += sw;
    }
    const int64_t w = W - 1;  // the last column has no W neighbour
    for (int k = 0; k < NR; ++k) {
      const A c = static_cast<A>(row[k][w]);
      if (has_d[k]) ad[w] += tv_term(static_cast<A>(nd[k][w]) - c, l1);
      if (has_h[k]) ah[w] += tv_term(static_cast<A>(nh[k][w]) - c, l1);
    }
  }
}

template <int MODE, typename T>
void tv_forward_rows(const T* x, int64_t D, int64_t H, int64_t W, int64_t r0, int64_t r1, double eps, double* sums) {
  // per-column accumulators across the chunk's rows, 4 rows at a time: the row loops are vertical SIMD
  // with no horizontal sum per row (which cost more than the row itself at W ~ 100)
  using A = acc_t<T>;
  std::vector<A> acc(static_cast<size_t>(3 * W), A(0));
  A* ad = acc.data();
  A* ah = ad + W;
  A* aw = ah + W;
  const A e = static_cast<A>(eps);
  int64_t r = r0;
  for (; r + 4 <= r1; r += 4) tv_forward_step<MODE, 4>(x, D, H, W, r, e, ad, ah, aw);
  for (; r < r1; ++r) tv_forward_step<MODE, 1>(x, D, H, W, r, e, ad, ah, aw);
  for (int64_t w = 0; w < W; ++w) {  // in order: deterministic
    sums[0] += ad[w];
    sums[1] += ah[w];
    sums[2] += aw[w];
  }
}

int64_t tv_chunk_rows(int64_t W) { return std::max<int64_t>(1, 16384 / std::max<int64_t>(W, 1)); }

at::Tensor tv_forward_cpu(const at::Tensor& x_, int64_t mode, double eps, const std::optional<at::Tensor>& weights) {
  TORCH_CHECK(x_.dim() == 4, "kernelhub_cuda_ext::tv_forward: argument 'x' must be [B, D, H, W], got ", x_.sizes());
  TORCH_CHECK(mode >= 0 && mode <= 2, "kernelhub_cuda_ext::tv_forward: argument 'mode' must be 0, 1 or 2");
  check_tv_weights("tv_forward", x_, mode, weights);
  const at::Tensor x = x_.contiguous();
  const int64_t B = x.size(0), D = x.size(1), H = x.size(2), W = x.size(3);
  const int64_t rows = W > 0 ? B * D * H : 0;  // rows of no voxels have nothing to walk (and no last column)
  const int64_t ch = tv_chunk_rows(W), chunks = (rows + ch - 1) / ch;
  std::vector<double> partial(static_cast<size_t>(chunks) * 3, 0.0);
  AT_DISPATCH_FLOATING_TYPES_AND2(at::kHalf, at::kBFloat16, x.scalar_type(), "tv_forward_cpu", [&] {
    const scalar_t* p = x.data_ptr<scalar_t>();
    at::parallel_for(0, chunks, 1, [&](int64_t c0, int64_t c1) {
      for (int64_t c = c0; c < c1; ++c) {
        const int64_t r0 = c * ch, r1 = std::min(rows, (c + 1) * ch);
        if (mode == TV_L1)
          tv_forward_rows<TV_L1>(p, D, H, W, r0, r1, eps, &partial[c * 3]);
        else if (mode == TV_SQ)
          tv_forward_rows<TV_SQ>(p, D, H, W, r0, r1, eps, &partial[c * 3]);
        else
          tv_forward_rows<TV_ISO>(p, D, H, W, r0, r1, eps, &partial[c * 3]);
      }
    });
  });
  double s[3] = {0, 0, 0};
  for (int64_t c = 0; c < chunks; ++c)
    for (int k = 0; k < 3; ++k) s[k] += partial[c * 3 + k];
  const auto opts = x.options().dtype(acc_dtype(x));
  if (mode == TV_L1 && !weights) return at::tensor({s[0], s[1], s[2]}, opts.dtype(at::kDouble)).to(opts.dtype());
  double total = s[0] + s[1] + s[2];
  if (mode == TV_ISO) {
    const double corners = static_cast<double>(B) * (D - 1) * (H - 1) * (W - 1);
    total = corners > 0 ? s[0] / corners : 0.0;
  }
  if (weights) {  // the weighted sum of the op's output, in double
    const at::Tensor w = weights->to(at::kDouble).contiguous();
    const double* wp = w.data_ptr<double>();
    total = mode == TV_L1 ? wp[0] * s[0] + wp[1] * s[1] + wp[2] * s[2] : wp[0] * total;
  }
  return at::scalar_tensor(total, opts.dtype(at::kDouble)).to(opts.dtype());
}

// ---- TV backward -------------------------------------------------------------------------

// One row of the SQ gradient. pd/nd/ph/nh are the neighbouring rows in D and H (the row itself where
// there is none, so that difference is 0); the first and last column likewise.
template <typename A>
inline A tv_sq_elem(A c, A xdm, A xdp, A xhm, A xhp, A xwm, A xwp, A g0) {
  return g0 * ((c - xdm) - (xdp - c) + (c - xhm) - (xhp - c) + (c - xwm) - (xwp - c));
}

template <typename T, typename A>
void tv_sq_backward_row(const T* __restrict row, T* __restrict o, const T* __restrict pd, const T* __restrict nd,
                        const T* __restrict ph, const T* __restrict nh, int64_t W, A g0) {
  auto edge = [&](int64_t w) {
    const A c = static_cast<A>(row[w]);
    const A xwm = w >= 1 ? static_cast<A>(row[w - 1]) : c, xwp = w + 1 < W ? static_cast<A>(row[w + 1]) : c;
    o[w] = static_cast<T>(tv_sq_elem(c, static_cast<A>(pd[w]), static_cast<A>(nd[w]), static_cast<A>(ph[w]),
                                     static_cast<A>(nh[w]), xwm, xwp, g0));
  };
  edge(0);
#pragma omp simd
  for (int64_t w = 1; w < W - 1; ++w)
    o[w] = static_cast<T>(tv_sq_elem(static_cast<A>(row[w]), static_cast<A>(pd[w]), static_cast<A>(nd[w]),
                                     static_cast<A>(ph[w]), static_cast<A>(nh[w]), static_cast<A>(row[w - 1]),
                                     static_cast<A>(row[w + 1]), g0));
  if (W > 1) edge(W - 1);
}

// L1: its cost is the signs, so each one is computed once and used by both voxels it joins (SQ's
// differences are cheaper to compute twice than to carry: carried, its backward went from 0.25 to
// 0.32 ms at 128^3 on 2 cores, while L1's went from 0.50 to 0.34 ms). A task is a slab of rows h0..h1 of
// one item walked down D: the D signs of the plane before are carried in a buffer (slab rows x W), the
// H signs of the row before in another (W), and each row's W signs are computed once into a third
// (W + 1, zero at both ends). No reduction: the result does not depend on the split.
template <typename T>
void tv_l1_backward_slab(const T* x, T* out, int64_t D, int64_t H, int64_t W, int64_t b, int64_t h0, int64_t h1,
                         const double* g) {
  using A = acc_t<T>;
  const int64_t plane = H * W, n = h1 - h0;
  const A g0 = static_cast<A>(g[0]), g1 = static_cast<A>(g[1]), g2 = static_cast<A>(g[2]);
  std::vector<A> buf(static_cast<size_t>(n * W + 2 * W + 1), A(0));
  A* __restrict fd = buf.data();  // per (h, w) of the slab: sign(x[d] - x[d - 1]) (0 at d = 0)
  A* __restrict fh = fd + n * W;  // sign(x[h] - x[h - 1]) of the row before (0 at h = 0)
  A* __restrict fw = fh + W;      // fw[w] = sign(row[w] - row[w - 1]) for 1 <= w < W; fw[0] = fw[W] = 0
  for (int64_t d = 0; d < D; ++d) {
    const int64_t to_next_plane = d + 1 < D ? plane : 0;  // no neighbour: the voxel itself, difference 0
    for (int64_t h = h0; h < h1; ++h) {
      const T* __restrict row = x + ((b * D + d) * H + h) * W;
      T* __restrict o = out + ((b * D + d) * H + h) * W;
      const T* __restrict nd = row + to_next_plane;
      const T* __restrict nh = row + (h + 1 < H ? W : 0);
      A* __restrict fdr = fd + (h - h0) * W;
      if (h == h0) {  // the slab's first row: the H sign of the row before is computed, not carried
        const T* __restrict ph = row - (h >= 1 ? W : 0);
#pragma omp simd
        for (int64_t w = 0; w < W; ++w) fh[w] = sgn(static_cast<A>(row[w]) - static_cast<A>(ph[w]));
      }
#pragma omp simd
      for (int64_t w = 1; w < W; ++w) fw[w] = sgn(static_cast<A>(row[w]) - static_cast<A>(row[w - 1]));
#pragma omp simd
      for (int64_t w = 0; w < W; ++w) {
        const A c = static_cast<A>(row[w]);
        const A sd = sgn(static_cast<A>(nd[w]) - c), sh = sgn(static_cast<A>(nh[w]) - c);
        o[w] = static_cast<T>(g0 * (fdr[w] - sd) + g1 * (fh[w] - sh) + g2 * (fw[w] - fw[w + 1]));
        fdr[w] = sd;
        fh[w] = sh;
      }
    }
  }
}

// SQ and iso: rows of W voxels.
template <typename T>
void tv_backward_rows(const T* x, T* out, int64_t D, int64_t H, int64_t W, int64_t r0, int64_t r1, int64_t mode,
                      double eps, const double* g) {
  using A = acc_t<T>;
  const int64_t plane = H * W;
  const A g0 = static_cast<A>(g[0]);
  const A e = static_cast<A>(eps);
  for (int64_t r = r0; r < r1; ++r) {
    const int64_t h = r % H, d = (r / H) % D;
    const T* row = x + r * W;
    T* o = out + r * W;
    const bool dm = d >= 1, dp = d + 1 < D, hm = h >= 1, hp = h + 1 < H;
    // a missing neighbour points at the row itself: its difference is 0
    const T* pd = row - (dm ? plane : 0);
    const T* nd = row + (dp ? plane : 0);
    const T* ph = row - (hm ? W : 0);
    const T* nh = row + (hp ? W : 0);
    if (mode == TV_ISO) {
      // corners (d,h,w), (d-1,h,w), (d,h-1,w), (d,h,w-1) touch voxel (d,h,w)
      const bool own = dp && hp, below = dm && hp, above = hm && dp;
      const T* pd_nh = pd + (hp ? W : 0);  // (d-1, h+1)
      const T* nd_ph = nd - (hm ? W : 0);  // (d+1, h-1)
      for (int64_t w = 0; w < W; ++w) {
        const bool wp = w + 1 < W, wm = w >= 1;
        const A c = static_cast<A>(row[w]);
        A acc = 0;
        if (own && wp) {
          const A dd = static_cast<A>(nd[w]) - c, dh = static_cast<A>(nh[w]) - c, dw = static_cast<A>(row[w + 1]) - c;
          acc -= (dd + dh + dw) / std::sqrt(dd * dd + dh * dh + dw * dw + e);
        }
        if (below && wp) {
          const A b = static_cast<A>(pd[w]);
          const A dd = c - b, dh = static_cast<A>(pd_nh[w]) - b, dw = static_cast<A>(pd[w + 1]) - b;
          acc += dd / std::sqrt(dd * dd + dh * dh + dw * dw + e);
        }
        if (above && wp) {
          const A b = static_cast<A>(ph[w]);
          const A dd = static_cast<A>(nd_ph[w]) - b, dh = c - b, dw = static_cast<A>(ph[w + 1]) - b;
          acc += dh / std::sqrt(dd * dd + dh * dh + dw * dw + e);
        }
        if (own && wm) {
          const A b = static_cast<A>(row[w - 1]);
          const A dd = static_cast<A>(nd[w - 1]) - b, dh = static_cast<A>(nh[w - 1]) - b, dw = c - b;
          acc += dw / std::sqrt(dd * dd + dh * dh + dw * dw + e);
        }
        o[w] = static_cast<T>(g0 * acc);
      }
      continue;
    }
    tv_sq_backward_row(row, o, pd, nd, ph, nh, W, g0);
  }
}

at::Tensor tv_backward_cpu(const at::Tensor& grad, const at::Tensor& x_, int64_t mode, double eps,
                           const std::optional<at::Tensor>& weights) {
  TORCH_CHECK(x_.dim() == 4, "kernelhub_cuda_ext::tv_backward: argument 'x' must be [B, D, H, W], got ", x_.sizes());
  TORCH_CHECK(grad.numel() == (mode == TV_L1 && !weights ? 3 : 1),
              "kernelhub_cuda_ext::tv_backward: argument 'grad' must have 3 elements for L1 and 1 otherwise "
              "(1 with weights)");
  check_tv_weights("tv_backward", x_, mode, weights);
  const at::Tensor x = x_.contiguous();
  at::Tensor out = at::empty_like(x);
  const int64_t B = x.size(0), D = x.size(1), H = x.size(2), W = x.size(3);
  if (x.numel() == 0) return out;
  const at::Tensor gd = grad.to(at::kDouble).contiguous().view({-1});
  double g[3] = {gd[0].item<double>(), 0, 0};
  if (weights) {  // the upstream gradient of each output element: its weight times the weighted sum's
    const at::Tensor w = weights->to(at::kDouble).contiguous();
    const double* wp = w.data_ptr<double>();
    for (int k = mode == TV_L1 ? 2 : 0; k >= 0; --k) g[k] = wp[k] * g[0];
  } else if (mode == TV_L1) {
    g[1] = gd[1].item<double>();
    g[2] = gd[2].item<double>();
  }
  if (mode == TV_SQ) {
    g[0] *= 2;
  } else if (mode == TV_ISO) {
    const double corners = static_cast<double>(B) * (D - 1) * (H - 1) * (W - 1);
    if (corners <= 0) return out.zero_();
    g[0] /= corners;
  }
  const int64_t rows = B * D * H;
  // L1: slabs of hc rows, one per thread for a single item (longer contiguous runs per plane were faster)
  const int64_t hc = std::max<int64_t>(1, std::min<int64_t>(H, B * H / at::get_num_threads()));
  const int64_t slabs_per_item = (H + hc - 1) / hc;
  AT_DISPATCH_FLOATING_TYPES_AND2(at::kHalf, at::kBFloat16, x.scalar_type(), "tv_backward_cpu", [&] {
    const scalar_t* p = x.data_ptr<scalar_t>();
    scalar_t* q = out.data_ptr<scalar_t>();
    if (mode == TV_L1) {
      at::parallel_for(0, B * slabs_per_item, 1, [&](int64_t t0, int64_t t1) {
        for (int64_t t = t0; t < t1; ++t) {
          const int64_t b = t / slabs_per_item, h0 = (t % slabs_per_item) * hc;
          tv_l1_backward_slab(p, q, D, H, W, b, h0, std::min(H, h0 + hc), g);
        }
      });
      return;
    }
    at::parallel_for(0, rows, std::max<int64_t>(1, 4096 / std::max<int64_t>(W, 1)), [&](int64_t r0, int64_t r1) {
      tv_backward_rows(p, q, D, H, W, r0, r1, mode, eps, g);
    });
  });
  return out;
}

// ---- trilinear ---------------------------------------------------------------------------
// Corner k = 4i + 2j + l has weight (i ? u : 1-u)(j ? v : 1-v)(l ? w : 1-w), with (u, v, w) = (p + 1) / 2.

template <typename A>
inline void corner_weights(A u, A v, A w, A* wk, A* du, A* dv, A* dw) {
  for (int k = 0; k < 8; ++k) {
    const int i = k >> 2, j = (k >> 1) & 1, l = k & 1;
    const A fu = i ? u : 1 - u, fv = j ? v : 1 - v, fw = l ? w : 1 - w;
    const A su = i ? 1 : -1, sv = j ? 1 : -1, sw = l ? 1 : -1;
    wk[k] = fu * fv * fw;
    if (du) {
      du[k] = su * fv * fw;
      dv[k] = fu * sv * fw;
      dw[k] = fu * fv * sw;
    }
  }
}

at::Tensor trilinear_forward_cpu(const at::Tensor& feats_, const at::Tensor& points_) {
  TORCH_CHECK(feats_.dim() == 3 && feats_.size(1) == 8, "kernelhub_cuda_ext::trilinear_forward: argument 'feats' must be [N, 8, F]");
  TORCH_CHECK(points_.dim() == 2 && points_.size(1) == 3 && points_.size(0) == feats_.size(0),
              "kernelhub_cuda_ext::trilinear_forward: argument 'points' must be [N, 3]");
  const at::Tensor feats = feats_.contiguous(), points = points_.contiguous();
  const int64_t N = feats.size(0), F = feats.size(2);
  at::Tensor out = at::empty({N, F}, feats.options());
  AT_DISPATCH_FLOATING_TYPES_AND2(at::kHalf, at::kBFloat16, feats.scalar_type(), "trilinear_forward_cpu", [&] {
    using A = acc_t<scalar_t>;
    const scalar_t* f = feats.data_ptr<scalar_t>();
    const scalar_t* pt = points.data_ptr<scalar_t>();
    scalar_t* o = out.data_ptr<scalar_t>();
    at::parallel_for(0, N, std::max<int64_t>(1, 2048 / std::max<int64_t>(F, 1)), [&](int64_t n0, int64_t n1) {
      for (int64_t n = n0; n < n1; ++n) {
        A wk[8];
        corner_weights<A>((static_cast<A>(pt[n * 3]) + 1) / 2, (static_cast<A>(pt[n * 3 + 1]) + 1) / 2,
                          (static_cast<A>(pt[n * 3 + 2]) + 1) / 2, wk, nullptr, nullptr, nullptr);
        const scalar_t* fn = f + n * 8 * F;
_Pragma("omp simd")
        for (int64_t c = 0; c < F; ++c) {
          A s = 0;
          for (int k = 0; k < 8; ++k) s += wk[k] * static_cast<A>(fn[k * F + c]);
          o[n * F + c] = static_cast<scalar_t>(s);
        }
      }
    });
  });
  return out;
}

std::tuple<at::Tensor, at::Tensor> trilinear_backward_cpu(const at::Tensor& grad_, const at::Tensor& feats_,
                                                          const at::Tensor& points_, bool need_feats, bool need_points) {
  const at::Tensor grad = grad_.contiguous(), feats = feats_.contiguous(), points = points_.contiguous();
  const int64_t N = feats.size(0), F = feats.size(2);
  at::Tensor gf = need_feats ? at::empty_like(feats) : at::empty({0}, feats.options());
  at::Tensor gp = need_points ? at::empty_like(points) : at::empty({0}, points.options());
  AT_DISPATCH_FLOATING_TYPES_AND2(at::kHalf, at::kBFloat16, feats.scalar_type(), "trilinear_backward_cpu", [&] {
    using A = acc_t<scalar_t>;
    const scalar_t* f = feats.data_ptr<scalar_t>();
    const scalar_t* pt = points.data_ptr<scalar_t>();
    const scalar_t* g = grad.data_ptr<scalar_t>();
    scalar_t* gfp = need_feats ? gf.data_ptr<scalar_t>() : nullptr;
    scalar_t* gpp = need_points ? gp.data_ptr<scalar_t>() : nullptr;
    at::parallel_for(0, N, std::max<int64_t>(1, 2048 / std::max<int64_t>(F, 1)), [&](int64_t n0, int64_t n1) {
      for (int64_t n = n0; n < n1; ++n) {
        A wk[8], du[8], dv[8], dw[8];
        corner_weights<A>((static_cast<A>(pt[n * 3]) + 1) / 2, (static_cast<A>(pt[n * 3 + 1]) + 1) / 2,
                          (static_cast<A>(pt[n * 3 + 2]) + 1) / 2, wk, du, dv, dw);
        const scalar_t* gn = g + n * F;
        if (need_feats) {
          for (int k = 0; k < 8; ++k) {
            scalar_t* o = gfp + (n * 8 + k) * F;
_Pragma("omp simd")
            for (int64_t c = 0; c < F; ++c) o[c] = static_cast<scalar_t>(wk[k] * static_cast<A>(gn[c]));
          }
        }
        if (need_points) {
          const scalar_t* fn = f + n * 8 * F;
          A su = 0, sv = 0, sw = 0;
_Pragma("omp simd reduction(+ : su, sv, sw)")
          for (int64_t c = 0; c < F; ++c) {
            A eu = 0, ev = 0, ew = 0;
            for (int k = 0; k < 8; ++k) {
              const A fv = static_cast<A>(fn[k * F + c]);
              eu += du[k] * fv;
              ev += dv[k] * fv;
              ew += dw[k] * fv;
            }
            const A gc = static_cast<A>(gn[c]);
            su += gc * eu;
            sv += gc * ev;
            sw += gc * ew;
          }
          gpp[n * 3] = static_cast<scalar_t>(su / 2);  // du/dp = 1/2
          gpp[n * 3 + 1] = static_cast<scalar_t>(sv / 2);
          gpp[n * 3 + 2] = static_cast<scalar_t>(sw / 2);
        }
      }
    });
  });
  return {gf, gp};
}

// ---- Tikhonov: pixels in parallel, each with tikhonov_pixel.h --------------------------------

at::Tensor tikhonov_forward_cpu(const at::Tensor& M, double lam) {
  TORCH_CHECK(M.dim() == 3 && M.size(1) == 2, "kernelhub_cuda_ext::tikhonov_forward: argument 'M' must be [P, 2, Z]");
  const int64_t P = M.size(0), Z = M.size(2);
  at::Tensor out = at::empty(M.sizes(), M.options());  // contiguous; M is read through its strides
  const PixelStrides ms = pixel_strides(M);
  AT_DISPATCH_FLOATING_AND_COMPLEX_TYPES(M.scalar_type(), "tikhonov_forward_cpu", [&] {
    const scalar_t* m = M.data_ptr<scalar_t>();
    scalar_t* o = out.data_ptr<scalar_t>();
    with_flag(M.stride(2) == 1, [&](auto unit_z) {
      at::parallel_for(0, P, 64, [&](int64_t p0, int64_t p1) {
        for (int64_t p = p0; p < p1; ++p)
          tikhonov_pixel_forward(PixelEntries(PixelRows<scalar_t, unit_z.value>(m, ms, p), Z), o + p * 2 * Z,
                                 o + p * 2 * Z + Z, lam);
      });
    });
  });
  return out;
}

at::Tensor tikhonov_backward_cpu(const at::Tensor& G, const at::Tensor& M, double lam) {
  const int64_t P = M.size(0), Z = M.size(2);
  at::Tensor out = at::empty(M.sizes(), M.options());
  const PixelStrides ms = pixel_strides(M), gs = pixel_strides(G);
  AT_DISPATCH_FLOATING_AND_COMPLEX_TYPES(M.scalar_type(), "tikhonov_backward_cpu", [&] {
    const scalar_t* m = M.data_ptr<scalar_t>();
    const scalar_t* g = G.data_ptr<scalar_t>();
    scalar_t* o = out.data_ptr<scalar_t>();
    with_flag(M.stride(2) == 1 && G.stride(2) == 1, [&](auto unit_z) {
      using Rows = PixelRows<scalar_t, unit_z.value>;
      at::parallel_for(0, P, 64, [&](int64_t p0, int64_t p1) {
        for (int64_t p = p0; p < p1; ++p) {
          const int64_t q = p * 2 * Z;
          tikhonov_pixel_backward(PixelEntries(Rows(g, gs, p), Z), PixelEntries(Rows(m, ms, p), Z), o + q, o + q + Z,
                                  lam);
        }
      });
    });
  });
  return out;
}

// ---- tilted K-Planes (kplanes_point.h): points in parallel forward; one task per t backward -------------
// A t's three planes are its own, so its task adds their gradient without atomics, in a fixed order; it
// writes its own rows of the pts-gradient partials [T, B, 3] and its rotation's gradient, and the partials
// are summed over t in order afterwards: deterministic.

at::Tensor kplanes_forward_cpu(const at::Tensor& pts, const at::Tensor& rot, const at::Tensor& planes,
                               int64_t taps, double h) {
  const KpArgs a = kp_args("kplanes_forward", pts, rot, planes, taps);
  const int64_t B = a.B, T = a.T, C = a.C;
  at::Tensor out = at::empty({taps, B, T * C}, a.pts.options());
  if (out.numel() == 0) return out;
  AT_DISPATCH_FLOATING_TYPES(a.pts.scalar_type(), "kplanes_forward_cpu", [&] {
    using A = acc_t<scalar_t>;
    const scalar_t *pt = a.pts.data_ptr<scalar_t>(), *r = a.rot.data_ptr<scalar_t>();
    const scalar_t* pl = a.planes.data_ptr<scalar_t>();
    scalar_t* o = out.data_ptr<scalar_t>();
    at::parallel_for(0, B, 256, [&](int64_t b0, int64_t b1) {
      for (int64_t b = b0; b < b1; ++b) {
        const A p[3] = {A(pt[b * 3]), A(pt[b * 3 + 1]), A(pt[b * 3 + 2])};
        for (int t = 0; t < T; ++t)
          for (int tap = 0; tap < taps; ++tap) {
            A R[9], pp[3];
            KpCorners<A> k0, k1, k2;
            kp_tap(p, r, t, tap, A(h), static_cast<int>(a.H), static_cast<int>(a.W), static_cast<int>(C), R, pp, k0,
                   k1, k2);
            scalar_t* ob = o + (tap * B + b) * T * C + t * C;
            for (int c = 0; c < C; ++c) ob[c] = static_cast<scalar_t>(kp_value(pl, k0, k1, k2, c));
          }
      }
    });
  });
  return out;
}

std::tuple<at::Tensor, at::Tensor, at::Tensor> kplanes_backward_cpu(
    const at::Tensor& grad, const at::Tensor& pts, const at::Tensor& rot, const at::Tensor& planes, int64_t taps,
    double h, bool need_planes, bool need_pts, bool need_rot) {
  const KpArgs a = kp_args("kplanes_backward", pts, rot, planes, taps, &grad);
  const int64_t B = a.B, T = a.T, C = a.C;
  const auto opts = a.pts.options().dtype(acc_dtype(a.pts));
  at::Tensor gpl = at::zeros({need_planes ? 3 * T : 0, a.H, a.W, C}, opts);
  at::Tensor gp = at::zeros({need_pts ? T : 0, B, 3}, opts);  // one partial per t
  at::Tensor gr = at::zeros({need_rot ? T : 0, 9}, opts);
  if (B > 0 && C > 0 && (need_planes || need_pts || need_rot)) {
    AT_DISPATCH_FLOATING_TYPES(a.pts.scalar_type(), "kplanes_backward_cpu", [&] {
      using A = acc_t<scalar_t>;
      const scalar_t *pt = a.pts.data_ptr<scalar_t>(), *r = a.rot.data_ptr<scalar_t>();
      const scalar_t *pl = a.planes.data_ptr<scalar_t>(), *g = grad.data_ptr<scalar_t>();
      A* gpl_p = need_planes ? gpl.data_ptr<A>() : nullptr;
      A* gp_p = need_pts ? gp.data_ptr<A>() : nullptr;
      A* gr_p = need_rot ? gr.data_ptr<A>() : nullptr;
      const int64_t s0 = grad.stride(0), s1 = grad.stride(1), s2 = grad.stride(2);
      const auto add = [gpl_p](int64_t offset, A value) { gpl_p[offset] += value; };
      at::parallel_for(0, T, 1, [&](int64_t t0, int64_t t1) {
        for (int t = static_cast<int>(t0); t < t1; ++t)
          for (int64_t b = 0; b < B; ++b) {
            const A p[3] = {A(pt[b * 3]), A(pt[b * 3 + 1]), A(pt[b * 3 + 2])};
            A unused[3] = {0, 0, 0};
            for (int tap = 0; tap < taps; ++tap) {
              A R[9], pp[3], dq[3] = {0, 0, 0};
              KpCorners<A> k0, k1, k2;
              kp_tap(p, r, t, tap, A(h), static_cast<int>(a.H), static_cast<int>(a.W), static_cast<int>(C), R, pp,
                     k0, k1, k2);
              const scalar_t* gt = g + tap * s0 + b * s1 + t * C * s2;
              for (int c = 0; c < C; ++c) kp_channel_backward(pl, k0, k1, k2, c, A(gt[c * s2]), need_planes, dq, add);
              kp_point_grads(R, pp, dq, need_pts ? gp_p + (t * B + b) * 3 : unused, need_rot ? gr_p + t * 9 : nullptr);
            }
          }
      });
    });
  }
  return kp_grads(planes, pts, rot, gpl, need_pts ? gp.sum(0) : gp, gr, need_planes, need_pts, need_rot);
}

}  // namespace

TORCH_LIBRARY(kernelhub_cuda_ext, m) {
  m.def("tv_forward(Tensor x, int mode, float eps, Tensor? weights=None) -> Tensor");
  m.def("tv_backward(Tensor grad, Tensor x, int mode, float eps, Tensor? weights=None) -> Tensor");
  m.def("trilinear_forward(Tensor feats, Tensor points) -> Tensor");
  m.def("trilinear_backward(Tensor grad, Tensor feats, Tensor points, bool need_feats, bool need_points) -> (Tensor, Tensor)");
  // pts [B, 3], rotations [T, 3, 3], planes [3T, C, H, W]; taps 1 or 4 -> [taps, B, T*C]
  m.def("kplanes_forward(Tensor pts, Tensor rotations, Tensor planes, int taps, float h) -> Tensor");
  m.def("kplanes_backward(Tensor grad, Tensor pts, Tensor rotations, Tensor planes, int taps, float h, "
        "bool need_planes, bool need_pts, bool need_rot) -> (Tensor, Tensor, Tensor)");
  m.def("tikhonov_forward(Tensor M, float lam) -> Tensor");
  m.def("tikhonov_backward(Tensor grad, Tensor M, float lam) -> Tensor");
  m.def("semiconv_forward(Tensor img, Tensor kernel, int semifield, float param, int groups, int[] stride, "
        "int[] padding, int[] dilation, int[] out_size, bool flip) -> Tensor");
  m.def("semiconv_backward(Tensor grad, Tensor img, Tensor kernel, int semifield, float param, int groups, "
        "int[] stride, int[] padding, int[] dilation, bool need_img, bool need_kernel, bool flip) -> (Tensor, Tensor)");
  // CUDA only: the forward and the winners its backward reads (semiconv.cu, semiconv_cuda.h), and that backward
  m.def("semiconv_forward_saving(Tensor img, Tensor kernel, int semifield, float param, int groups, int[] stride, "
        "int[] padding, int[] dilation, int[] out_size, bool flip) -> (Tensor, Tensor)");
  m.def("semiconv_backward_saved(Tensor grad, Tensor saved, Tensor img, Tensor kernel, int semifield, float param, "
        "int groups, int[] stride, int[] padding, int[] dilation, bool need_img, bool need_kernel, bool flip) -> "
        "(Tensor, Tensor)");
}

TORCH_LIBRARY_IMPL(kernelhub_cuda_ext, CPU, m) {
  m.impl("tv_forward", &tv_forward_cpu);
  m.impl("tv_backward", &tv_backward_cpu);
  m.impl("trilinear_forward", &trilinear_forward_cpu);
  m.impl("trilinear_backward", &trilinear_backward_cpu);
  m.impl("kplanes_forward", &kplanes_forward_cpu);
  m.impl("kplanes_backward", &kplanes_backward_cpu);
  m.impl("tikhonov_forward", &tikhonov_forward_cpu);
  m.impl("tikhonov_backward", &tikhonov_backward_cpu);
}

}  // namespace kernelhub_cuda_ext
