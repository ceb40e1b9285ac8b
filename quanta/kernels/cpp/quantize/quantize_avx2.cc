// AVX2 QuantizeLinear run, 8 floats per step; the bytes of quantize_portable.cc:
// rne(f32(x / scale)), clamp to [qmin - zp, qmax - zp] in float, + zp in int32, narrow
// with packs (exact: the values are already in range).
//
// The quotient without the division, as in quantize_avx512vnni.cc (the argument is
// written in quantize_avx512.h): P = f32(x · f32(1 / scale)) rounds like f32(x / scale)
// unless a lane lies within the margin of a half-integer, and then that vector divides.
// 8-bit storage: the margin 2^-11. 16-bit storage: the margin follows the lane's size,
// 2^-21·|P|, for |P| < 2^17 (beyond, P and Q clamp to the same end of ±65535, as there):
// |P − Q| ≤ 3u·|q| < 2^-22·|P| (u = 2^-24), and f32(0.5 − 2^-21·|P|) is at most 2^-26
// above the exact difference, so a lane with |P − rne(P)| below it has no half-integer
// between P and Q when |P| ≥ 2^-4 (2^-21·|P| − 2^-26 ≥ 2^-22·|P|), and for smaller |P|
// the nearest half-integer is ≥ 0.4375 away. A fixed 2^-4 (AVX-512's) sends about two of
// three 8-lane vectors of 16-bit codes to the divider.
#include <immintrin.h>

#include <cstdint>
#include <limits>
#include <type_traits>

#include "quantize.h"

namespace quanta {
namespace {

constexpr float kTieMargin8 = 0.5f - 0x1p-11f;

template <typename T>
void run(const float* x, T* y, int64_t n, float scale, int32_t zp) {
  const float lo = static_cast<float>(std::numeric_limits<T>::min() - zp);
  const float hi = static_cast<float>(std::numeric_limits<T>::max() - zp);
  const bool fast = scale >= 0x1p-126f && scale <= 0x1p126f;  // R = 1 / scale normal and finite
  const __m256 vs = _mm256_set1_ps(scale), vinv = _mm256_set1_ps(1.0f / scale), vlo = _mm256_set1_ps(lo),
               vhi = _mm256_set1_ps(hi), margin = _mm256_set1_ps(kTieMargin8);
  const __m256 abs_mask = _mm256_castsi256_ps(_mm256_set1_epi32(0x7fffffff));
  const __m256i vzp = _mm256_set1_epi32(zp);
  constexpr int kRound = _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC;
  int64_t i = 0;
  for (; i + 8 <= n; i += 8) {
    const __m256 xv = _mm256_loadu_ps(x + i);
    __m256 q = _mm256_mul_ps(xv, vinv);  // P
    const __m256 dist = _mm256_and_ps(_mm256_sub_ps(q, _mm256_round_ps(q, kRound)), abs_mask);
    __m256 near;
    if constexpr (sizeof(T) == 1) {
      near = _mm256_cmp_ps(dist, margin, _CMP_GE_OQ);
    } else {  // NaN P: both comparisons false, the lane is safe (as the 8-bit test)
      const __m256 a = _mm256_and_ps(q, abs_mask);
      const __m256 lane_margin = _mm256_sub_ps(_mm256_set1_ps(0.5f), _mm256_mul_ps(a, _mm256_set1_ps(0x1p-21f)));
      near = _mm256_and_ps(_mm256_cmp_ps(dist, lane_margin, _CMP_GE_OQ),
                           _mm256_cmp_ps(a, _mm256_set1_ps(0x1p17f), _CMP_LT_OQ));
    }
    if (!fast || _mm256_movemask_ps(near) != 0) {  // near a tie: divide
      q = _mm256_div_ps(xv, vs);
    }
    // Clamp, then round (integral bounds: the same as rounding first); vmaxps returns its
    // second operand for a NaN q: NaN -> qmin − zp, as the portable path and ONNX Runtime.
    q = _mm256_min_ps(_mm256_max_ps(q, vlo), vhi);
    const __m256i v = _mm256_add_epi32(_mm256_cvtps_epi32(q), vzp);  // rounds half to even (MXCSR)
    const __m128i v0 = _mm256_castsi256_si128(v), v1 = _mm256_extracti128_si256(v, 1);
    if constexpr (sizeof(T) == 1) {
      const __m128i w = _mm_packs_epi32(v0, v1);  // in range
      const __m128i b = std::is_same_v<T, uint8_t> ? _mm_packus_epi16(w, w) : _mm_packs_epi16(w, w);
      _mm_storel_epi64(reinterpret_cast<__m128i*>(y + i), b);
    } else {
      const __m128i w = std::is_same_v<T, uint16_t> ? _mm_packus_epi32(v0, v1) : _mm_packs_epi32(v0, v1);
      _mm_storeu_si128(reinterpret_cast<__m128i*>(y + i), w);
    }
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
void quantize_run_u16_avx2(const float* x, uint16_t* y, int64_t n, float scale, int32_t zp) {
  run<uint16_t>(x, y, n, scale, zp);
}
void quantize_run_s16_avx2(const float* x, int16_t* y, int64_t n, float scale, int32_t zp) {
  run<int16_t>(x, y, n, scale, zp);
}

}  // namespace quanta
