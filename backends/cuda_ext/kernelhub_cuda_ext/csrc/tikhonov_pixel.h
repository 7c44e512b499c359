// kernelhub_cuda_ext: the per-pixel Tikhonov algebra, shared by the CPU and CUDA kernels.
//
// Per pixel, with rows M0, M1 of Z entries: a = sum|M0|^2, c = sum|M1|^2, b = sum M0 conj(M1); all in double
// (complex<double> for a complex M; double for a real one, whose sums are real: its algebra is then a quarter of
// the complex one's multiplies and holds half the registers, `Algebra`). Forward: det = lam (a + c + lam) + a |r|^2 with r = M1 - (conj(b)/a) M0, which does not
// cancel when the rows are nearly parallel. Backward formulas: kernelhub_triton/tikhonov.py's docstring.
//
// M (and the backward's upstream gradient) are read through their strides, so a permuted view (pixels
// trailing in memory, as in [2, Z, Y, X] moved to [Y, X, 2, Z]) needs no copy; the outputs are contiguous.
//
// Scale: where the largest of a, c and lam is beyond 2^+-500, the products of the 2x2 algebra (lam^2, a |r|^2, A C)
// would overflow or underflow a double although W is representable (lam = 1e300 gave W = 0; |M| = 1e80 likewise).
// There the algebra runs on M' = M / 2^k, lam' = lam / 4^k with 4^k near that largest value, so every sum is at most
// about 1, and the results are scaled back exactly (W = W'(M', lam') / 2^k; dM = dM'(G, M', lam') / 4^k).
// Within that range k = 0 and the arithmetic is the unscaled one, bit for bit.
//
// A pixel may be shared by several workers (the CUDA kernel gives it 8 lanes of a warp; the CPU one
// thread): each handles the entries z = share.first, first + step, ... and `share.sum(v, n)` turns its n
// partial sums into the pixel's totals (a shuffle across the lanes; nothing on the CPU).
#pragma once
#include <c10/macros/Macros.h>
#include <c10/util/complex.h>

#include <cmath>
#include <cstdint>
#include <type_traits>

namespace kernelhub_cuda_ext {

using cd = c10::complex<double>;

// The type a pixel's algebra runs in: double for a real input, complex<double> for a complex one.
template <typename T>
struct Algebra {
  using type = double;
  static constexpr bool complex = false;
};
template <typename T>
struct Algebra<c10::complex<T>> {
  using type = cd;
  static constexpr bool complex = true;
};

template <typename T>
C10_HOST_DEVICE inline double to_algebra(T x) { return static_cast<double>(x); }
template <typename T>
C10_HOST_DEVICE inline cd to_algebra(c10::complex<T> z) { return cd(double(z.real()), double(z.imag())); }
template <typename T>
C10_HOST_DEVICE inline void store(T* p, double x) { *p = static_cast<T>(x); }
template <typename T>
C10_HOST_DEVICE inline void store(c10::complex<T>* p, cd z) { *p = c10::complex<T>(T(z.real()), T(z.imag())); }
C10_HOST_DEVICE inline cd cj(cd z) { return cd(z.real(), -z.imag()); }
C10_HOST_DEVICE inline double cj(double x) { return x; }
C10_HOST_DEVICE inline double abs2(cd z) { return z.real() * z.real() + z.imag() * z.imag(); }
C10_HOST_DEVICE inline double abs2(double x) { return x * x; }
C10_HOST_DEVICE inline double re(cd z) { return z.real(); }
C10_HOST_DEVICE inline double re(double x) { return x; }
C10_HOST_DEVICE inline double im(cd z) { return z.imag(); }
C10_HOST_DEVICE inline double im(double) { return 0.0; }
// The algebra's value of real part r and imaginary part i (i is dropped for a real algebra, where it is 0).
template <typename V>
C10_HOST_DEVICE inline V value(double r, double i) {
  if constexpr (std::is_same_v<V, cd>)
    return cd(r, i);
  else
    return r;
}
// x 2^e and z 2^e where Scaled (the extreme magnitudes, Scale above), x and z themselves elsewhere: the common case
// runs no ldexp, which costs the kernels more than their loads (an ldexp is a few dozen instructions on a GPU).
template <bool Scaled>
C10_HOST_DEVICE inline double pow2(double x, int e) {
  if constexpr (Scaled)
    return ::ldexp(x, e);
  else
    return x;
}
template <bool Scaled>
C10_HOST_DEVICE inline cd pow2(cd z, int e) {
  return cd(pow2<Scaled>(z.real(), e), pow2<Scaled>(z.imag(), e));
}

// Calls f(std::true_type()) where `on`, else f(std::false_type()): a run-time condition made a compile-time one, so
// that each case compiles without the other's work: the per-entry passes without the scaling where k == 0 (Scale
// above; k is the pixel's, the same in every lane that shares it, so no lane of a pixel branches apart from the
// others), a unit z stride, cuda.cu's staged kernels.
template <typename F>
C10_HOST_DEVICE inline void with_flag(bool on, F&& f) {
  if (on)
    f(std::true_type());
  else
    f(std::false_type());
}

// k of the scale above: half the exponent of the largest of a, c, lam (rounded down) where that exponent is 500 or
// more, or -500 or less; else 0 (kernelhub_triton/tikhonov.py's _scale, the same rule).
C10_HOST_DEVICE inline int tikhonov_scale(double a, double c, double lam) {
  const double m = a > c ? (a > lam ? a : lam) : (c > lam ? c : lam);
  if (!(m > 0 && m <= 0x1.fffffffffffffp+1023)) return 0;  // NaN stays NaN whatever the scale
  if (m < 0x1p500 && m >= 0x1p-499) return 0;  // the exponent within (-500, 500): no ilogb needed
  return ::ilogb(m) >> 1;
}

// Element strides of a [P, 2, Z] tensor.
struct PixelStrides {
  int64_t pixel, row, z;
};

// Host side: the strides of t (an at::Tensor; a template so that this header needs no ATen).
template <typename Tensor>
inline PixelStrides pixel_strides(const Tensor& t) {
  return {t.stride(0), t.stride(1), t.stride(2)};
}

// One pixel's two rows of a [P, 2, Z] tensor, read through its strides: rows(r, z) is entry z of row r.
// UnitZ: the z stride is known to be 1 at compile time (a contiguous M: no multiply per entry).
template <typename T, bool UnitZ = false>
struct PixelRows {
  using Scalar = T;
  using Value = typename Algebra<T>::type;
  const T* p;
  int64_t row, z;
  C10_HOST_DEVICE PixelRows(const T* base, const PixelStrides& s, int64_t pixel)
      : p(base + pixel * s.pixel), row(s.row), z(s.z) {}
  C10_HOST_DEVICE Value operator()(int r, int64_t k) const { return to_algebra(p[r * row + (UnitZ ? k : k * z)]); }
};

#if defined(__CUDA_ARCH__)
#define KERNELHUB_UNROLL _Pragma("unroll")
#else
#define KERNELHUB_UNROLL
#endif

// One worker's entries of a pixel's two rows: its j-th is entry z(j) = first + j * step, for j < count() where
// has(j). N > 0: at most N of them (Z <= first + N * step), each read once, when this is made, into registers (the
// CUDA kernel: all of a thread's loads in flight together, none repeated by the later passes; loops over j unroll).
// N = 0: any number, read from memory each time a pass uses them (the CPU kernel).
template <typename Rows, int N = 0>
struct PixelEntries {
  using Scalar = typename Rows::Scalar;
  using Value = typename Rows::Value;
  static constexpr bool complex = Algebra<Scalar>::complex;
  Rows rows;
  int64_t first, step, Z;
  Value v[2][N > 0 ? N : 1];
  C10_HOST_DEVICE PixelEntries(Rows rows_, int64_t Z_, int64_t first_ = 0, int64_t step_ = 1)
      : rows(rows_), first(first_), step(step_), Z(Z_) {
    if constexpr (N > 0) {
      KERNELHUB_UNROLL
      for (int j = 0; j < N; ++j)
        for (int r = 0; r < 2; ++r) v[r][j] = has(j) ? rows(r, z(j)) : Value(0);
    }
  }
  C10_HOST_DEVICE int64_t count() const { return N > 0 ? N : (Z > first ? (Z - first + step - 1) / step : 0); }
  C10_HOST_DEVICE bool has(int64_t j) const { return N == 0 || first + j * step < Z; }
  C10_HOST_DEVICE int64_t z(int64_t j) const { return first + j * step; }
  C10_HOST_DEVICE Value operator()(int r, int64_t j) const {
    if constexpr (N > 0)
      return v[r][j];
    else
      return rows(r, z(j));
  }
};

// One worker's part of a pixel: entries first, first + step, ...; sum() completes partial sums in place.
struct Whole {
  int64_t first = 0, step = 1;
  C10_HOST_DEVICE void sum(double*, int) const {}
};

// W = (M M^H + lam I)^-1 M for one pixel: M's entries m (this worker's) in, rows w0, w1 out.
template <typename Entries, typename Share = Whole>
C10_HOST_DEVICE inline void tikhonov_pixel_forward(const Entries& m, typename Entries::Scalar* w0,
                                                   typename Entries::Scalar* w1, double lam, Share share = Share()) {
  using V = typename Entries::Value;
  double s[4] = {0, 0, 0, 0};  // a, c, b (its imaginary part last: a real M's sums are the first three)
  KERNELHUB_UNROLL
  for (int64_t j = 0; j < m.count(); ++j) {
    if (!m.has(j)) continue;
    const V x0 = m(0, j), x1 = m(1, j), bz = x0 * cj(x1);
    s[0] += abs2(x0);
    s[1] += abs2(x1);
    s[2] += re(bz);
    if constexpr (Entries::complex) s[3] += im(bz);
  }
  share.sum(s, Entries::complex ? 4 : 3);
  const int k = tikhonov_scale(s[0], s[1], lam);  // 0 but at extreme magnitudes (see Scale above)
  double a = s[0], c = s[1], l = lam;
  V b = value<V>(s[2], s[3]);
  with_flag(k != 0, [&](auto on) {
    a = pow2<on.value>(a, -2 * k), c = pow2<on.value>(c, -2 * k), l = pow2<on.value>(l, -2 * k);
    b = pow2<on.value>(b, -2 * k);
  });
  const V kappa = a > 0 ? cj(b) * (1.0 / a) : V(0);
  double rr = 0;
  KERNELHUB_UNROLL
  for (int64_t j = 0; j < m.count(); ++j)
    if (m.has(j)) rr += abs2(m(1, j) - kappa * m(0, j));
  share.sum(&rr, 1);
  with_flag(k != 0, [&](auto on) {
    rr = pow2<on.value>(rr, -2 * k);
    const double inv = 1.0 / (l * (a + c + l) + a * rr);
    KERNELHUB_UNROLL
    for (int64_t j = 0; j < m.count(); ++j) {
      if (!m.has(j)) continue;
      const V x0 = m(0, j), x1 = m(1, j);
      const V r = x1 - kappa * x0;
      // W0 = ((lam + |r|^2) M0 - b r) / det, W1 = (lam M1 + a r) / det, in the scaled terms: / 4^k
      store(w0 + m.z(j), pow2<on.value>(((l + rr) * x0 - b * r) * inv, -2 * k));
      store(w1 + m.z(j), pow2<on.value>((l * x1 + a * r) * inv, -2 * k));
    }
  });
}

// dL/dM for one pixel from the upstream gradient's entries g (torch's convention: dL/dRe + i dL/dIm) and M's m,
// both this worker's (the same first and step).
template <typename Entries, typename Share = Whole>
C10_HOST_DEVICE inline void tikhonov_pixel_backward(const Entries& g, const Entries& m, typename Entries::Scalar* d0,
                                                    typename Entries::Scalar* d1, double lam, Share share = Share()) {
  using V = typename Entries::Value;
  // a, c, then the real parts of b, p00, p01, p10, p11 (pXY = sum conj(GX) MY), then their imaginary parts (a real
  // M's sums are the first seven)
  double s[12] = {0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0};
  KERNELHUB_UNROLL
  for (int64_t j = 0; j < m.count(); ++j) {
    if (!m.has(j)) continue;
    const V x0 = m(0, j), x1 = m(1, j), y0 = cj(g(0, j)), y1 = cj(g(1, j));
    const V terms[5] = {x0 * cj(x1), y0 * x0, y0 * x1, y1 * x0, y1 * x1};
    s[0] += abs2(x0);
    s[1] += abs2(x1);
    for (int t = 0; t < 5; ++t) {
      s[2 + t] += re(terms[t]);
      if constexpr (Entries::complex) s[7 + t] += im(terms[t]);
    }
  }
  share.sum(s, Entries::complex ? 12 : 7);
  const int k = tikhonov_scale(s[0], s[1], lam);  // 0 but at extreme magnitudes (see Scale above)
  with_flag(k != 0, [&](auto on) {
    const double a = pow2<on.value>(s[0], -2 * k), c = pow2<on.value>(s[1], -2 * k), l = pow2<on.value>(lam, -2 * k);
    const V b = pow2<on.value>(value<V>(s[2], s[7]), -2 * k);
    const V p00 = pow2<on.value>(value<V>(s[3], s[8]), -k), p01 = pow2<on.value>(value<V>(s[4], s[9]), -k),
            p10 = pow2<on.value>(value<V>(s[5], s[10]), -k), p11 = pow2<on.value>(value<V>(s[6], s[11]), -k);
    const double A = a + l, C = c + l;
    const double inv = 1.0 / (A * C - abs2(b));
    const double t = (C * re(p00) - re(b * p01) + A * re(p11) - re(cj(b) * p10)) * inv;
    const double two_alpha_a = 2.0 * (re(p11) - t * C) * inv, two_alpha_c = 2.0 * (re(p00) - t * A) * inv;
    const V beta = (2.0 * t * cj(b) - p01 - cj(p10)) * inv;
    KERNELHUB_UNROLL
    for (int64_t j = 0; j < m.count(); ++j) {
      if (!m.has(j)) continue;
      const V x0 = pow2<on.value>(m(0, j), -k), x1 = pow2<on.value>(m(1, j), -k), h0 = g(0, j), h1 = g(1, j);
      store(d0 + m.z(j), pow2<on.value>((C * h0 - b * h1) * inv + two_alpha_a * x0 + cj(beta) * x1, -2 * k));
      store(d1 + m.z(j), pow2<on.value>((A * h1 - cj(b) * h0) * inv + two_alpha_c * x1 + beta * x0, -2 * k));
    }
  });
}

}  // namespace kernelhub_cuda_ext
