// The MLAS rational logistic and tanh of recurrent_scalar.h (logistic_one, tanh_one) on
// 8 lanes (AVX2 + FMA) and 16 lanes (AVX-512F): each lane computes the scalar operations
// in their order, the Horner steps as vfmadd (one rounding, as std::fma). Used by the
// recurrent kernels and by float_ops' ORT-compatible MlasLogistic / MlasTanh.
//
// Everything here has internal linkage (an anonymous namespace): the header is included
// by translation units built for different ISAs, and an inline function with external
// linkage could be merged across them by the linker (an AVX-512 encoding running on an
// AVX2-only CPU).
//
// NaN: vminps / vmaxps return their SECOND operand when either is NaN, so the clamps are
// max(lo, x) then min(hi, t), and the logistic's floor is max(0, r): a NaN stays NaN, as
// np.maximum / np.minimum keep it.
#pragma once

#include <immintrin.h>

#include "recurrent/recurrent_scalar.h"

namespace quanta {
namespace recurrent {
namespace {

#if defined(__AVX2__) && defined(__FMA__)
inline __m256 clamp8(__m256 x, float lo, float hi) {
  return _mm256_min_ps(_mm256_set1_ps(hi), _mm256_max_ps(_mm256_set1_ps(lo), x));
}

template <int NP, int NQ>
inline __m256 rational8(__m256 v, const float (&P)[NP], const float (&Q)[NQ]) {
  const __m256 s = _mm256_mul_ps(v, v);
  __m256 p = _mm256_fmadd_ps(s, _mm256_set1_ps(P[0]), _mm256_set1_ps(P[1]));
  for (int k = 2; k < NP; ++k) p = _mm256_fmadd_ps(p, s, _mm256_set1_ps(P[k]));
  p = _mm256_mul_ps(v, p);
  __m256 q = _mm256_fmadd_ps(s, _mm256_set1_ps(Q[0]), _mm256_set1_ps(Q[1]));
  for (int k = 2; k < NQ; ++k) q = _mm256_fmadd_ps(q, s, _mm256_set1_ps(Q[k]));
  return _mm256_div_ps(p, q);
}

inline __m256 logistic8(__m256 x) {
  const __m256 r = _mm256_add_ps(rational8(clamp8(x, -kLogisticClamp, kLogisticClamp), kLogisticP, kLogisticQ),
                                 _mm256_set1_ps(0.5f));
  return _mm256_max_ps(_mm256_setzero_ps(), r);
}

inline __m256 tanh8(__m256 x) { return rational8(clamp8(x, -kTanhClamp, kTanhClamp), kTanhP, kTanhQ); }
#endif

#if defined(__AVX512F__)
inline __m512 clamp16(__m512 x, float lo, float hi) {
  return _mm512_min_ps(_mm512_set1_ps(hi), _mm512_max_ps(_mm512_set1_ps(lo), x));
}

template <int NP, int NQ>
inline __m512 rational16(__m512 v, const float (&P)[NP], const float (&Q)[NQ]) {
  const __m512 s = _mm512_mul_ps(v, v);
  __m512 p = _mm512_fmadd_ps(s, _mm512_set1_ps(P[0]), _mm512_set1_ps(P[1]));
  for (int k = 2; k < NP; ++k) p = _mm512_fmadd_ps(p, s, _mm512_set1_ps(P[k]));
  p = _mm512_mul_ps(v, p);
  __m512 q = _mm512_fmadd_ps(s, _mm512_set1_ps(Q[0]), _mm512_set1_ps(Q[1]));
  for (int k = 2; k < NQ; ++k) q = _mm512_fmadd_ps(q, s, _mm512_set1_ps(Q[k]));
  return _mm512_div_ps(p, q);
}

inline __m512 logistic16(__m512 x) {
  const __m512 r = _mm512_add_ps(rational16(clamp16(x, -kLogisticClamp, kLogisticClamp), kLogisticP, kLogisticQ),
                                 _mm512_set1_ps(0.5f));
  return _mm512_max_ps(_mm512_setzero_ps(), r);
}

inline __m512 tanh16(__m512 x) { return rational16(clamp16(x, -kTanhClamp, kTanhClamp), kTanhP, kTanhQ); }
#endif

}  // namespace
}  // namespace recurrent
}  // namespace quanta
