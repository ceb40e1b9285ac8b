// Float MaxPool 2x2 stride 2 inside the plane (pool.h direct_max_pool windows: VGG-style
// downsampling, openWakeWord's embedding) on AVX2, without the direct form's row of window
// maxima and its strided reload: per 8 outputs the two input rows' 16 values, even and
// odd columns split by shuffles, then
//
//   y = nanmax(nanmax(x00, x01), nanmax(x10, x11))      nanmax(m, v) = (v > m or v is NaN) ? v : m
//
// the generic loops' taps in (ky, kx) order, so the same element (of equal values the
// earlier, of NaNs the last) as every other form; tail outputs scalar in that order.
#pragma once

#include <cstdint>

#include "pool/pool.h"

namespace quanta {
namespace pool {

// Whether max_plane_2x2s2_avx2 takes g's windows.
inline bool max_pool_2x2s2(const Geometry2d& g) {
  return g.k_h == 2 && g.k_w == 2 && g.s_h == 2 && g.s_w == 2 && direct_max_pool(g);
}

void max_plane_2x2s2_avx2(const float* x, float* y, const Geometry2d& g);

}  // namespace pool
}  // namespace quanta
