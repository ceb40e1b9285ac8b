// The scalar steps of the float_ops contract (float_ops.h): exp (E1)-(E6), the lane tree
// (R2), one element of each binary op, and the row kernels written one element at a time.
// The portable table is built from these; the SIMD variants perform the same float32
// operations lane by lane (and use the scalar row functions for nothing else).
//
// Internal linkage on purpose: this header is compiled into TUs with different -m flags,
// and an inline function with external linkage would be merged by the linker into one
// copy (possibly the AVX-512 one, called from the portable path).
#pragma once

#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>

#include "float_ops/float_ops.h"

namespace quanta {
namespace float_ops {
namespace {  // NOLINT: see the header comment

// exp constants (reference/float_ops.py spells the same bits).
constexpr float kExpLo = -104.0f;              // (E1): below, e^x < 2^-150 rounds to 0
constexpr float kExpHi = 89.0f;                // (E1): above, e^x > FLT_MAX
constexpr float kL2E = 0x1.715476p+0f;         // 0x3FB8AA3B, f32(log2 e)
constexpr float kC1 = 0x1.63p-1f;              // 0x3F318000, 0.693359375 (n·C1 exact)
constexpr float kC2 = -0x1.bd0106p-13f;        // 0xB95E8083, ln 2 − C1
constexpr float kP0 = 0x1.a0d2cep-13f;         // 0x39506967, 1.9875691500e-4
constexpr float kP1 = 0x1.6e879cp-10f;         // 0x3AB743CE, 1.3981999507e-3
constexpr float kP2 = 0x1.11121p-7f;           // 0x3C088908, 8.3334519073e-3
constexpr float kP3 = 0x1.555382p-5f;          // 0x3D2AA9C1, 4.1665795894e-2
constexpr float kP4 = 0x1.555554p-3f;          // 0x3E2AAAAA, 1.6666665459e-1
constexpr float kP5 = 0x1p-1f;                 // 0x3F000000, 5.0000001201e-1 in float32
constexpr int kLanes = 16;

// 2^k from its exponent bits, k in [−126, 127].
inline float pow2(int32_t k) {
  const uint32_t bits = static_cast<uint32_t>(k + 127) << 23;
  float f;
  std::memcpy(&f, &bits, sizeof f);
  return f;
}

inline float exp_one(float x) {
  float t = x < kExpLo ? kExpLo : x;  // (E1); NaN compares false and stays NaN
  t = t > kExpHi ? kExpHi : t;
  const float n = std::nearbyint(t * kL2E);      // (E2), current rounding mode: to nearest even
  const float r = (t - n * kC1) - n * kC2;       // (E3)
  float h = kP0;                                 // (E4)
  h = h * r + kP1;
  h = h * r + kP2;
  h = h * r + kP3;
  h = h * r + kP4;
  h = h * r + kP5;
  const float p = ((h * (r * r)) + r) + 1.0f;    // (E5)
  const int32_t ni = n == n ? static_cast<int32_t>(n) : 0;  // NaN: p is NaN anyway
  const int32_t n1 = ni >> 1;                    // floor(n / 2) (arithmetic shift)
  return (p * pow2(n1)) * pow2(ni - n1);         // (E6)
}

// (R2)-(R3) over 16 lane sums (modified in place).
inline float tree16(float* acc) {
  for (int h = kLanes / 2; h >= 1; h /= 2) {
    for (int j = 0; j < h; ++j) acc[j] = acc[j] + acc[j + h];
  }
  return acc[0];
}

template <BinaryOp op>
inline float binary_one(float a, float b) {
  if constexpr (op == BinaryOp::kAdd) return a + b;
  if constexpr (op == BinaryOp::kSub) return a - b;
  if constexpr (op == BinaryOp::kMul) return a * b;
  return a / b;
}

}  // namespace
}  // namespace float_ops
}  // namespace quanta
