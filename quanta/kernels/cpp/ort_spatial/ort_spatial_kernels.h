// Kernels of ort_spatial.h written once and compiled by ort_spatial_portable.cc and
// ort_spatial_avx2.cc with their own -m flags; the AVX2 file replaces the resize row with
// intrinsics. Each output keeps its float32 operations in the contract's order.
//
// Internal linkage on purpose (anonymous namespace): the same template compiled with
// different flags must not be merged into one copy by the linker.
#pragma once

#include <algorithm>
#include <cstdint>

#include "ort_spatial/ort_spatial.h"

namespace quanta {
namespace ort_spatial {
namespace {  // NOLINT: see the header comment

// (RB2)-(RB3) of output columns [j_begin, n_w) of one row.
inline void resize_columns(const float* __restrict r1, const float* __restrict r2, float dy1, float dy2,
                           const ResizeTaps& t, float* __restrict y, int64_t j_begin) {
  for (int64_t j = j_begin; j < t.n_w; ++j) {
    const float w22 = t.dx2[j] * dy2, w12 = t.dx1[j] * dy2;
    const float w21 = t.dx2[j] * dy1, w11 = t.dx1[j] * dy1;
    float s = w22 * r1[t.x1[j]] + w12 * r1[t.x2[j]];
    s = s + w21 * r2[t.x1[j]];
    y[j] = s + w11 * r2[t.x2[j]];
  }
}

inline void resize_row_generic(const float* r1, const float* r2, float dy1, float dy2, const ResizeTaps& t, float* y) {
  resize_columns(r1, r2, dy1, dy2, t, y, 0);
}

// The window positions inside the input along one axis: [lo, hi) for output index o.
inline void window_range(int64_t o, int64_t axis_size, int64_t k, int64_t s, int64_t pad, int64_t* lo, int64_t* hi) {
  const int64_t start = o * s - pad;
  *lo = std::max<int64_t>(start, 0);
  *hi = std::min<int64_t>(start + k, axis_size);
}

// (AP-M3)-(AP-M4) of planes [p_begin, p_end), kLanes planes at a time: kLanes independent
// sums, each in the contract's order. A block shorter than kLanes repeats its last plane
// in the spare lanes and stores only its own.
inline void average_planes_generic(const float* x, float* y, const PoolGeometry& g, const float* count, int64_t p_begin,
                                   int64_t p_end) {
  constexpr int kLanes = 8;
  const int64_t in_plane = g.size[0] * g.size[1] * g.size[2];
  const int64_t out_plane = g.out[0] * g.out[1] * g.out[2];
  for (int64_t p = p_begin; p < p_end; p += kLanes) {
    const int lanes = static_cast<int>(std::min<int64_t>(kLanes, p_end - p));
    const float* base[kLanes];
    for (int l = 0; l < kLanes; ++l) base[l] = x + (p + std::min(l, lanes - 1)) * in_plane;
    int64_t o = 0;
    for (int64_t od = 0; od < g.out[0]; ++od) {
      int64_t d0, d1;
      window_range(od, g.size[0], g.kernel[0], g.strides[0], g.pads[0], &d0, &d1);
      for (int64_t oh = 0; oh < g.out[1]; ++oh) {
        int64_t h0, h1;
        window_range(oh, g.size[1], g.kernel[1], g.strides[1], g.pads[1], &h0, &h1);
        for (int64_t ow = 0; ow < g.out[2]; ++ow, ++o) {
          int64_t w0, w1;
          window_range(ow, g.size[2], g.kernel[2], g.strides[2], g.pads[2], &w0, &w1);
          float m[kLanes];
          for (int l = 0; l < kLanes; ++l) m[l] = 0.0f;  // (AP-M3): +0
          for (int64_t d = d0; d < d1; ++d) {
            for (int64_t h = h0; h < h1; ++h) {
              const int64_t row = (d * g.size[1] + h) * g.size[2];
              for (int64_t w = w0; w < w1; ++w) {
                for (int l = 0; l < kLanes; ++l) m[l] = m[l] + base[l][row + w];
              }
            }
          }
          for (int l = 0; l < lanes; ++l) y[(p + l) * out_plane + o] = m[l] / count[o];  // (AP-M4)
        }
      }
    }
  }
}

// (AP-M2) of planes [p_begin, p_end) of a 2-D pool (axis 0 of g of size 1), kLanes
// planes at a time: per window column b, its kh rows summed from the first (a row in the
// padding is −0, a column in the padding +0, as the twin pads), then the columns from the
// first; then (AP-M4).
inline void average_planes_vector(const float* x, float* y, const PoolGeometry& g, const float* count, int64_t p_begin,
                                  int64_t p_end) {
  constexpr int kLanes = 8;
  const int64_t h = g.size[1], w = g.size[2];
  const int64_t in_plane = h * w, out_plane = g.out[1] * g.out[2];
  for (int64_t p = p_begin; p < p_end; p += kLanes) {
    const int lanes = static_cast<int>(std::min<int64_t>(kLanes, p_end - p));
    const float* base[kLanes];
    for (int l = 0; l < kLanes; ++l) base[l] = x + (p + std::min(l, lanes - 1)) * in_plane;
    int64_t o = 0;
    for (int64_t oh = 0; oh < g.out[1]; ++oh) {
      for (int64_t ow = 0; ow < g.out[2]; ++ow, ++o) {
        float m[kLanes], col[kLanes];
        for (int64_t b = 0; b < g.kernel[2]; ++b) {
          const int64_t ix = ow * g.strides[2] + b - g.pads[2];
          const bool col_inside = ix >= 0 && ix < w;
          for (int64_t a = 0; a < g.kernel[1]; ++a) {
            const int64_t iy = oh * g.strides[1] + a - g.pads[1];
            const bool inside = col_inside && iy >= 0 && iy < h;
            const float pad = col_inside ? -0.0f : 0.0f;
            for (int l = 0; l < kLanes; ++l) {
              const float v = inside ? base[l][iy * w + ix] : pad;
              col[l] = a == 0 ? v : col[l] + v;
            }
          }
          for (int l = 0; l < kLanes; ++l) m[l] = b == 0 ? col[l] : m[l] + col[l];
        }
        for (int l = 0; l < lanes; ++l) y[(p + l) * out_plane + o] = m[l] / count[o];  // (AP-M4)
      }
    }
  }
}

}  // namespace
}  // namespace ort_spatial
}  // namespace quanta
