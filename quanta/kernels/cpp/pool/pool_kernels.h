// Plane kernels of pool.h, written once and compiled by pool_portable.cc, pool_avx2.cc and
// pool_avx512vnni.cc with their own -m flags (GCC vectorises the inner loops). Every loop
// keeps each output's float32 operations in the contract's order; integer sums wrap in
// uint32 (defined overflow), so every variant gives the same bytes.
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

template <typename T>
uint32_t sum_plane(const T* x, int64_t n) {
  uint32_t s = 0;
  for (int64_t i = 0; i < n; ++i) s += static_cast<uint32_t>(static_cast<int32_t>(x[i]));
  return s;
}

template <typename T>
void sum_channels(const T* x, int64_t rows, int64_t stride, int64_t width, uint32_t* acc) {
  for (int64_t p = 0; p < rows; ++p) {
    const T* row = x + p * stride;
    for (int64_t c = 0; c < width; ++c) acc[c] += static_cast<uint32_t>(static_cast<int32_t>(row[c]));
  }
}

// First and one-past-last output index o in [0, out) whose input position
// o·s − pad + off lies in [0, size).
inline void valid_outputs(int64_t out, int64_t s, int64_t pad, int64_t off, int64_t size, int64_t* lo,
                          int64_t* hi) {
  // o·s >= pad − off  and  o·s <= size − 1 + pad − off
  const int64_t a = pad - off;
  const int64_t b = size - 1 + pad - off;
  int64_t first = a <= 0 ? 0 : (a + s - 1) / s;
  int64_t last = b < 0 ? -1 : b / s;  // inclusive
  *lo = std::min(first, out);
  *hi = std::max(*lo, std::min(last + 1, out));
}

template <typename T>
void max_plane(const T* x, T* y, const Geometry2d& g) {
  constexpr T qmin = std::numeric_limits<T>::min();
  for (int64_t oh = 0; oh < g.out_h; ++oh) {
    T* yr = y + oh * g.out_w;
    for (int64_t ow = 0; ow < g.out_w; ++ow) yr[ow] = qmin;
    for (int64_t kh = 0; kh < g.k_h; ++kh) {
      const int64_t ih = oh * g.s_h - g.pad_t + kh * g.d_h;
      if (ih < 0 || ih >= g.h) continue;
      const T* xr = x + ih * g.w;
      for (int64_t kw = 0; kw < g.k_w; ++kw) {
        int64_t lo, hi;
        valid_outputs(g.out_w, g.s_w, g.pad_l, kw * g.d_w, g.w, &lo, &hi);
        const int64_t base = kw * g.d_w - g.pad_l;  // xr[base + ow·s_w] is the tap of output ow
        if (g.s_w == 1) {
          for (int64_t ow = lo; ow < hi; ++ow) yr[ow] = std::max(yr[ow], xr[base + ow]);
        } else {
          for (int64_t ow = lo; ow < hi; ++ow) yr[ow] = std::max(yr[ow], xr[base + ow * g.s_w]);
        }
      }
    }
  }
}

// sat(rne(v)) with NaN -> qmin.
template <typename T>
inline T round_sat(float v) {
  constexpr float lo = static_cast<float>(std::numeric_limits<T>::min());
  constexpr float hi = static_cast<float>(std::numeric_limits<T>::max());
  if (v != v) return std::numeric_limits<T>::min();
  float r = std::nearbyint(v);
  r = r < lo ? lo : r;
  r = r > hi ? hi : r;
  return static_cast<T>(static_cast<int32_t>(r));
}

template <typename T>
void average_plane(const T* x, T* y, const Geometry2d& g, const AverageParams& p) {
  constexpr int64_t kBlock = 256;  // outputs per row block (stack scratch)
  float total[kBlock];
  const float zy = static_cast<float>(p.zy);
  const int64_t window = g.k_h * g.k_w;
  for (int64_t oh = 0; oh < g.out_h; ++oh) {
    const int64_t h0 = oh * g.s_h - g.pad_t;
    const int64_t rows_in = std::min(h0 + g.k_h, g.h) - std::max<int64_t>(h0, 0);
    T* yr = y + oh * g.out_w;
    for (int64_t ob = 0; ob < g.out_w; ob += kBlock) {
      const int64_t oe = std::min(ob + kBlock, g.out_w);
      float* t = total;  // t[ow − ob] for ow in [ob, oe)
      for (int64_t ow = ob; ow < oe; ++ow) t[ow - ob] = 0.0f;
      for (int64_t kh = 0; kh < g.k_h; ++kh) {
        const int64_t ih = h0 + kh;
        if (ih < 0 || ih >= g.h) continue;
        const T* xr = x + ih * g.w;
        for (int64_t kw = 0; kw < g.k_w; ++kw) {
          int64_t lo, hi;
          valid_outputs(g.out_w, g.s_w, g.pad_l, kw, g.w, &lo, &hi);
          lo = std::max(lo, ob);
          hi = std::min(hi, oe);
          const int64_t base = kw - g.pad_l;
          if (g.s_w == 1) {
            for (int64_t ow = lo; ow < hi; ++ow) {
              t[ow - ob] += p.sx * static_cast<float>(static_cast<int32_t>(xr[base + ow]) - p.zx);
            }
          } else {
            for (int64_t ow = lo; ow < hi; ++ow) {
              t[ow - ob] += p.sx * static_cast<float>(static_cast<int32_t>(xr[base + ow * g.s_w]) - p.zx);
            }
          }
        }
      }
      for (int64_t ow = ob; ow < oe; ++ow) {
        int64_t count = window;
        if (!p.count_include_pad) {
          const int64_t w0 = ow * g.s_w - g.pad_l;
          count = rows_in * (std::min(w0 + g.k_w, g.w) - std::max<int64_t>(w0, 0));
        }
        const float avg = t[ow - ob] / static_cast<float>(count);
        yr[ow] = round_sat<T>(avg / p.sy + zy);
      }
    }
  }
}

constexpr Kernels kPlaneKernels = {
    sum_plane<uint8_t>,  sum_plane<int8_t>,  sum_channels<uint8_t>,  sum_channels<int8_t>,
    max_plane<uint8_t>,  max_plane<int8_t>,  average_plane<uint8_t>, average_plane<int8_t>,
};

}  // namespace
}  // namespace pool
}  // namespace quanta
