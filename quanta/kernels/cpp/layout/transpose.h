// Batched 2-D transpose of fixed-size elements: the data movement behind ONNX Transpose
// for the permutations a compiled model actually uses (NCHW <-> NHWC at the edges of a
// channels-last region, [0, 2, 1, 3] of attention heads).
//
// Contract: x is [B, R, C] elements of `elem_bytes` bytes each, C-contiguous; y is
// [B, C, R], C-contiguous; for every b, r, c: y[b, c, r] = x[b, r, c] (a byte copy, so
// bit-exact for every dtype). An ONNX perm reduces to this form when it keeps a leading
// group of axes, swaps two adjacent groups and keeps a trailing group (which becomes part
// of the element): see quanta/targets/native/layout.py.
//
// Blocking: 1-byte elements with >= 8 rows and 4-byte elements run the convolution
// paths' SIMD tile transposes (conv/kernels.h transpose_u8 / transpose_s32: 16 x 64 bytes
// through AVX-512 shuffles, 8 x 8 int32 through AVX2, portable loops otherwise) on units of
// whole source columns (each unit writes whole destination rows; ~64 KiB per unit): 6-16x
// the scalar tiles' ~2 GB/s for bytes. Other elements of 1, 2, 4 or 8 bytes: 16 x 16
// element tiles (both sides of a tile stay in L1); larger elements: a row-wise memcpy.
// One row or one column (R = 1 or C = 1): y's bytes are x's, one memcpy.
// Few columns of 4-byte elements (C in {2, 3, 4}: a 3-channel image going NCHW): each
// pixel's C values scattered into C output rows, row ranges split over the threads.
// Threads: units split over num_threads with the qgemm pool; every byte is written once,
// whatever the split. No allocation; x and y must not overlap.
//
// Few rows: 1-byte elements with R = rows in {2, 3, 4} (an image's channels going NHWC:
// 1x3x224x224 uint8) are an interleave of R rows into pixels of R bytes, which 16 x 16
// tiles would walk R rows at a time. They run column ranges instead (split over the
// threads): transpose_avx2.cc (vpshufb, 32 columns per step) on every ISA but portable,
// else a per-pixel loop over the R rows.
#pragma once

#include <cstddef>
#include <cstdint>

namespace quanta {
namespace layout {

void transpose_batched(const void* x, void* y, int64_t batch, int64_t rows, int64_t cols, int64_t elem_bytes,
                       int num_threads);

// Few rows (rows in {2, 3, 4}, 1-byte elements): y[c·rows + r] = x[r·cols + c] for columns
// c in [c0, c1) of one plane.
void interleave_rows_u8_portable(const uint8_t* x, int64_t rows, int64_t cols, uint8_t* y, int64_t c0, int64_t c1);
void interleave_rows_u8_avx2(const uint8_t* x, int64_t rows, int64_t cols, uint8_t* y, int64_t c0, int64_t c1);

}  // namespace layout
}  // namespace quanta
