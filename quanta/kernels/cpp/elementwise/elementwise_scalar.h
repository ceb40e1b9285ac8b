// One element of each elementwise kernel (contract: elementwise.h). The portable runs are
// loops over these; the SIMD runs use them for their tails (AVX2) so that a tail element
// and a vector lane perform the same float32 operations in the same order.
//
// Internal linkage on purpose: this header is compiled into TUs with different -m flags,
// and an inline function with external linkage would be merged by the linker into one
// copy (possibly the AVX-512 one, called from the portable path).
#pragma once

#include <cmath>
#include <cstdint>
#include <limits>

#include "elementwise/elementwise.h"

namespace quanta {
namespace elementwise {
namespace {  // NOLINT: see the header comment

// sat(rne(v)), NaN -> qmin (the reference's _round_sat_f32: NaN replaced, rint, clip).
template <typename T>
inline T round_sat(float v) {
  constexpr float lo = static_cast<float>(std::numeric_limits<T>::min());
  constexpr float hi = static_cast<float>(std::numeric_limits<T>::max());
  if (v != v) return std::numeric_limits<T>::min();
  float r = std::nearbyint(v);
  r = r < lo ? lo : r;
  r = r > hi ? hi : r;
  return static_cast<T>(static_cast<int32_t>(r));
}

// dq(x) = f32(scale · float32(x − zp)); the integer difference is exact.
template <typename T>
inline float dequantize_one(T x, float scale, int32_t zp) {
  return scale * static_cast<float>(static_cast<int32_t>(x) - zp);
}

template <typename T>
inline T add_one(T a, T b, const AddParams& p) {
  const float v = (dequantize_one(a, p.sa, p.za) + dequantize_one(b, p.sb, p.zb)) / p.sc;
  return round_sat<T>(v + static_cast<float>(p.zc));
}

template <typename T>
inline T mul_one(T a, T b, const MulParams& p) {
  const int32_t acc = (static_cast<int32_t>(a) - p.za) * (static_cast<int32_t>(b) - p.zb);
  return round_sat<T>(static_cast<float>(acc) * p.ratio + static_cast<float>(p.zc));
}

}  // namespace
}  // namespace elementwise
}  // namespace quanta
