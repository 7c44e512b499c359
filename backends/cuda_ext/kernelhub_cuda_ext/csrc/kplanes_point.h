// kernelhub_cuda_ext: tilted K-Planes per point and channel, shared by the CPU and CUDA kernels.
//
// For each t (and tap), q = R_t p (p + h e_i for tap i); plane p of t samples the pair XY = (q0, q1),
// ZX = (q2, q0), YZ = (q1, q2) as grid_sample(bilinear, border, align_corners): x = (u + 1) / 2 (W - 1)
// clipped to [0, W - 1], a neighbour beyond the last column / row contributing nothing, and no coordinate
// gradient where the coordinate was clipped or lies on the border (torch's rule). The planes are read
// channels-last ([3T, H, W, C]). `kp_channel_backward` adds the planes gradient through an `add(offset, value)`
// the caller provides: atomics on the GPU, plain adds on the CPU (one thread per t there).
#pragma once
#include <c10/macros/Macros.h>

#include <cstdint>

namespace kernelhub_cuda_ext {

template <typename A>
struct KpCorners {
  int64_t o00, o01, o10, o11;  // offsets of the four neighbours' channel 0 in the plane
  bool m01, m10, m11;          // whether the right / lower neighbours exist
  A wx, wy, dx, dy;            // weights of the right / lower neighbours; d(x)/d(u), d(y)/d(v)
};

template <typename A>
C10_HOST_DEVICE inline void kp_axis(A u, int n, int& i0, int& i1, A& w, bool& has1, A& d) {
  A x = (u + A(1)) / A(2) * A(n - 1);
  const bool inside = x > A(0) && x < A(n - 1);  // torch's rule: no gradient where clipped or on the border
  x = x > A(0) ? x : A(0);  // (NaN goes to 0)
  x = x < A(n - 1) ? x : A(n - 1);
  const A f = static_cast<A>(static_cast<int64_t>(x));  // floor: x >= 0 here
  w = x - f;
  i0 = static_cast<int>(f);
  has1 = i0 + 1 < n;
  i1 = has1 ? i0 + 1 : i0;
  d = inside ? A(n - 1) / A(2) : A(0);
}

template <typename A>
C10_HOST_DEVICE inline KpCorners<A> kp_corners(int64_t plane, A u, A v, int H, int W, int C) {
  KpCorners<A> k;
  int x0, x1, y0, y1;
  bool hx, hy;
  kp_axis(u, W, x0, x1, k.wx, hx, k.dx);
  kp_axis(v, H, y0, y1, k.wy, hy, k.dy);
  const int64_t base = plane * H * W;
  k.o00 = (base + static_cast<int64_t>(y0) * W + x0) * C;
  k.o01 = (base + static_cast<int64_t>(y0) * W + x1) * C;
  k.o10 = (base + static_cast<int64_t>(y1) * W + x0) * C;
  k.o11 = (base + static_cast<int64_t>(y1) * W + x1) * C;
  k.m01 = hx;
  k.m10 = hy;
  k.m11 = hx && hy;
  return k;
}

// the sample of channel c, and its derivatives by u and by v
template <typename T, typename A>
C10_HOST_DEVICE inline A kp_sample(const T* pl, const KpCorners<A>& k, int c, A& eu, A& ev) {
  const A v00 = A(pl[k.o00 + c]);
  const A v01 = k.m01 ? A(pl[k.o01 + c]) : A(0);
  const A v10 = k.m10 ? A(pl[k.o10 + c]) : A(0);
  const A v11 = k.m11 ? A(pl[k.o11 + c]) : A(0);
  eu = ((1 - k.wy) * (v01 - v00) + k.wy * (v11 - v10)) * k.dx;
  ev = ((1 - k.wx) * (v10 - v00) + k.wx * (v11 - v01)) * k.dy;
  return (1 - k.wy) * ((1 - k.wx) * v00 + k.wx * v01) + k.wy * ((1 - k.wx) * v10 + k.wx * v11);
}

template <typename A>
C10_HOST_DEVICE inline void kp_point(const A* p, int tap, A h, A* pp) {
  for (int i = 0; i < 3; ++i) pp[i] = p[i] + (tap == i + 1 ? h : A(0));
}

// R = R_t, the tap's point pp = p (+ h e_i), q = R pp, and the neighbours of the three planes of t: plane 0
// reads (q0, q1), plane 1 (q2, q0), plane 2 (q1, q2)
template <typename T, typename A>
C10_HOST_DEVICE inline void kp_tap(const A* p, const T* rot, int t, int tap, A h, int H, int W, int C,
                                       A* R, A* pp, KpCorners<A>& k0, KpCorners<A>& k1, KpCorners<A>& k2) {
  for (int k = 0; k < 9; ++k) R[k] = A(rot[t * 9 + k]);
  kp_point(p, tap, h, pp);
  const A q0 = R[0] * pp[0] + R[1] * pp[1] + R[2] * pp[2];
  const A q1 = R[3] * pp[0] + R[4] * pp[1] + R[5] * pp[2];
  const A q2 = R[6] * pp[0] + R[7] * pp[1] + R[8] * pp[2];
  k0 = kp_corners(t * 3 + 0, q0, q1, H, W, C);
  k1 = kp_corners(t * 3 + 1, q2, q0, H, W, C);
  k2 = kp_corners(t * 3 + 2, q1, q2, H, W, C);
}

template <typename T, typename A>
C10_HOST_DEVICE inline A kp_value(const T* pl, const KpCorners<A>& k0, const KpCorners<A>& k1,
                                  const KpCorners<A>& k2, int c) {
  A e, f;
  return kp_sample(pl, k0, c, e, f) * kp_sample(pl, k1, c, e, f) * kp_sample(pl, k2, c, e, f);
}

#ifdef __CUDACC__
#pragma nv_exec_check_disable  // `add` is a device functor in the CUDA kernel
#endif
template <typename A, typename Add>
C10_HOST_DEVICE inline void kp_add_corners(const KpCorners<A>& k, int c, A gs, const Add& add) {
  add(k.o00 + c, gs * (1 - k.wx) * (1 - k.wy));
  if (k.m01) add(k.o01 + c, gs * k.wx * (1 - k.wy));
  if (k.m10) add(k.o10 + c, gs * (1 - k.wx) * k.wy);
  if (k.m11) add(k.o11 + c, gs * k.wx * k.wy);
}

// channel c's share of the backward with upstream gradient gc: the planes gradient through `add`, and the
// coordinate gradient into dq[3]
#ifdef __CUDACC__
#pragma nv_exec_check_disable  // `add` is a device functor in the CUDA kernel
#endif
template <typename T, typename A, typename Add>
C10_HOST_DEVICE inline void kp_channel_backward(const T* pl, const KpCorners<A>& k0, const KpCorners<A>& k1,
                                                const KpCorners<A>& k2, int c, A gc, bool need_planes, A* dq,
                                                const Add& add) {
  A u0, v0, u1, v1, u2, v2;
  const A s0 = kp_sample(pl, k0, c, u0, v0), s1 = kp_sample(pl, k1, c, u1, v1), s2 = kp_sample(pl, k2, c, u2, v2);
  const A g0 = gc * s1 * s2, g1 = gc * s0 * s2, g2 = gc * s0 * s1;
  if (need_planes) {
    kp_add_corners(k0, c, g0, add);
    kp_add_corners(k1, c, g1, add);
    kp_add_corners(k2, c, g2, add);
  }
  // plane 0 reads (q0, q1), plane 1 (q2, q0), plane 2 (q1, q2)
  dq[0] += g0 * u0 + g1 * v1;
  dq[1] += g0 * v0 + g2 * u2;
  dq[2] += g1 * u1 + g2 * v2;
}

// the pts and rotations gradients of one tap from its coordinate gradient dq = d/dq
template <typename A>
C10_HOST_DEVICE inline void kp_point_grads(const A* R, const A* pp, const A* dq, A* gp, A* dR) {
  for (int j = 0; j < 3; ++j) gp[j] += R[j] * dq[0] + R[3 + j] * dq[1] + R[6 + j] * dq[2];
  if (dR != nullptr)
    for (int i = 0; i < 3; ++i)
      for (int j = 0; j < 3; ++j) dR[i * 3 + j] += dq[i] * pp[j];
}

}  // namespace kernelhub_cuda_ext
