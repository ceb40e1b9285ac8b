// One vector of lanes of OrtGRU's row steps (recurrent.h Kernels::ort_gru_reset /
// ort_gru_update) over the vector traits of simd.h, shared by recurrent_avx2.cc (whole
// vectors, the tail lanes by recurrent_scalar.h's ort_gru_*_lane) and
// recurrent_avx512vnni.cc (masked tails). Each lane computes the scalar lane's operations
// in their order: ORT's rational functions as separate products and sums (-ffp-contract=off),
// MLAS's logistic as mlas_simd.h's (its Horner steps vfmadd, as std::fma).
//
// The clamps: ort_clip with a bias is min(x, clip) then max(·, −clip) with x first, so a
// NaN x becomes clip (vminps returns its second operand on NaN), as std::min(clip, x);
// without one, and the functions' own clamps, clamp_v (a NaN stays).
#pragma once

#include <cstdint>

#include "recurrent/mlas_simd.h"
#include "recurrent/recurrent_scalar.h"
#include "simd.h"

namespace quanta {
namespace recurrent {
namespace {

template <class T>
inline typename T::V deepcpu_rational_v(typename T::V x) {
  using V = typename T::V;
  const V x2 = T::mul(x, x);
  V p = T::add(T::mul(x2, T::set1(kDeepP[0])), T::set1(kDeepP[1]));
  for (int i = 2; i < 7; ++i) p = T::add(T::mul(x2, p), T::set1(kDeepP[i]));
  p = T::mul(x, p);
  V q = T::add(T::mul(x2, T::set1(kDeepQ[0])), T::set1(kDeepQ[1]));
  for (int i = 2; i < 4; ++i) q = T::add(T::mul(x2, q), T::set1(kDeepQ[i]));
  return T::div(p, q);
}

template <class T, class Ld>
inline typename T::V ort_clip_v(Ld ld, typename T::V v, const float* bias, int64_t j, float clip) {
  if (!bias) return clamp_v<T>(v, -clip, clip);
  const typename T::V x = T::min(T::add(v, ld(bias + j)), T::set1(clip));
  return T::max(x, T::set1(-clip));
}

// Lanes [j, j + kLanes) of ort_gru_reset_lane.
template <class T, class Ld>
inline typename T::V ort_gru_reset_lanes(Ld ld, const float* zr_r, const float* br, float clip, const float* src,
                                         int64_t j) {
  const typename T::V u =
      T::mul(T::set1(0.5f), clamp_v<T>(ort_clip_v<T>(ld, ld(zr_r + j), br, j, clip), -20.0f, 20.0f));
  const typename T::V r = T::mul(T::set1(0.5f), T::add(T::set1(1.0f), deepcpu_rational_v<T>(u)));
  return T::mul(ld(src + j), r);
}

// Lanes [j, j + kLanes) of ort_gru_update_lane: the new h.
template <class T, class Ld>
inline typename T::V ort_gru_update_lanes(Ld ld, const float* zr_z, const float* bz, const float* a0, const float* a1,
                                          const float* bh, float clip, int64_t j, const float* h) {
  using V = typename T::V;
  const V a = a1 ? T::add(ld(a0 + j), ld(a1 + j)) : ld(a0 + j);
  const V z = logistic_v<T>(ort_clip_v<T>(ld, ld(zr_z + j), bz, j, clip));
  const V hh = deepcpu_rational_v<T>(clamp_v<T>(ort_clip_v<T>(ld, a, bh, j, clip), -10.0f, 10.0f));
  return T::add(T::mul(T::sub(T::set1(1.0f), z), hh), T::mul(z, ld(h + j)));
}

}  // namespace
}  // namespace recurrent
}  // namespace quanta
