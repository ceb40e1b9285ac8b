// The per-row zero-point fold of the int8 GEMM epilogues (the vector form of the first
// steps of finish_element, kernel.h), written once over the integer traits of simd.h
// (I32x8 in qgemm_avx2.cc, I32x16 in qgemm_avx512vnni.cc) for the two accumulator vectors
// of a tile row, columns n0 .. n0 + 2·kLanes − 1: v −= zw'[n]·rowsum[m] (when zw),
// v −= cs[n]·zx'[m] (when zx_row), v += rowterm[m] (when rowterm). int32 arithmetic
// wraps, so the order of the terms does not change the bits.
//
// Internal linkage, as in simd.h: the header is compiled into TUs built for different ISAs.
#pragma once

#include <cstdint>

#include "qgemm/kernel.h"

namespace quanta {
namespace qgemm {
namespace {  // NOLINT: see the header comment

// zw'[n] and cs[n] of the tile's columns (two vectors each), loaded once per tile; 0
// where the epilogue does not use them.
template <class I>
__attribute__((always_inline)) inline void fold_columns(const Epilogue& e, int64_t n0, typename I::V (&zw)[2],
                                                        typename I::V (&cs)[2]) {
  zw[0] = zw[1] = cs[0] = cs[1] = I::zero();
  if (e.zw) {
    zw[0] = I::loadu(e.zw + n0);
    zw[1] = I::loadu(e.zw + n0 + I::kLanes);
  }
  if (e.zx_row) {
    cs[0] = I::loadu(e.cs + n0);
    cs[1] = I::loadu(e.cs + n0 + I::kLanes);
  }
}

// The terms of row m folded into its two vectors v0, v1.
template <class I>
__attribute__((always_inline)) inline void fold_row(typename I::V& v0, typename I::V& v1, const Epilogue& e, int64_t m,
                                                    const typename I::V (&zw)[2], const typename I::V (&cs)[2]) {
  using V = typename I::V;
  if (e.zw) {
    const V rs = I::set1(e.rowsum[m]);
    v0 = I::sub(v0, I::mullo(zw[0], rs));
    v1 = I::sub(v1, I::mullo(zw[1], rs));
  }
  if (e.zx_row) {
    const V zr = I::set1(e.zx_row[m]);
    v0 = I::sub(v0, I::mullo(cs[0], zr));
    v1 = I::sub(v1, I::mullo(cs[1], zr));
  }
  if (e.rowterm) {
    const V rt = I::set1(e.rowterm[m]);
    v0 = I::add(v0, rt);
    v1 = I::add(v1, rt);
  }
}

}  // namespace
}  // namespace qgemm
}  // namespace quanta
