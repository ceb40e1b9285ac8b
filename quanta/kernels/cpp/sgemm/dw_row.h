// The depthwise row kernel of sgemm.h (DwRowFn) over the vector traits of simd.h, shared
// by sgemm_avx2.cc (F32x8: 8 pixels per ymm) and sgemm_avx512vnni.cc (F32x16: 16 per
// zmm); each ISA's translation unit instantiates it with its own traits, compiled for
// that ISA.
#pragma once

#include <cstdint>

#include "simd.h"

namespace quanta {
namespace sgemm {
namespace dw {
namespace {

// U vectors of output pixels [x0, x0 + min(n, U·kLanes)) at once (U independent fma chains).
template <class T, int U, int S>
void step(const float* const* rows, const float* w, int kh, int kw, int sw, int dw, float bias, float lo, float hi,
          float* y, int64_t x0, int64_t n) {
  typename T::V acc[U];
  for (int u = 0; u < U; ++u) acc[u] = T::zero();
  for (int ky = 0; ky < kh; ++ky) {
    const float* row = rows[ky] + x0 * sw;
    for (int kx = 0; kx < kw; ++kx) {
      const typename T::V wv = T::set1(w[ky * kw + kx]);
      const float* p = row + kx * dw;
      for (int u = 0; u < U; ++u) acc[u] = T::fmadd(wv, T::template strided<S>(p + u * T::kLanes * sw, sw), acc[u]);
    }
  }
  const typename T::V bv = T::set1(bias);
  for (int u = 0; u < U; ++u) {
    typename T::V r = T::add(acc[u], bv);
    if (lo != -__builtin_inff()) r = T::max(T::set1(lo), r);
    if (hi != __builtin_inff()) r = T::min(T::set1(hi), r);
    T::store(y + x0 + u * T::kLanes, T::tail(n - u * T::kLanes), r);
  }
}

template <class T, int S>
void row_s(const float* const* rows, const float* w, int kh, int kw, int sw, int dw, float bias, float lo, float hi,
           float* y, int64_t ow) {
  constexpr int L = T::kLanes;
  int64_t x = 0;
  for (; x + 4 * L <= ow; x += 4 * L) step<T, 4, S>(rows, w, kh, kw, sw, dw, bias, lo, hi, y, x, 4 * L);
  const int64_t rest = ow - x;
  if (rest > 3 * L) {
    step<T, 4, S>(rows, w, kh, kw, sw, dw, bias, lo, hi, y, x, rest);
  } else if (rest > 2 * L) {
    step<T, 3, S>(rows, w, kh, kw, sw, dw, bias, lo, hi, y, x, rest);
  } else if (rest > L) {
    step<T, 2, S>(rows, w, kh, kw, sw, dw, bias, lo, hi, y, x, rest);
  } else if (rest > 0) {
    step<T, 1, S>(rows, w, kh, kw, sw, dw, bias, lo, hi, y, x, rest);
  }
}

// DwRowFn: stride 1 and 2 load contiguous vectors (permuted for 2), others gather.
template <class T>
void row(const float* const* rows, const float* w, int kh, int kw, int sw, int dw, float bias, float lo, float hi,
         float* y, int64_t ow) {
  if (sw == 1) {
    row_s<T, 1>(rows, w, kh, kw, sw, dw, bias, lo, hi, y, ow);
  } else if (sw == 2) {
    row_s<T, 2>(rows, w, kh, kw, sw, dw, bias, lo, hi, y, ow);
  } else {
    row_s<T, 0>(rows, w, kh, kw, sw, dw, bias, lo, hi, y, ow);
  }
}

}  // namespace
}  // namespace dw
}  // namespace sgemm
}  // namespace quanta
