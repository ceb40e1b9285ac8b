// AVX2 QuantizeLinear run, 8 floats per step; same arithmetic as quantize_portable.cc:
// true division, round to nearest even (_MM_FROUND_TO_NEAREST_INT), clamp to
// [qmin - zp, qmax - zp] in float, then + zp in int32 and narrow.
#include <immintrin.h>

#include <cstdint>
#include <limits>

#include "quantize.h"

namespace quanta {
namespace {
template <typename T>
void run(const float* x, T* y, int64_t n, float scale, int32_t zp) {
  const float lo = static_cast<float>(std::numeric_limits<T>::min() - zp);
  const float hi = static_cast<float>(std::numeric_limits<T>::max() - zp);
  const __m256 vs = _mm256_set1_ps(scale), vlo = _mm256_set1_ps(lo), vhi = _mm256_set1_ps(hi);
  const __m256i vzp = _mm256_set1_epi32(zp);
  int64_t i = 0;
  alignas(32) int32_t tmp[8];
  for (; i + 8 <= n; i += 8) {
    __m256 q = _mm256_div_ps(_mm256_loadu_ps(x + i), vs);
    q = _mm256_round_ps(q, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    // NaN -> qmin - zp (then + zp = qmin), as the portable path and ONNX Runtime.
    q = _mm256_blendv_ps(vlo, q, _mm256_cmp_ps(q, q, _CMP_ORD_Q));
    q = _mm256_min_ps(_mm256_max_ps(q, vlo), vhi);
    _mm256_store_si256(reinterpret_cast<__m256i*>(tmp), _mm256_add_epi32(_mm256_cvtps_epi32(q), vzp));
    for (int j = 0; j < 8; ++j) y[i + j] = static_cast<T>(tmp[j]);
  }
  for (; i < n; ++i) {
    float r = __builtin_nearbyintf(x[i] / scale);
    r = r < lo ? lo : r;
    r = r > hi ? hi : r;
    if (r != r) r = lo;
    y[i] = static_cast<T>(static_cast<int32_t>(r) + zp);
  }
}
}  // namespace

void quantize_run_u8_avx2(const float* x, uint8_t* y, int64_t n, float scale, int32_t zp) {
  run<uint8_t>(x, y, n, scale, zp);
}
void quantize_run_s8_avx2(const float* x, int8_t* y, int64_t n, float scale, int32_t zp) {
  run<int8_t>(x, y, n, scale, zp);
}

}  // namespace quanta
