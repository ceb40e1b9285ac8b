// MatMulNBits W4A8 panel, AVX-512 VNNI: up to 4 rows × 32 columns, one 64-byte load of
// nibbles per group of 4 k split into the two tiles' codes, vpdpbusd (codes unsigned, qa
// signed), the block's zero-point term (W10) and float step (W8) on registers (nbits_a8.h).
#include <immintrin.h>

#include <cfloat>
#include <cstring>
#include <limits>

#include "w4/nbits_a8.h"

namespace quanta {
namespace nbits_a8 {
namespace {

// U sets of block accumulators take alternate groups: with one or two rows, one set would
// chain every vpdpbusd of a tile on the one before it (latency-bound, not throughput-bound).
template <int MR, int NT, int U, int BITS>
void panel(const PanelArgs& p) {
  [[maybe_unused]] const __m512i low = _mm512_set1_epi8(0x0F);
  __m512 t[MR][NT];
  for (int r = 0; r < MR; ++r) {
    for (int j = 0; j < NT; ++j) t[r][j] = _mm512_setzero_ps();
  }
  for (int64_t b = 0; b < p.kb; ++b) {
    __m512i acc[U][MR][NT];
    for (int u = 0; u < U; ++u) {
      for (int r = 0; r < MR; ++r) {
        for (int j = 0; j < NT; ++j) acc[u][r][j] = _mm512_setzero_si512();
      }
    }
    const int8_t* a = p.qa + b * p.b4 * 4;
    const uint8_t* w = p.w + b * p.wb_stride;
    auto group = [&](int64_t g, __m512i(&ac)[MR][NT]) {
      __m512i wv[NT];
      if constexpr (BITS == 8) {
        // one code a byte: each tile's 16 columns × 4 k are their own 64 bytes
        for (int j = 0; j < NT; ++j) wv[j] = _mm512_loadu_si512(w + g * 128 + j * 64);
      } else {
        const __m512i v = _mm512_loadu_si512(w + g * 64);
        wv[0] = _mm512_and_si512(v, low);
        if constexpr (NT == 2) wv[1] = _mm512_and_si512(_mm512_srli_epi16(v, 4), low);
      }
      for (int r = 0; r < MR; ++r) {
        int32_t q;
        std::memcpy(&q, a + r * p.lda + 4 * g, 4);
        const __m512i x = _mm512_set1_epi32(q);
        for (int j = 0; j < NT; ++j) ac[r][j] = _mm512_dpbusd_epi32(ac[r][j], wv[j], x);
      }
    };
    int64_t g = 0;
    for (; g + U <= p.b4; g += U) {
      for (int u = 0; u < U; ++u) group(g + u, acc[u]);
    }
    for (; g < p.b4; ++g) group(g, acc[0]);
    __m512i zv[NT];
    __m512 sv[NT];
    for (int j = 0; j < NT; ++j) {
      zv[j] = _mm512_cvtepu8_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p.zp + b * 32 + j * 16)));
      sv[j] = _mm512_loadu_ps(p.sw + b * 32 + j * 16);
    }
    for (int r = 0; r < MR; ++r) {
      const __m512 s = _mm512_set1_ps(p.sa[r * p.kb + b]);
      const __m512i sq = _mm512_set1_epi32(p.sqa[r * p.kb + b]);
      for (int j = 0; j < NT; ++j) {
        __m512i d = acc[0][r][j];
        for (int u = 1; u < U; ++u) d = _mm512_add_epi32(d, acc[u][r][j]);
        d = _mm512_sub_epi32(d, _mm512_mullo_epi32(zv[j], sq));  // eq. (W10)
        const __m512 f = _mm512_cvtepi32_ps(d);
        t[r][j] = _mm512_add_ps(t[r][j], _mm512_mul_ps(f, _mm512_mul_ps(s, sv[j])));
      }
    }
  }
  for (int r = 0; r < MR; ++r) {
    for (int j = 0; j < NT; ++j) _mm512_storeu_ps(p.t + r * 32 + j * 16, t[r][j]);
  }
}

}  // namespace

void quantize_rows_avx512vnni(const float* a, const Params& p, int64_t r0, int64_t r1, int8_t* qa, float* sa,
                              int32_t* sqa) {
  const int64_t kb = (p.k + p.block - 1) / p.block, lda = kb * p.block;
  const __m512 sign = _mm512_set1_ps(-0.0f), big = _mm512_set1_ps(FLT_MAX);
  for (int64_t i = r0; i < r1; ++i) {
    const float* row = a + i * p.k;
    for (int64_t b = 0; b < kb; ++b) {
      const int64_t k0 = b * p.block, len = k0 + p.block < p.k ? p.block : p.k - k0;
      __m512 mx = _mm512_setzero_ps();
      __mmask16 bad = 0;
      for (int64_t k = 0; k < len; k += 16) {
        const __mmask16 m = len - k >= 16 ? 0xFFFF : static_cast<__mmask16>((1u << (len - k)) - 1);
        const __m512 v = _mm512_andnot_ps(sign, _mm512_maskz_loadu_ps(m, row + k0 + k));
        bad |= m & ~_mm512_cmp_ps_mask(v, big, _CMP_LE_OQ);  // inf and NaN
        mx = _mm512_max_ps(mx, v);
      }
      int8_t* q = qa + i * lda + k0;
      if (bad) {
        sa[i * kb + b] = std::numeric_limits<float>::quiet_NaN();
        sqa[i * kb + b] = 0;
        std::memset(q, 0, static_cast<size_t>(p.block));
        continue;
      }
      const float m = _mm512_reduce_max_ps(mx);
      sa[i * kb + b] = m / 127.0f;
      const __m512 r = _mm512_set1_ps(m != 0.0f ? 127.0f / m : 0.0f);
      __m512i sum = _mm512_setzero_si512();
      for (int64_t k = 0; k < len; k += 16) {
        const __mmask16 mk = len - k >= 16 ? 0xFFFF : static_cast<__mmask16>((1u << (len - k)) - 1);
        // vcvtps2dq rounds in the default mode, to nearest even: std::nearbyint's codes
        const __m512i c = _mm512_cvtps_epi32(_mm512_mul_ps(_mm512_maskz_loadu_ps(mk, row + k0 + k), r));
        sum = _mm512_add_epi32(sum, c);
        _mm512_mask_cvtepi32_storeu_epi8(q + k, mk, c);
      }
      sqa[i * kb + b] = _mm512_reduce_add_epi32(sum);
      if (len < p.block) std::memset(q + len, 0, static_cast<size_t>(p.block - len));
    }
  }
}

namespace {

template <int BITS>
void panel_bits(const PanelArgs& p, int rows, int nt) {
  switch (rows * 2 + nt - 1) {
    case 2: return panel<1, 1, 2, BITS>(p);
    case 3: return panel<1, 2, 2, BITS>(p);
    case 4: return panel<2, 1, 2, BITS>(p);
    case 5: return panel<2, 2, 2, BITS>(p);
    case 6: return panel<3, 1, 1, BITS>(p);
    case 7: return panel<3, 2, 1, BITS>(p);
    case 8: return panel<4, 1, 1, BITS>(p);
    default: return panel<4, 2, 1, BITS>(p);
  }
}

}  // namespace

void panel_avx512vnni(const PanelArgs& p, int rows, int nt) {
  if (p.bits == 8) return panel_bits<8>(p, rows, nt);
  return panel_bits<4>(p, rows, nt);
}

}  // namespace nbits_a8
}  // namespace quanta
