// The 2-D pooling geometry the pooling bindings check (bindings_elementwise.cc: NCHW
// uint8/int8; bindings_pool.cc: float32 NCHW and uint8/int8 channels-last).
#pragma once

#include <array>
#include <cstdint>
#include <string>

#include "bindings.h"
#include "pool/pool.h"

namespace quanta {

using PoolPair = std::array<int64_t, 2>;

// x [N, C, H, W] (or [N, H, W, C] when channels_last) and the window attributes checked,
// as pool::Geometry2d (planes: N·C, or N for channels-last). Every window must start
// inside the input or its begin padding (the ceil_mode rule), so that no index computed
// from the geometry is far outside the plane.
inline pool::Geometry2d pool_geometry_2d(const py::array& x, bool channels_last, const PoolPair& kernel,
                                         const PoolPair& strides, const PoolPair& dilations, const PoolPair& pads_begin,
                                         const PoolPair& out_hw, const std::string& op) {
  const int h_axis = channels_last ? 1 : 2;
  if (x.ndim() != 4) {
    throw py::value_error(op + ": x: expected rank 4 " + (channels_last ? "[N, H, W, C]" : "[N, C, H, W]") +
                          ", got shape " + shape_str(shape_of(x)));
  }
  for (int i = 0; i < 2; ++i) {
    if (kernel[i] < 1 || strides[i] < 1 || dilations[i] < 1) {
      throw py::value_error(op + ": expected kernel, strides and dilations >= 1");
    }
    if (pads_begin[i] < 0 || out_hw[i] < 0) throw py::value_error(op + ": expected pads and output sizes >= 0");
    const int64_t size = x.shape(h_axis + i);
    if (out_hw[i] > 0 && (out_hw[i] - 1) * strides[i] - pads_begin[i] >= size) {
      throw py::value_error(op + ": expected the last window to start inside the input on axis " +
                            std::to_string(h_axis + i));
    }
  }
  const int64_t planes = channels_last ? x.shape(0) : x.shape(0) * x.shape(1);
  return pool::Geometry2d{planes,       x.shape(h_axis), x.shape(h_axis + 1), out_hw[0],  out_hw[1],
                          kernel[0],    kernel[1],       strides[0],          strides[1], dilations[0],
                          dilations[1], pads_begin[0],   pads_begin[1]};
}

}  // namespace quanta
