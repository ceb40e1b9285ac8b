// AVX-512 QuantizeLinear run, 16 floats per step; the bytes of quantize_portable.cc
// (rne(f32(x / scale)), clamp in float, + zp in int32, narrow with vpmov[u]sdb, which
// cannot saturate here because the value is already in range).
//
// The quotient without the division (vdivps zmm occupies the divider ~10 cycles per
// vector; it was the bound of this loop): P = f32(x · R), R = f32(1 / scale), is within
// 3u·|q| (u = 2^-24, q = x / scale exactly) of Q = f32(x / scale), the quotient the
// contract rounds. So rne(P) = rne(Q) whenever no half-integer lies within 3u·|q| of P:
//   - for |q| <= 1025 that distance is < 2^-12, and a vector whose lanes all have
//     |P − rne(P)| < 0.5 − 2^-11 takes rne(P) (no half-integer between P and Q);
//   - for |q| > 600 both round beyond the clamp range [qmin − zp, qmax − zp] ⊂ [−255, 510]
//     and clamp to the same end (P and Q have the same sign, and |P| > 600(1 − 3u) too);
//   - 16-bit storage: the clamp range lies in [−65535, 65535]; for |q| <= 2^17 the distance
//     is < 3·2^-7 < 2^-5, so the lane test uses the margin 0.5 − 2^-4, and beyond 2^17 both
//     clamp to the same end as above;
//   - NaN x: P is NaN, the lane is "safe" (the comparison is false) and maps to qmin.
// Any other vector (a lane near a tie) is recomputed with the true division. R must be
// normal and finite for the bound (scale in [2^-126, 2^126]); otherwise every vector
// divides. tests/kernels/test_quantize_native.py drives x onto and next to the ties.
#include <immintrin.h>

#include <cstdint>
#include <limits>
#include <type_traits>

#include "quantize.h"

namespace quanta {
namespace {

// |P − rne(P)| below this: rne(P) = rne(Q) (8-bit and 16-bit storage, bounds above)
template <typename T>
constexpr float kTieMargin = sizeof(T) == 1 ? 0.5f - 0x1p-11f : 0.5f - 0x1p-4f;

template <typename T>
void run(const float* x, T* y, int64_t n, float scale, int32_t zp) {
  const float lo = static_cast<float>(std::numeric_limits<T>::min() - zp);
  const float hi = static_cast<float>(std::numeric_limits<T>::max() - zp);
  const float inv = 1.0f / scale;
  const bool fast = scale >= 0x1p-126f && scale <= 0x1p126f;  // R = 1 / scale normal and finite
  const __m512 vs = _mm512_set1_ps(scale), vinv = _mm512_set1_ps(inv), vlo = _mm512_set1_ps(lo),
               vhi = _mm512_set1_ps(hi), margin = _mm512_set1_ps(kTieMargin<T>);
  const __m512 abs_mask = _mm512_castsi512_ps(_mm512_set1_epi32(0x7fffffff));
  const __m512i vzp = _mm512_set1_epi32(zp);
  for (int64_t i = 0; i < n; i += 16) {
    const int64_t left = n - i;
    const __mmask16 k = left >= 16 ? static_cast<__mmask16>(0xffff) : static_cast<__mmask16>((1u << left) - 1u);
    const __m512 xv = _mm512_maskz_loadu_ps(k, x + i);
    __m512 q = _mm512_mul_ps(xv, vinv);  // P
    // vreduceps (imm 0): P − rne(P), exact, in [−0.5, 0.5]; NaN for a NaN P (then "safe")
    const __m512 dist = _mm512_and_ps(_mm512_reduce_ps(q, _MM_FROUND_TO_NEAREST_INT), abs_mask);
    if (!fast || _mm512_cmp_ps_mask(dist, margin, _CMP_GE_OQ) != 0) q = _mm512_div_ps(xv, vs);  // Q
    // Clamp, then round: with integral bounds rne(clamp(q)) = clamp(rne(q)); vmaxps returns
    // its second operand for a NaN q, so NaN -> qmin − zp (then + zp = qmin), as the
    // portable path and ONNX Runtime. vcvtps2dq rounds half to even (MXCSR, as nearbyint).
    q = _mm512_min_ps(_mm512_max_ps(q, vlo), vhi);
    const __m512i v = _mm512_add_epi32(_mm512_cvtps_epi32(q), vzp);
    // register-form narrowing + a plain store for whole vectors (the masked memory form
    // of vpmov[u]sd[bw] is several times slower); the masked form for the tail only
    if constexpr (sizeof(T) == 1) {
      const __m128i b = std::is_same_v<T, uint8_t> ? _mm512_cvtusepi32_epi8(v) : _mm512_cvtsepi32_epi8(v);
      if (left >= 16) {
        _mm_storeu_si128(reinterpret_cast<__m128i*>(y + i), b);
      } else {
        _mm_mask_storeu_epi8(y + i, k, b);
      }
    } else {
      const __m256i w = std::is_same_v<T, uint16_t> ? _mm512_cvtusepi32_epi16(v) : _mm512_cvtsepi32_epi16(v);
      if (left >= 16) {
        _mm256_storeu_si256(reinterpret_cast<__m256i*>(y + i), w);
      } else {
        _mm256_mask_storeu_epi16(y + i, k, w);
      }
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
void quantize_run_u16_avx512vnni(const float* x, uint16_t* y, int64_t n, float scale, int32_t zp) {
  run<uint16_t>(x, y, n, scale, zp);
}
void quantize_run_s16_avx512vnni(const float* x, int16_t* y, int64_t n, float scale, int32_t zp) {
  run<int16_t>(x, y, n, scale, zp);
}

}  // namespace quanta
