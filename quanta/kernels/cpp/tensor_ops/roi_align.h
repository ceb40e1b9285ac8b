// RoiAlign, float32 (ONNX RoiAlign, avg or max): the contract of
// kernels/reference/roi_align.py, eqs. (RA1)-(RA4) of docs/float-ops.md (ONNX Runtime's
// algorithm, which ONNX's reference copies), one float32 operation per step in that order,
// so the bytes are the twin's.
#pragma once

#include <cstdint>

namespace quanta {
namespace tensor_ops {

// x [n, c, h, w], rois [r, 4] (x1, y1, x2, y2), batch [r] in [0, n) -> y [r, c, ph, pw].
void roi_align_f32(const float* x, int64_t n, int64_t c, int64_t h, int64_t w, const float* rois, const int64_t* batch,
                   int64_t r, int64_t ph, int64_t pw, int64_t sampling_ratio, float spatial_scale, bool half_pixel,
                   bool max_mode, float* y, int num_threads);

}  // namespace tensor_ops
}  // namespace quanta
