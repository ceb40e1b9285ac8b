// Float32 LSTM and GRU (ONNX ai.onnx ops), bit-exact with reference/rnn.py.
//
// ---------------------------------------------------------------------------------------
// Contract (docs/float-ops.md "LSTM and GRU", equations (RNN1)-(RNN9)). Every float
// operation is one float32 IEEE operation in the order written (-ffp-contract=off).
// ---------------------------------------------------------------------------------------
//
//   (RNN1) matrix products in a fixed order: for every output (m, n)
//          acc = +0;  acc = f32(acc + f32(a[m, k] · w[k, n])) for k = 0, 1, ..., K − 1
//          (w = the ONNX weight transposed, [K, N], prepacked once by the binder).
//          Vectorized over n (and blocked over m), never over k, so every ISA gives the
//          same bytes; no FMA.
//   The gates, the activations (sigmoid_f32, tanh_f32 of float_ops.h, (Σ1)-(Σ2),
//   (T1)-(T4)) and the state updates: docs/float-ops.md (RNN2)-(RNN9).
//
// seq_gemm is the small GEMM the recurrences need (y [M, N] = a [M, K] · w [K, N] by
// (RNN1)); it is where a float GEMM family with the same summation contract could later
// take over.
//
// Threads: a bidirectional node with num_threads >= 2 runs its directions on two pool
// threads; otherwise one thread. Each output is computed by the same instructions
// whichever thread runs it.
#pragma once

#include <cstdint>

#include "dispatch.h"

namespace quanta {
namespace recurrent {

// y[m, n] (row stride ldy) = (RNN1) over a [M, K] (row stride lda) and w [K, N] (row stride ldw).
using SeqGemmFn = void (*)(const float* a, int64_t lda, const float* w, int64_t ldw, float* y, int64_t ldy, int64_t M,
                           int64_t K, int64_t N);
SeqGemmFn seq_gemm_for(Isa isa);

struct FloatRnnParams {
  bool gru = false;
  int64_t T = 0, B = 0, I = 0, H = 0;
  int D = 1;
  bool reverse = false;
  const float* x = nullptr;          // [T, B, I]
  const float* w[2] = {nullptr, nullptr};  // per direction [I, G·H] (G = 4 LSTM, 3 GRU), gates in ONNX order
  const float* r[2] = {nullptr, nullptr};  // per direction [H, G·H]
  const float* bias = nullptr;       // [D, 2·G·H] (Wb then Rb), or null
  const float* peephole = nullptr;   // LSTM [D, 3H], or null
  const float* initial_h = nullptr;  // [D, B, H], or null
  const float* initial_c = nullptr;  // LSTM [D, B, H], or null
  const int32_t* lens = nullptr;     // [B] in [0, T], or null
  float clip = 0.0f;                 // > 0; FLT_MAX: none
  bool input_forget = false;         // LSTM
  bool linear_before_reset = false;  // GRU
  float* y = nullptr;                // [T, D, B, H]
  float* y_h = nullptr;              // [D, B, H]
  float* y_c = nullptr;              // LSTM [D, B, H], or null
  int num_threads = 1;
  Isa isa = Isa::kPortable;
};

void float_rnn(const FloatRnnParams& p);

}  // namespace recurrent
}  // namespace quanta
