// A16W8 micro-kernel, AVX-512 VNNI: vpdpwssd (int16 pairs -> int32 lanes), 4 rows × 32
// columns = 8 zmm accumulators, flushed to int64 every kKcPairs pair steps (a16w8.h bound).
#include <immintrin.h>

#include <cstring>

#include "a16w8/a16w8.h"

namespace quanta {
namespace a16w8 {
namespace {
// One int16 pair as the int32 the broadcast takes (memcpy: no aliasing of the int16 panel).
inline int32_t pair(const int16_t* p) {
  int32_t v;
  std::memcpy(&v, p, sizeof v);
  return v;
}
}  // namespace

void ukernel_avx512vnni(const int16_t* a, int64_t lda, int mr, int64_t k2, const int16_t* b, int64_t* c) {
  for (int r = 0; r < mr; ++r) {
    for (int j = 0; j < kNR; ++j) c[r * kNR + j] = 0;
  }
  const int16_t* b0 = b;
  const int16_t* b1 = b + k2 * 32;
  for (int64_t p0 = 0; p0 < k2; p0 += kKcPairs) {
    const int64_t p1 = p0 + kKcPairs < k2 ? p0 + kKcPairs : k2;
    __m512i acc[kMR][2];
    for (int r = 0; r < kMR; ++r) acc[r][0] = acc[r][1] = _mm512_setzero_si512();
    if (mr == kMR) {
      const int16_t *a0 = a, *a1 = a + lda, *a2 = a + 2 * lda, *a3 = a + 3 * lda;
      for (int64_t p = p0; p < p1; ++p) {
        const __m512i w0 = _mm512_loadu_si512(b0 + p * 32);
        const __m512i w1 = _mm512_loadu_si512(b1 + p * 32);
        __m512i x = _mm512_set1_epi32(pair(a0 + 2 * p));
        acc[0][0] = _mm512_dpwssd_epi32(acc[0][0], x, w0);
        acc[0][1] = _mm512_dpwssd_epi32(acc[0][1], x, w1);
        x = _mm512_set1_epi32(pair(a1 + 2 * p));
        acc[1][0] = _mm512_dpwssd_epi32(acc[1][0], x, w0);
        acc[1][1] = _mm512_dpwssd_epi32(acc[1][1], x, w1);
        x = _mm512_set1_epi32(pair(a2 + 2 * p));
        acc[2][0] = _mm512_dpwssd_epi32(acc[2][0], x, w0);
        acc[2][1] = _mm512_dpwssd_epi32(acc[2][1], x, w1);
        x = _mm512_set1_epi32(pair(a3 + 2 * p));
        acc[3][0] = _mm512_dpwssd_epi32(acc[3][0], x, w0);
        acc[3][1] = _mm512_dpwssd_epi32(acc[3][1], x, w1);
      }
    } else {
      for (int64_t p = p0; p < p1; ++p) {
        const __m512i w0 = _mm512_loadu_si512(b0 + p * 32);
        const __m512i w1 = _mm512_loadu_si512(b1 + p * 32);
        for (int r = 0; r < mr; ++r) {
          const __m512i x = _mm512_set1_epi32(pair(a + r * lda + 2 * p));
          acc[r][0] = _mm512_dpwssd_epi32(acc[r][0], x, w0);
          acc[r][1] = _mm512_dpwssd_epi32(acc[r][1], x, w1);
        }
      }
    }
    for (int r = 0; r < mr; ++r) {
      for (int h = 0; h < 2; ++h) {
        int64_t* cp = c + r * kNR + h * 16;
        const __m512i lo = _mm512_cvtepi32_epi64(_mm512_castsi512_si256(acc[r][h]));
        const __m512i hi = _mm512_cvtepi32_epi64(_mm512_extracti64x4_epi64(acc[r][h], 1));
        _mm512_storeu_si512(cp, _mm512_add_epi64(_mm512_loadu_si512(cp), lo));
        _mm512_storeu_si512(cp + 8, _mm512_add_epi64(_mm512_loadu_si512(cp + 8), hi));
      }
    }
  }
}

}  // namespace a16w8
}  // namespace quanta
