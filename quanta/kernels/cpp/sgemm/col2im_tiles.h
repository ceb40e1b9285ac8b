// ConvTranspose's col2im when the windows do not overlap (kernel = stride, dilation 1:
// the 2x2 stride-2 upsampling of DB text-detection heads and U-Net decoders). Every
// canvas position (cy, cx) then takes exactly one column value, the one of
// (ky, kx) = (cy mod sh, cx mod sw) at (iy, ix) = (cy div sh, cx div sw), so the scatter
// is an interleave of the kh·kw column planes:
//
//   y[p][oy][ox] = clamp((+0 + cols[p][ky][kx][iy][ix]) + bias[p mod m], lo, hi)
//
// and (+0 + bias) clamped where the crop reads outside the canvas: per element the chain
// of sgemm::col2im (sgemm.h) with its one contribution, so the same bytes (a −0 column
// value becomes +0 there too). The AVX2 rows interleave kw = 2 eight column values at a
// time; other widths and ISAs run the scalar rows.
#pragma once

#include <cstdint>

#include "dispatch.h"

namespace quanta {
namespace sgemm {

// Whether col2im's geometry is non-overlapping windows (col2im_tiles applies).
inline bool col2im_tiles_apply(int64_t kh, int64_t kw, int64_t sh, int64_t sw, int64_t dh, int64_t dw) {
  return kh == sh && kw == sw && dh == 1 && dw == 1;
}

// sgemm::col2im's arguments (dilations 1, strides = kernel) and the ISA of the rows.
void col2im_tiles(const float* cols, int64_t planes, int64_t m, int64_t kh, int64_t kw, int64_t h, int64_t w,
                  int64_t bt, int64_t bl, int64_t oh, int64_t ow, const float* bias, float lo, float hi, float* y,
                  int num_threads, Isa isa);

// The AVX2 interleave of two column rows: out[2i] = f(s0[i]), out[2i + 1] = f(s1[i]) for
// i < n, f(v) = clamp((+0 + v) + b, lo, hi).
void interleave2_avx2(const float* s0, const float* s1, int64_t n, float b, float lo, float hi, float* out);

}  // namespace sgemm
}  // namespace quanta
