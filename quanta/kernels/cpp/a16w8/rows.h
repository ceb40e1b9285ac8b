// The scalar steps of the A16W8 kernels, shared by the driver and the ISA files: the
// eq. (A4) requantization of one int64 accumulator and the generic row loops of the
// depthwise path (compiled once without ISA flags and once with -mavx2, where the
// compiler vectorizes them). Everything is in an anonymous namespace so that each file
// keeps its own copy (one shared inline function would let the linker pick the AVX2 build
// for the portable path).
#pragma once

#include <cmath>
#include <cstdint>

#include "a16w8/a16w8.h"

namespace quanta {
namespace a16w8 {
namespace {

// Round to nearest, ties to even, for |v| ≤ 2^22 (the clamped values here stay within
// ±65536): adding and subtracting 1.5·2^23 leaves the integer part in float32's last
// place, rounded by the current (default: nearest-even) mode. nearbyint is a libm call
// that saves the floating-point environment, which cost more than the GEMM itself.
inline float round_even(float v) {
  constexpr float kMagic = 12582912.0f;  // 1.5 · 2^23
  const float t = v + kMagic;            // two IEEE roundings (no -ffast-math: not reassociated)
  return t - kMagic;
}

// eq. (A4): saturate(rne(f32(acc) · m) + zy), clamped before rounding as requantize() does.
template <typename T>
inline void store(void* y, int64_t i, int64_t acc, float m, int64_t zy, int64_t qmin, int64_t qmax) {
  const float lo = static_cast<float>(qmin - zy), hi = static_cast<float>(qmax - zy);
  float v = static_cast<float>(acc) * m;
  v = std::isnan(v) ? lo : (v < lo ? lo : (v > hi ? hi : v));
  int64_t q = static_cast<int64_t>(round_even(v)) + zy;
  q = q < qmin ? qmin : (q > qmax ? qmax : q);
  static_cast<T*>(y)[i] = static_cast<T>(q);
}

inline void store_any(void* y, Elem out, int64_t i, int64_t acc, float m, int64_t zy) {
  switch (out) {
    case Elem::kU8: store<uint8_t>(y, i, acc, m, zy, 0, 255); break;
    case Elem::kI8: store<int8_t>(y, i, acc, m, zy, -128, 127); break;
    case Elem::kU16: store<uint16_t>(y, i, acc, m, zy, 0, 65535); break;
    default: store<int16_t>(y, i, acc, m, zy, -32768, 32767); break;
  }
}

inline void dw_row_generic(const double* const* src, const double* w, int64_t taps, int64_t n, int64_t* acc) {
  for (int64_t i = 0; i < n; ++i) {
    double v = 0.0;
    for (int64_t t = 0; t < taps; ++t) v += src[t][i] * w[t];  // exact (a16w8.h RowKernels)
    acc[i] = static_cast<int64_t>(v);
  }
}

// outputs [i0, n) of dw_pairs
inline void dw_pairs_generic_tail(const int32_t* const* src, const int32_t* w, int64_t pairs, int64_t i0, int64_t n,
                                  int64_t* acc) {
  for (int64_t i = i0; i < n; ++i) {
    int64_t v = 0;  // int64: the bound (a16w8.h) keeps it within int32, this does not rely on it
    for (int64_t t = 0; t < pairs; ++t) {
      const int32_t s = src[t][i], k = w[t];
      v += static_cast<int64_t>(static_cast<int16_t>(s & 0xffff)) * static_cast<int16_t>(k & 0xffff) +
           static_cast<int64_t>(static_cast<int16_t>(s >> 16)) * static_cast<int16_t>(k >> 16);
    }
    acc[i] = v;
  }
}

inline void dw_pairs_generic(const int32_t* const* src, const int32_t* w, int64_t pairs, int64_t n, int64_t* acc) {
  dw_pairs_generic_tail(src, w, pairs, 0, n, acc);
}

inline void requant_row_generic(const int64_t* hi, const int64_t* lo, const int64_t* rx, int64_t c1, int64_t bias,
                                float m, int64_t zy, Elem out, void* y, int64_t y0, int64_t n) {
  for (int64_t i = 0; i < n; ++i) {
    int64_t v = lo[i] + bias;
    if (hi) v += 256 * hi[i];
    if (rx) v += c1 * rx[i];
    store_any(y, out, y0 + i, v, m, zy);
  }
}

}  // namespace
}  // namespace a16w8
}  // namespace quanta
