// One vector of lanes of the float GRU's gate steps (recurrent.h Kernels::onnx_gru_zr /
// onnx_gru_h) over the vector traits of simd.h, shared by recurrent_avx2.cc (whole
// vectors, the tail lanes by recurrent_scalar.h's gru_*_lane) and recurrent_avx512vnni.cc
// (masked tails). Each lane computes the scalar lane's operations in their order; Acts
// supplies ONNX's sigmoid and tanh (float_ops_simd.h).
#pragma once

#include <cstdint>

#include "recurrent/mlas_simd.h"
#include "simd.h"

namespace quanta {
namespace recurrent {
namespace {

template <class T, class Acts, class Ld>
inline typename T::V gru_zr_lanes(Ld ld, const float* xg, const float* hg, const float* bias, float clip, int64_t n) {
  typename T::V v = T::add(ld(xg + n), ld(hg + n));
  if (bias) v = T::add(v, ld(bias + n));
  return Acts::sigmoid(clamp_v<T>(v, -clip, clip));
}

template <class T, class Acts, class Ld>
inline typename T::V gru_h_lanes(Ld ld, const float* xg_h, const float* hr_h, const float* rb_h, const float* r,
                                 const float* z, const float* bias_h, float clip, bool lbr, int64_t j, const float* h) {
  using V = typename T::V;
  V v;
  if (lbr) {
    V u = ld(hr_h + j);
    if (rb_h) u = T::add(u, ld(rb_h + j));
    v = T::add(ld(xg_h + j), T::mul(ld(r + j), u));
  } else {
    v = T::add(ld(xg_h + j), ld(hr_h + j));
  }
  if (bias_h) v = T::add(v, ld(bias_h + j));
  const V hh = Acts::tanh(clamp_v<T>(v, -clip, clip));
  const V zv = ld(z + j);
  return T::add(T::mul(T::sub(T::set1(1.0f), zv), hh), T::mul(zv, ld(h + j)));
}

}  // namespace
}  // namespace recurrent
}  // namespace quanta
