// Portable float micro-kernels (contract: sgemm.h): an R × 16 tile in scalar code, each
// element one std::fma chain, and the depthwise rows.
#include <cmath>

#include "sgemm/sgemm.h"

namespace quanta {
namespace sgemm {
namespace {

constexpr int kNr = 16;

inline float finish(float v, const Epilogue& ep, float row_bias, const float* col_bias) {
  if (ep.alpha != 1.0f) v = v * ep.alpha;
  if (ep.bias_row) v = v + row_bias;
  if (col_bias) v = v + *col_bias;
  if (v < ep.lo) v = ep.lo;  // NaN compares false: stays NaN
  if (v > ep.hi) v = ep.hi;
  return v;
}

template <int R, bool kPacked>
void tile(const Tile& t) {
  float acc[R][kNr];
  for (int r = 0; r < R; ++r)
    for (int j = 0; j < kNr; ++j) acc[r][j] = t.load_c && j < t.nr ? t.c[r * t.ldc + j] : 0.0f;
  const float* b = t.b;
  for (int64_t k = 0; k < t.k; ++k) {
    for (int r = 0; r < R; ++r) {
      const float a = kPacked ? t.a[r + k * kPackMr] : t.a[r * t.a_rs + k];
      for (int j = 0; j < t.nr; ++j) acc[r][j] = std::fma(a, b[j], acc[r][j]);
    }
    b += t.ldb;
  }
  for (int r = 0; r < R; ++r) {
    float* c = t.c + r * t.ldc;
    for (int j = 0; j < t.nr; ++j) {
      float v = acc[r][j];
      if (t.ep) {
        v = finish(v, *t.ep, t.ep->bias_row ? t.ep->bias_row[t.row0 + r] : 0.0f,
                   t.ep->bias_col ? t.ep->bias_col + t.col0 + j : nullptr);
      }
      c[j] = v;
    }
  }
}

void dw_row(const float* const* rows, const float* w, int kh, int kw, int sw, int dw, float bias, float lo, float hi,
            float* y, int64_t ow) {
  for (int64_t x = 0; x < ow; ++x) {
    float acc = 0.0f;
    for (int ky = 0; ky < kh; ++ky)
      for (int kx = 0; kx < kw; ++kx) acc = std::fma(w[ky * kw + kx], rows[ky][x * sw + kx * dw], acc);
    float v = acc + bias;
    if (v < lo) v = lo;
    if (v > hi) v = hi;
    y[x] = v;
  }
}

void gemv(const float* a, int64_t panels, int64_t k, const float* x, int64_t ldx, float* y, int64_t ldy,
          int64_t rows_left, int64_t row0, const Epilogue& ep) {
  for (int64_t i = 0; i < panels * kPackMr && i < rows_left; ++i) {
    const float* ap = a + (i / kPackMr) * k * kPackMr + i % kPackMr;
    float acc = 0.0f;
    for (int64_t kk = 0; kk < k; ++kk) acc = std::fma(ap[kk * kPackMr], x[kk * ldx], acc);
    y[i * ldy] = finish(acc, ep, ep.bias_row ? ep.bias_row[row0 + i] : 0.0f, ep.bias_col);
  }
}

void pack_gather8(const float* src, const int32_t* base, const int64_t* tap, int64_t k, float* dst) {
  for (int64_t kk = 0; kk < k; ++kk)
    for (int r = 0; r < 8; ++r) dst[kk * 8 + r] = src[tap[kk] + base[r]];
}

}  // namespace

extern const Kernels kKernelsPortable = {
    "portable",
    4,
    kNr,
    4,
    {{nullptr, tile<1, false>, tile<2, false>, tile<3, false>, tile<4, false>, nullptr, nullptr, nullptr, nullptr},
     {nullptr, tile<1, true>, tile<2, true>, tile<3, true>, tile<4, true>, nullptr, nullptr, nullptr, nullptr}},
    {},  // tile_indirect: the implicit GEMM packs B panels
    dw_row,
    gemv,
    nullptr,  // dw_block16: small planes take the row kernel
    nullptr,  // dw_rows2: one row at a time
    nullptr,  // interleave16: no dw_block16
    nullptr,
    nullptr,  // dw_rows2_split: stride 2 takes dw_rows2 / dw_row
    nullptr,
    pack_gather8,
    nullptr,  // direct_row: the implicit GEMM
};

}  // namespace sgemm
}  // namespace quanta
