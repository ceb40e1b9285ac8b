// Layout transposes, portable (contract in tiles.h): cache-blocked scalar loops. The
// gemm path uses them at the ONNX boundary (NCHW x -> NHWC rows, NHWC result -> NCHW y).
#include "layout/tiles.h"

namespace quanta {
namespace layout {
namespace {
constexpr int64_t kBlock = 32;  // 32 x 32 bytes (or 4 KiB of int32): both sides stay in L1
}  // namespace

void transpose_u8_portable(const uint8_t* src, int64_t src_stride, int64_t rows, int64_t cols, uint8_t* dst,
                           int64_t dst_stride, uint8_t flip) {
  for (int64_t j0 = 0; j0 < cols; j0 += kBlock) {
    const int64_t j1 = j0 + kBlock < cols ? j0 + kBlock : cols;
    for (int64_t i0 = 0; i0 < rows; i0 += kBlock) {
      const int64_t i1 = i0 + kBlock < rows ? i0 + kBlock : rows;
      for (int64_t j = j0; j < j1; ++j) {
        for (int64_t i = i0; i < i1; ++i) {
          dst[j * dst_stride + i] = static_cast<uint8_t>(src[i * src_stride + j] ^ flip);
        }
      }
    }
  }
}

void transpose_s32_portable(const int32_t* src, int64_t src_stride, int64_t rows, int64_t cols, int32_t* dst,
                            int64_t dst_stride) {
  for (int64_t j0 = 0; j0 < cols; j0 += kBlock) {
    const int64_t j1 = j0 + kBlock < cols ? j0 + kBlock : cols;
    for (int64_t i0 = 0; i0 < rows; i0 += kBlock) {
      const int64_t i1 = i0 + kBlock < rows ? i0 + kBlock : rows;
      for (int64_t j = j0; j < j1; ++j) {
        for (int64_t i = i0; i < i1; ++i) dst[j * dst_stride + i] = src[i * src_stride + j];
      }
    }
  }
}

TransposeU8Fn transpose_u8_for(Isa isa) {
  switch (isa) {
    case Isa::kAvx512Vnni: return transpose_u8_avx512vnni;
    case Isa::kAvx2: return transpose_u8_avx2;
    case Isa::kPortable: break;
  }
  return transpose_u8_portable;
}

TransposeS32Fn transpose_s32_for(Isa isa) {
  return isa == Isa::kPortable ? transpose_s32_portable : transpose_s32_avx2;
}

}  // namespace layout
}  // namespace quanta
