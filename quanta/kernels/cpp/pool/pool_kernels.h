// Plane kernels of pool.h, written once over a row policy R and compiled by
// pool_portable.cc, pool_avx2.cc and pool_avx512vnni.cc with their own -m flags. R supplies
// the inner row operations (GenericRows below: plain loops; the SIMD files override the
// hot ones with intrinsics). Every row operation keeps each output's float32 operations in
// the contract's order; integer sums wrap in uint32 (defined overflow), so every variant
// gives the same bytes.
//
// Internal linkage on purpose (anonymous namespace): the same template compiled with
// different flags must not be merged into one copy by the linker.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>

#include "pool/pool.h"

namespace quanta {
namespace pool {
namespace {  // NOLINT: see the header comment

// Loops take __restrict pointers: T is a char type, which may alias anything, so without
// them GCC reloads every pointer after each store and vectorises nothing.
struct GenericRows {
  // Σ x[0, n) modulo 2^32
  template <typename T>
  static uint32_t sum(const T* __restrict x, int64_t n) {
    uint32_t s = 0;
    for (int64_t i = 0; i < n; ++i) s += static_cast<uint32_t>(static_cast<int32_t>(x[i]));
    return s;
  }

  // y[i] = max(y[i], x[i·s]), i < n
  template <typename T>
  static void max(T* __restrict y, const T* __restrict x, int64_t n, int64_t s) {
    for (int64_t i = 0; i < n; ++i) {
      const T v = x[i * s];
      y[i] = v > y[i] ? v : y[i];
    }
  }

  // t[i] += dq(x[i·s]) = f32(sx · float32(x − zx)): one float32 add per tap
  template <typename T>
  static void add_dequantized(float* __restrict t, const T* __restrict x, int64_t n, int64_t s, float sx, int32_t zx) {
    for (int64_t i = 0; i < n; ++i) t[i] += sx * static_cast<float>(static_cast<int32_t>(x[i * s]) - zx);
  }

  // y[i] = sat(rne(f32(f32(t[i] / count[i]) / sy) + zy)), NaN -> qmin
  template <typename T>
  static void finish_average(T* __restrict y, const float* __restrict t, const float* __restrict count, int64_t n,
                             float sy, float zy) {
    constexpr float lo = static_cast<float>(std::numeric_limits<T>::min());
    constexpr float hi = static_cast<float>(std::numeric_limits<T>::max());
    for (int64_t i = 0; i < n; ++i) {
      const float avg = t[i] / count[i];
      float v = avg / sy + zy;
      v = v != v ? lo : v;
      float r = std::nearbyint(v);
      r = r < lo ? lo : r;
      r = r > hi ? hi : r;
      y[i] = static_cast<T>(static_cast<int32_t>(r));
    }
  }
  // Output pixels p < pixels of a channels-last max pool over their taps inside the input:
  // y[p·channels + c] = max(qmin, x[p·pixel_step + i·row_step + j·col_step + c]) over
  // i < rows, j < cols, for c < channels
  template <typename T>
  static void max_windows_nhwc(T* __restrict y, const T* __restrict x, int64_t pixels, int64_t pixel_step, int64_t rows,
                               int64_t row_step, int64_t cols, int64_t col_step, int64_t channels) {
    for (int64_t q = 0; q < pixels; ++q) {
      T* __restrict yq = y + q * channels;
      std::fill(yq, yq + channels, std::numeric_limits<T>::min());
      for (int64_t i = 0; i < rows; ++i) {
        for (int64_t j = 0; j < cols; ++j) {
          const T* __restrict p = x + q * pixel_step + i * row_step + j * col_step;
          for (int64_t c = 0; c < channels; ++c) yq[c] = p[c] > yq[c] ? p[c] : yq[c];
        }
      }
    }
  }
};

template <typename T>
void sum_channels(const T* __restrict x, int64_t rows, int64_t stride, int64_t width, uint32_t* __restrict acc) {
  for (int64_t p = 0; p < rows; ++p) {
    const T* __restrict row = x + p * stride;
    for (int64_t c = 0; c < width; ++c) acc[c] += static_cast<uint32_t>(static_cast<int32_t>(row[c]));
  }
}

// First and one-past-last output index o in [0, out) whose input position
// o·s − pad + off lies in [0, size).
inline void valid_outputs(int64_t out, int64_t s, int64_t pad, int64_t off, int64_t size, int64_t* lo, int64_t* hi) {
  // o·s >= pad − off  and  o·s <= size − 1 + pad − off
  const int64_t a = pad - off;
  const int64_t b = size - 1 + pad - off;
  int64_t first = a <= 0 ? 0 : (a + s - 1) / s;
  int64_t last = b < 0 ? -1 : b / s;  // inclusive
  *lo = std::min(first, out);
  *hi = std::max(*lo, std::min(last + 1, out));
}

template <class R, typename T>
uint32_t sum_plane(const T* x, int64_t n) {
  return R::sum(x, n);
}

// The output columns [lo[kw], hi[kw]) whose tap kw lies inside the input row, for every kw
// (computed once per plane: they do not depend on the output row).
struct ColumnRanges {
  static constexpr int64_t kMaxTaps = 64;
  int64_t lo[kMaxTaps], hi[kMaxTaps];
  bool ok;
  ColumnRanges(const Geometry2d& g, int64_t d_w) : ok(g.k_w <= kMaxTaps) {
    for (int64_t kw = 0; ok && kw < g.k_w; ++kw)
      valid_outputs(g.out_w, g.s_w, g.pad_l, kw * d_w, g.w, &lo[kw], &hi[kw]);
  }
  void get(const Geometry2d& g, int64_t d_w, int64_t kw, int64_t* l, int64_t* h) const {
    if (ok) {
      *l = lo[kw];
      *h = hi[kw];
    } else {
      valid_outputs(g.out_w, g.s_w, g.pad_l, kw * d_w, g.w, l, h);
    }
  }
};

template <class R, typename T>
void max_plane(const T* x, T* y, const Geometry2d& g) {
  constexpr T qmin = std::numeric_limits<T>::min();
  const ColumnRanges cols(g, g.d_w);
  for (int64_t oh = 0; oh < g.out_h; ++oh) {
    T* yr = y + oh * g.out_w;
    std::fill(yr, yr + g.out_w, qmin);
    for (int64_t kh = 0; kh < g.k_h; ++kh) {
      const int64_t ih = oh * g.s_h - g.pad_t + kh * g.d_h;
      if (ih < 0 || ih >= g.h) continue;
      const T* xr = x + ih * g.w;
      for (int64_t kw = 0; kw < g.k_w; ++kw) {
        int64_t lo, hi;
        cols.get(g, g.d_w, kw, &lo, &hi);
        // xr[kw·d_w − pad_l + ow·s_w] is the tap of output ow
        if (hi > lo) R::max(yr + lo, xr + (kw * g.d_w - g.pad_l + lo * g.s_w), hi - lo, g.s_w);
      }
    }
  }
}

// Output row oy of a channels-last max pool of one image x [H, W, C] -> y [OW, C]: the
// taps inside the input form a box of rows [ky0, ky1) x columns [kx0, kx1) of the window
// (dilated), which R::max_windows_nhwc reduces; the output pixels whose every column tap
// lies inside the row share one box and go in one call.
template <class R, typename T>
void max_row_nhwc(const T* x, T* y, const Geometry2d& g, int64_t c, int64_t oy) {
  int64_t ky0, ky1;  // window rows whose input row oy·s_h − pad_t + ky·d_h lies in [0, h)
  valid_outputs(g.k_h, g.d_h, g.pad_t - oy * g.s_h, 0, g.h, &ky0, &ky1);
  const int64_t rows = ky1 - ky0, row_step = g.d_h * g.w * c, col_step = g.d_w * c;
  const int64_t iy = oy * g.s_h - g.pad_t + ky0 * g.d_h;
  const T* xr = rows > 0 ? x + iy * g.w * c : x;  // read only when rows > 0
  // one pixel: its own column box (no tap inside: an empty box, the pixel stays qmin)
  auto edge = [&](int64_t ox) {
    int64_t kx0, kx1;
    valid_outputs(g.k_w, g.d_w, g.pad_l - ox * g.s_w, 0, g.w, &kx0, &kx1);
    const int64_t ix = ox * g.s_w - g.pad_l + kx0 * g.d_w;
    const T* p = rows > 0 && kx1 > kx0 ? xr + ix * c : x;
    R::max_windows_nhwc(y + ox * c, p, 1, 0, rows, row_step, kx1 - kx0, col_step, c);
  };
  // outputs whose first tap and whose last tap both lie inside the row: all k_w taps do
  int64_t a0, a1, b0, b1;
  valid_outputs(g.out_w, g.s_w, g.pad_l, 0, g.w, &a0, &a1);
  valid_outputs(g.out_w, g.s_w, g.pad_l, (g.k_w - 1) * g.d_w, g.w, &b0, &b1);
  const int64_t lo = std::max(a0, b0), hi = std::max(lo, std::min(a1, b1));
  for (int64_t ox = 0; ox < lo; ++ox) edge(ox);
  if (hi > lo) {
    const T* p = rows > 0 ? xr + (lo * g.s_w - g.pad_l) * c : x;
    R::max_windows_nhwc(y + lo * c, p, hi - lo, g.s_w * c, rows, row_step, g.k_w, col_step, c);
  }
  for (int64_t ox = hi; ox < g.out_w; ++ox) edge(ox);
}

template <class R, typename T>
void average_plane(const T* x, T* y, const Geometry2d& g, const AverageParams& p) {
  constexpr int64_t kBlock = 256;  // outputs per row block (stack scratch)
  float total[kBlock];
  float count[kBlock];
  const float zy = static_cast<float>(p.zy);
  const int64_t window = g.k_h * g.k_w;
  const ColumnRanges cols(g, 1);
  for (int64_t oh = 0; oh < g.out_h; ++oh) {
    const int64_t h0 = oh * g.s_h - g.pad_t;
    const int64_t rows_in = std::min(h0 + g.k_h, g.h) - std::max<int64_t>(h0, 0);
    T* yr = y + oh * g.out_w;
    for (int64_t ob = 0; ob < g.out_w; ob += kBlock) {
      const int64_t oe = std::min(ob + kBlock, g.out_w);
      std::fill(total, total + (oe - ob), 0.0f);
      // Taps in row-major window order; positions outside the input are skipped (the
      // twin adds zeros there, which leave a float32 sum unchanged).
      for (int64_t kh = 0; kh < g.k_h; ++kh) {
        const int64_t ih = h0 + kh;
        if (ih < 0 || ih >= g.h) continue;
        const T* xr = x + ih * g.w;
        for (int64_t kw = 0; kw < g.k_w; ++kw) {
          int64_t lo, hi;
          cols.get(g, 1, kw, &lo, &hi);
          lo = std::max(lo, ob);
          hi = std::min(hi, oe);
          if (hi > lo) {
            R::add_dequantized(total + (lo - ob), xr + (kw - g.pad_l + lo * g.s_w), hi - lo, g.s_w, p.sx, p.zx);
          }
        }
      }
      for (int64_t ow = ob; ow < oe; ++ow) {
        int64_t c = window;
        if (!p.count_include_pad) {
          const int64_t w0 = ow * g.s_w - g.pad_l;
          c = rows_in * (std::min(w0 + g.k_w, g.w) - std::max<int64_t>(w0, 0));
        }
        count[ow - ob] = static_cast<float>(c);
      }
      R::finish_average(yr + ob, total, count, oe - ob, p.sy, zy);
    }
  }
}

// The plane functions of an ISA: the generic loops over R's row operations unless the ISA
// supplies its own planes (P).
template <class R>
struct GenericPlanes {
  template <typename T>
  static void max(const T* x, T* y, const Geometry2d& g) {
    max_plane<R, T>(x, y, g);
  }
  template <typename T>
  static void average(const T* x, T* y, const Geometry2d& g, const AverageParams& p) {
    average_plane<R, T>(x, y, g, p);
  }
};

template <class R, class P = GenericPlanes<R>>
constexpr Kernels make_kernels(void (*max_plane_f32)(const float*, float*, const Geometry2d&, float*) = nullptr) {
  return Kernels{
      sum_plane<R, uint8_t>,
      sum_plane<R, int8_t>,
      sum_channels<uint8_t>,
      sum_channels<int8_t>,
      P::template max<uint8_t>,
      P::template max<int8_t>,
      P::template average<uint8_t>,
      P::template average<int8_t>,
      max_row_nhwc<R, uint8_t>,
      max_row_nhwc<R, int8_t>,
      max_plane_f32,
  };
}

}  // namespace
}  // namespace pool
}  // namespace quanta
