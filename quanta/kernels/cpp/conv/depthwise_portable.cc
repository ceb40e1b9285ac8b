// qconv_dw_u8s8_s32__portable: the depthwise kernel in plain C++ (contract in kernels.h),
// one output at a time over the same padded rows and folded terms as the SIMD kernels.
// Sums are uint32 so that wrap-around is defined behaviour.
#include "conv/kernels.h"

namespace quanta {
namespace conv {

void depthwise_rows_portable(const DepthwiseRows& a) {
  for (int64_t oy = 0; oy < a.rows; ++oy) {
    for (int64_t ox = 0; ox < a.ow; ++ox) {
      uint32_t acc = 0, xsum = 0;
      for (int64_t ky = 0; ky < a.kh; ++ky) {
        const uint8_t* row = a.in + (oy * a.sh + ky * a.dh) * a.in_stride + ox * a.sw;
        const int8_t* w = a.taps + ky * a.kw;
        for (int64_t kx = 0; kx < a.kw; ++kx) {
          const uint8_t v = row[kx * a.dw];
          acc += static_cast<uint32_t>(static_cast<int32_t>(v) * static_cast<int32_t>(w[kx]));
          xsum += v;
        }
      }
      acc += static_cast<uint32_t>(a.colterm) - static_cast<uint32_t>(a.zw) * xsum;
      dw_store(static_cast<int32_t>(acc), a, oy * a.y_stride + ox);
    }
  }
}

}  // namespace conv
}  // namespace quanta
