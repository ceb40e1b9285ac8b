// AVX-512 (W8) dequantization of one int8 micro-panel (contract: w8.h): per row of 32
// weights two sign extensions to int32, conversions (exact), a subtraction (exact) and a
// multiply (the one rounding).
#include <immintrin.h>

#include "sgemm/w8.h"

namespace quanta {
namespace sgemm {

void dequant_panel_avx512vnni(const int8_t* q, const float* zp, const float* scale, int64_t kc, float* out) {
  const __m512 z0 = _mm512_loadu_ps(zp), z1 = _mm512_loadu_ps(zp + 16);
  const __m512 s0 = _mm512_loadu_ps(scale), s1 = _mm512_loadu_ps(scale + 16);
  for (int64_t kk = 0; kk < kc; ++kk) {
    const int8_t* src = q + kk * kPackNr;
    const __m512 f0 = _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(src))));
    const __m512 f1 =
        _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(src + 16))));
    _mm512_store_ps(out + kk * kPackNr, _mm512_mul_ps(_mm512_sub_ps(f0, z0), s0));
    _mm512_store_ps(out + kk * kPackNr + 16, _mm512_mul_ps(_mm512_sub_ps(f1, z1), s1));
  }
}

}  // namespace sgemm
}  // namespace quanta
