// The scalar steps of the float_ops contract (float_ops.h): exp (E1)-(E6), log (LN1)-(LN6), erf (F1)-(F5),
// tanh (T1)-(T4), sigmoid (Σ1)-(Σ2), relu, Gelu (G1)-(G2), the lane tree (R2) and one
// element of each binary op.
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
constexpr float kExpLo = -104.0f;        // (E1): below, e^x < 2^-150 rounds to 0
constexpr float kExpHi = 89.0f;          // (E1): above, e^x > FLT_MAX
constexpr float kL2E = 0x1.715476p+0f;   // 0x3FB8AA3B, f32(log2 e)
constexpr float kC1 = 0x1.63p-1f;        // 0x3F318000, 0.693359375 (n·C1 exact)
constexpr float kC2 = -0x1.bd0106p-13f;  // 0xB95E8083, ln 2 − C1
constexpr float kP0 = 0x1.a0d2cep-13f;   // 0x39506967, 1.9875691500e-4
constexpr float kP1 = 0x1.6e879cp-10f;   // 0x3AB743CE, 1.3981999507e-3
constexpr float kP2 = 0x1.11121p-7f;     // 0x3C088908, 8.3334519073e-3
constexpr float kP3 = 0x1.555382p-5f;    // 0x3D2AA9C1, 4.1665795894e-2
constexpr float kP4 = 0x1.555554p-3f;    // 0x3E2AAAAA, 1.6666665459e-1
constexpr float kP5 = 0x1p-1f;           // 0x3F000000, 5.0000001201e-1 in float32
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
  const float n = std::nearbyint(t * kL2E);  // (E2), current rounding mode: to nearest even
  const float r = (t - n * kC1) - n * kC2;   // (E3)
  float h = kP0;                             // (E4)
  h = h * r + kP1;
  h = h * r + kP2;
  h = h * r + kP3;
  h = h * r + kP4;
  h = h * r + kP5;
  const float p = ((h * (r * r)) + r) + 1.0f;               // (E5)
  const int32_t ni = n == n ? static_cast<int32_t>(n) : 0;  // NaN: p is NaN anyway
  const int32_t n1 = ni >> 1;                               // floor(n / 2) (arithmetic shift)
  return (p * pow2(n1)) * pow2(ni - n1);                    // (E6)
}

// erf constants (F1)-(F5); reference/float_ops.py spells the same bits.
constexpr float kErfTMax = 0x1.f66666p+1f;  // 0x407B3333, 3.925: erf rounds to 1 in float32 from 3.9192
constexpr float kErfSplit = 0x1.d8p-1f;     // 0x3F6C0000, 0.921875
constexpr float kErfA[6] = {
    -0x1.3a1a82p-11f,  // 0xBA1D0D41
    0x1.473f48p-8f,    // 0x3BA39FA4
    -0x1.b68bd2p-6f,   // 0xBCDB45E9
    0x1.ce1a46p-4f,    // 0x3DE70D23
    -0x1.8126ep-2f,    // 0xBEC09370
    0x1.06eba6p-3f,    // 0x3E0375D3, ≈ 2/√π − 1
};
constexpr float kErfB[7] = {
    0x1.2229p-16f,     // 0x37911480
    -0x1.91d2ccp-12f,  // 0xB9C8E966
    0x1.fd1336p-9f,    // 0x3B7E899B
    -0x1.8d63p-6f,     // 0xBCC6B180
    0x1.b55cbp-4f,     // 0x3DDAAE58
    0x1.450aap-1f,     // 0x3F228550
    0x1.079d0cp-3f,    // 0x3E03CE86
};
// tanh constants (T1)-(T4).
constexpr float kTanhSplit = 0.75f;  // 0x3F400000
constexpr float kTanhT[6] = {
    -0x1.55554ap-2f,  // 0xBEAAAAA5, ≈ −1/3
    0x1.110db8p-3f,   // 0x3E0886DC
    -0x1.b97d3cp-5f,  // 0xBD5CBE9E
    0x1.5f7854p-6f,   // 0x3CAFBC2A
    -0x1.f5d344p-8f,  // 0xBBFAE9A2
    0x1.c75364p-10f,  // 0x3AE3A9B2
};
// Gelu constants (G1)-(G2).
constexpr float kGeluSqrt2 = 0x1.6a09e6p+0f;  // 0x3FB504F3, f32(√2)
constexpr float kGeluK = 0x1.988454p-1f;      // 0x3F4C422A, f32(√(2/π))
constexpr float kGeluC = 0x1.6e4e26p-5f;      // 0x3D372713, f32(0.044715)

// log constants (LN1)-(LN6); reference/float_ops.py spells the same bits.
constexpr float kLogSqrtHalf = 0x1.6a09e6p-1f;  // 0x3F3504F3, f32(√½)
constexpr float kLogQ[9] = {
    0x1.204376p-4f,   // 0x3D9021BB
    -0x1.d7a37p-4f,   // 0xBDEBD1B8
    0x1.de4a34p-4f,   // 0x3DEF251A
    -0x1.fcba9ep-4f,  // 0xBDFE5D4F
    0x1.23d37ep-3f,   // 0x3E11E9BF
    -0x1.555ca0p-3f,  // 0xBE2AAE50
    0x1.999d58p-3f,   // 0x3E4CCEAC
    -0x1.fffff8p-3f,  // 0xBE7FFFFC
    0x1.555554p-2f,   // 0x3EAAAAAA
};
constexpr float kLogFlt2 = 0x1p23f;  // (LN2): a subnormal times 2^23 is normal, exactly

inline float log_one(float x) {
  if (!(x > 0.0f) || x == std::numeric_limits<float>::infinity()) {  // (LN1)
    if (x == 0.0f) return -std::numeric_limits<float>::infinity();
    return x > 0.0f ? x : std::numeric_limits<float>::quiet_NaN();  // +inf; negative and NaN
  }
  const bool tiny = x < std::numeric_limits<float>::min();  // (LN2)
  int e = 0;
  float m = std::frexp(tiny ? x * kLogFlt2 : x, &e);  // (LN3): m in [0.5, 1), exact
  if (tiny) e -= 23;
  float f;
  if (m < kLogSqrtHalf) {  // (LN4)
    e -= 1;
    f = (m + m) - 1.0f;
  } else {
    f = m - 1.0f;
  }
  const float fe = static_cast<float>(e);
  const float z = f * f;  // (LN5)
  float p = kLogQ[0];
  for (int k = 1; k < 9; ++k) p = p * f + kLogQ[k];
  float y = (p * f) * z;
  y = y + fe * kC2;  // (LN6)
  y = y - 0.5f * z;
  return (f + y) + fe * kC1;
}

// cos constants (CS1)-(CS6), Cephes cosf; reference/float_ops.py spells the same bits.
constexpr float kCosTMax = 0x1p24f;             // (CS1): past 2^24 the float32 grid is coarser than 1
constexpr float kCosFopi = 0x1.45f306p+0f;      // 0x3FA2F983, f32(4/π)
constexpr float kCosDp[3] = {0x1.92p-1f,        // 0x3F490000, 0.78515625
                             0x1.fb4p-13f,      // 0x397DA000
                             0x1.4442d2p-25f};  // 0x33222169: DP1 + DP2 + DP3 ≈ π/4
constexpr float kCosC[3] = {0x1.99eb9cp-16f,    // 0x37CCF5CE
                            -0x1.6c0c34p-10f,   // 0xBAB6061A
                            0x1.55554ap-5f};    // 0x3D2AAAA5
constexpr float kCosS[3] = {-0x1.9943f2p-13f,   // 0xB94CA1F9
                            0x1.11073cp-7f,     // 0x3C08839E
                            -0x1.555546p-3f};   // 0xBE2AAAA3

// (CS2)-(CS5) for a = |x| finite: the octant o (q mod 8) and both polynomials.
inline void trig_parts(float a, float& o, float& yc, float& ys) {
  const float t = a > kCosTMax ? kCosTMax : a;
  const float j = std::trunc(t * kCosFopi);  // (CS2)
  const float q = 2.0f * std::ceil(j * 0.5f);
  o = q - 8.0f * std::floor(q * 0.125f);                                  // (CS3)
  const float z = ((t - q * kCosDp[0]) - q * kCosDp[1]) - q * kCosDp[2];  // (CS4)
  const float s = z * z;                                                  // (CS5)
  yc = ((kCosC[0] * s + kCosC[1]) * s + kCosC[2]) * s * s;
  yc = yc - 0.5f * s;
  yc = yc + 1.0f;
  ys = ((kCosS[0] * s + kCosS[1]) * s + kCosS[2]) * s * z + z;
}

inline float cos_one(float x) {
  const float a = std::fabs(x);
  if (!(a < std::numeric_limits<float>::infinity())) return std::numeric_limits<float>::quiet_NaN();  // (CS1)
  float o, yc, ys;
  trig_parts(a, o, yc, ys);
  const float y = (o == 2.0f || o == 6.0f) ? ys : yc;  // (CS6)
  return (o == 2.0f || o == 4.0f) ? -y : y;
}

// sin reads |x| only and takes the sign of x at the end: odd bit for bit, sin(−0) = −0.
inline float sin_one(float x) {
  const float a = std::fabs(x);
  if (!(a < std::numeric_limits<float>::infinity())) return std::numeric_limits<float>::quiet_NaN();  // (CS1)
  float o, yc, ys;
  trig_parts(a, o, yc, ys);
  float y = (o == 2.0f || o == 6.0f) ? yc : ys;  // (SN1)
  if (o >= 4.0f) y = -y;
  return std::signbit(x) ? -y : y;
}

// atan constants (AT1)-(AT4), Cephes atanf; reference/float_ops.py spells the same bits.
constexpr float kAtanT3P8 = 0x1.3504f4p+1f;     // 0x401A827A, f32(tan(3π/8))
constexpr float kAtanTP8 = 0x1.a8279ap-2f;      // 0x3ED413CD, f32(tan(π/8))
constexpr float kAtanPio2 = 0x1.921fb6p+0f;     // 0x3FC90FDB
constexpr float kAtanPio4 = 0x1.921fb6p-1f;     // 0x3F490FDB
constexpr float kAtanP[4] = {0x1.49e1a2p-4f,    // 0x3DA4F0D1
                             -0x1.1c370ap-3f,   // 0xBE0E1B85
                             0x1.9924bep-3f,    // 0x3E4C925F
                             -0x1.555454p-2f};  // 0xBEAAAA2A

inline float atan_one(float x) {
  const float a = std::fabs(x);  // (AT1)
  float y0 = 0.0f;
  float r = a;
  if (a > kAtanT3P8) {  // (AT2); NaN takes the last branch and stays NaN
    y0 = kAtanPio2;
    r = -1.0f / a;
  } else if (a > kAtanTP8) {
    y0 = kAtanPio4;
    r = (a - 1.0f) / (a + 1.0f);
  }
  const float z = r * r;  // (AT3)
  float p = kAtanP[0];
  for (int k = 1; k < 4; ++k) p = p * z + kAtanP[k];
  const float y = y0 + ((p * z) * r + r);
  return std::copysign(y, x);  // (AT4)
}

inline float tanh_one(float x) {
  const float t = std::fabs(x);  // (T1)
  const float s = t * t;
  float p = kTanhT[5];  // (T2)
  for (int k = 4; k >= 0; --k) p = p * s + kTanhT[k];
  const float small = t + t * (s * p);
  const float e = exp_one(t + t);  // (T3)
  const float big = 1.0f - 2.0f / (e + 1.0f);
  return std::copysign(t < kTanhSplit ? small : big, x);  // (T4); NaN: big is NaN
}

// (EN1)-(EN6): exp of x <= 0 (or NaN) with the reduction's second step and the polynomial
// as fused multiply-adds: 7 roundings fewer than (E3)-(E5) and no upper clamp.
inline float exp_fused_nonpositive_one(float x) {
  const float t = x < kExpLo ? kExpLo : x;         // (EN1); NaN compares false and stays NaN
  const float n = std::nearbyint(t * kL2E);        // (EN2) = (E2)
  const float r = std::fma(n, -kC2, t - n * kC1);  // (EN3): n · C1 is exact
  float h = kP0;                                   // (EN4)
  h = std::fma(h, r, kP1);
  h = std::fma(h, r, kP2);
  h = std::fma(h, r, kP3);
  h = std::fma(h, r, kP4);
  h = std::fma(h, r, kP5);
  const float p = std::fma(h, r * r, r) + 1.0f;             // (EN5)
  const int32_t ni = n == n ? static_cast<int32_t>(n) : 0;  // NaN: p is NaN anyway
  const int32_t n1 = ni >> 1;                               // floor(n / 2) (arithmetic shift)
  return (p * pow2(n1)) * pow2(ni - n1);                    // (EN6) = (E6)
}

inline float erf_one(float x) {
  const float a = std::fabs(x);
  const float t = a > kErfTMax ? kErfTMax : a;  // (F1); NaN compares false and stays NaN
  const float s = t * t;                        // (F2)
  float p = kErfA[0];                           // (F3)
  for (int k = 1; k < 6; ++k) p = std::fma(p, s, kErfA[k]);
  const float small = std::fma(p, t, t);
  float q = kErfB[0];  // (F4)
  for (int k = 1; k < 7; ++k) q = std::fma(q, t, kErfB[k]);
  q = std::fma(q, t, t);
  const float big = 1.0f - exp_fused_nonpositive_one(-q);
  return std::copysign(t > kErfSplit ? big : small, x);  // (F5)
}

inline float sigmoid_one(float x) {
  const float e = exp_fused_nonpositive_one(-std::fabs(x));  // (Σ1)
  const float d = 1.0f + e;
  return x >= 0.0f ? 1.0f / d : e / d;  // (Σ2); NaN: e / d is NaN
}

inline float silu_one(float x) { return x * sigmoid_one(x); }

// expm1 constants (X1)-(X3); reference/float_ops.py spells the same bits.
constexpr float kExpm1Split = 0x1.62e43p-2f;  // 0x3EB17218, f32(ln 2 / 2)
constexpr float kExpm1Q[7] = {
    0x1p-1f,          // 0x3F000000, 1/2!
    0x1.555556p-3f,   // 0x3E2AAAAB, 1/3!
    0x1.555556p-5f,   // 0x3D2AAAAB, 1/4!
    0x1.111112p-7f,   // 0x3C088889, 1/5!
    0x1.6c16c2p-10f,  // 0x3AB60B61, 1/6!
    0x1.a01a02p-13f,  // 0x39500D01, 1/7!
    0x1.a01a02p-16f,  // 0x37D00D01, 1/8!
};

inline float expm1_one(float x) {
  float q = kExpm1Q[6];  // (X1)
  for (int k = 5; k >= 0; --k) q = q * x + kExpm1Q[k];
  const float small = x + (x * x) * q;
  const float big = exp_one(x) - 1.0f;              // (X2)
  return std::fabs(x) < kExpm1Split ? small : big;  // (X3); NaN: big
}

// (EL): expm1 only where x < 0 (NaN and ±0 pass through).
inline float elu_one(float x, float alpha) { return x < 0.0f ? alpha * expm1_one(x) : x; }

// float32 -> float16 bits, round to nearest even (float_ops.h "half"); NaN as NumPy's
// npy_floatbits_to_halfbits: the top 10 payload bits, 1 if those are all zero.
inline uint16_t half_from_bits(uint32_t f) {
  const uint32_t sign = (f >> 16) & 0x8000u;
  const uint32_t a = f & 0x7FFFFFFFu;
  if (a > 0x7F800000u) {  // NaN
    const uint32_t h = 0x7C00u + ((a & 0x007FFFFFu) >> 13);
    return static_cast<uint16_t>(sign | (h == 0x7C00u ? 0x7C01u : h));
  }
  if (a >= 0x477FF000u) return static_cast<uint16_t>(sign | 0x7C00u);               // >= 65520 rounds to inf; inf
  if (a >= 0x38800000u) {                                                           // a normal half (>= 2^-14)
    const uint32_t m = a - 0x38000000u;                                             // the exponent rebiased by −112
    return static_cast<uint16_t>(sign | ((m + 0x0FFFu + ((m >> 13) & 1u)) >> 13));  // carry may bump the exponent
  }
  if (a <= 0x33000000u) return static_cast<uint16_t>(sign);  // <= 2^-25: rounds to ±0 (the tie to even)
  // a subnormal half: the value in units of 2^-24 is mant · 2^(e − 126), e in [102, 112]
  const uint32_t e = a >> 23;
  const uint32_t mant = (a & 0x007FFFFFu) | 0x00800000u;
  const uint32_t shift = 126u - e;  // 14 .. 24
  uint32_t q = mant >> shift;
  const uint32_t rem = mant & ((1u << shift) - 1u), half = 1u << (shift - 1u);
  if (rem > half || (rem == half && (q & 1u))) ++q;
  return static_cast<uint16_t>(sign | q);
}

inline uint16_t half_from_f32(float x) {
  uint32_t f;
  std::memcpy(&f, &x, sizeof f);
  return half_from_bits(f);
}

// float16 bits -> float32 (exact); NaN as NumPy's npy_halfbits_to_floatbits: the payload
// shifted up, the quiet bit as it was.
inline float half_to_f32(uint16_t h) {
  const uint32_t sign = static_cast<uint32_t>(h & 0x8000u) << 16;
  const uint32_t e = (h >> 10) & 0x1Fu, m = h & 0x03FFu;
  uint32_t f;
  if (e == 0x1Fu) {
    f = sign | 0x7F800000u | (m << 13);
  } else if (e != 0) {
    f = sign | ((e + 112u) << 23) | (m << 13);
  } else {
    const float v = static_cast<float>(m) * 0x1p-24f;  // a subnormal half or 0: exact
    std::memcpy(&f, &v, sizeof f);
    f |= sign;
  }
  float y;
  std::memcpy(&y, &f, sizeof y);
  return y;
}

// np.maximum(x, 0): +0 for ±0 (np.maximum returns its second operand on equal zeros)
// and x itself for NaN.
inline float relu_one(float x) { return x > 0.0f || x != x ? x : 0.0f; }

inline float gelu_one(float x) { return (0.5f * x) * (1.0f + erf_one(x / kGeluSqrt2)); }  // (G1)

inline float gelu_tanh_one(float x) {
  const float a = kGeluK * (x + kGeluC * ((x * x) * x));  // (G2)
  return (0.5f * x) * (1.0f + tanh_one(a));
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
  if constexpr (op == BinaryOp::kMax) return a != a ? a : (a > b ? a : b);
  if constexpr (op == BinaryOp::kMin) return a != a ? a : (a < b ? a : b);
  if constexpr (op == BinaryOp::kPRelu) return a < 0.0f ? a * b : a;
  return a / b;
}

}  // namespace
}  // namespace float_ops
}  // namespace quanta
