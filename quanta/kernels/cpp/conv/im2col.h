// The im2col row walk (contract in kernels.h), shared by im2col.cc (memset / memcpy) and
// im2col_avx512vnni.cc (64-byte vector moves with a masked tail). `Bytes` moves the
// bytes: pad(d, n) writes n padding bytes (zx'), zero(d, n) n zeros, copy(d, s, n) n
// bytes of the input; each instantiation lives in its ISA's translation unit.
#pragma once

#include <cstdint>

#include "conv/kernels.h"

namespace quanta {
namespace conv {

template <class Bytes>
inline void im2col_nhwc_rows(const uint8_t* xt, int64_t xt_stride, const Geometry& geo, int64_t Cg, int64_t g,
                             int64_t r0, int64_t r1, int64_t Kp, uint8_t* dst, const Bytes& bytes) {
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
        bytes.pad(d, geo.kw * Cg);
        d += geo.kw * Cg;
        continue;
      }
      const uint8_t* row = xt + ((n * geo.H + iy) * geo.W) * xt_stride + g * Cg;
      if (whole_rows && ix0 >= 0 && ix0 + geo.kw <= geo.W) {
        bytes.copy(d, row + ix0 * xt_stride, geo.kw * Cg);
        d += geo.kw * Cg;
        continue;
      }
      for (int64_t kx = 0; kx < geo.kw; ++kx) {
        const int64_t ix = ix0 + kx * geo.dw;
        if (ix < 0 || ix >= geo.W) {
          bytes.pad(d, Cg);
        } else {
          bytes.copy(d, row + ix * xt_stride, Cg);
        }
        d += Cg;
      }
    }
    if (Kp > K) bytes.zero(d, Kp - K);
  }
}

}  // namespace conv
}  // namespace quanta
