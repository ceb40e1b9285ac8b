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

// Windows that stay inside the plane (no pads, no ceil_mode overhang) and do not overlap
// (a [1, 3] stride [1, 3] time pool, VGG's 2x2 stride 2): no bordered copy, per output row
//   M[j] = max_{ky < k_h, kx < k_w} x[(oy·s_h + ky)·w + j + kx]     j < (out_w − 1)·s_w + 1
// as contiguous (masked) vector loads, then y[oy, ox] = M[ox·s_w], one strided load (a
// permute for s_w = 2, a gather otherwise) per vector of outputs. Each input is read
// k_w times from L1 and the plane once from memory. scratch holds out_w·s_w + kLanes·s_w
// floats (the strided load of the last vector reads past M; those lanes are not stored).
template <class T>
void max_plane_f32_direct(const float* x, float* y, const Geometry2d& g, float* scratch) {
  using V = typename T::V;
  constexpr int64_t L = T::kLanes;
  const int64_t span = (g.out_w - 1) * g.s_w + 1;
  float* __restrict m = g.s_w == 1 ? nullptr : scratch;
  for (int64_t oy = 0; oy < g.out_h; ++oy) {
    const float* top = x + oy * g.s_h * g.w;
    float* dst = g.s_w == 1 ? y + oy * g.out_w : m;
    for (int64_t j = 0; j < span; j += L) {
      const typename T::M k = T::tail(span - j);
      V v = T::load(k, top + j);
      for (int64_t ky = 0; ky < g.k_h; ++ky) {
        const float* row = top + ky * g.w + j;
        for (int64_t kx = ky == 0 ? 1 : 0; kx < g.k_w; ++kx) v = max_nan_v<T>(v, T::load(k, row + kx));
      }
      T::store(dst + j, k, v);
    }
    if (g.s_w == 1) continue;
    float* out = y + oy * g.out_w;
    for (int64_t ox = 0; ox < g.out_w; ox += L) {
      const typename T::M k = T::tail(g.out_w - ox);
      const float* src = m + ox * g.s_w;
      T::store(out + ox, k, g.s_w == 2 ? T::template strided<2>(src, 2) : T::template strided<0>(src, int(g.s_w)));
    }
  }
}

#if defined(__AVX512F__)
// The direct form at s_w = 2 … 8 on AVX-512: per vector of 16 outputs of a row the s_w
// vectors from its first window's start (masked at the row's end), and tap kx of output
// lane i is their element s_w·i + kx, picked by one permute per pair of vectors (and a
// blend for the lanes of each further pair): no scratch, no gather (a [1, 3] stride
// [1, 3] pool reads each input once).
template <int kSw>
void max_plane_f32_deinterleave(const float* x, float* y, const Geometry2d& g) {
  using T = simd::F32x16;
  constexpr int64_t sw = kSw, pairs = (kSw + 1) / 2;
  __m512i idx[kSw];
  __mmask16 in_pair[kSw][pairs];  // lanes whose element lies in the vectors 2q, 2q + 1
  const __m512i iota = _mm512_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15);
  for (int64_t kx = 0; kx < g.k_w; ++kx) {
    idx[kx] = _mm512_add_epi32(_mm512_mullo_epi32(iota, _mm512_set1_epi32(int(sw))), _mm512_set1_epi32(int(kx)));
    for (int64_t q = 0; q < pairs; ++q) {
      in_pair[kx][q] = _mm512_cmpge_epi32_mask(idx[kx], _mm512_set1_epi32(int(32 * q))) &
                       _mm512_cmplt_epi32_mask(idx[kx], _mm512_set1_epi32(int(32 * q + 32)));
    }
  }
  for (int64_t oy = 0; oy < g.out_h; ++oy) {
    float* out = y + oy * g.out_w;
    for (int64_t ox = 0; ox < g.out_w; ox += 16) {
      const int64_t avail = g.w - ox * sw;  // floats of the row from the first window on
      __m512 m = _mm512_setzero_ps();
      for (int64_t ky = 0; ky < g.k_h; ++ky) {
        const float* p = x + (oy * g.s_h + ky) * g.w + ox * sw;
        __m512 v[2 * pairs];
        for (int64_t q = 0; q < sw; ++q) v[q] = T::load(T::tail(avail - 16 * q), p + 16 * q);
        if constexpr (sw % 2 == 1) v[sw] = _mm512_setzero_ps();
        for (int64_t kx = 0; kx < g.k_w; ++kx) {
          // permutex2var reads the low 5 bits of idx: element idx − 32q of the pair q
          __m512 t = _mm512_permutex2var_ps(v[0], idx[kx], v[1]);
          for (int64_t q = 1; q < pairs; ++q) {
            t = _mm512_mask_blend_ps(in_pair[kx][q], t, _mm512_permutex2var_ps(v[2 * q], idx[kx], v[2 * q + 1]));
          }
          m = ky == 0 && kx == 0 ? t : max_nan_v<T>(m, t);
        }
      }
      T::store(out + ox, T::tail(g.out_w - ox), m);
    }
  }
}
#endif

// Kernels::max_plane_f32: windows inside the plane that do not overlap take the direct
// form, stride 1 in both axes the flattened row maxima, any other stride the
// per-output-row form.
template <class T>
void max_plane_f32(const float* x, float* y, const Geometry2d& g, float* scratch) {
  if (direct_max_pool(g)) {
    if (g.k_h == 1 && g.s_h == 1 && g.w == g.out_w * g.s_w && g.out_h == g.h && g.h > 1) {
      // rows of single-row windows that use every column: the plane is one row of h·w
      // (a [1, 3] stride [1, 3] pool over 24 columns: 8 outputs a row fill no vector)
      Geometry2d flat = g;
      flat.w = g.h * g.w;
      flat.out_w = g.out_h * g.out_w;
      flat.h = flat.out_h = 1;
      return max_plane_f32<T>(x, y, flat, scratch);
    }
#if defined(__AVX512F__)
    if constexpr (T::kLanes == 16) {
      switch (g.s_w) {
        case 2: return max_plane_f32_deinterleave<2>(x, y, g);
        case 3: return max_plane_f32_deinterleave<3>(x, y, g);
        case 4: return max_plane_f32_deinterleave<4>(x, y, g);
        case 5: return max_plane_f32_deinterleave<5>(x, y, g);
        case 6: return max_plane_f32_deinterleave<6>(x, y, g);
        case 7: return max_plane_f32_deinterleave<7>(x, y, g);
        case 8: return max_plane_f32_deinterleave<8>(x, y, g);
        default: break;
      }
    }
#endif
    return max_plane_f32_direct<T>(x, y, g, scratch);
  }
  if (g.s_h == 1 && g.s_w == 1) return max_plane_f32_s1<T>(x, y, g, scratch);
  max_plane_f32_strided<T>(x, y, g, scratch);
}

}  // namespace
}  // namespace pool
}  // namespace quanta
