// The MLAS rational logistic and tanh of recurrent_scalar.h (logistic_one, tanh_one) over
// the vector traits of simd.h (8 lanes AVX2 + FMA, 16 lanes AVX-512F): each lane computes
// the scalar operations in their order, the Horner steps as vfmadd (one rounding, as
// std::fma). Used by the
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
#include "simd.h"

namespace quanta {
namespace recurrent {
namespace {

template <class T>
inline typename T::V clamp_v(typename T::V x, float lo, float hi) {
  return T::min(T::set1(hi), T::max(T::set1(lo), x));
}

template <class T, int NP, int NQ>
inline typename T::V rational_v(typename T::V v, const float (&P)[NP], const float (&Q)[NQ]) {
  const typename T::V s = T::mul(v, v);
  typename T::V p = T::fmadd(s, T::set1(P[0]), T::set1(P[1]));
  for (int k = 2; k < NP; ++k) p = T::fmadd(p, s, T::set1(P[k]));
  p = T::mul(v, p);
  typename T::V q = T::fmadd(s, T::set1(Q[0]), T::set1(Q[1]));
  for (int k = 2; k < NQ; ++k) q = T::fmadd(q, s, T::set1(Q[k]));
  return T::div(p, q);
}

template <class T>
inline typename T::V logistic_v(typename T::V x) {
  const typename T::V r =
      T::add(rational_v<T>(clamp_v<T>(x, -kLogisticClamp, kLogisticClamp), kLogisticP, kLogisticQ), T::set1(0.5f));
  return T::max(T::zero(), r);
}

template <class T>
inline typename T::V tanh_v(typename T::V x) {
  return rational_v<T>(clamp_v<T>(x, -kTanhClamp, kTanhClamp), kTanhP, kTanhQ);
}

#if defined(__AVX2__) && defined(__FMA__)
inline __m256 clamp8(__m256 x, float lo, float hi) { return clamp_v<simd::F32x8>(x, lo, hi); }
inline __m256 logistic8(__m256 x) { return logistic_v<simd::F32x8>(x); }
inline __m256 tanh8(__m256 x) { return tanh_v<simd::F32x8>(x); }
#endif

#if defined(__AVX512F__)
inline __m512 clamp16(__m512 x, float lo, float hi) { return clamp_v<simd::F32x16>(x, lo, hi); }
inline __m512 logistic16(__m512 x) { return logistic_v<simd::F32x16>(x); }
inline __m512 tanh16(__m512 x) { return tanh_v<simd::F32x16>(x); }
#endif

}  // namespace
}  // namespace recurrent
}  // namespace quanta
