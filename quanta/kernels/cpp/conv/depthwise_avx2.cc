// qconv_dw_u8s8_s32_8c4__avx2: the depthwise kernel (contract in kernels.h).
//
// Per 4 output pixels of a row: one 16-byte load and one vpshufb gather the 4 x 4 tap
// bytes (byte 4o + t = in[(ox0 + o)·sw + (4q + t)·dw], zero past kw), vpmovzxbw widens
// them to int16 and vpmaddwd against the taps (w_eff as int16, repeated per pixel) gives
// two int32 partial sums per pixel (taps 0+1, 2+3; |pair| <= 2·255·128, exact: no
// vpmaddubsw and its int16 saturation). A block is 8 pixels = two such vectors; after the
// last tap vphaddd adds the pairs and vpermq restores pixel order. Geometries whose taps
// do not fit one 16-byte load (dw_gather_fits) gather with scalar loads.
// Epilogue as qgemm's AVX2 family (float32 multiply, clamp, vroundps to nearest even).
#if defined(__clang__)
#pragma clang fp contract(off)
#else
#pragma GCC optimize("fp-contract=off")
#endif

#include <immintrin.h>

#include <cstring>

#include "conv/kernels.h"

namespace quanta {
namespace conv {
namespace {

struct Gather {
  __m128i shuf_full, shuf_last;
};

Gather make_gather(const DepthwiseRows& a) {
  Gather g;
  g.shuf_full = _mm_loadu_si128(reinterpret_cast<const __m128i*>(a.gather_full));
  g.shuf_last = _mm_loadu_si128(reinterpret_cast<const __m128i*>(a.gather_last));
  return g;
}

template <bool kFast>
inline __m256i gather4(const uint8_t* src, const Gather& g, bool last_group, const DepthwiseRows& a, int64_t taps) {
  if (kFast) {
    const __m128i v = _mm_loadu_si128(reinterpret_cast<const __m128i*>(src));
    return _mm256_cvtepu8_epi16(_mm_shuffle_epi8(v, last_group ? g.shuf_last : g.shuf_full));
  }
  alignas(16) uint8_t tmp[16];
  for (int o = 0; o < 4; ++o) {
    for (int t = 0; t < 4; ++t) tmp[4 * o + t] = t < taps ? src[o * a.sw + t * a.dw] : 0;
  }
  return _mm256_cvtepu8_epi16(_mm_load_si128(reinterpret_cast<const __m128i*>(tmp)));
}

inline void finish(__m256i acc, const DepthwiseRows& a, int64_t at, int valid) {
  if (a.out_type == OutType::kS32) {
    if (valid >= 8) {
      _mm256_storeu_si256(reinterpret_cast<__m256i*>(static_cast<int32_t*>(a.y) + at), acc);
    } else {
      alignas(32) int32_t tmp[8];
      _mm256_store_si256(reinterpret_cast<__m256i*>(tmp), acc);
      std::memcpy(static_cast<int32_t*>(a.y) + at, tmp, static_cast<size_t>(valid) * sizeof(int32_t));
    }
    return;
  }
  __m256 f = _mm256_mul_ps(_mm256_cvtepi32_ps(acc), _mm256_set1_ps(a.multiplier));
  f = _mm256_min_ps(_mm256_max_ps(f, _mm256_set1_ps(a.lo_minus_zy)), _mm256_set1_ps(a.hi_minus_zy));
  f = _mm256_round_ps(f, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
  const __m256i q = _mm256_add_epi32(_mm256_cvttps_epi32(f), _mm256_set1_epi32(a.zy));
  // q is in range: the packs are exact
  const __m128i p16 = _mm_packs_epi32(_mm256_castsi256_si128(q), _mm256_extracti128_si256(q, 1));
  const __m128i p8 = a.out_type == OutType::kS8 ? _mm_packs_epi16(p16, p16) : _mm_packus_epi16(p16, p16);
  uint8_t* dst = static_cast<uint8_t*>(a.y) + at;
  if (valid >= 8) {
    _mm_storel_epi64(reinterpret_cast<__m128i*>(dst), p8);
  } else {
    alignas(16) uint8_t tmp[16];
    _mm_store_si128(reinterpret_cast<__m128i*>(tmp), p8);
    std::memcpy(dst, tmp, static_cast<size_t>(valid));
  }
}

template <bool kZw, bool kFast>
void rows_impl(const DepthwiseRows& a) {
  const Gather g = make_gather(a);
  const int64_t last_taps = a.kw - 4 * (a.groups4 - 1);
  const __m256i ones = _mm256_set1_epi16(1);
  const __m256i colterm = _mm256_set1_epi32(a.colterm);
  const __m256i zw = _mm256_set1_epi32(a.zw);
  for (int64_t oy = 0; oy < a.rows; ++oy) {
    const uint8_t* base = a.in + oy * a.sh * a.in_stride;
    for (int64_t ox0 = 0; ox0 < a.ow; ox0 += 8) {
      __m256i acc0 = _mm256_setzero_si256(), acc1 = _mm256_setzero_si256();
      __m256i xs0 = _mm256_setzero_si256(), xs1 = _mm256_setzero_si256();
      for (int64_t ky = 0; ky < a.kh; ++ky) {
        const uint8_t* row = base + ky * a.dh * a.in_stride + ox0 * a.sw;
        for (int64_t q = 0; q < a.groups4; ++q) {
          const bool last = q == a.groups4 - 1;
          const int64_t taps = last ? last_taps : 4;
          const __m256i w = _mm256_cvtepi8_epi16(_mm_set1_epi32(a.taps4[ky * a.groups4 + q]));
          const uint8_t* src = row + 4 * q * a.dw;
          const __m256i v0 = gather4<kFast>(src, g, last, a, taps);
          const __m256i v1 = gather4<kFast>(src + 4 * a.sw, g, last, a, taps);
          acc0 = _mm256_add_epi32(acc0, _mm256_madd_epi16(v0, w));
          acc1 = _mm256_add_epi32(acc1, _mm256_madd_epi16(v1, w));
          if (kZw) {
            xs0 = _mm256_add_epi32(xs0, _mm256_madd_epi16(v0, ones));
            xs1 = _mm256_add_epi32(xs1, _mm256_madd_epi16(v1, ones));
          }
        }
      }
      // (o0, o1, o4, o5 | o2, o3, o6, o7) -> pixel order
      __m256i v = _mm256_permute4x64_epi64(_mm256_hadd_epi32(acc0, acc1), 0xD8);
      v = _mm256_add_epi32(v, colterm);
      if (kZw) {
        const __m256i xs = _mm256_permute4x64_epi64(_mm256_hadd_epi32(xs0, xs1), 0xD8);
        v = _mm256_sub_epi32(v, _mm256_mullo_epi32(xs, zw));
      }
      const int64_t left = a.ow - ox0;
      finish(v, a, oy * a.y_stride + ox0, static_cast<int>(left < 8 ? left : 8));
    }
  }
}

}  // namespace

void depthwise_rows_avx2(const DepthwiseRows& a) {
  const bool fast = dw_gather_fits(a.sw, a.dw, a.kw);
  if (a.zw != 0) {
    fast ? rows_impl<true, true>(a) : rows_impl<true, false>(a);
  } else {
    fast ? rows_impl<false, true>(a) : rows_impl<false, false>(a);
  }
}

}  // namespace conv
}  // namespace quanta
