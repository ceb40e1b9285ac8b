// GatherElements (ONNX), any element type of 1, 2, 4 or 8 bytes:
//
//   y[i_0, .., i_{r-1}] = data[i_0, .., idx[i_0, .., i_{r-1}], .., i_{r-1}]   (at `axis`)
//
// with idx in [-data.shape[axis], data.shape[axis]) (the binding checks them), a negative
// one counting from the end, as the twin's _indices wraps them. indices.shape may be smaller than
// data.shape on the other axes (those positions read data at the same coordinates).
// Moves bytes only: the twin's (np.take_along_axis) values.
#pragma once

#include <cstdint>
#include <vector>

namespace quanta {
namespace tensor_ops {

void gather_elements(const uint8_t* data, const std::vector<int64_t>& data_shape, const int64_t* idx,
                     const std::vector<int64_t>& idx_shape, int64_t axis, int64_t elem_bytes, uint8_t* y,
                     int num_threads);

}  // namespace tensor_ops
}  // namespace quanta
