// Float MaxPool of one plane at dilation 1 (pool.h max_pool_2d_f32's vector path on whole
// planes), over the vector traits of simd.h: compiled by pool_avx2.cc (F32x8) and
// pool_avx512vnni.cc (F32x16).
//
// Internal linkage on purpose (anonymous namespace): the same template compiled with
// different flags must not be merged into one copy by the linker.
#pragma once

#include <algorithm>
#include <cstdint>
#include <limits>

#include "pool/pool.h"
#include "simd.h"

namespace quanta {
namespace pool {
namespace {  // NOLINT: see the header comment

// max(m, v) where a NaN in either gives NaN: vmaxps(v, m) returns m when either is NaN,
// so only a NaN v needs putting back.
template <class T>
inline typename T::V max_nan_v(typename T::V m, typename T::V v) {
  return T::select(T::template cmp<_CMP_UNORD_Q>(v, v), T::max(v, m), v);
}

// The plane x into pad, a −inf-bordered hp × wp copy (flat, row stride wp): input row iy
// and column ix land on (iy + pad_t, ix + pad_l); rows and columns past hp / wp (inputs
// no window reads) are left out.
template <class T>
inline void bordered_copy(const float* x, float* __restrict pad, const Geometry2d& g, int64_t hp, int64_t wp) {
  constexpr int64_t L = T::kLanes;
  const int64_t np = hp * wp;
  const typename T::V ninf = T::set1(-std::numeric_limits<float>::infinity());
  int64_t i = 0;
  for (; i + L <= np; i += L) T::storeu(pad + i, ninf);
  if (i < np) T::store(pad + i, T::tail(np - i), ninf);
  const int64_t c1 = std::min(g.w, wp - g.pad_l);
  for (int64_t iy = 0; iy < g.h; ++iy) {
    const int64_t py = iy + g.pad_t;
    if (py >= hp) break;
    const float* src = x + iy * g.w;
    float* dst = pad + py * wp + g.pad_l;
    int64_t c = 0;
    for (; c + L <= c1; c += L) T::storeu(dst + c, T::loadu(src + c));
    if (c < c1) {
      const typename T::M k = T::tail(c1 - c);
      T::store(dst + c, k, T::load(k, src + c));
    }
  }
}

// The plane goes into a −inf-bordered copy P of hp × wp (hp = out_h + k_h − 1, wp = out_w +
// k_w − 1: exactly the positions the windows read) laid out as one flat array, so that
//   H[i] = max_{kx < k_w} P[i + kx]        over the flat index i
// is one contiguous vector loop whatever the plane's width (an SPPF plane of 10 columns
// fills 16-lane vectors instead of a 10-lane tail per row); the values of H that straddle
// two rows are never read. Then y[oy, ox] = max_{ky < k_h} H[(oy + ky)·wp + ox], one
// (masked) vector loop per output row. A −inf border position changes no maximum and a
// window of border only gives −inf, the twin's value; max only selects, so the result is
// the twin's whatever the order. scratch holds 2·hp·wp floats.
template <class T>
void max_plane_f32_s1(const float* x, float* y, const Geometry2d& g, float* scratch) {
  using V = typename T::V;
  constexpr int64_t L = T::kLanes;
  const int64_t hp = g.out_h + g.k_h - 1, wp = g.out_w + g.k_w - 1, np = hp * wp;
  float* __restrict pad = scratch;
  float* __restrict hmax = scratch + np;
  bordered_copy<T>(x, pad, g, hp, wp);
  const int64_t nh = np - (g.k_w - 1);
  for (int64_t i = 0; i < nh; i += L) {
    const typename T::M k = T::tail(nh - i);
    V m = T::load(k, pad + i);
    for (int64_t kx = 1; kx < g.k_w; ++kx) m = max_nan_v<T>(m, T::load(k, pad + i + kx));
    T::store(hmax + i, k, m);
  }
  for (int64_t oy = 0; oy < g.out_h; ++oy) {
    const float* src = hmax + oy * wp;
    float* dst = y + oy * g.out_w;
    for (int64_t ox = 0; ox < g.out_w; ox += L) {
      const typename T::M k = T::tail(g.out_w - ox);
      V m = T::load(k, src + ox);
      for (int64_t ky = 1; ky < g.k_h; ++ky) m = max_nan_v<T>(m, T::load(k, src + ky * wp + ox));
      T::store(dst + ox, k, m);
    }
  }
}

// Other strides (dilation 1): the bordered copy P of hp × wp (hp = (out_h − 1)·s_h + k_h,
// wp = (out_w − 1)·s_w + k_w), then per output row
//   V[c] = max_{ky < k_h} P[(oy·s_h + ky)·wp + c]        c < wp, a vector loop
//   V split into s_w phases, phase r holding the columns r, r + s_w, r + 2·s_w, …
//   y[oy, ox] = max_{kx < k_w} phase_{kx mod s_w}[ox + ⌊kx / s_w⌋]
// so each tap of the strided window is a contiguous (masked) vector load. scratch holds
// hp·wp + 2·wp + 2·s_w floats.
template <class T>
void max_plane_f32_strided(const float* x, float* y, const Geometry2d& g, float* scratch) {
  using V = typename T::V;
  constexpr int64_t L = T::kLanes;
  const int64_t hp = (g.out_h - 1) * g.s_h + g.k_h, wp = (g.out_w - 1) * g.s_w + g.k_w, np = hp * wp;
  const int64_t phase_len = (wp + g.s_w - 1) / g.s_w;
  float* __restrict pad = scratch;
  float* __restrict vmax = scratch + np;
  float* __restrict phases = vmax + wp + g.s_w;  // s_w rows of phase_len
  const float ninf_s = -std::numeric_limits<float>::infinity();
  bordered_copy<T>(x, pad, g, hp, wp);
  for (int64_t oy = 0; oy < g.out_h; ++oy) {
    const float* top = pad + oy * g.s_h * wp;
    for (int64_t c = 0; c < wp; c += L) {
      const typename T::M k = T::tail(wp - c);
      V m = T::load(k, top + c);
      for (int64_t ky = 1; ky < g.k_h; ++ky) m = max_nan_v<T>(m, T::load(k, top + ky * wp + c));
      T::store(vmax + c, k, m);
    }
    for (int64_t c = wp; c < phase_len * g.s_w; ++c) vmax[c] = ninf_s;  // never read
    if (g.s_w == 2) {
      float* __restrict even = phases;
      float* __restrict odd = phases + phase_len;
      for (int64_t j = 0; j < phase_len; ++j) {
        even[j] = vmax[2 * j];
        odd[j] = vmax[2 * j + 1];
      }
    } else {
      for (int64_t r = 0; r < g.s_w; ++r) {
        float* __restrict ph = phases + r * phase_len;
        for (int64_t j = 0; j < phase_len; ++j) ph[j] = vmax[j * g.s_w + r];
      }
    }
    float* dst = y + oy * g.out_w;
    for (int64_t ox = 0; ox < g.out_w; ox += L) {
      const typename T::M k = T::tail(g.out_w - ox);
      V m = T::load(k, phases + ox);  // kx = 0: phase 0
      for (int64_t kx = 1; kx < g.k_w; ++kx) {
        m = max_nan_v<T>(m, T::load(k, phases + (kx % g.s_w) * phase_len + ox + kx / g.s_w));
      }
      T::store(dst + ox, k, m);
    }
  }
}

// Kernels::max_plane_f32: stride 1 in both axes takes the flattened row maxima, any other
// stride the per-output-row form.
template <class T>
void max_plane_f32(const float* x, float* y, const Geometry2d& g, float* scratch) {
  if (g.s_h == 1 && g.s_w == 1) return max_plane_f32_s1<T>(x, y, g, scratch);
  max_plane_f32_strided<T>(x, y, g, scratch);
}

}  // namespace
}  // namespace pool
}  // namespace quanta
