// qconv_dw_u8s8_s32_16c4__avx512vnni: the depthwise kernel (contract in kernels.h).
//
// One zmm holds 16 consecutive output pixels of a row as int32 lanes; the 4 bytes that
// vpdpbusd multiplies and adds per lane are 4 horizontal taps of that pixel:
//   acc[o] += Σ_{t<4} u8(in[row, (ox0 + o)·sw + (4q + t)·dw]) · s8(w_eff[ky, 4q + t])
// The 64 taps of a 16-pixel block come from ONE 64-byte load: vpermd gives 128-bit lane L
// the 16 bytes at 4·L·sw (dwords L·sw .. L·sw + 3, needs sw <= 4), and an in-lane vpshufb
// picks byte o·sw + t·dw for pixel 4L + o and tap t (index 0x80, i.e. zero, for taps past
// kw). A 3x3 kernel is 3 loads, 6 shuffles and 3 vpdpbusd per 16 pixels; 5x5 is 10 of
// each group (the second group of a row holds 1 tap). Geometries whose taps do not fit the
// one-load gather (dw_gather_fits) build the same vectors with scalar loads.
//
// With zw_eff != 0 a second vpdpbusd against bytes of 1 accumulates Σ x' for the − zw·Σx'
// term (the zeroed pad taps add nothing). Up to 4 blocks (64 pixels) run together so that
// the vpdpbusd chains overlap. Epilogue as qgemm's (float32 multiply, clamp,
// round-to-nearest-even conversion, + zy), masked stores for the row's tail.
#if defined(__clang__)
#pragma clang fp contract(off)
#else
#pragma GCC optimize("fp-contract=off")
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"  // GCC 12, inside its AVX-512 headers
#endif

#include <immintrin.h>

#include "conv/kernels.h"

namespace quanta {
namespace conv {
namespace {

struct Gather {
  __m512i perm;
  __m512i shuf_full;  // a group of 4 taps
  __m512i shuf_last;  // the row's last group (kw − 4·(groups4 − 1) taps)
};

Gather make_gather(const DepthwiseRows& a) {
  Gather g;
  g.perm = _mm512_loadu_si512(a.gather_perm);
  g.shuf_full = _mm512_loadu_si512(a.gather_full);
  g.shuf_last = _mm512_loadu_si512(a.gather_last);
  return g;
}

// The 16 x 4 tap bytes of the block at src (pixel 0, tap 4q).
template <bool kFast>
inline __m512i gather(const uint8_t* src, const Gather& g, bool last_group, const DepthwiseRows& a, int64_t taps) {
  if (kFast) {
    const __m512i v = _mm512_permutexvar_epi32(g.perm, _mm512_loadu_si512(src));
    return _mm512_shuffle_epi8(v, last_group ? g.shuf_last : g.shuf_full);
  }
  alignas(64) uint8_t tmp[64];
  for (int o = 0; o < 16; ++o) {
    for (int t = 0; t < 4; ++t) tmp[4 * o + t] = t < taps ? src[o * a.sw + t * a.dw] : 0;
  }
  return _mm512_load_si512(tmp);
}

inline void finish(__m512i acc, const DepthwiseRows& a, int64_t at, __mmask16 mask) {
  if (a.out_type == OutType::kS32) {
    _mm512_mask_storeu_epi32(static_cast<int32_t*>(a.y) + at, mask, acc);
    return;
  }
  __m512 f = _mm512_mul_ps(_mm512_cvtepi32_ps(acc), _mm512_set1_ps(a.multiplier));
  f = _mm512_min_ps(_mm512_max_ps(f, _mm512_set1_ps(a.lo_minus_zy)), _mm512_set1_ps(a.hi_minus_zy));
  const __m512i q = _mm512_add_epi32(_mm512_cvt_roundps_epi32(f, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC),
                                     _mm512_set1_epi32(a.zy));
  // q is in [qmin, qmax]: the truncating narrow is exact
  if (a.out_type == OutType::kS8) {
    _mm512_mask_cvtepi32_storeu_epi8(static_cast<int8_t*>(a.y) + at, mask, q);
  } else {
    _mm512_mask_cvtepi32_storeu_epi8(static_cast<uint8_t*>(a.y) + at, mask, q);
  }
}

// NB blocks of 16 pixels from ox0 in output row oy. KH / G: compile-time kh / groups4
// (0: read from a).
template <int NB, int KH, int G, bool kZw, bool kFast>
inline void blocks(const DepthwiseRows& a, const Gather& g, int64_t oy, int64_t ox0, int valid_last) {
  const int64_t kh = KH ? KH : a.kh;
  const int64_t groups = G ? G : a.groups4;
  const int64_t last_taps = a.kw - 4 * (groups - 1);
  const uint8_t* base = a.in + oy * a.sh * a.in_stride + ox0 * a.sw;
  __m512i acc[NB], xs[NB];
#pragma GCC unroll 4
  for (int b = 0; b < NB; ++b) {
    acc[b] = _mm512_setzero_si512();
    xs[b] = _mm512_setzero_si512();
  }
  const __m512i ones = _mm512_set1_epi8(1);
#pragma GCC unroll 5
  for (int64_t ky = 0; ky < kh; ++ky) {
    const uint8_t* row = base + ky * a.dh * a.in_stride;
#pragma GCC unroll 2
    for (int64_t q = 0; q < groups; ++q) {
      const bool last = q == groups - 1;
      const int64_t taps = last ? last_taps : 4;
      const __m512i w = _mm512_set1_epi32(a.taps4[ky * groups + q]);
#pragma GCC unroll 4
      for (int b = 0; b < NB; ++b) {
        const __m512i v = gather<kFast>(row + (16 * b) * a.sw + 4 * q * a.dw, g, last, a, taps);
        acc[b] = _mm512_dpbusd_epi32(acc[b], v, w);
        if (kZw) xs[b] = _mm512_dpbusd_epi32(xs[b], v, ones);
      }
    }
  }
  const __m512i colterm = _mm512_set1_epi32(a.colterm);
  const __m512i zw = _mm512_set1_epi32(a.zw);
#pragma GCC unroll 4
  for (int b = 0; b < NB; ++b) {
    __m512i v = _mm512_add_epi32(acc[b], colterm);
    if (kZw) v = _mm512_sub_epi32(v, _mm512_mullo_epi32(xs[b], zw));
    const int valid = b == NB - 1 ? valid_last : 16;
    const __mmask16 mask = valid >= 16 ? static_cast<__mmask16>(0xffff) : static_cast<__mmask16>((1u << valid) - 1u);
    finish(v, a, oy * a.y_stride + ox0 + 16 * b, mask);
  }
}

template <int KH, int G, bool kZw, bool kFast>
void rows_impl(const DepthwiseRows& a) {
  const Gather g = make_gather(a);
  for (int64_t oy = 0; oy < a.rows; ++oy) {
    int64_t ox0 = 0;
    for (; ox0 + 64 <= a.ow; ox0 += 64) blocks<4, KH, G, kZw, kFast>(a, g, oy, ox0, 16);
    for (; ox0 < a.ow; ox0 += 16) {
      const int64_t left = a.ow - ox0;
      blocks<1, KH, G, kZw, kFast>(a, g, oy, ox0, static_cast<int>(left < 16 ? left : 16));
    }
  }
}

template <bool kZw>
void dispatch_shape(const DepthwiseRows& a) {
  if (!dw_gather_fits(a.sw, a.dw, a.kw)) {
    rows_impl<0, 0, kZw, false>(a);
  } else if (a.kh == 3 && a.kw == 3) {
    rows_impl<3, 1, kZw, true>(a);
  } else if (a.kh == 5 && a.kw == 5) {
    rows_impl<5, 2, kZw, true>(a);
  } else {
    rows_impl<0, 0, kZw, true>(a);
  }
}

}  // namespace

void depthwise_rows_avx512vnni(const DepthwiseRows& a) {
  if (a.zw != 0) {
    dispatch_shape<true>(a);
  } else {
    dispatch_shape<false>(a);
  }
}

}  // namespace conv
}  // namespace quanta
