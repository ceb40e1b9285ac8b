// TopK of float32 rows (ONNX TopK), the contract of kernels/reference/tensor_ops.py topk:
// for each row of n values, the k first of the row in this total order, in that order:
//
//   largest:  NaN before every number, then larger values first;
//   smallest: smaller values first, NaN after every number;
//   equal values (+0 and -0 are equal, NaN equals NaN) by ascending index.
//
// The reference's stable argsort orders a row the same way, so the values and indices are
// its bytes. One selection (std::nth_element) and a sort of the k selected per row: O(n)
// per row on average, where the reference sorts the whole row.
#pragma once

#include <cstdint>

namespace quanta {
namespace tensor_ops {

// x [rows, n] -> values [rows, k], indices [rows, k] (int64); 0 <= k <= n.
void topk_f32(const float* x, int64_t rows, int64_t n, int64_t k, bool largest, float* values, int64_t* indices,
              int num_threads);

}  // namespace tensor_ops
}  // namespace quanta
