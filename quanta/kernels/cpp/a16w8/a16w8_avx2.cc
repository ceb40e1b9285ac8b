// A16W8 micro-kernel, AVX2: vpmaddwd (int16 pairs -> int32) + vpaddd, 4 rows × 16 columns
// at a time (8 ymm accumulators), flushed to int64 every kKcPairs pair steps (a16w8.h).
#include <immintrin.h>

#include "a16w8/a16w8.h"
#include "a16w8/rows.h"

namespace quanta {
namespace a16w8 {
void ukernel_avx2(const int16_t* a, int64_t lda, int mr, int64_t k2, const int16_t* b, int64_t* c) {
  for (int r = 0; r < mr; ++r) {
    for (int j = 0; j < kNR; ++j) c[r * kNR + j] = 0;
  }
  for (int blk = 0; blk < 2; ++blk) {
    const int16_t* bb = b + blk * k2 * 32;
    for (int64_t p0 = 0; p0 < k2; p0 += kKcPairs) {
      const int64_t p1 = p0 + kKcPairs < k2 ? p0 + kKcPairs : k2;
      __m256i acc[kMR][2];
      for (int r = 0; r < kMR; ++r) acc[r][0] = acc[r][1] = _mm256_setzero_si256();
      for (int64_t p = p0; p < p1; ++p) {
        const __m256i w0 = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(bb + p * 32));
        const __m256i w1 = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(bb + p * 32 + 16));
        for (int r = 0; r < mr; ++r) {
          const __m256i x = _mm256_set1_epi32(pair(a + r * lda + 2 * p));
          acc[r][0] = _mm256_add_epi32(acc[r][0], _mm256_madd_epi16(x, w0));
          acc[r][1] = _mm256_add_epi32(acc[r][1], _mm256_madd_epi16(x, w1));
        }
      }
      for (int r = 0; r < mr; ++r) {
        for (int h = 0; h < 2; ++h) {
          int64_t* cp = c + r * kNR + blk * 16 + h * 8;
          const __m256i lo = _mm256_cvtepi32_epi64(_mm256_castsi256_si128(acc[r][h]));
          const __m256i hi = _mm256_cvtepi32_epi64(_mm256_extracti128_si256(acc[r][h], 1));
          const __m256i* src = reinterpret_cast<const __m256i*>(cp);
          _mm256_storeu_si256(reinterpret_cast<__m256i*>(cp), _mm256_add_epi64(_mm256_loadu_si256(src), lo));
          _mm256_storeu_si256(reinterpret_cast<__m256i*>(cp + 4), _mm256_add_epi64(_mm256_loadu_si256(src + 1), hi));
        }
      }
    }
  }
}

}  // namespace a16w8
}  // namespace quanta

namespace quanta {
namespace a16w8 {
namespace {

// a16w8.h RowKernels::dw_pairs: vpmaddwd (two int16 products summed in int32) + vpaddd,
// 32 outputs in four chains, then 8 at a time; the tail through a copy.
inline void store_widened(int64_t* acc, __m256i v) {
  _mm256_storeu_si256(reinterpret_cast<__m256i*>(acc), _mm256_cvtepi32_epi64(_mm256_castsi256_si128(v)));
  _mm256_storeu_si256(reinterpret_cast<__m256i*>(acc + 4), _mm256_cvtepi32_epi64(_mm256_extracti128_si256(v, 1)));
}

inline __m256i load8(const int32_t* p) { return _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p)); }

void dw_pairs(const int32_t* const* src, const int32_t* w, int64_t pairs, int64_t n, int64_t* acc) {
  int64_t i = 0;
  for (; i + 32 <= n; i += 32) {
    __m256i a0 = _mm256_setzero_si256(), a1 = a0, a2 = a0, a3 = a0;
    for (int64_t t = 0; t < pairs; ++t) {
      const __m256i wv = _mm256_set1_epi32(w[t]);
      const int32_t* s = src[t] + i;
      a0 = _mm256_add_epi32(a0, _mm256_madd_epi16(load8(s), wv));
      a1 = _mm256_add_epi32(a1, _mm256_madd_epi16(load8(s + 8), wv));
      a2 = _mm256_add_epi32(a2, _mm256_madd_epi16(load8(s + 16), wv));
      a3 = _mm256_add_epi32(a3, _mm256_madd_epi16(load8(s + 24), wv));
    }
    store_widened(acc + i, a0);
    store_widened(acc + i + 8, a1);
    store_widened(acc + i + 16, a2);
    store_widened(acc + i + 24, a3);
  }
  for (; i + 8 <= n; i += 8) {
    __m256i a0 = _mm256_setzero_si256();
    for (int64_t t = 0; t < pairs; ++t)
      a0 = _mm256_add_epi32(a0, _mm256_madd_epi16(load8(src[t] + i), _mm256_set1_epi32(w[t])));
    store_widened(acc + i, a0);
  }
  if (i < n) dw_pairs_generic_tail(src, w, pairs, i, n, acc);
}

}  // namespace

const RowKernels kRowsAvx2 = {dw_row_generic, dw_pairs, requant_row_generic};
}  // namespace a16w8
}  // namespace quanta
