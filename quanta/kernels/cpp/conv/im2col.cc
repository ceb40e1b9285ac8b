// im2col for the gemm path (contract in kernels.h): NHWC rows [ky][kx][c] of the input
// patches of consecutive output pixels, padding with zx' (the quantized real 0), K padded
// with zeros to Kp (the packed weights hold zw in those rows, so they contribute 0).
//
// In NHWC one kernel row of a patch is contiguous when dw = 1 and G = 1: one memcpy of
// kw·C bytes per (pixel, ky) inside the image; otherwise one copy of Cg bytes per tap.
#include <cstring>

#include "conv/kernels.h"

namespace quanta {
namespace conv {

void im2col_nhwc(const uint8_t* xt, int64_t xt_stride, const Geometry& geo, int64_t Cg, int64_t g, int64_t r0,
                 int64_t r1, uint8_t pad_value, int64_t Kp, uint8_t* dst) {
  const int64_t ohw = geo.OH * geo.OW;
  const int64_t K = geo.kh * geo.kw * Cg;
  const bool whole_rows = geo.dw == 1 && Cg == xt_stride;
  // (n, oy, ox) of row r0, then stepped: no division per row
  int64_t n = r0 / ohw, oy = (r0 % ohw) / geo.OW, ox = (r0 % ohw) % geo.OW;
  for (int64_t r = r0; r < r1; ++r, ++ox) {
    if (ox == geo.OW) {
      ox = 0;
      if (++oy == geo.OH) {
        oy = 0;
        ++n;
      }
    }
    uint8_t* d = dst + (r - r0) * Kp;
    const int64_t ix0 = ox * geo.sw - geo.pad_left;
    for (int64_t ky = 0; ky < geo.kh; ++ky) {
      const int64_t iy = oy * geo.sh - geo.pad_top + ky * geo.dh;
      if (iy < 0 || iy >= geo.H) {
        std::memset(d, pad_value, static_cast<size_t>(geo.kw * Cg));
        d += geo.kw * Cg;
        continue;
      }
      const uint8_t* row = xt + ((n * geo.H + iy) * geo.W) * xt_stride + g * Cg;
      if (whole_rows && ix0 >= 0 && ix0 + geo.kw <= geo.W) {
        std::memcpy(d, row + ix0 * xt_stride, static_cast<size_t>(geo.kw * Cg));
        d += geo.kw * Cg;
        continue;
      }
      for (int64_t kx = 0; kx < geo.kw; ++kx) {
        const int64_t ix = ix0 + kx * geo.dw;
        if (ix < 0 || ix >= geo.W) {
          std::memset(d, pad_value, static_cast<size_t>(Cg));
        } else {
          std::memcpy(d, row + ix * xt_stride, static_cast<size_t>(Cg));
        }
        d += Cg;
      }
    }
    if (Kp > K) std::memset(d, 0, static_cast<size_t>(Kp - K));
  }
}

}  // namespace conv
}  // namespace quanta
