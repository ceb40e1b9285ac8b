// AVX-512 QuantizeLinear run, 16 floats per step; same arithmetic as quantize_portable.cc
// (true division, round half to even, clamp in float, + zp in int32, saturating narrow
// with vpmov[u]sdb, which cannot saturate here because the value is already in range).
#include <immintrin.h>

#include <cstdint>
#include <limits>
#include <type_traits>

#include "quantize.h"

namespace quanta {
namespace {
template <typename T>
void run(const float* x, T* y, int64_t n, float scale, int32_t zp) {
  const float lo = static_cast<float>(std::numeric_limits<T>::min() - zp);
  const float hi = static_cast<float>(std::numeric_limits<T>::max() - zp);
  const __m512 vs = _mm512_set1_ps(scale), vlo = _mm512_set1_ps(lo), vhi = _mm512_set1_ps(hi);
  const __m512i vzp = _mm512_set1_epi32(zp);
  int64_t i = 0;
  for (; i < n; i += 16) {
    const int64_t left = n - i;
    const __mmask16 k = left >= 16 ? static_cast<__mmask16>(0xffff) : static_cast<__mmask16>((1u << left) - 1u);
    __m512 q = _mm512_div_ps(_mm512_maskz_loadu_ps(k, x + i), vs);
    q = _mm512_roundscale_ps(q, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    q = _mm512_mask_mov_ps(vlo, _mm512_cmp_ps_mask(q, q, _CMP_ORD_Q), q);  // NaN -> qmin - zp
    q = _mm512_min_ps(_mm512_max_ps(q, vlo), vhi);
    const __m512i v = _mm512_add_epi32(_mm512_cvtps_epi32(q), vzp);
    if constexpr (std::is_same_v<T, uint8_t>) {
      _mm512_mask_cvtusepi32_storeu_epi8(y + i, k, v);
    } else {
      _mm512_mask_cvtsepi32_storeu_epi8(y + i, k, v);
    }
  }
}
}  // namespace

void quantize_run_u8_avx512vnni(const float* x, uint8_t* y, int64_t n, float scale, int32_t zp) {
  run<uint8_t>(x, y, n, scale, zp);
}
void quantize_run_s8_avx512vnni(const float* x, int8_t* y, int64_t n, float scale, int32_t zp) {
  run<int8_t>(x, y, n, scale, zp);
}

}  // namespace quanta
