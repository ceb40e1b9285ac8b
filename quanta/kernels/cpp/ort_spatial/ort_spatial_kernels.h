// Kernels of ort_spatial.h written once and compiled by ort_spatial_portable.cc and
// ort_spatial_avx2.cc with their own -m flags; the AVX2 file replaces the resize row's
// column gather with vgatherdps. Each output keeps its float32 operations in the
// contract's order.
//
// Internal linkage on purpose (anonymous namespace): the same template compiled with
// different flags must not be merged into one copy by the linker.
#pragma once

#include <algorithm>
#include <cstdint>
#include <vector>

#include "ort_spatial/ort_spatial.h"

namespace quanta {
namespace ort_spatial {
namespace {  // NOLINT: see the header comment

// (RB1)'s columns of one input row, from column j_begin: c1[j] = row[x1_j], c2[j] = row[x2_j].
inline void resize_gather_from(const float* __restrict row, const ResizeTaps& t, float* __restrict c1,
                               float* __restrict c2, int64_t j_begin) {
  for (int64_t j = j_begin; j < t.n_w; ++j) {
    c1[j] = row[t.x1[j]];
    c2[j] = row[t.x2[j]];
  }
}

inline void resize_gather_generic(const float* row, const ResizeTaps& t, float* c1, float* c2) {
  resize_gather_from(row, t, c1, c2, 0);
}

// (RB2)-(RB3) of one output row from the gathered rows y1 (a1 = x[y1, x1], b1 = x[y1, x2])
// and y2 (a2, b2): every column its own sequence of float32 operations in the contract's
// order, so the loop vectorises without reordering any of them.
inline void resize_combine(const float* __restrict a1, const float* __restrict b1, const float* __restrict a2,
                           const float* __restrict b2, float dy1, float dy2, const ResizeTaps& t, float* __restrict y) {
  const float* __restrict dx1 = t.dx1;
  const float* __restrict dx2 = t.dx2;
  for (int64_t j = 0; j < t.n_w; ++j) {
    const float w22 = dx2[j] * dy2, w12 = dx1[j] * dy2;
    const float w21 = dx2[j] * dy1, w11 = dx1[j] * dy1;
    float v = w22 * a1[j] + w12 * b1[j];
    v = v + w21 * a2[j];
    y[j] = v + w11 * b2[j];
  }
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

// (AP-M2) of planes [p_begin, p_end) of a 2-D pool (axis 0 of g of size 1), one plane at a
// time. Per output row: col[c] = the kh rows of window column c (c counted from the begin
// padding) summed from the first row's value, in increasing row, for every column the
// row's windows touch (each window column's sum is the same whichever window reads it);
// then per output m = col[first] + col[first + 1] + ... in increasing column; then (AP-M4).
// The twin's padding: +0 in a column outside the input (every row of it), −0 in a row
// outside; adding either to what a column already holds changes no bit (+0 + +0 = +0,
// v + −0 = v), so only the first row writes them.
inline void average_planes_vector(const float* x, float* y, const PoolGeometry& g, const float* count, int64_t p_begin,
                                  int64_t p_end) {
  const int64_t h = g.size[1], w = g.size[2];
  const int64_t kh = g.kernel[1], kw = g.kernel[2], sh = g.strides[1], sw = g.strides[2];
  const int64_t pad_t = g.pads[1], pad_l = g.pads[2];
  const int64_t out_h = g.out[1], out_w = g.out[2];
  const int64_t need = (out_w - 1) * sw + kw;                                // window columns from −pad_l
  const int64_t lo = std::min(pad_l, need), hi = std::min(pad_l + w, need);  // [lo, hi): inside
  std::vector<float> col_buf(static_cast<size_t>(need)), m_buf(static_cast<size_t>(out_w));
  float* __restrict col = col_buf.data();
  float* __restrict m = m_buf.data();
  for (int64_t p = p_begin; p < p_end; ++p) {
    const float* plane = x + p * h * w;
    float* yp = y + p * out_h * out_w;
    for (int64_t oh = 0; oh < out_h; ++oh) {
      for (int64_t a = 0; a < kh; ++a) {
        const int64_t iy = oh * sh + a - pad_t;
        const bool inside = iy >= 0 && iy < h;
        const float* __restrict src = plane + (inside ? iy : 0) * w;  // input column c - pad_l
        if (a == 0) {
          for (int64_t c = 0; c < lo; ++c) col[c] = 0.0f;
          for (int64_t c = hi; c < need; ++c) col[c] = 0.0f;
          if (inside) {
            for (int64_t c = lo; c < hi; ++c) col[c] = src[c - pad_l];
          } else {
            for (int64_t c = lo; c < hi; ++c) col[c] = -0.0f;
          }
        } else if (inside) {
          for (int64_t c = lo; c < hi; ++c) col[c] = col[c] + src[c - pad_l];
        }
      }
      for (int64_t ow = 0; ow < out_w; ++ow) m[ow] = col[ow * sw];
      for (int64_t b = 1; b < kw; ++b) {
        for (int64_t ow = 0; ow < out_w; ++ow) m[ow] = m[ow] + col[ow * sw + b];
      }
      const float* cnt = count + oh * out_w;
      for (int64_t ow = 0; ow < out_w; ++ow) yp[oh * out_w + ow] = m[ow] / cnt[ow];  // (AP-M4)
    }
  }
}

}  // namespace
}  // namespace ort_spatial
}  // namespace quanta
