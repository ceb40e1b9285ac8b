// MatMulNBits W4A8 panel, AVX-512 VNNI: up to 4 rows × 32 columns, vpdpbusd per group of
// 4 k, the block's float step (W8) on registers (nbits_a8.h).
#include <immintrin.h>

#include <cstring>

#include "w4/nbits_a8.h"

namespace quanta {
namespace nbits_a8 {
namespace {

template <int MR, int NT>
void panel(const PanelArgs& p) {
  __m512 t[MR][NT];
  for (int r = 0; r < MR; ++r) {
    for (int j = 0; j < NT; ++j) t[r][j] = _mm512_setzero_ps();
  }
  for (int64_t b = 0; b < p.kb; ++b) {
    __m512i acc[MR][NT];
    for (int r = 0; r < MR; ++r) {
      for (int j = 0; j < NT; ++j) acc[r][j] = _mm512_setzero_si512();
    }
    const uint8_t* a = p.qa + b * p.b4 * 4;
    const int8_t* w = p.w + b * p.wb_stride;
    for (int64_t g = 0; g < p.b4; ++g) {
      __m512i wv[NT];
      for (int j = 0; j < NT; ++j) wv[j] = _mm512_loadu_si512(w + j * p.tile_bytes + g * 64);
      for (int r = 0; r < MR; ++r) {
        int32_t q;
        std::memcpy(&q, a + r * p.lda + 4 * g, 4);
        const __m512i x = _mm512_set1_epi32(q);
        for (int j = 0; j < NT; ++j) acc[r][j] = _mm512_dpbusd_epi32(acc[r][j], x, wv[j]);
      }
    }
    __m512i cv[NT];
    __m512 sv[NT];
    for (int j = 0; j < NT; ++j) {
      cv[j] = _mm512_loadu_si512(p.corr + b * p.npad + j * 16);
      sv[j] = _mm512_loadu_ps(p.sw + b * p.npad + j * 16);
    }
    for (int r = 0; r < MR; ++r) {
      const __m512 s = _mm512_set1_ps(p.sa[r * p.kb + b]);
      for (int j = 0; j < NT; ++j) {
        const __m512 f = _mm512_cvtepi32_ps(_mm512_sub_epi32(acc[r][j], cv[j]));
        t[r][j] = _mm512_add_ps(t[r][j], _mm512_mul_ps(f, _mm512_mul_ps(s, sv[j])));
      }
    }
  }
  for (int r = 0; r < MR; ++r) {
    for (int j = 0; j < NT; ++j) _mm512_storeu_ps(p.t + r * 32 + j * 16, t[r][j]);
  }
}

}  // namespace

void panel_avx512vnni(const PanelArgs& p, int rows, int nt) {
  switch (rows * 2 + nt - 1) {
    case 2: return panel<1, 1>(p);
    case 3: return panel<1, 2>(p);
    case 4: return panel<2, 1>(p);
    case 5: return panel<2, 2>(p);
    case 6: return panel<3, 1>(p);
    case 7: return panel<3, 2>(p);
    case 8: return panel<4, 1>(p);
    default: return panel<4, 2>(p);
  }
}

}  // namespace nbits_a8
}  // namespace quanta
