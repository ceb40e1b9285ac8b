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
  v = v != v ? lo : v;  // branch-free, so that loops over it vectorise
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
  const float inner = std::fmaf(static_cast<float>(b), p.rb, p.k);
  return round_sat<T>(std::fmaf(static_cast<float>(a), p.ra, inner));
}

template <typename T>
inline T mul_one(T a, T b, const MulParams& p) {
  const int32_t acc = (static_cast<int32_t>(a) - p.za) * (static_cast<int32_t>(b) - p.zb);
  return round_sat<T>(static_cast<float>(acc) * p.ratio + static_cast<float>(p.zc));
}

// ---- row kernels compiled once per ISA (the loops vectorise under the ISA's flags) ----------

// y[i] = table[x[i]] (bytes).
inline void lut_scalar(const uint8_t* __restrict x, uint8_t* __restrict y, int64_t n, const uint8_t* __restrict table) {
  for (int64_t i = 0; i < n; ++i) y[i] = table[x[i]];
}

template <typename T>
inline int32_t row_max(const T* __restrict x, int64_t d) {
  T m = x[0];
  for (int64_t j = 1; j < d; ++j) m = x[j] > m ? x[j] : m;
  return m;
}

// sat(rne(f64(t) · ys / f64(sum)) + zy): ms_qops.py eq. (5), ONNX Runtime's float64 quotient,
// rounded half to even before the zero point is added (an odd zy keeps the tie's side).
template <typename T>
inline T softmax_out(float t, double ys, double sum, double zy) {
  constexpr double lo = static_cast<double>(std::numeric_limits<T>::min());
  constexpr double hi = static_cast<double>(std::numeric_limits<T>::max());
  double r = std::nearbyint(static_cast<double>(t) * ys / sum) + zy;
  r = r != r ? lo : r;
  r = r < lo ? lo : r;
  r = r > hi ? hi : r;
  return static_cast<T>(static_cast<int32_t>(r));
}

// QLinearSoftmax rows, ms_qops.py (1)-(5): the float32 sum in index order, then one float64
// division per element (ORT 1.32's QlinearSoftmaxCPU). Four rows at a time interleave
// four independent sums.
template <typename T>
void softmax_rows(const T* x, T* y, int64_t rows, int64_t d, const float* __restrict table, float ys, int32_t zy) {
  const double ysd = static_cast<double>(ys), zyd = static_cast<double>(zy);
  int64_t r = 0;
  for (; r + 4 <= rows; r += 4) {
    const T* __restrict x0 = x + r * d;
    const T* __restrict x1 = x0 + d;
    const T* __restrict x2 = x1 + d;
    const T* __restrict x3 = x2 + d;
    // table[b + v] = T[255 − (max − v)], b = 255 − max
    const int32_t b0 = 255 - row_max(x0, d), b1 = 255 - row_max(x1, d);
    const int32_t b2 = 255 - row_max(x2, d), b3 = 255 - row_max(x3, d);
    float s0 = 0.0f, s1 = 0.0f, s2 = 0.0f, s3 = 0.0f;
    for (int64_t j = 0; j < d; ++j) {
      s0 += table[b0 + x0[j]];
      s1 += table[b1 + x1[j]];
      s2 += table[b2 + x2[j]];
      s3 += table[b3 + x3[j]];
    }
    const int32_t bs[4] = {b0, b1, b2, b3};
    const double sums[4] = {s0, s1, s2, s3};
    for (int k = 0; k < 4; ++k) {
      const T* __restrict xr = x + (r + k) * d;
      T* __restrict yr = y + (r + k) * d;
      const int32_t b = bs[k];
      const double sum = sums[k];
      for (int64_t j = 0; j < d; ++j) yr[j] = softmax_out<T>(table[b + xr[j]], ysd, sum, zyd);
    }
  }
  for (; r < rows; ++r) {
    const T* __restrict xr = x + r * d;
    T* __restrict yr = y + r * d;
    const int32_t b = 255 - row_max(xr, d);
    float sum = 0.0f;
    for (int64_t j = 0; j < d; ++j) sum += table[b + xr[j]];
    const double sumd = static_cast<double>(sum);
    for (int64_t j = 0; j < d; ++j) yr[j] = softmax_out<T>(table[b + xr[j]], ysd, sumd, zyd);
  }
}

}  // namespace
}  // namespace elementwise
}  // namespace quanta
