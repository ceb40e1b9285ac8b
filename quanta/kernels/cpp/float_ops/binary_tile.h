// Binary ops of a short run against a repeated run: the blocked layout's per-channel
// operand (an SE gate [N, Cb, 1, 1, 16] times [N, Cb, H, W, 16]), where NumPy
// broadcasting leaves inner runs of 16 elements and the generic walk (float_ops.cc
// binary, broadcast.h) pays an odometer step and an indirect call per run.
//
//   c[r·inner + i] = a[r·as + i] op b[r·bs + i]      r < rows, i < inner
//
// with as, bs each inner (stepping) or 0 (the repeated run). Each element is the one IEEE
// operation of the generic walk (a + b, a − b, a · b, a / b), so the bytes are the same.
#pragma once

#include <cstdint>

#include "float_ops/float_ops.h"

namespace quanta {
namespace float_ops {

// The AVX2 rows of add / sub / mul / div (8 lanes, a scalar tail per row).
void binary_tile_rows_avx2(BinaryOp op, const float* a, int64_t as, const float* b, int64_t bs, float* c, int64_t rows,
                           int64_t inner);

}  // namespace float_ops
}  // namespace quanta
