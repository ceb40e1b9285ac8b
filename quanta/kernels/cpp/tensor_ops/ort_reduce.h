// ONNX Runtime's float32 ReduceSum / ReduceMean over the trailing axes, in its order.
//
// ORT's CPU kernel (reduction_ops.h FastReduceKR) sums each row [R, N] with Eigen's
// .sum() on a Map, which ORT's x86-64 build compiles for SSE (packets of 4 floats), then
// divides by f32(N) for the mean. A file ORT's quantizer wrote feeds such sums into
// DynamicQuantizeLinear, so their last bits choose codes; the session puts these kernels
// in place of ReduceSum / ReduceMean for such files (rule ReduceToOrtReduce). The order
// (docs/float-ops.md (ER1)-(ER4); twin reference/ort_float.py eigen_sum_rows):
//
//   (ER1) a0 = min((−d·N) mod 4, N): row d's elements before a 16-byte boundary of a
//         16-byte aligned buffer (ORT's arena and NumPy's feeds are)
//   (ER2) P_k = x[a0 + 4k ..], k < K = (N − a0) / 4; p0 = P_0, p1 = P_1, then p0 += P_2j,
//         p1 += P_2j+1 for j = 1 .. K/2 − 1; p0 += p1 (K >= 2); p0 += P_K−1 (K odd, >= 3)
//   (ER3) s = (p0[0] + p0[2]) + (p0[1] + p0[3]), then s += x[i] for i < a0, then for
//         i >= a0 + 4K, in increasing i
//   (ER4) K = 0: s = x[0] + x[1] + ... in order
//
// Every step is one float32 IEEE addition in this order, so the result is the same on
// every ISA; the rows split across threads (a row's a0 comes from its index, not from
// the address quanta's buffer has).
#pragma once

#include <cstdint>

namespace quanta {
namespace tensor_ops {

// y[d] = sum of row d of x [rows, n] by (ER1)-(ER4); with mean, f32(sum / f32(n)).
void ort_reduce_rows(const float* x, int64_t rows, int64_t n, bool mean, float* y, int num_threads);

}  // namespace tensor_ops
}  // namespace quanta
