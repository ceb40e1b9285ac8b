// NumPy broadcasting of a binary elementwise op as an odometer over outer dimensions
// around one inner run: shared by the integer (elementwise/) and float (float_ops/)
// families. Header-only; no allocation (plans live on the stack).
//
// Shape: dimensions already aligned to the output's rank; each input dimension is 1 or
// the output's. make_plan drops size-1 output dimensions and merges neighbours that both
// inputs walk contiguously (or both repeat), so the inner run is as long as the memory
// allows; for_each_run(begin, end) calls run(a, a_step, b, b_step, c, len) over the flat
// output positions [begin, end) with a_step / b_step 1 (stepping) or 0 (repeating), so a
// thread can take any contiguous range of the output.
#pragma once

#include <algorithm>
#include <cstdint>

namespace quanta {
namespace broadcast {

constexpr int kMaxRank = 16;

struct Shape {
  int rank;
  const int64_t* out_shape;  // [rank]
  const int64_t* a_shape;    // [rank], each 1 or out_shape[d]
  const int64_t* b_shape;
};

struct Plan {
  int rank = 0;  // outer dimensions
  int64_t n[kMaxRank];
  int64_t as[kMaxRank], bs[kMaxRank];  // element strides (0: broadcast)
  int64_t inner = 1;
  int64_t a_step = 0, b_step = 0;  // 1 or 0 within the inner run
  int64_t outer = 1;
  int64_t total() const { return outer * inner; }
};

// True when some output dimension is 0 (nothing to compute).
inline bool empty(const Shape& s) {
  for (int d = 0; d < s.rank; ++d) {
    if (s.out_shape[d] == 0) return true;
  }
  return false;
}

inline Plan make_plan(const Shape& s) {
  int64_t n[kMaxRank], as[kMaxRank], bs[kMaxRank];
  int kept = 0;
  int64_t a_acc = 1, b_acc = 1;  // contiguous strides, innermost first
  int64_t a_str[kMaxRank], b_str[kMaxRank];
  for (int d = s.rank - 1; d >= 0; --d) {
    a_str[d] = s.a_shape[d] == 1 ? 0 : a_acc;
    b_str[d] = s.b_shape[d] == 1 ? 0 : b_acc;
    a_acc *= s.a_shape[d];
    b_acc *= s.b_shape[d];
  }
  for (int d = 0; d < s.rank; ++d) {
    if (s.out_shape[d] == 1) continue;
    // Merge into the previous kept dimension when both inputs continue it contiguously
    // (or both keep repeating): the pair then walks memory as one dimension.
    if (kept > 0 && as[kept - 1] == a_str[d] * s.out_shape[d] && bs[kept - 1] == b_str[d] * s.out_shape[d]) {
      n[kept - 1] *= s.out_shape[d];
      as[kept - 1] = a_str[d];
      bs[kept - 1] = b_str[d];
      continue;
    }
    n[kept] = s.out_shape[d];
    as[kept] = a_str[d];
    bs[kept] = b_str[d];
    ++kept;
  }
  Plan p;
  if (kept == 0) return p;  // one element
  p.inner = n[kept - 1];
  p.a_step = as[kept - 1];
  p.b_step = bs[kept - 1];
  p.rank = kept - 1;
  for (int d = 0; d < p.rank; ++d) {
    p.n[d] = n[d];
    p.as[d] = as[d];
    p.bs[d] = bs[d];
    p.outer *= n[d];
  }
  return p;
}

// run(a, a_step, b, b_step, c, len) over the flat output positions [begin, end).
template <typename T, typename Run>
void for_each_run(const T* a, const T* b, T* c, const Plan& p, int64_t begin, int64_t end, Run&& run) {
  int64_t o = begin / p.inner;
  int64_t i0 = begin - o * p.inner;
  int64_t idx[kMaxRank];
  int64_t a_off = 0, b_off = 0;
  for (int d = p.rank - 1; d >= 0; --d) {
    idx[d] = o % p.n[d];
    o /= p.n[d];
    a_off += idx[d] * p.as[d];
    b_off += idx[d] * p.bs[d];
  }
  int64_t pos = begin;
  while (pos < end) {
    const int64_t len = std::min(end - pos, p.inner - i0);
    run(a + a_off + i0 * p.a_step, p.a_step, b + b_off + i0 * p.b_step, p.b_step, c + pos, len);
    pos += len;
    i0 = 0;
    for (int d = p.rank - 1; d >= 0; --d) {  // odometer step over the outer dimensions
      ++idx[d];
      a_off += p.as[d];
      b_off += p.bs[d];
      if (idx[d] < p.n[d]) break;
      a_off -= idx[d] * p.as[d];
      b_off -= idx[d] * p.bs[d];
      idx[d] = 0;
    }
  }
}

}  // namespace broadcast
}  // namespace quanta
