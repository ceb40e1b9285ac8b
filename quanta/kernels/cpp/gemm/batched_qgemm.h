// batched_qgemm: a batch of int8 GEMMs whose weights are activations (attention scores
// Q·Kᵀ and context P·V), on the qgemm core (qgemm/qgemm.h).
//
// For every batch index i < batch, with the qgemm contract (eq. (4), output stages of
// qgemm.h) and the same zero points / multipliers for every batch matrix:
//
//   y[i] = output_stage(Σ_k (x[i][m,k] − zx)·(w[i][k,n] − zw[n]) + bias[n])
//
// Operands are strided views, so the Transpose/broadcast views of a graph cost no copy:
//   x[i][m,k] = x_base[i·x_batch_stride + m·x_row_stride + k]          (unit k stride)
//   w[i][k,n] = w_base[i·w_batch_stride + k·w_k_stride + n·w_n_stride] (any strides,
//               0 for a broadcast batch, negative for a flipped view)
//   y[i][m,n] = y_base[i·y_batch_stride + m·y_row_stride + n]
// Strides are in elements.
//
// Per batch matrix w[i] is packed into a per-thread scratch PackedWeights (the layout and
// column sums of qgemm.h, identical bytes to qgemm::pack_weights on the contiguous copy),
// then multiplied by qgemm. Cost of packing: K·N per matrix against M·K·N multiply-adds.
//
// Threads: with batch >= num_threads > 1 the batch matrices are claimed by the threads of
// the qgemm pool, each running a one-thread qgemm on its own scratch; otherwise the batch
// runs in order and each qgemm uses num_threads. Each output element is computed by the
// same code either way (qgemm's own guarantee), so the bytes are identical for any
// num_threads.
//
// Buffers: the caller owns x, w, y and the parameter arrays (read during the call); the
// BatchedScratch (one call at a time) owns the packed panels and the qgemm workspaces and
// only grows.
#pragma once

#include <cstdint>
#include <vector>

#include "qgemm/qgemm.h"

namespace quanta {
namespace gemm {

// Packs w[k,n] = w_base[k·k_stride + n·n_stride] (int8, or uint8 when w_unsigned) for
// `isa` into pw, reusing pw's buffers when they are large enough. zero_point: N values, or
// 1 when zero_point_per_channel is false (ranges checked by the caller).
void pack_weights_strided(const void* w_base, bool w_unsigned, int64_t K, int64_t N, int64_t k_stride, int64_t n_stride,
                          const int32_t* zero_point, bool zero_point_per_channel, Isa isa, qgemm::PackedWeights& pw);

// The layout fields pack_weights_strided gives a PackedWeights for these arguments, with
// no buffers: what qgemm_workspace_bytes reads of it.
qgemm::PackedWeights packed_layout(Isa isa, int64_t K, int64_t N, bool w_unsigned, bool has_zero_point);

// Grows pw's buffers to what pack_weights_strided needs for (isa, K, N), so that a later
// call of that size allocates nothing (a workspace reserved ahead of the hot path).
void reserve_packed_weights(qgemm::PackedWeights& pw, Isa isa, int64_t K, int64_t N);

class BatchedScratch {
 public:
  struct Slot {
    qgemm::PackedWeights packed;
    qgemm::Workspace workspace;
  };
  Slot& slot(int thread);  // slots exist for thread < reserved()
  void reserve(int threads);
  int reserved() const { return static_cast<int>(slots_.size()); }

 private:
  std::vector<Slot> slots_;
};

struct BatchedParams {
  int64_t batch = 0;
  // M, x (batch 0), x_row_stride, x_signed, zx, the output stage, y (batch 0),
  // y_row_stride and num_threads as in qgemm.h; `w` and `zx_per_row` are not used.
  qgemm::QGemmParams gemm;
  int64_t x_batch_stride = 0;
  const void* w = nullptr;  // w_base
  bool w_unsigned = false;
  int64_t K = 0, N = 0;
  int64_t w_batch_stride = 0, w_k_stride = 0, w_n_stride = 0;
  const int32_t* zw = nullptr;  // N values, or 1
  bool zw_per_channel = false;
  int64_t y_batch_stride = 0;
  Isa isa = Isa::kPortable;
};

void batched_qgemm(const BatchedParams& p, BatchedScratch& scratch);

}  // namespace gemm
}  // namespace quanta
