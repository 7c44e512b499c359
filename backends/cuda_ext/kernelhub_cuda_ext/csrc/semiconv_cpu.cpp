// semiconv on the CPU (semiconv.h has the contract). A row of outputs (b, oc, od, oh) at a time: for each
// (c, tap) the row's outputs read one image row at a fixed offset, so the inner loop over ow is a
// branch-free SIMD loop in the interior and a constant (the semifield's zero) at the padded ends.
// Forward: parallel over output rows. Backward: the row's statistics again (no saved state), then a second
// walk over the taps that hands out the gradient; parallel over (b, group), so no two tasks write the same
// img element, with the kernel's gradient in per-batch partials summed in order (deterministic).
#include "ops.h"
#include "semiconv.h"

#include <ATen/Dispatch.h>
#include <ATen/OpMathType.h>
#include <ATen/Parallel.h>

#include <algorithm>
#include <vector>

namespace kernelhub_cuda_ext {
namespace {

// The taps of output row (b, oc, od, oh) in (c, tap) order: f(xrow, off, lo, hi, koff). For lo <= ow < hi the
// output reads img[xrow + ow * s + off]; every other ow reads the semifield's zero (all of them when the
// tap's row is padding: lo == hi == 0).
template <typename F>
inline void row_taps(const ScGeo& g, int64_t b, int64_t oc, int64_t od, int64_t oh, F&& f) {
  const int64_t grp = oc / g.Og, s2 = g.s[2];
  for (int64_t c = 0; c < g.Cg; ++c) {
    const int64_t kc = (oc * g.Cg + c) * g.taps();
    int64_t t = 0;  // the tap in window order
    for (int64_t kd = 0; kd < g.KD; ++kd) {
      const int64_t z = od * g.s[0] - g.p[0] + kd * g.d[0];
      for (int64_t kh = 0; kh < g.KH; ++kh) {
        const int64_t y = oh * g.s[1] - g.p[1] + kh * g.d[1];
        const bool in = z >= 0 && z < g.D && y >= 0 && y < g.H;
        const int64_t xrow = in ? (((b * g.C + grp * g.Cg + c) * g.D + z) * g.H + y) * g.W : 0;
        for (int64_t kw = 0; kw < g.KW; ++kw, ++t) {
          const int64_t off = kw * g.d[2] - g.p[2];
          int64_t lo = 0, hi = 0;
          if (in) {
            lo = std::min(off >= 0 ? int64_t(0) : (-off + s2 - 1) / s2, g.OW);
            hi = std::max(lo, std::min(g.W - off <= 0 ? int64_t(0) : (g.W - off + s2 - 1) / s2, g.OW));
          }
          f(xrow, off, lo, hi, kc + g.ktap(t));
        }
      }
    }
  }
}

// step(ow, x value) over a whole output row for one tap; it returns the img gradient of the product, which
// is added to gx where the tap reads the image (gx null: the forward, nothing to add)
template <typename T, typename A, typename S>
inline void row_apply(const T* x, int64_t xrow, int64_t off, int64_t lo, int64_t hi, int64_t OW, int64_t s2, A zero,
                      A* __restrict gx, S&& step) {
  for (int64_t ow = 0; ow < lo; ++ow) step(ow, zero);
  if (s2 == 1) {
    const T* __restrict xs = x + xrow + off;
    A* __restrict gs = gx ? gx + xrow + off : nullptr;
    if (gs) {
#pragma omp simd
      for (int64_t ow = lo; ow < hi; ++ow) gs[ow] += step(ow, static_cast<A>(xs[ow]));
    } else {
#pragma omp simd
      for (int64_t ow = lo; ow < hi; ++ow) step(ow, static_cast<A>(xs[ow]));
    }
  } else {
    for (int64_t ow = lo; ow < hi; ++ow) {
      const A dx = step(ow, static_cast<A>(x[xrow + ow * s2 + off]));
      if (gx) gx[xrow + ow * s2 + off] += dx;
    }
  }
  for (int64_t ow = hi; ow < OW; ++ow) step(ow, zero);
}

// The statistics of one output row: best (max/min; log: the max of mu*a), acc (the sums), nan (a NaN seen)
template <int SF, typename T, typename A>
void row_stats(const ScGeo& g, const T* x, const T* k, int64_t b, int64_t oc, int64_t od, int64_t oh, A zero,
               A prm, A* __restrict best, A* __restrict acc, A* __restrict nan) {
  const int64_t OW = g.OW, s2 = g.s[2];
  const A start = SF == SC_MIN ? A(INFINITY) : A(-INFINITY);
  std::fill(best, best + OW, start);
  std::fill(acc, acc + OW, A(0));
  std::fill(nan, nan + OW, A(0));
  row_taps(g, b, oc, od, oh, [&](int64_t xrow, int64_t off, int64_t lo, int64_t hi, int64_t koff) {
    const A kv = static_cast<A>(k[koff]);
    row_apply<T, A>(x, xrow, off, lo, hi, OW, s2, zero, nullptr, [&](int64_t ow, A xv) {
      const A a = sc_combine<SF>(xv, kv);
      if constexpr (SF == SC_MAX) { nan[ow] = a != a ? A(1) : nan[ow]; best[ow] = a > best[ow] ? a : best[ow]; }
      else if constexpr (SF == SC_MIN) { nan[ow] = a != a ? A(1) : nan[ow]; best[ow] = a < best[ow] ? a : best[ow]; }
      else if constexpr (SF == SC_LINEAR) acc[ow] += a;
      else if constexpr (SF == SC_ROOT) acc[ow] += std::pow(a, prm);
      else { const A v = prm * a; nan[ow] = v != v ? A(1) : nan[ow]; best[ow] = v > best[ow] ? v : best[ow]; }
      return A(0);
    });
  });
  if constexpr (SF == SC_LOG) {  // the sum of exp(mu a - shift), a second walk
    row_taps(g, b, oc, od, oh, [&](int64_t xrow, int64_t off, int64_t lo, int64_t hi, int64_t koff) {
      const A kv = static_cast<A>(k[koff]);
      row_apply<T, A>(x, xrow, off, lo, hi, OW, s2, zero, nullptr, [&](int64_t ow, A xv) {
        acc[ow] += std::exp(prm * sc_combine<SF>(xv, kv) - sc_shift(best[ow]));
        return A(0);
      });
    });
  }
}

template <int SF, typename T>
void forward_impl(const ScGeo& g, const T* x, const T* k, T* out, double zero_, double prm_) {
  using A = at::opmath_type<T>;
  const A zero = A(zero_), prm = A(prm_);
  const int64_t rows = g.B * g.O * g.OD * g.OH;
  const int64_t grain = std::max<int64_t>(1, 65536 / (g.OW * g.Cg * g.taps()));  // ~64k products a task
  at::parallel_for(0, rows, grain, [&](int64_t lo, int64_t hi) {
    std::vector<A> buf(5 * g.OW);  // best, acc, nan, weight, kernel gradient
    A *best = buf.data(), *acc = best + g.OW, *nan = acc + g.OW;
    for (int64_t r = lo; r < hi; ++r) {
      const int64_t oh = r % g.OH, od = (r / g.OH) % g.OD, oc = (r / (g.OH * g.OD)) % g.O, b = r / (g.OH * g.OD * g.O);
      row_stats<SF, T, A>(g, x, k, b, oc, od, oh, zero, prm, best, acc, nan);
      T* orow = out + r * g.OW;
      for (int64_t ow = 0; ow < g.OW; ++ow) orow[ow] = static_cast<T>(sc_value<SF>(best[ow], acc[ow], nan[ow] != A(0), prm));
    }
  });
}

// One output row's gradient: its statistics, then a walk over the taps in (c, tap) order
template <int SF, typename T, typename A>
void row_backward(const ScGeo& g, const T* x, const T* k, const T* grow, int64_t b, int64_t oc, int64_t od,
                  int64_t oh, A zero, A prm, A* __restrict buf, A* __restrict gx, A* __restrict gk) {
  const int64_t OW = g.OW, s2 = g.s[2];
  A *best = buf, *acc = buf + OW, *nan = buf + 2 * OW, *wgt = buf + 3 * OW, *dks = buf + 4 * OW;
  row_stats<SF, T, A>(g, x, k, b, oc, od, oh, zero, prm, best, acc, nan);
  for (int64_t ow = 0; ow < OW; ++ow) {
    const A gv = static_cast<A>(grow[ow]);
    if constexpr (SF == SC_MAX || SF == SC_MIN) {
      best[ow] = nan[ow] != A(0) ? A(NAN) : best[ow];  // equal to no product: no gradient
      nan[ow] = A(0);  // from here: the winner was found
      wgt[ow] = gv;
    } else if constexpr (SF == SC_ROOT) {
      wgt[ow] = sc_root_grad(gv, acc[ow], prm);
    } else if constexpr (SF == SC_LOG) {
      best[ow] = nan[ow] != A(0) ? A(NAN) : std::log(acc[ow]) + sc_shift(best[ow]);  // the log-sum-exp
      wgt[ow] = gv;
    } else {
      wgt[ow] = gv;
    }
  }
  row_taps(g, b, oc, od, oh, [&](int64_t xrow, int64_t off, int64_t lo, int64_t hi, int64_t koff) {
    const A kv = static_cast<A>(k[koff]);
    row_apply<T, A>(x, xrow, off, lo, hi, OW, s2, zero, gx, [&](int64_t ow, A xv) {
      const A a = sc_combine<SF>(xv, kv);
      A dx, dkv;
      if constexpr (SF == SC_MAX || SF == SC_MIN) {
        const A hit = ((nan[ow] == A(0)) & (a == best[ow])) ? A(1) : A(0);  // the first winner only
        nan[ow] += hit;
        dx = hit * wgt[ow];
        dkv = SF == SC_MIN ? -dx : dx;
      } else if constexpr (SF == SC_LOG) {
        dx = dkv = sc_smooth_weight<SF>(a, wgt[ow], prm, best[ow]);
      } else {
        const A w = sc_smooth_weight<SF>(a, wgt[ow], prm, A(0));
        dx = w * kv;
        dkv = w * xv;
      }
      dks[ow] = dkv;  // summed below, in order: the SIMD loop has no reduction
      return dx;
    });
    A dk = 0;
    for (int64_t ow = 0; ow < OW; ++ow) dk += dks[ow];
    gk[koff] += dk;
  });
}

template <int SF, typename T>
void backward_impl(const ScGeo& g, const T* x, const T* k, const T* go, at::opmath_type<T>* gx,
                   at::opmath_type<T>* gkp, double zero_, double prm_) {
  using A = at::opmath_type<T>;
  const A zero = A(zero_), prm = A(prm_);
  const int64_t G = g.O / g.Og, ksize = g.O * g.Cg * g.taps();
  at::parallel_for(0, g.B * G, 1, [&](int64_t lo, int64_t hi) {
    std::vector<A> buf(5 * g.OW);  // best, acc, nan, weight, kernel gradient
    for (int64_t bg = lo; bg < hi; ++bg) {
      const int64_t b = bg / G, grp = bg % G;
      for (int64_t oc = grp * g.Og; oc < (grp + 1) * g.Og; ++oc) {
        for (int64_t od = 0; od < g.OD; ++od) {
          for (int64_t oh = 0; oh < g.OH; ++oh) {
            const T* grow = go + (((b * g.O + oc) * g.OD + od) * g.OH + oh) * g.OW;
            row_backward<SF, T, A>(g, x, k, grow, b, oc, od, oh, zero, prm, buf.data(), gx, gkp + b * ksize);
          }
        }
      }
    }
  });
}

at::Tensor semiconv_forward_cpu(const at::Tensor& img_, const at::Tensor& ker_, int64_t sf, double param,
                                int64_t groups, at::IntArrayRef stride, at::IntArrayRef pad, at::IntArrayRef dil,
                                at::IntArrayRef out_size, bool flip) {
  const at::Tensor img = img_.contiguous(), ker = ker_.contiguous();
  const ScGeo g = sc_geo("semiconv_forward", img, ker, groups, stride, pad, dil, out_size, flip);
  auto out = at::empty({g.B, g.O, g.OD, g.OH, g.OW}, img.options());
  if (out.numel() == 0) return out;
  AT_DISPATCH_FLOATING_TYPES_AND2(at::kHalf, at::kBFloat16, img.scalar_type(), "semiconv_forward_cpu", [&] {
    sc_dispatch(sf, [&](auto SF) {
      forward_impl<decltype(SF)::value, scalar_t>(g, img.data_ptr<scalar_t>(), ker.data_ptr<scalar_t>(),
                                                  out.data_ptr<scalar_t>(), sc_zero(sf, param), param);
    });
  });
  return out;
}

std::tuple<at::Tensor, at::Tensor> semiconv_backward_cpu(const at::Tensor& grad_, const at::Tensor& img_,
                                                         const at::Tensor& ker_, int64_t sf, double param,
                                                         int64_t groups, at::IntArrayRef stride, at::IntArrayRef pad,
                                                         at::IntArrayRef dil, bool need_img, bool need_kernel,
                                                         bool flip) {
  const at::Tensor img = img_.contiguous(), ker = ker_.contiguous(), grad = grad_.contiguous();
  const ScGeo g = sc_backward_geo(grad, img, ker, groups, stride, pad, dil, flip);
  auto gx = at::zeros(img.sizes(), img.options().dtype(acc_dtype(img)));
  auto gkp = at::zeros({g.B, g.O, g.Cg, g.KD, g.KH, g.KW}, img.options().dtype(acc_dtype(img)));
  if (grad.numel() > 0) {
    AT_DISPATCH_FLOATING_TYPES_AND2(at::kHalf, at::kBFloat16, img.scalar_type(), "semiconv_backward_cpu", [&] {
      using A = at::opmath_type<scalar_t>;
      sc_dispatch(sf, [&](auto SF) {
        backward_impl<decltype(SF)::value, scalar_t>(g, img.data_ptr<scalar_t>(), ker.data_ptr<scalar_t>(),
                                                     grad.data_ptr<scalar_t>(), gx.data_ptr<A>(), gkp.data_ptr<A>(),
                                                     sc_zero(sf, param), param);
      });
    });
  }
  return {need_img ? gx.to(img.scalar_type()) : at::empty({0}, img.options()),
          need_kernel ? gkp.sum(0).to(ker.scalar_type()) : at::empty({0}, ker.options())};
}

}  // namespace

TORCH_LIBRARY_IMPL(kernelhub_cuda_ext, CPU, m) {
  m.impl("semiconv_forward", &semiconv_forward_cpu);
  m.impl("semiconv_backward", &semiconv_backward_cpu);
}

}  // namespace kernelhub_cuda_ext
