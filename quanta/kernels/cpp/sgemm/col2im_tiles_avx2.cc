// AVX2 rows of col2im_tiles.h: 8 values of each of the two column rows per step,
// (+0 + v) + b and the clamp in lanes (max(lo, v) / min(hi, v) keep v when it is NaN, as
// the scalar v < lo ? lo : v), then unpack and a lane swap put them in output order.
#include <immintrin.h>

#include "sgemm/col2im_tiles.h"

namespace quanta {
namespace sgemm {

void interleave2_avx2(const float* s0, const float* s1, int64_t n, float b, float lo, float hi, float* out) {
  const __m256 zero = _mm256_setzero_ps();
  const __m256 bv = _mm256_set1_ps(b);
  const __m256 lov = _mm256_set1_ps(lo);
  const __m256 hiv = _mm256_set1_ps(hi);
  auto f = [&](__m256 v) { return _mm256_min_ps(hiv, _mm256_max_ps(lov, _mm256_add_ps(_mm256_add_ps(zero, v), bv))); };
  int64_t i = 0;
  for (; i + 8 <= n; i += 8) {
    const __m256 a = f(_mm256_loadu_ps(s0 + i));
    const __m256 c = f(_mm256_loadu_ps(s1 + i));
    const __m256 l = _mm256_unpacklo_ps(a, c);  // a0 c0 a1 c1 | a4 c4 a5 c5
    const __m256 u = _mm256_unpackhi_ps(a, c);  // a2 c2 a3 c3 | a6 c6 a7 c7
    _mm256_storeu_ps(out + 2 * i, _mm256_permute2f128_ps(l, u, 0x20));
    _mm256_storeu_ps(out + 2 * i + 8, _mm256_permute2f128_ps(l, u, 0x31));
  }
  for (; i < n; ++i) {
    for (int k = 0; k < 2; ++k) {
      float v = 0.0f + (k ? s1[i] : s0[i]);
      v = v + b;
      v = v < lo ? lo : v;
      v = v > hi ? hi : v;
      out[2 * i + k] = v;
    }
  }
}

}  // namespace sgemm
}  // namespace quanta
