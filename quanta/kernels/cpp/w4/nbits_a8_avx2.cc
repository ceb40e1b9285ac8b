// MatMulNBits W4A8 panel, AVX2: per 16-column tile (the low or the high nibbles), vpmaddubsw
// (codes unsigned, qa signed) then vpmaddwd with ones per group of 4 k (exact: a pair sums to
// at most 2 · 15 · 127 = 3810 < 2^15), up to 4 rows a pass (nbits_a8.h).
#include <immintrin.h>

#include <cfloat>
#include <cmath>
#include <cstring>
#include <limits>

#include "w4/nbits_a8.h"

namespace quanta {
namespace nbits_a8 {
namespace {

// one 16-column tile j of the panel for MR rows. 8-bit codes go in as their two nibbles,
// Σ q·qa = Σ lo·qa + 16 · Σ hi·qa: a vpmaddubsw pair of whole bytes could reach
// 2 · 255 · 127 > 2^15 and saturate, a pair of nibbles stays exact.
template <int MR, int BITS>
void tile(const PanelArgs& p, int j) {
  const __m256i ones = _mm256_set1_epi16(1);
  const __m256i low = _mm256_set1_epi8(0x0F);
  const int64_t c0 = j * 16;
  __m256 t[MR][2];
  for (int r = 0; r < MR; ++r) t[r][0] = t[r][1] = _mm256_setzero_ps();
  for (int64_t b = 0; b < p.kb; ++b) {
    __m256i acc[MR][2];
    for (int r = 0; r < MR; ++r) acc[r][0] = acc[r][1] = _mm256_setzero_si256();
    const int8_t* a = p.qa + b * p.b4 * 4;
    const uint8_t* w = p.w + b * p.wb_stride;
    for (int64_t g = 0; g < p.b4; ++g) {
      if constexpr (BITS == 8) {
        const uint8_t* wg = w + g * 128 + j * 64;
        const __m256i v0 = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(wg));
        const __m256i v1 = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(wg + 32));
        const __m256i l0 = _mm256_and_si256(v0, low), h0 = _mm256_and_si256(_mm256_srli_epi16(v0, 4), low);
        const __m256i l1 = _mm256_and_si256(v1, low), h1 = _mm256_and_si256(_mm256_srli_epi16(v1, 4), low);
        for (int r = 0; r < MR; ++r) {
          int32_t q;
          std::memcpy(&q, a + r * p.lda + 4 * g, 4);
          const __m256i x = _mm256_set1_epi32(q);
          const __m256i d0 =
              _mm256_add_epi32(_mm256_madd_epi16(_mm256_maddubs_epi16(l0, x), ones),
                               _mm256_slli_epi32(_mm256_madd_epi16(_mm256_maddubs_epi16(h0, x), ones), 4));
          const __m256i d1 =
              _mm256_add_epi32(_mm256_madd_epi16(_mm256_maddubs_epi16(l1, x), ones),
                               _mm256_slli_epi32(_mm256_madd_epi16(_mm256_maddubs_epi16(h1, x), ones), 4));
          acc[r][0] = _mm256_add_epi32(acc[r][0], d0);
          acc[r][1] = _mm256_add_epi32(acc[r][1], d1);
        }
      } else {
        __m256i w0 = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(w + g * 64));
        __m256i w1 = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(w + g * 64 + 32));
        if (j == 1) {
          w0 = _mm256_srli_epi16(w0, 4);
          w1 = _mm256_srli_epi16(w1, 4);
        }
        w0 = _mm256_and_si256(w0, low);
        w1 = _mm256_and_si256(w1, low);
        for (int r = 0; r < MR; ++r) {
          int32_t q;
          std::memcpy(&q, a + r * p.lda + 4 * g, 4);
          const __m256i x = _mm256_set1_epi32(q);
          acc[r][0] = _mm256_add_epi32(acc[r][0], _mm256_madd_epi16(_mm256_maddubs_epi16(w0, x), ones));
          acc[r][1] = _mm256_add_epi32(acc[r][1], _mm256_madd_epi16(_mm256_maddubs_epi16(w1, x), ones));
        }
      }
    }
    for (int h = 0; h < 2; ++h) {
      const __m256i zv =
          _mm256_cvtepu8_epi32(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(p.zp + b * 32 + c0 + h * 8)));
      const __m256 sv = _mm256_loadu_ps(p.sw + b * 32 + c0 + h * 8);
      for (int r = 0; r < MR; ++r) {
        const __m256i sq = _mm256_set1_epi32(p.sqa[r * p.kb + b]);
        const __m256i d = _mm256_sub_epi32(acc[r][h], _mm256_mullo_epi32(zv, sq));  // eq. (W10)
        const __m256 f = _mm256_cvtepi32_ps(d);
        const __m256 c = _mm256_mul_ps(_mm256_set1_ps(p.sa[r * p.kb + b]), sv);
        t[r][h] = _mm256_add_ps(t[r][h], _mm256_mul_ps(f, c));
      }
    }
  }
  for (int r = 0; r < MR; ++r) {
    _mm256_storeu_ps(p.t + r * 32 + c0, t[r][0]);
    _mm256_storeu_ps(p.t + r * 32 + c0 + 8, t[r][1]);
  }
}

}  // namespace

void quantize_rows_avx2(const float* a, const Params& p, int64_t r0, int64_t r1, int8_t* qa, float* sa, int32_t* sqa) {
  const int64_t kb = (p.k + p.block - 1) / p.block, lda = kb * p.block;
  const __m256 sign = _mm256_set1_ps(-0.0f), big = _mm256_set1_ps(FLT_MAX);
  for (int64_t i = r0; i < r1; ++i) {
    const float* row = a + i * p.k;
    for (int64_t b = 0; b < kb; ++b) {
      const int64_t k0 = b * p.block, len = k0 + p.block < p.k ? p.block : p.k - k0, l8 = len & ~int64_t{7};
      __m256 mx = _mm256_setzero_ps();
      int bad = 0;
      for (int64_t k = 0; k < l8; k += 8) {
        const __m256 v = _mm256_andnot_ps(sign, _mm256_loadu_ps(row + k0 + k));
        bad |= _mm256_movemask_ps(_mm256_cmp_ps(v, big, _CMP_NLE_UQ));  // inf and NaN
        mx = _mm256_max_ps(mx, v);
      }
      alignas(32) float lanes[8];
      _mm256_store_ps(lanes, mx);
      float m = 0.0f;
      for (float v : lanes) m = v > m ? v : m;
      for (int64_t k = l8; k < len; ++k) {
        const float v = std::fabs(row[k0 + k]);
        bad |= !(v <= FLT_MAX);
        m = v > m ? v : m;
      }
      int8_t* q = qa + i * lda + k0;
      if (bad) {
        sa[i * kb + b] = std::numeric_limits<float>::quiet_NaN();
        sqa[i * kb + b] = 0;
        std::memset(q, 0, static_cast<size_t>(p.block));
        continue;
      }
      sa[i * kb + b] = m / 127.0f;
      const float rs = m != 0.0f ? 127.0f / m : 0.0f;
      const __m256 r = _mm256_set1_ps(rs);
      __m256i sum = _mm256_setzero_si256();
      alignas(32) int32_t codes[8];
      for (int64_t k = 0; k < l8; k += 8) {
        // vcvtps2dq rounds in the default mode, to nearest even: std::nearbyint's codes
        const __m256i c = _mm256_cvtps_epi32(_mm256_mul_ps(_mm256_loadu_ps(row + k0 + k), r));
        sum = _mm256_add_epi32(sum, c);
        _mm256_store_si256(reinterpret_cast<__m256i*>(codes), c);
        for (int t = 0; t < 8; ++t) q[k + t] = static_cast<int8_t>(codes[t]);
      }
      _mm256_store_si256(reinterpret_cast<__m256i*>(codes), sum);
      int32_t total = 0;
      for (int32_t c : codes) total += c;
      for (int64_t k = l8; k < len; ++k) {
        const int32_t c = static_cast<int32_t>(std::nearbyint(row[k0 + k] * rs));
        q[k] = static_cast<int8_t>(c);
        total += c;
      }
      sqa[i * kb + b] = total;
      if (len < p.block) std::memset(q + len, 0, static_cast<size_t>(p.block - len));
    }
  }
}

namespace {

template <int BITS>
void tiles(const PanelArgs& p, int rows, int nt) {
  for (int j = 0; j < nt; ++j) {
    switch (rows) {
      case 1: tile<1, BITS>(p, j); break;
      case 2: tile<2, BITS>(p, j); break;
      case 3: tile<3, BITS>(p, j); break;
      default: tile<4, BITS>(p, j); break;
    }
  }
}

}  // namespace

void panel_avx2(const PanelArgs& p, int rows, int nt) {
  if (p.bits == 8) return tiles<8>(p, rows, nt);
  tiles<4>(p, rows, nt);
}

}  // namespace nbits_a8
}  // namespace quanta
