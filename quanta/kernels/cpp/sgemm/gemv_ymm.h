// The one-column GEMV over packed A panels (sgemm.h GemvFn) in AVX2 + FMA: one ymm per
// 8-row panel (a packed panel's k-th column is 8 contiguous floats), 4 panels per step
// for 4 independent fma chains. Included by sgemm_avx2.cc and sgemm_avx512vnni.cc (both
// compiled with -mfma); each element is the tile's chain, fma(a, x, acc) in increasing k.
#pragma once

#include <immintrin.h>

#include "sgemm/sgemm.h"

namespace quanta {
namespace sgemm {
namespace ymm {

inline float finish_scalar(float v, const Epilogue& ep, int64_t row) {
  if (ep.alpha != 1.0f) v = v * ep.alpha;
  if (ep.bias_row) v = v + ep.bias_row[row];
  if (ep.bias_col) v = v + ep.bias_col[0];
  if (v < ep.lo) v = ep.lo;  // NaN compares false: stays NaN, as max(lo, v) in the tiles
  if (v > ep.hi) v = ep.hi;
  return v;
}

template <int P>
inline void gemv_panels(const float* a, int64_t k, const float* x, int64_t ldx, float* y, int64_t ldy,
                        int64_t rows_left, int64_t row0, const Epilogue& ep) {
  __m256 acc[P];
  for (int q = 0; q < P; ++q) acc[q] = _mm256_setzero_ps();
  const int64_t stride = k * kPackMr;
  for (int64_t kk = 0; kk < k; ++kk) {
    const __m256 xv = _mm256_set1_ps(x[kk * ldx]);
    for (int q = 0; q < P; ++q) acc[q] = _mm256_fmadd_ps(_mm256_loadu_ps(a + q * stride + kk * kPackMr), xv, acc[q]);
  }
  alignas(32) float tmp[8];
  for (int q = 0; q < P; ++q) {
    _mm256_store_ps(tmp, acc[q]);
    for (int r = 0; r < kPackMr; ++r) {
      const int64_t i = q * kPackMr + r;
      if (i < rows_left) y[i * ldy] = finish_scalar(tmp[r], ep, row0 + i);
    }
  }
}

inline void gemv(const float* a, int64_t panels, int64_t k, const float* x, int64_t ldx, float* y, int64_t ldy,
                 int64_t rows_left, int64_t row0, const Epilogue& ep) {
  int64_t p = 0;
  for (; p + 4 <= panels; p += 4) {
    const int64_t off = p * kPackMr;
    gemv_panels<4>(a + p * k * kPackMr, k, x, ldx, y + off * ldy, ldy, rows_left - off, row0 + off, ep);
  }
  for (; p < panels; ++p) {
    const int64_t off = p * kPackMr;
    gemv_panels<1>(a + p * k * kPackMr, k, x, ldx, y + off * ldy, ldy, rows_left - off, row0 + off, ep);
  }
}

}  // namespace ymm
}  // namespace sgemm
}  // namespace quanta
