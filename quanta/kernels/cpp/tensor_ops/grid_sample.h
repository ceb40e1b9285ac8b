// GridSample over 2-D images, float32 (ONNX GridSample, linear or nearest, zeros or border
// padding): the contract of kernels/reference/grid_sample.py, eqs. (GS1)-(GS4) of
// docs/float-ops.md, one float32 operation per step in that order, so the bytes are the
// twin's.
#pragma once

#include <cstdint>

namespace quanta {
namespace tensor_ops {

// x [n, c, h, w], grid [n, p, 2] (normalized (x, y) per output position) -> y [n, c, p].
void grid_sample_f32(const float* x, const float* grid, int64_t n, int64_t c, int64_t h, int64_t w, int64_t p,
                     bool align_corners, bool nearest, bool border, float* y, int num_threads);

}  // namespace tensor_ops
}  // namespace quanta
