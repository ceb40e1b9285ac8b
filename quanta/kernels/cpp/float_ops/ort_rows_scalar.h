// ONNX Runtime's Softmax, LayerNorm family and FastGelu, one element (or one row) at a
// time: float_ops.h's mlas_softmax, ort_layer_norm and fast_gelu_ort, twins in
// kernels/reference/ort_float.py. The portable table runs these rows; the AVX2 rows
// (float_ops_avx2.cc) perform the same operations lane by lane and use the short-row
// kernels below as they are. std::fma is one rounding on every target (an FMA
// instruction with -mfma, libm's fmaf without).
#pragma once

#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>

#include "float_ops/float_ops.h"
#include "recurrent/recurrent_scalar.h"

namespace quanta {
namespace float_ops {
namespace ort {

// MlasExpConstants (ORT's compute.cpp) as MlasComputeSumExpF32KernelFma3 reads them
constexpr float kExpLower = -88.3762626647949f;       // LowerRangeSumExp
constexpr float kExpLowerAvx512f = -103.9720840454f;  // LowerRange: the AVX-512F sum-exp kernel's clamp
constexpr float kExpBias = 12582912.0f;               // RoundingBias, 1.5 · 2^23
constexpr float kExpLog2e = 1.44269504088896341f;
constexpr float kExpLn2Hi = -6.93145752e-1f;
constexpr float kExpLn2Lo = -1.42860677e-6f;
constexpr float kExpP0 = 0x1.694000p-10f;
constexpr float kExpP1 = 0x1.125edcp-7f;
constexpr float kExpP2 = 0x1.555b5ap-5f;
constexpr float kExpP3 = 0x1.555450p-3f;
constexpr float kExpP4 = 0x1.fffff6p-2f;
constexpr uint32_t kExpOne = 0x3F800000u;
// FastGelu's B = f32(√(2/π)) and C' = f32(0.044715 · √(2/π)) (ORT's bias_gelu.cc)
constexpr float kFastGeluB = 0.7978845608028654f;
constexpr float kFastGeluC = 0.035677408136300125f;
// row lengths from which ORT takes its AVX2 LayerNormalization / SimplifiedLayerNormalization
constexpr int64_t kLayerNormAvx2From = 8;
constexpr int64_t kSimplifiedAvx2From = 16;

// (SM2): MLAS's exp of v (v = x − max), every step one rounding
inline float sum_exp_one(float v) {
  const float t = kExpLower > v ? kExpLower : v;  // vmaxps(lower, v): v when NaN
  const float b = std::fma(t, kExpLog2e, kExpBias);
  const float m = b - kExpBias;
  float r = std::fma(m, kExpLn2Hi, t);
  r = std::fma(m, kExpLn2Lo, r);
  float p = std::fma(kExpP0, r, kExpP1);
  p = std::fma(p, r, kExpP2);
  p = std::fma(p, r, kExpP3);
  p = std::fma(p, r, kExpP4);
  p = std::fma(p, r, 1.0f);
  p = std::fma(p, r, 1.0f);
  uint32_t bits;
  std::memcpy(&bits, &b, 4);
  bits = (bits << 23) + kExpOne;  // 2^m in the exponent field (32-bit wrap)
  float scale;
  std::memcpy(&scale, &bits, 4);
  return p * scale;
}

// (SX1): MLAS's AVX-512F exp of v: the steps of sum_exp_one from max(LowerRange, v), then p scaled by 2^m in one
// rounding (vscalefps), so a subnormal result is p · 2^m rounded once; p · 2^m is exact in
// double (m an integer in [-150, 0], or NaN with p)
inline float sum_exp_one_scalef(float v) {
  const float t = kExpLowerAvx512f > v ? kExpLowerAvx512f : v;
  const float b = std::fma(t, kExpLog2e, kExpBias);
  const float m = b - kExpBias;
  float r = std::fma(m, kExpLn2Hi, t);
  r = std::fma(m, kExpLn2Lo, r);
  float p = std::fma(kExpP0, r, kExpP1);
  p = std::fma(p, r, kExpP2);
  p = std::fma(p, r, kExpP3);
  p = std::fma(p, r, kExpP4);
  p = std::fma(p, r, 1.0f);
  p = std::fma(p, r, 1.0f);
  if (m != m) return p * m;  // NaN
  return static_cast<float>(static_cast<double>(p) * std::ldexp(1.0, static_cast<int>(m)));
}

// The helpers the AVX-512 rows (float_ops_avx512vnni.cc) share with the portable and AVX2
// ones are always inlined: an out-of-line copy that TU compiled (with -mavx512f) could be
// the one the linker keeps for every caller, AVX-512 code on an AVX2 CPU.
#define QUANTA_ORT_ROWS_INLINE inline __attribute__((always_inline))

// (SM1)'s step: x when x > m, so a NaN x leaves m
QUANTA_ORT_ROWS_INLINE float max_skip_nan(float m, float x) { return x > m ? x : m; }

// (SM3)'s lane sum of 8 lanes
QUANTA_ORT_ROWS_INLINE float sum8_pairs(const float* l) {
  return ((l[0] + l[1]) + (l[2] + l[3])) + ((l[4] + l[5]) + (l[6] + l[7]));
}

// (SX2)'s lane sum of 16 lanes: the high half onto the low, then (SM3)'s tree
QUANTA_ORT_ROWS_INLINE float sum16_folded(const float* l) {
  float h[8];
  for (int j = 0; j < 8; ++j) h[j] = l[j + 8] + l[j];
  return sum8_pairs(h);
}

// (OL3)'s lane sum of 8 lanes
inline float sum8_halves(const float* q) {
  const float h0 = q[0] + q[4], h1 = q[1] + q[5], h2 = q[2] + q[6], h3 = q[3] + q[7];
  return (h0 + h2) + (h1 + h3);
}

// (FG1)
inline float fast_gelu_one(float x) {
  const float a = x * ((kFastGeluC * x) * x + kFastGeluB);
  return (0.5f * x) * (recurrent::tanh_one(a) + 1.0f);
}

// The two lane orders of ORT's Softmax rows: what differs between an AVX2 host's MLAS
// kernel and an AVX-512F host's is the lane count, the exponential and the lane fold.
// (SM2), (SM3): the AVX2 host's 8 lanes
struct Avx2SoftmaxOrder {
  static constexpr int kLanes = 8;
  static QUANTA_ORT_ROWS_INLINE float exp(float v) { return sum_exp_one(v); }
  static QUANTA_ORT_ROWS_INLINE float fold(const float* l) { return sum8_pairs(l); }
};

// (SX1), (SX2): the AVX-512F host's 16 lanes (a masked last vector adds nothing to its
// empty lanes)
struct Avx512fSoftmaxOrder {
  static constexpr int kLanes = 16;
  static QUANTA_ORT_ROWS_INLINE float exp(float v) { return sum_exp_one_scalef(v); }
  static QUANTA_ORT_ROWS_INLINE float fold(const float* l) { return sum16_folded(l); }
};

// (SM1), Order's exponential and lane sum, (SM4), (SM5): ORT's Softmax one element at a
// time in Order's lane order
template <class Order>
QUANTA_ORT_ROWS_INLINE void softmax_rows_in_order(const float* x, float* y, int64_t rows, int64_t d) {
  constexpr int kLanes = Order::kLanes;
  for (int64_t row = 0; row < rows; ++row) {
    const float* xr = x + row * d;
    float* yr = y + row * d;
    float m = std::numeric_limits<float>::lowest();  // (SM1)
    for (int64_t i = 0; i < d; ++i) m = max_skip_nan(m, xr[i]);
    const float neg = -m;
    float lanes[kLanes] = {};
    for (int64_t i = 0; i < d; ++i) {
      yr[i] = Order::exp(xr[i] + neg);                // (SM2) / (SX1)
      lanes[i % kLanes] = lanes[i % kLanes] + yr[i];  // (SM3) / (SX2)
    }
    const float r = 1.0f / Order::fold(lanes);   // (SM4)
    for (int64_t i = 0; i < d; ++i) yr[i] *= r;  // (SM5)
  }
}

// The Kernels tables' entries: their addresses go into the portable and AVX2 tables, so
// they are ordinary inline functions, and no AVX-512 TU refers to them
inline void softmax_rows(const float* x, float* y, int64_t rows, int64_t d) {
  softmax_rows_in_order<Avx2SoftmaxOrder>(x, y, rows, d);
}

inline void softmax_rows_avx512f(const float* x, float* y, int64_t rows, int64_t d) {
  softmax_rows_in_order<Avx512fSoftmaxOrder>(x, y, rows, d);
}

// (OL3) over v[0, d): lanes of fma, then the 4-product and fma tails
template <class V>
inline float square_sum(int64_t d, V&& v) {
  float q[8] = {};
  const int64_t blocks = d / 8;
  for (int64_t i = 0; i < blocks * 8; ++i) q[i % 8] = std::fma(v(i), v(i), q[i % 8]);
  float s = sum8_halves(q);
  int64_t i = blocks * 8;
  if (d - i >= 4) {
    for (int64_t j = i; j < i + 4; ++j) s = s + v(j) * v(j);
    i += 4;
  }
  for (; i < d; ++i) s = std::fma(v(i), v(i), s);
  return s;
}

// (OL1): the float64 mean over 4 lanes
inline float mean_f64(const float* xr, int64_t d) {
  double l[4] = {};
  const int64_t blocks = d / 4;
  for (int64_t i = 0; i < blocks * 4; ++i) l[i % 4] = l[i % 4] + static_cast<double>(xr[i]);
  double s = (l[0] + l[2]) + (l[1] + l[3]);
  for (int64_t i = blocks * 4; i < d; ++i) s = s + static_cast<double>(xr[i]);
  return static_cast<float>(s / static_cast<double>(d));
}

// (OL8), (OL9): Welford's sums (ORT's SkipLayerNormalization, and LayerNormalization of
// rows shorter than kLayerNormAvx2From)
inline void welford_row(const float* xr, float* yr, int64_t d, const float* scale, const float* bias, float eps) {
  float mean = 0.0f, m2 = 0.0f;
  for (int64_t k = 0; k < d; ++k) {
    const float delta = xr[k] - mean;
    mean = mean + delta / static_cast<float>(k + 1);
    m2 = m2 + (xr[k] - mean) * delta;
  }
  const float sd = std::sqrt(m2 / static_cast<float>(d) + eps);
  for (int64_t i = 0; i < d; ++i) {
    const float v = ((xr[i] - mean) / sd) * scale[i];
    yr[i] = bias ? v + bias[i] : v;
  }
}

// (OL7): SimplifiedLayerNormalization of rows shorter than kSimplifiedAvx2From
inline void simplified_short_row(const float* xr, float* yr, int64_t d, const float* scale, float eps) {
  float s = 0.0f;
  for (int64_t i = 0; i < d; ++i) s = s + xr[i] * xr[i];
  const float r = std::sqrt(s / static_cast<float>(d) + eps);
  for (int64_t i = 0; i < d; ++i) yr[i] = (xr[i] / r) * scale[i];
}

inline void layer_norm_rows(const float* x, float* y, int64_t rows, int64_t d, const float* scale, const float* bias,
                            float eps, OrtNormKernel kernel) {
  const float count = static_cast<float>(d);
  for (int64_t row = 0; row < rows; ++row) {
    const float* xr = x + row * d;
    float* yr = y + row * d;
    if (kernel == OrtNormKernel::kSimplified) {
      if (d < kSimplifiedAvx2From) {
        simplified_short_row(xr, yr, d, scale, eps);
        continue;
      }
      const float inv = 1.0f / std::sqrt(square_sum(d, [&](int64_t i) { return xr[i]; }) / count + eps);  // (OL6)
      for (int64_t i = 0; i < d; ++i) yr[i] = (inv * xr[i]) * scale[i];
      continue;
    }
    if (kernel == OrtNormKernel::kSkip || d < kLayerNormAvx2From) {
      welford_row(xr, yr, d, scale, bias, eps);
      continue;
    }
    const float mean = mean_f64(xr, d);  // (OL1)
    const float inv =
        1.0f / std::sqrt(square_sum(d, [&](int64_t i) { return xr[i] - mean; }) / count + eps);  // (OL2)-(OL4)
    for (int64_t i = 0; i < d; ++i) {
      const float t = (xr[i] - mean) * inv;
      yr[i] = bias ? std::fma(t, scale[i], bias[i]) : t * scale[i];  // (OL5)
    }
  }
}

}  // namespace ort
}  // namespace float_ops
}  // namespace quanta
