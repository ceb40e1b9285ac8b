// im2col for the gemm path (contract in kernels.h): NHWC rows [ky][kx][c] of the input
// patches of consecutive output pixels, padding with zx' (the quantized real 0), K padded
// with zeros to Kp (the packed weights hold zw in those rows, so they contribute 0).
//
// In NHWC one kernel row of a patch is contiguous when dw = 1 and G = 1: one memcpy of
// kw·C bytes per (pixel, ky) inside the image; otherwise one copy of Cg bytes per tap.
#include <cstring>

#include "conv/im2col.h"
#include "conv/kernels.h"

namespace quanta {
namespace conv {

namespace {

struct Bytes {
  uint8_t pad_value;
  void pad(uint8_t* d, int64_t n) const { std::memset(d, pad_value, static_cast<size_t>(n)); }
  void zero(uint8_t* d, int64_t n) const { std::memset(d, 0, static_cast<size_t>(n)); }
  void copy(uint8_t* d, const uint8_t* s, int64_t n) const { std::memcpy(d, s, static_cast<size_t>(n)); }
};

}  // namespace

void im2col_nhwc(const uint8_t* xt, int64_t xt_stride, const Geometry& geo, int64_t Cg, int64_t g, int64_t r0,
                 int64_t r1, uint8_t pad_value, int64_t Kp, uint8_t* dst) {
  im2col_nhwc_rows(xt, xt_stride, geo, Cg, g, r0, r1, Kp, dst, Bytes{pad_value});
}

}  // namespace conv
}  // namespace quanta
