// Float32 LSTM and GRU (ONNX ai.onnx ops), bit-exact with reference/rnn.py.
//
// ---------------------------------------------------------------------------------------
// Contract (docs/float-ops.md "LSTM and GRU", equations (RNN1)-(RNN9)). Every float
// operation is one float32 IEEE operation in the order written (-ffp-contract=off).
// ---------------------------------------------------------------------------------------
//
//   (RNN1) matrix products in a fixed order: for every output (m, n)
//          acc = +0;  acc = f32(acc + f32(a[m, k] · w[k, n])) for k = 0, 1, ..., K − 1
//          (w = the ONNX weight transposed, [K, N], prepacked once by the binder in
//          kSeqPanel-column panels).
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
// threads; otherwise a direction's input projection (X·Wᵀ of every step, at least
// kSplitMacs multiply-adds) splits its rows over num_threads, and a recurrence step of
// kTeamMacs or more runs on two threads (float_rnn.cc StepTeam: the step's products by
// column panels, its gates by rows; OrtGRU's recurrence on one). Each output is computed
// by the same instructions whichever thread runs it.
#pragma once

#include <cstdint>

#include "dispatch.h"

namespace quanta {
namespace recurrent {

// Columns per weight panel: seq_gemm's w [K, N] is stored panel by panel, panel q =
// columns [q·kSeqPanel, (q + 1)·kSeqPanel) as [K][kSeqPanel] contiguous, zero-padded past N
// (ceil(N / kSeqPanel)·K·kSeqPanel floats). A panel (K·512 bytes) stays in the cache while
// the row blocks pass over it, and the k steps read consecutive bytes (the prefetcher's
// pattern): with the plain [K, N] layout an H = 512 LSTM ran at 4 GMAC/s, out of L2.
constexpr int64_t kSeqPanel = 128;

// y[m, n] (row stride ldy) = (RNN1) over a [M, K] (row stride lda) and the panels of w [K, N].
using SeqGemmFn = void (*)(const float* a, int64_t lda, const float* w, int64_t K, int64_t N, float* y, int64_t ldy,
                           int64_t M);
SeqGemmFn seq_gemm_for(Isa isa);

// Columns per weight strip: the same w [K, N] as strips of kSeqStrip columns, strip s =
// columns [s·kSeqStrip, (s + 1)·kSeqStrip) as [K][kSeqStrip] contiguous, zero-padded past
// N; the block starting at a column c that is a multiple of kSeqStrip starts at w + c·K,
// as in the panels. A six-row block reads one contiguous stream (one 64-column half of
// a panel is a strided one): float_rnn.cc repacks a long batch-6+ LSTM recurrence's R so
// (docs/float-ops.md "LSTM and GRU").
constexpr int64_t kSeqStrip = 64;

// seq_gemm on strips: the (RNN1) chains of seq_gemm, the bytes of seq_gemm; null on an
// ISA without a strips kernel (AVX2, portable: the panels only).
SeqGemmFn seq_gemm_strips_for(Isa isa);

// OrtLSTM's products (docs/float-ops.md (RNN-ORT)), as ONNX Runtime's MLAS float GEMM
// forms them on prepacked weights: per block of kMlasStrideK k, one fused multiply-add
// chain from +0 in increasing k, added to y (accumulate, or from the second block on) or
// stored (the first block otherwise) with one float32 addition. Same panels as seq_gemm.
constexpr int64_t kMlasStrideK = 256;
using SeqGemmMlasFn = void (*)(const float* a, int64_t lda, const float* w, int64_t K, int64_t N, float* y, int64_t ldy,
                               int64_t M, bool accumulate);
SeqGemmMlasFn seq_gemm_mlas_for(Isa isa);

// Columns per row strip: w [K, N] as strips of kSeqRowStrip columns, strip s = columns
// [s·kSeqRowStrip, (s + 1)·kSeqRowStrip) as [K][kSeqRowStrip] contiguous, zero-padded past
// N (the block at a column that is a multiple of kSeqRowStrip starts at w + c·K, as in the
// panels). float_rnn.cc repacks the recurrence weights of a batch-1 recurrence so: a step
// then reads them front to back, two strips at a time, where the panels' tiles read half
// rows of 512 bytes; on AVX2 an H = 400 GRU step's 1.9 MB took 42 us on the panels, 26 on
// strips (benchmarks/results/2026-12-06h-rnn16.md).
constexpr int64_t kSeqRowStrip = 32;

// seq_gemm (mlas false: (RNN1), accumulate ignored) or seq_gemm_mlas (mlas true:
// (RNN-ORT1)) on row strips, a row at a time: the chains and bytes of the panel kernels;
// null on an ISA without (AVX-512, portable: the panels only).
SeqGemmMlasFn seq_row_strips_for(Isa isa, bool mlas);

// Columns per input-weight strip: W [I, G·H] as strips of kSeqWStrip columns (the layout
// of kSeqRowStrip with 16), the binder's layout of W on an ISA with a strips projection
// (AVX2: seq_gemm_wstrips_for, blocks of six rows × one strip, each strip one
// contiguous stream).
constexpr int64_t kSeqWStrip = 16;

// The X·Wᵀ projection (mlas false: (RNN1), accumulate ignored; true: (RNN-ORT1)) on W in
// strips of kSeqWStrip columns, the chains and bytes of the panel kernels; null on an ISA
// without (AVX-512, portable: the panels only).
SeqGemmMlasFn seq_gemm_wstrips_for(Isa isa, bool mlas);

// The column blocks float_rnn takes W in on `isa` (kSeqWStrip where seq_gemm_wstrips_for
// has a kernel, else kSeqPanel); as R's below, the binder packs them once and float_rnn
// takes either layout on every ISA (FloatRnnParams::w_cols).
int64_t float_rnn_w_cols(Isa isa);

// The column blocks float_rnn takes R (and a GRU's R_h) in on `isa`: kSeqRowStrip where a
// batch-1 step runs on row strips (AVX2), so the binder packs them once per session and a
// call repacks nothing (ddddocr's T = 21 LSTM repacked 2 × 4 MB a call, ~2 steps' reads
// and writes); kSeqPanel elsewhere. float_rnn takes either layout on every ISA
// (FloatRnnParams::r_cols): a call whose path needs the other one repacks R for itself.
int64_t float_rnn_r_cols(Isa isa);

struct FloatRnnParams {
  bool gru = false;
  int64_t T = 0, B = 0, I = 0, H = 0;
  int D = 1;
  bool reverse = false;
  const float* x = nullptr;  // [T, B, I]
  // The ONNX W, R of each direction transposed, gates in ONNX order, in column blocks: W of
  // w_cols (kSeqPanel: panels; kSeqWStrip: strips), R and R_h of r_cols (kSeqPanel;
  // kSeqRowStrip: row strips)
  const float* w[2] = {nullptr, nullptr};    // [I, G·H] (G = 4 LSTM, 3 GRU)
  const float* r[2] = {nullptr, nullptr};    // LSTM [H, 4H]; GRU the z, r columns [H, 2H]
  const float* r_h[2] = {nullptr, nullptr};  // GRU the h columns [H, H]
  int64_t w_cols = kSeqPanel, r_cols = kSeqPanel;
  const float* bias = nullptr;       // [D, 2·G·H] (Wb then Rb), or null
  const float* peephole = nullptr;   // LSTM [D, 3H], or null
  const float* initial_h = nullptr;  // [D, B, H], or null
  const float* initial_c = nullptr;  // LSTM [D, B, H], or null
  const int32_t* lens = nullptr;     // [B] in [0, T], or null
  float clip = 0.0f;                 // > 0; FLT_MAX: none
  bool input_forget = false;         // LSTM
  bool linear_before_reset = false;  // GRU
  // ONNX Runtime's float LSTM (quanta::OrtLSTM, (RNN-ORT)): products by seq_gemm_mlas
  // (H·Rᵀ added onto the step's X·Wᵀ row), gates by mlas_logistic / mlas_tanh; with gru,
  // its float GRU (quanta::OrtGRU, (RNN-ORT-GRU)): the same products, z by mlas_logistic,
  // r and the candidate by ORT's own rational sigmoid / tanh.
  bool ort = false;
  float* y = nullptr;    // [T, D, B, H]
  float* y_h = nullptr;  // [D, B, H]
  float* y_c = nullptr;  // LSTM [D, B, H], or null
  int num_threads = 1;
  Isa isa = Isa::kPortable;
};

void float_rnn(const FloatRnnParams& p);

// quanta::LSTMGates (reference/rnn.py lstm_gates, docs/float-ops.md (LG1)-(LG2)): the
// elementwise half of an exported LSTM cell. gates [B, 4H] (row stride 4H), chunk order[k]
// holding gate k of (i, f, g, o); c [B, H] -> h_out, c_out [B, H]:
//   i = σ(a_i), f = σ(a_f), g = tanh(a_g), o = σ(a_o)   (sigmoid_f32, tanh_f32 of the ISA)
//   c' = f32(f32(f · c) + f32(i · g)),  h' = f32(o · tanh(c'))
void lstm_gates(const float* gates, const float* c, float* h_out, float* c_out, int64_t B, int64_t H,
                const int order[4], Isa isa);

// quanta::GRUGates (reference/rnn.py gru_gates, docs/float-ops.md (GG1)-(GG3)): the
// elementwise half of an exported GRU cell (torch's GRUCell). gx, gh [B, 3H] (row stride
// 3H) the input's and the state's products, chunk order[k] holding gate k of (r, z, n) in
// both; h [B, H] -> h_out [B, H]:
//   r = σ(f32(gh_r + gx_r)),  z = σ(f32(gh_z + gx_z)),  n = tanh(f32(gx_n + f32(r · gh_n)))
//   h' = f32(f32(f32(h − n) · z) + n)                   (sigmoid_f32, tanh_f32 of the ISA)
void gru_gates(const float* gx, const float* gh, const float* h, float* h_out, int64_t B, int64_t H, const int order[3],
               Isa isa);

}  // namespace recurrent
}  // namespace quanta
