// ScatterElements' float32 reductions (twin: reference/tensor_ops.py scatter_elements,
// scatter_in_order; docs/float-ops.md (SC1)): y[p_i] = f32(y[p_i] op u_i) for
// i = 0, 1, … in order, op + or ·, so the updates of one position combine in the order
// of the indices (their C order), one float32 operation each. One thread: a split by i
// would reorder a position's updates, and a split by position needs them grouped first;
// a GNN's edge-to-node aggregation moves a few hundred thousand elements.
#pragma once

#include <cstdint>

namespace quanta {
namespace tensor_ops {

// positions are checked by the caller (every p_i in [0, size of y)).
inline void scatter_f32(float* y, const int64_t* positions, const float* updates, int64_t n, bool multiply) {
  if (multiply) {
    for (int64_t i = 0; i < n; ++i) y[positions[i]] = y[positions[i]] * updates[i];
  } else {
    for (int64_t i = 0; i < n; ++i) y[positions[i]] = y[positions[i]] + updates[i];
  }
}

}  // namespace tensor_ops
}  // namespace quanta
