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

// ONNX Runtime's float32 GlobalAveragePool of one (n, c) row [n] as MLAS computes it
// (pooling.cpp MlasPoolGlobalKernel, SSE vectors of 4 on x86-64; docs/float-ops.md
// (GP1)-(GP3); twin reference/ort_float.py mlas_global_average_rows):
//
//   (GP1) lane j (0 <= j < 4) starts at +0 and adds x[4k + j], k = 0 .. n div 4 − 1, in order
//   (GP2) s = f32(f32(l0 + l2) + f32(l1 + l3)), then s += x[i] for i = 4·(n div 4) .. n − 1
//   (GP3) y = f32(s / f32(n))
//
// Every step is one float32 IEEE addition in this order (no FMA, no reassociation), so the
// result is the same on every ISA and for every split of the rows across threads; n = 0
// gives NaN (0 / 0), as the twin.
void mlas_global_average_rows(const float* x, int64_t rows, int64_t n, float* y, int num_threads);

}  // namespace tensor_ops
}  // namespace quanta
