// kernelhub_cuda_ext: the per-pixel Tikhonov algebra, shared by the CPU and CUDA kernels.
//
// Per pixel, with rows M0, M1 of Z entries: a = sum|M0|^2, c = sum|M1|^2, b = sum M0 conj(M1); all in double
// (complex<double>). Forward: det = lam (a + c + lam) + a |r|^2 with r = M1 - (conj(b)/a) M0, which does not
// cancel when the rows are nearly parallel. Backward formulas: kernelhub_triton/tikhonov.py's docstring.
#pragma once
#include <c10/macros/Macros.h>
#include <c10/util/complex.h>

#include <cstdint>

namespace kernelhub_cuda_ext {

using cd = c10::complex<double>;

template <typename T>
C10_HOST_DEVICE inline cd to_cd(T z) { return cd(static_cast<double>(z), 0.0); }
template <typename T>
C10_HOST_DEVICE inline cd to_cd(c10::complex<T> z) { return cd(double(z.real()), double(z.imag())); }
template <typename T>
C10_HOST_DEVICE inline void store(T* p, cd z) { *p = static_cast<T>(z.real()); }
template <typename T>
C10_HOST_DEVICE inline void store(c10::complex<T>* p, cd z) { *p = c10::complex<T>(T(z.real()), T(z.imag())); }
C10_HOST_DEVICE inline cd cj(cd z) { return cd(z.real(), -z.imag()); }
C10_HOST_DEVICE inline double abs2(cd z) { return z.real() * z.real() + z.imag() * z.imag(); }

// W = (M M^H + lam I)^-1 M for one pixel: rows m0, m1 in, rows w0, w1 out.
template <typename T>
C10_HOST_DEVICE inline void tikhonov_pixel_forward(const T* m0, const T* m1, T* w0, T* w1, int64_t Z, double lam) {
  double a = 0, c = 0;
  cd b(0, 0);
  for (int64_t z = 0; z < Z; ++z) {
    const cd x0 = to_cd(m0[z]), x1 = to_cd(m1[z]);
    a += abs2(x0);
    c += abs2(x1);
    b += x0 * cj(x1);
  }
  const cd kappa = a > 0 ? cj(b) / a : cd(0, 0);
  double rr = 0;
  for (int64_t z = 0; z < Z; ++z) rr += abs2(to_cd(m1[z]) - kappa * to_cd(m0[z]));
  const double inv = 1.0 / (lam * (a + c + lam) + a * rr);
  for (int64_t z = 0; z < Z; ++z) {
    const cd x0 = to_cd(m0[z]), x1 = to_cd(m1[z]);
    const cd r = x1 - kappa * x0;
    store(w0 + z, ((lam + rr) * x0 - b * r) * inv);
    store(w1 + z, (lam * x1 + a * r) * inv);
  }
}

// dL/dM for one pixel from the upstream gradient rows g0, g1 (torch's convention: dL/dRe + i dL/dIm).
template <typename T>
C10_HOST_DEVICE inline void tikhonov_pixel_backward(const T* g0, const T* g1, const T* m0, const T* m1, T* d0, T* d1,
                                                    int64_t Z, double lam) {
  double a = 0, c = 0;
  cd b(0, 0), p00(0, 0), p01(0, 0), p10(0, 0), p11(0, 0);  // pXY = sum conj(GX) MY
  for (int64_t z = 0; z < Z; ++z) {
    const cd x0 = to_cd(m0[z]), x1 = to_cd(m1[z]), y0 = cj(to_cd(g0[z])), y1 = cj(to_cd(g1[z]));
    a += abs2(x0);
    c += abs2(x1);
    b += x0 * cj(x1);
    p00 += y0 * x0;
    p01 += y0 * x1;
    p10 += y1 * x0;
    p11 += y1 * x1;
  }
  const double A = a + lam, C = c + lam;
  const double inv = 1.0 / (A * C - abs2(b));
  const double s = (C * p00.real() - (b * p01).real() + A * p11.real() - (cj(b) * p10).real()) * inv;
  const double two_alpha_a = 2.0 * (p11.real() - s * C) * inv, two_alpha_c = 2.0 * (p00.real() - s * A) * inv;
  const cd beta = (2.0 * s * cj(b) - p01 - cj(p10)) * inv;
  for (int64_t z = 0; z < Z; ++z) {
    const cd x0 = to_cd(m0[z]), x1 = to_cd(m1[z]), h0 = to_cd(g0[z]), h1 = to_cd(g1[z]);
    store(d0 + z, (C * h0 - b * h1) * inv + two_alpha_a * x0 + cj(beta) * x1);
    store(d1 + z, (A * h1 - cj(b) * h0) * inv + two_alpha_c * x1 + beta * x0);
  }
}

}  // namespace kernelhub_cuda_ext
