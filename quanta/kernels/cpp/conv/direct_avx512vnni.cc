// qconv_direct_u8s8_s32_8x16c4__avx512vnni: the direct small-channel kernel for
// channels_last (the stem of a CNN: C = 3, 3x3, stride 2; contract in kernels.h
// "Direct, small C").
//
// SIMD lanes are output channels (16 per zmm, up to 4 zmm); the 4 bytes of a lane are 4
// consecutive k of one kernel row's run of kw·C input bytes, read as one broadcast dword
// from the padded NHWC image (vpbroadcastd from memory: a load, no shuffle). A run is
// padded to groups of 4 whose extra k have weight 0, so the bytes read past the run
// (the next pixel's, or the image's 64 slack bytes) add nothing; w_eff = w − zw (fits
// int8, checked at pack time) so there is no Σx' term. 8 output pixels run together: 8
// independent vpdpbusd chains share each weight vector.
#if defined(__clang__)
#pragma clang fp contract(off)
#else
#pragma GCC optimize("fp-contract=off")
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"  // GCC 12, inside its AVX-512 headers
#endif

#include <immintrin.h>

#include <cstring>

#include "conv/kernels.h"

namespace quanta {
namespace conv {
namespace {

inline int32_t load_dword(const uint8_t* p) {
  int32_t v;
  std::memcpy(&v, p, 4);
  return v;
}

inline __mmask16 first_lanes(int64_t n) {
  return n >= 16 ? static_cast<__mmask16>(0xffff) : n <= 0 ? 0 : static_cast<__mmask16>((1u << n) - 1u);
}

template <int MB, int NP>
inline void pixels(const DirectRow& a, int64_t o0) {
  __m512i acc[NP][MB];
  for (int p = 0; p < NP; ++p) {
    for (int b = 0; b < MB; ++b) acc[p][b] = _mm512_setzero_si512();
  }
  const int8_t* w = a.weights;
  for (int64_t ky = 0; ky < a.kh; ++ky) {
    const uint8_t* row = a.in + ky * a.row_step + o0 * a.pixel_step;
    for (int64_t q = 0; q < a.groups; ++q) {
      __m512i wv[MB];
      for (int b = 0; b < MB; ++b) wv[b] = _mm512_loadu_si512(w + 64 * b);
      w += 64 * MB;
      for (int p = 0; p < NP; ++p) {
        const __m512i xv = _mm512_set1_epi32(load_dword(row + p * a.pixel_step + 4 * q));
        for (int b = 0; b < MB; ++b) acc[p][b] = _mm512_dpbusd_epi32(acc[p][b], xv, wv[b]);
      }
    }
  }
  for (int p = 0; p < NP; ++p) {
    for (int b = 0; b < MB; ++b) {
      const __mmask16 mask = first_lanes(a.M - 16 * b);
      const __m512i v = _mm512_add_epi32(acc[p][b], _mm512_loadu_si512(a.colterm + 16 * b));
      const int64_t at = (o0 + p) * a.M + 16 * b;
      if (a.out_type == OutType::kS32) {
        _mm512_mask_storeu_epi32(static_cast<int32_t*>(a.y) + at, mask, v);
        continue;
      }
      __m512 f = _mm512_mul_ps(_mm512_cvtepi32_ps(v), _mm512_loadu_ps(a.multiplier + 16 * b));
      f = _mm512_min_ps(_mm512_max_ps(f, _mm512_set1_ps(a.lo_minus_zy)), _mm512_set1_ps(a.hi_minus_zy));
      const __m512i qv = _mm512_add_epi32(_mm512_cvt_roundps_epi32(f, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC),
                                          _mm512_set1_epi32(a.zy));
      // qv is in the output's range: the truncating narrow is exact
      _mm512_mask_cvtepi32_storeu_epi8(static_cast<uint8_t*>(a.y) + at, mask, qv);
    }
  }
}

template <int MB>
void row_impl(const DirectRow& a) {
  int64_t o = 0;
  for (; o + 8 <= a.ow; o += 8) pixels<MB, 8>(a, o);
  for (; o < a.ow; ++o) pixels<MB, 1>(a, o);
}

}  // namespace

void direct_row_avx512vnni(const DirectRow& a) {
  switch ((a.M + 15) / 16) {
    case 1: row_impl<1>(a); break;
    case 2: row_impl<2>(a); break;
    case 3: row_impl<3>(a); break;
    default: row_impl<4>(a); break;
  }
}

}  // namespace conv
}  // namespace quanta
