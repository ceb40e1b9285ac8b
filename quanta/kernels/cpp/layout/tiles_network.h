// The 16-row byte transpose network of tiles_avx2.cc (I8x32) and tiles_avx512vnni.cc
// (I8x64), written once over the byte traits of simd.h. Four rounds of in-lane unpacks
// (epi8, epi16, epi32, epi64) of the rows a[0 .. 15]; emit(hhh, e0, e1) receives, for
// hhh = (h·2 + h2)·2 + h3 in 0 .. 7, in 128-bit lane L of e0 the 16 bytes of column
// 16L + j with j = 8h + 4h2 + 2h3 = 2·hhh, and of column 16L + j + 1 in e1. The loads
// (full or masked) and the stores stay in each file.
//
// Internal linkage, as in simd.h: the header is compiled into TUs built for different ISAs.
#pragma once

namespace quanta {
namespace layout {
namespace {  // NOLINT: see the header comment

template <class B, typename Emit>
__attribute__((always_inline)) inline void transpose_16_rows(typename B::V (&a)[16], Emit&& emit) {
  typename B::V b[16];
  // round 1: b[2k + h] holds (row 2k, row 2k+1) byte pairs of columns 8h .. 8h+7
#pragma GCC unroll 8
  for (int k = 0; k < 8; ++k) {
    b[2 * k] = B::unpacklo8(a[2 * k], a[2 * k + 1]);
    b[2 * k + 1] = B::unpackhi8(a[2 * k], a[2 * k + 1]);
  }
  // round 2: a[(m·2 + h)·2 + h2] holds rows 4m .. 4m+3 of columns 8h + 4h2 .. +3
#pragma GCC unroll 4
  for (int m = 0; m < 4; ++m) {
#pragma GCC unroll 2
    for (int h = 0; h < 2; ++h) {
      a[(m * 2 + h) * 2] = B::unpacklo16(b[2 * (2 * m) + h], b[2 * (2 * m + 1) + h]);
      a[(m * 2 + h) * 2 + 1] = B::unpackhi16(b[2 * (2 * m) + h], b[2 * (2 * m + 1) + h]);
    }
  }
  // round 3: b[((q·2 + h)·2 + h2)·2 + h3] holds rows 8q .. 8q+7 of columns 8h + 4h2 + 2h3 .. +1
#pragma GCC unroll 2
  for (int q = 0; q < 2; ++q) {
#pragma GCC unroll 4
    for (int hh = 0; hh < 4; ++hh) {  // hh = h·2 + h2
      const typename B::V lo = a[((2 * q) * 2) * 2 + hh];
      const typename B::V hi = a[((2 * q + 1) * 2) * 2 + hh];
      b[(q * 4 + hh) * 2] = B::unpacklo32(lo, hi);
      b[(q * 4 + hh) * 2 + 1] = B::unpackhi32(lo, hi);
    }
  }
  // round 4: columns 2·hhh and 2·hhh + 1 (of each 16-column lane), rows 0 .. 15
#pragma GCC unroll 8
  for (int hhh = 0; hhh < 8; ++hhh) {
    emit(hhh, B::unpacklo64(b[hhh], b[8 + hhh]), B::unpackhi64(b[hhh], b[8 + hhh]));
  }
}

}  // namespace
}  // namespace layout
}  // namespace quanta
