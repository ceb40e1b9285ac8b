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
// The generic row loops with AVX2 enabled (the compiler vectorizes them).
const RowKernels kRowsAvx2 = {dw_row_generic, requant_row_generic};
}  // namespace a16w8
}  // namespace quanta
