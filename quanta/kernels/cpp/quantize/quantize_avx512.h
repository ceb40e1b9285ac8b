// One 16-lane step of the AVX-512 QuantizeLinear run (quantize_avx512vnni.cc and the fused
// runs that end in a per-tensor QuantizeLinear, e.g. tensor_ops/softmax_quant_avx512vnni.cc):
// the bytes of quantize_portable.cc
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
// Include only from translation units compiled for AVX-512.
#pragma once

#include <immintrin.h>

#include <cstdint>
#include <limits>
#include <type_traits>

namespace quanta {

// |P − rne(P)| below this: rne(P) = rne(Q) (8-bit and 16-bit storage, bounds above)
template <typename T>
constexpr float kTieMargin = sizeof(T) == 1 ? 0.5f - 0x1p-11f : 0.5f - 0x1p-4f;

// The constants of one (scale, zero point) and the step: 16 floats -> 16 int32 codes
// (already in T's range; narrow with store16).
template <typename T>
struct Quantize16 {
  __m512 vs, vinv, vlo, vhi, margin, abs_mask;
  __m512i vzp;
  bool fast;

  Quantize16(float scale, int32_t zp)
      : vs(_mm512_set1_ps(scale)),
        vinv(_mm512_set1_ps(1.0f / scale)),
        vlo(_mm512_set1_ps(static_cast<float>(std::numeric_limits<T>::min() - zp))),
        vhi(_mm512_set1_ps(static_cast<float>(std::numeric_limits<T>::max() - zp))),
        margin(_mm512_set1_ps(kTieMargin<T>)),
        abs_mask(_mm512_castsi512_ps(_mm512_set1_epi32(0x7fffffff))),
        vzp(_mm512_set1_epi32(zp)),
        fast(scale >= 0x1p-126f && scale <= 0x1p126f) {}  // R = 1 / scale normal and finite

  __m512i operator()(__m512 xv) const {
    __m512 q = _mm512_mul_ps(xv, vinv);  // P
    // vreduceps (imm 0): P − rne(P), exact, in [−0.5, 0.5]; NaN for a NaN P (then "safe")
    const __m512 dist = _mm512_and_ps(_mm512_reduce_ps(q, _MM_FROUND_TO_NEAREST_INT), abs_mask);
    if (!fast || _mm512_cmp_ps_mask(dist, margin, _CMP_GE_OQ) != 0) q = _mm512_div_ps(xv, vs);  // Q
    // Clamp, then round: with integral bounds rne(clamp(q)) = clamp(rne(q)); vmaxps returns
    // its second operand for a NaN q, so NaN -> qmin − zp (then + zp = qmin), as the
    // portable path and ONNX Runtime. vcvtps2dq rounds half to even (MXCSR, as nearbyint).
    q = _mm512_min_ps(_mm512_max_ps(q, vlo), vhi);
    return _mm512_add_epi32(_mm512_cvtps_epi32(q), vzp);
  }

  // register-form narrowing + a plain store for whole vectors (the masked memory form
  // of vpmov[u]sd[bw] is several times slower); the masked form for a tail of left < 16
  static void store16(T* y, __m512i v, int64_t left, __mmask16 k) {
    if constexpr (sizeof(T) == 1) {
      const __m128i b = std::is_same_v<T, uint8_t> ? _mm512_cvtusepi32_epi8(v) : _mm512_cvtsepi32_epi8(v);
      if (left >= 16) {
        _mm_storeu_si128(reinterpret_cast<__m128i*>(y), b);
      } else {
        _mm_mask_storeu_epi8(y, k, b);
      }
    } else {
      const __m256i w = std::is_same_v<T, uint16_t> ? _mm512_cvtusepi32_epi16(v) : _mm512_cvtsepi32_epi16(v);
      if (left >= 16) {
        _mm256_storeu_si256(reinterpret_cast<__m256i*>(y), w);
      } else {
        _mm256_mask_storeu_epi16(y, k, w);
      }
    }
  }
};

}  // namespace quanta
