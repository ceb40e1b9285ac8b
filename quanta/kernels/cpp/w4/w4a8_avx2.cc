// W4A8 block dot, AVX2: vpmaddubsw (u8 × s8 pairs -> int16, exact: |w'| ≤ 15 so a pair
// sums to at most 2·255·15 = 7650 < 2^15) then vpmaddwd with ones -> int32.
#include <immintrin.h>

#include <cstring>

#include "w4/w4a8.h"

namespace quanta {
namespace w4a8 {

void block_dot_avx2(const uint8_t* a, const int8_t* w, int64_t b4, int32_t* acc) {
  const __m256i ones = _mm256_set1_epi16(1);
  __m256i s0 = _mm256_setzero_si256(), s1 = _mm256_setzero_si256();
  for (int64_t g = 0; g < b4; ++g) {
    int32_t q;
    std::memcpy(&q, a + 4 * g, 4);
    const __m256i x = _mm256_set1_epi32(q);
    const __m256i w0 = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(w + g * 64));
    const __m256i w1 = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(w + g * 64 + 32));
    s0 = _mm256_add_epi32(s0, _mm256_madd_epi16(_mm256_maddubs_epi16(x, w0), ones));
    s1 = _mm256_add_epi32(s1, _mm256_madd_epi16(_mm256_maddubs_epi16(x, w1), ones));
  }
  _mm256_storeu_si256(reinterpret_cast<__m256i*>(acc), s0);
  _mm256_storeu_si256(reinterpret_cast<__m256i*>(acc + 8), s1);
}

}  // namespace w4a8
}  // namespace quanta
