// AVX2 (W8) dequantization of one int8 micro-panel (contract: w8.h): four 8-lane sign
// extensions per row of 32 weights, conversions and the subtraction exact, the multiply
// the one rounding.
#include <immintrin.h>

#include "sgemm/w8.h"

namespace quanta {
namespace sgemm {

void dequant_panel_avx2(const int8_t* q, const float* zp, const float* scale, int64_t kc, float* out) {
  __m256 z[4], s[4];
  for (int v = 0; v < 4; ++v) {
    z[v] = _mm256_loadu_ps(zp + 8 * v);
    s[v] = _mm256_loadu_ps(scale + 8 * v);
  }
  for (int64_t kk = 0; kk < kc; ++kk) {
    const int8_t* src = q + kk * kPackNr;
    for (int v = 0; v < 4; ++v) {
      const __m128i b = _mm_loadl_epi64(reinterpret_cast<const __m128i*>(src + 8 * v));
      const __m256 f = _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(b));
      _mm256_store_ps(out + kk * kPackNr + 8 * v, _mm256_mul_ps(_mm256_sub_ps(f, z[v]), s[v]));
    }
  }
}

}  // namespace sgemm
}  // namespace quanta
