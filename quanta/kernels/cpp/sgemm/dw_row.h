// The depthwise row kernel of sgemm.h (DwRowFn) over the vector traits of simd.h, shared
// by sgemm_avx2.cc (F32x8: 8 pixels per ymm) and sgemm_avx512vnni.cc (F32x16: 16 per
// zmm); each ISA's translation unit instantiates it with its own traits, compiled for
// that ISA.
#pragma once

#include <cstdint>
#include <type_traits>
#include <utility>

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

// The end of every output chain of a row pair: + bias, the clamp, the masked stores of
// outputs [x0, x0 + n) of both rows.
template <class T, int U>
__attribute__((always_inline)) inline void finish_pair(const typename T::V* a0, const typename T::V* a1, float bias,
                                                       float lo, float hi, float* y0, float* y1, int64_t x0,
                                                       int64_t n) {
  constexpr int L = T::kLanes;
  const typename T::V bv = T::set1(bias);
  for (int u = 0; u < U; ++u) {
    typename T::V v0 = T::add(a0[u], bv), v1 = T::add(a1[u], bv);
    if (lo != -__builtin_inff()) v0 = T::max(T::set1(lo), v0), v1 = T::max(T::set1(lo), v1);
    if (hi != __builtin_inff()) v0 = T::min(T::set1(hi), v0), v1 = T::min(T::set1(hi), v1);
    T::store(y0 + x0 + u * L, T::tail(n - u * L), v0);
    T::store(y1 + x0 + u * L, T::tail(n - u * L), v1);
  }
}

// A row of ow outputs as steps of two vectors and a last step of one or two:
// step(std::integral_constant<int, U>, x0, n) computes outputs [x0, x0 + n), n <= U·L.
template <int L, class Step>
__attribute__((always_inline)) inline void walk_pairs(int64_t ow, Step&& step) {
  int64_t x = 0;
  for (; x + 2 * L <= ow; x += 2 * L) step(std::integral_constant<int, 2>{}, x, int64_t{2 * L});
  const int64_t rest = ow - x;
  if (rest > L) {
    step(std::integral_constant<int, 2>{}, x, rest);
  } else if (rest > 0) {
    step(std::integral_constant<int, 1>{}, x, rest);
  }
}

// Two output rows at once with the taps known at compile time: 2·U independent fma chains
// whose accumulators and the KH·KW weight broadcasts stay in registers. One row's U
// chains (4 at most) are as many as the fma latency needs, so the generic row kernel
// waits on each chain and spills its accumulators at every ky; two rows double the
// chains. Every output keeps its own chain (fma from +0, taps in (ky, kx) order, + bias,
// clamp): the bytes of row(). step2 is inlined so that the weight vectors of rows2_s stay
// in registers (a call would reload one per fma: two loads for every fma).
template <class T, int KH, int KW, int S, int U>
__attribute__((always_inline)) inline void step2(const float* const* r0, const float* const* r1,
                                                 const typename T::V* wv, int sw, int dw, float bias, float lo,
                                                 float hi, float* y0, float* y1, int64_t x0, int64_t n) {
  typename T::V a0[U], a1[U];
  for (int u = 0; u < U; ++u) a0[u] = a1[u] = T::zero();
  for (int ky = 0; ky < KH; ++ky) {
    const float* p0 = r0[ky] + x0 * S;
    const float* p1 = r1[ky] + x0 * S;
    for (int kx = 0; kx < KW; ++kx) {
      for (int u = 0; u < U; ++u) {
        a0[u] = T::fmadd(wv[ky * KW + kx], T::template strided<S>(p0 + kx * dw + u * T::kLanes * S, sw), a0[u]);
        a1[u] = T::fmadd(wv[ky * KW + kx], T::template strided<S>(p1 + kx * dw + u * T::kLanes * S, sw), a1[u]);
      }
    }
  }
  finish_pair<T, U>(a0, a1, bias, lo, hi, y0, y1, x0, n);
}

// step2 at stride 1 and dilation 1 with every row pointer 64-byte aligned and x0 a
// multiple of 16 (AVX-512): per tap row, the U + 1 aligned vectors of the window are
// loaded once and the KW shifted ones built by valignd, where step2 issues an unaligned
// load (split across two cache lines) for every tap: 0.72-0.80x the time in a standalone
// build on Zen 4. The same values reach the same fma chains in the same order: the same
// bytes.
template <class T, int U, int K>
__attribute__((always_inline)) inline void tap_aligned(typename T::V w, const typename T::V* l0,
                                                       const typename T::V* l1, typename T::V* a0, typename T::V* a1) {
  for (int u = 0; u < U; ++u) {
    if constexpr (K == 0) {
      a0[u] = T::fmadd(w, l0[u], a0[u]);
      a1[u] = T::fmadd(w, l1[u], a1[u]);
    } else {
      a0[u] = T::fmadd(w, T::template shift_concat<K>(l0[u], l0[u + 1]), a0[u]);
      a1[u] = T::fmadd(w, T::template shift_concat<K>(l1[u], l1[u + 1]), a1[u]);
    }
  }
}

// One tap row, kx = 0 .. KW − 1 in order (a fold over the compile-time shifts).
template <class T, int U, int... K>
__attribute__((always_inline)) inline void tap_row_aligned(std::integer_sequence<int, K...>, const typename T::V* w,
                                                           const typename T::V* l0, const typename T::V* l1,
                                                           typename T::V* a0, typename T::V* a1) {
  (tap_aligned<T, U, K>(w[K], l0, l1, a0, a1), ...);
}

template <class T, int KH, int KW, int U>
__attribute__((always_inline)) inline void step2_aligned(const float* const* r0, const float* const* r1,
                                                         const typename T::V* wv, float bias, float lo, float hi,
                                                         float* y0, float* y1, int64_t x0, int64_t n) {
  constexpr int L = T::kLanes;
  typename T::V a0[U], a1[U];
  for (int u = 0; u < U; ++u) a0[u] = a1[u] = T::zero();
  for (int ky = 0; ky < KH; ++ky) {
    typename T::V l0[U + 1], l1[U + 1];
    for (int u = 0; u <= U; ++u) {
      l0[u] = T::loadu(r0[ky] + x0 + u * L);  // aligned addresses: no line split
      l1[u] = T::loadu(r1[ky] + x0 + u * L);
    }
    tap_row_aligned<T, U>(std::make_integer_sequence<int, KW>{}, wv + ky * KW, l0, l1, a0, a1);
  }
  finish_pair<T, U>(a0, a1, bias, lo, hi, y0, y1, x0, n);
}

template <int KH>
bool rows_aligned(const float* const* r0, const float* const* r1) {
  for (int ky = 0; ky < KH; ++ky) {
    if ((reinterpret_cast<uintptr_t>(r0[ky]) | reinterpret_cast<uintptr_t>(r1[ky])) % 64 != 0) return false;
  }
  return true;
}

template <class T, int KH, int KW, int S>
void rows2_s(const float* const* r0, const float* const* r1, const float* w, int sw, int dw, float bias, float lo,
             float hi, float* y0, float* y1, int64_t ow) {
  constexpr int L = T::kLanes;
  typename T::V wv[KH * KW];
  for (int t = 0; t < KH * KW; ++t) wv[t] = T::set1(w[t]);
  if constexpr (S == 1 && L == 16) {
    if (dw == 1 && rows_aligned<KH>(r0, r1)) {
      walk_pairs<L>(ow, [&](auto u, int64_t x, int64_t n) {
        step2_aligned<T, KH, KW, decltype(u)::value>(r0, r1, wv, bias, lo, hi, y0, y1, x, n);
      });
      return;
    }
  }
  walk_pairs<L>(ow, [&](auto u, int64_t x, int64_t n) {
    step2<T, KH, KW, S, decltype(u)::value>(r0, r1, wv, sw, dw, bias, lo, hi, y0, y1, x, n);
  });
}

template <class T, int KH, int KW>
bool rows2_k(const float* const* r0, const float* const* r1, const float* w, int sw, int dw, float bias, float lo,
             float hi, float* y0, float* y1, int64_t ow) {
  if (sw == 1) {
    rows2_s<T, KH, KW, 1>(r0, r1, w, sw, dw, bias, lo, hi, y0, y1, ow);
  } else if (sw == 2) {
    rows2_s<T, KH, KW, 2>(r0, r1, w, sw, dw, bias, lo, hi, y0, y1, ow);
  } else {
    return false;
  }
  return true;
}

// Stride 2, dilation 1, on split rows: every padded input row stored as its even columns
// E (from the row pointer) and its odd columns O (from + half), both 64-byte aligned, so
// that tap kx of output x reads E[x + kx/2] (kx even) or O[x + (kx − 1)/2] (kx odd). Per
// tap row the U + 1 aligned vectors of each half are loaded once and the KW tap vectors
// built by valignd, where step2 at S = 2 loads two vectors and permutes them for every tap
// (two loads and a vpermt2ps per fma: the loads bound it). The same values reach the same
// fma chains in the same order: the bytes of step2 at S = 2.
template <class T, int U, int KX>
__attribute__((always_inline)) inline void tap_split(typename T::V w, const typename T::V* e0, const typename T::V* o0,
                                                     const typename T::V* e1, const typename T::V* o1,
                                                     typename T::V* a0, typename T::V* a1) {
  constexpr int J = KX / 2;
  const typename T::V* s0 = KX % 2 == 0 ? e0 : o0;
  const typename T::V* s1 = KX % 2 == 0 ? e1 : o1;
  for (int u = 0; u < U; ++u) {
    if constexpr (J == 0) {
      a0[u] = T::fmadd(w, s0[u], a0[u]);
      a1[u] = T::fmadd(w, s1[u], a1[u]);
    } else {
      a0[u] = T::fmadd(w, T::template shift_concat<J>(s0[u], s0[u + 1]), a0[u]);
      a1[u] = T::fmadd(w, T::template shift_concat<J>(s1[u], s1[u + 1]), a1[u]);
    }
  }
}

template <class T, int U, int... KX>
__attribute__((always_inline)) inline void tap_row_split(std::integer_sequence<int, KX...>, const typename T::V* w,
                                                         const typename T::V* e0, const typename T::V* o0,
                                                         const typename T::V* e1, const typename T::V* o1,
                                                         typename T::V* a0, typename T::V* a1) {
  (tap_split<T, U, KX>(w[KX], e0, o0, e1, o1, a0, a1), ...);
}

template <class T, int KH, int KW, int U>
__attribute__((always_inline)) inline void step2_split(const float* const* r0, const float* const* r1, int64_t half,
                                                       const typename T::V* wv, float bias, float lo, float hi,
                                                       float* y0, float* y1, int64_t x0, int64_t n) {
  constexpr int L = T::kLanes;
  typename T::V a0[U], a1[U];
  for (int u = 0; u < U; ++u) a0[u] = a1[u] = T::zero();
  for (int ky = 0; ky < KH; ++ky) {
    typename T::V e0[U + 1], o0[U + 1], e1[U + 1], o1[U + 1];
    for (int u = 0; u <= U; ++u) {
      e0[u] = T::loadu(r0[ky] + x0 + u * L);  // aligned addresses: no line split
      o0[u] = T::loadu(r0[ky] + half + x0 + u * L);
      e1[u] = T::loadu(r1[ky] + x0 + u * L);
      o1[u] = T::loadu(r1[ky] + half + x0 + u * L);
    }
    tap_row_split<T, U>(std::make_integer_sequence<int, KW>{}, wv + ky * KW, e0, o0, e1, o1, a0, a1);
  }
  finish_pair<T, U>(a0, a1, bias, lo, hi, y0, y1, x0, n);
}

template <class T, int KH, int KW>
void rows2_split_k(const float* const* r0, const float* const* r1, int64_t half, const float* w, float bias, float lo,
                   float hi, float* y0, float* y1, int64_t ow) {
  constexpr int L = T::kLanes;
  typename T::V wv[KH * KW];
  for (int t = 0; t < KH * KW; ++t) wv[t] = T::set1(w[t]);
  walk_pairs<L>(ow, [&](auto u, int64_t x, int64_t n) {
    step2_split<T, KH, KW, decltype(u)::value>(r0, r1, half, wv, bias, lo, hi, y0, y1, x, n);
  });
}

// DwRows2SplitFn: 3x3 and 5x5 taps on split rows.
template <class T>
bool rows2_split(const float* const* r0, const float* const* r1, int64_t half, const float* w, int kh, int kw,
                 float bias, float lo, float hi, float* y0, float* y1, int64_t ow) {
  if (kh == 3 && kw == 3) {
    rows2_split_k<T, 3, 3>(r0, r1, half, w, bias, lo, hi, y0, y1, ow);
  } else if (kh == 5 && kw == 5) {
    rows2_split_k<T, 5, 5>(r0, r1, half, w, bias, lo, hi, y0, y1, ow);
  } else {
    return false;
  }
  return true;
}

// DwRows2Fn: the 3x3 and 5x5 taps at strides 1 and 2 (every depthwise layer of the zoo's
// MobileNet / PP-LCNet / EfficientNet blocks); false leaves the rows to row().
template <class T>
bool rows2(const float* const* r0, const float* const* r1, const float* w, int kh, int kw, int sw, int dw, float bias,
           float lo, float hi, float* y0, float* y1, int64_t ow) {
  if (kh == 3 && kw == 3) return rows2_k<T, 3, 3>(r0, r1, w, sw, dw, bias, lo, hi, y0, y1, ow);
  if (kh == 5 && kw == 5) return rows2_k<T, 5, 5>(r0, r1, w, sw, dw, bias, lo, hi, y0, y1, ow);
  return false;
}

}  // namespace
}  // namespace dw
}  // namespace sgemm
}  // namespace quanta
