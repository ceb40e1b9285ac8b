// Tile transposes of bytes and int32: the convolution paths' NCHW <-> NHWC moves
// (conv/), and the batched Transpose (transpose.h) for 1- and 4-byte elements.
#pragma once

#include <cstdint>

#include "dispatch.h"

namespace quanta {
namespace layout {

// ---------------------------------------------------------------------------------------
// Tile transposes (tiles.cc portable, tiles_avx2.cc, tiles_avx512vnni.cc; int32 has
// no AVX-512 variant: the avx512vnni ISA uses the AVX2 one).
//
// transpose_u8: dst[j·dst_stride + i] = src[i·src_stride + j] ^ flip, for i < rows,
//   j < cols (a rows x cols byte matrix becomes cols x rows).
// transpose_s32: the same for int32 elements (strides in elements), no flip.
// ---------------------------------------------------------------------------------------
using TransposeU8Fn = void (*)(const uint8_t* src, int64_t src_stride, int64_t rows, int64_t cols, uint8_t* dst,
                               int64_t dst_stride, uint8_t flip);
using TransposeS32Fn = void (*)(const int32_t* src, int64_t src_stride, int64_t rows, int64_t cols, int32_t* dst,
                                int64_t dst_stride);

void transpose_u8_portable(const uint8_t* src, int64_t src_stride, int64_t rows, int64_t cols, uint8_t* dst,
                           int64_t dst_stride, uint8_t flip);
void transpose_u8_avx2(const uint8_t* src, int64_t src_stride, int64_t rows, int64_t cols, uint8_t* dst,
                       int64_t dst_stride, uint8_t flip);
void transpose_u8_avx512vnni(const uint8_t* src, int64_t src_stride, int64_t rows, int64_t cols, uint8_t* dst,
                             int64_t dst_stride, uint8_t flip);
void transpose_s32_portable(const int32_t* src, int64_t src_stride, int64_t rows, int64_t cols, int32_t* dst,
                            int64_t dst_stride);
void transpose_s32_avx2(const int32_t* src, int64_t src_stride, int64_t rows, int64_t cols, int32_t* dst,
                        int64_t dst_stride);
// The ISA's variants (tiles.cc).
TransposeU8Fn transpose_u8_for(Isa isa);
TransposeS32Fn transpose_s32_for(Isa isa);

}  // namespace layout
}  // namespace quanta
