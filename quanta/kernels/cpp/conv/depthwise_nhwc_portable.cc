// qconv_dwc_u8s8_s32_1c1__portable: the channels_last depthwise kernel in plain C++
// (contract in kernels.h "Depthwise, channels_last"): per output pixel, taps outer and
// channels inner (contiguous, so the compiler vectorises the channel loop), the sums in
// uint32 so that wrap-around is defined behaviour.
#include "conv/kernels.h"

namespace quanta {
namespace conv {

void depthwise_nhwc_portable(const DepthwiseNhwc& a) {
  const int64_t C = a.C;
  uint32_t* acc = reinterpret_cast<uint32_t*>(a.scratch);
  uint32_t* xsum = acc + C;
  const int8_t* w = reinterpret_cast<const int8_t*>(a.weights);  // [taps][C]
  const int ob = out_bytes(a.out_type);
  DepthwiseRows out;  // dw_store's output stage, one channel at a time
  out.out_type = a.out_type;
  out.zy = a.zy;
  out.lo_minus_zy = a.lo_minus_zy;
  out.hi_minus_zy = a.hi_minus_zy;
  for (int64_t o = 0; o < a.ow; ++o) {
    for (int64_t c = 0; c < C; ++c) acc[c] = xsum[c] = 0;
    for (int64_t t = 0; t < a.taps; ++t) {
      const uint8_t* x = a.ptrs[o * a.taps + t];
      const int8_t* wt = w + t * C;
      for (int64_t c = 0; c < C; ++c) {
        const uint32_t v = static_cast<uint8_t>(x[c] ^ a.flip);
        acc[c] += static_cast<uint32_t>(static_cast<int32_t>(v) * static_cast<int32_t>(wt[c]));
        xsum[c] += v;
      }
    }
    out.y = static_cast<uint8_t*>(a.y) + o * a.y_pixel_stride * ob;
    for (int64_t c = 0; c < C; ++c) {
      uint32_t v = acc[c] + static_cast<uint32_t>(a.colterm[c]);
      if (a.zw) v -= static_cast<uint32_t>(a.zw[c]) * xsum[c];
      if (a.out_type != OutType::kS32) out.multiplier = a.multiplier[c];
      dw_store(static_cast<int32_t>(v), out, c);
    }
  }
}

}  // namespace conv
}  // namespace quanta
