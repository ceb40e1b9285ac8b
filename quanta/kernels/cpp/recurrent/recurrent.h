// recurrent: com.microsoft DynamicQuantizeLSTM (ONNX Runtime's CPU kernel, bit for bit).
//
// ---------------------------------------------------------------------------------------
// Contract (NumPy twin: quanta/kernels/reference/ms_lstm.py, whose module docstring
// numbers the steps (1)-(4); docs/kernels.md "Recurrent"). Every float operation is one
// float32 IEEE operation in the twin's order (-ffp-contract=off); the MLAS logistic and
// tanh's Horner steps are explicit fused multiply-adds (vfmadd on AVX2 / AVX-512,
// std::fma in the portable variant), as MLAS's FMA3 kernels compute them. Every ISA
// variant therefore gives the twin's bytes (NaN inputs aside: a NaN in a quantization
// block gives unspecified codes).
// ---------------------------------------------------------------------------------------
//
// Per direction d (reverse: d == 1 of a bidirectional node, or a reverse node), with
// L = max sequence_lens:
//   (1)+(2) X[:L] (all L·B rows, in time order) is ONE quantization block: q, s, z by (1),
//           then G = qgemm(q, W_d) with the kF32 output stage, multiplier[n] =
//           f32(s · w_scale[n]): G = f32(f32(acc) · m). The twin's reversed rows
//           (ReverseSequence) are the same rows in another order and the block's (lo, hi)
//           do not depend on the order, so step t of row b reads G's row
//           (t' = len[b] − 1 − t for t < len[b], else t, b) instead of a reversed copy.
//   (2) per step: the previous H [B, H] is one block; P = qgemm(qh, R_d) (kF32,
//       multiplier f32(s_h · r_scale[n])); the gate pre-activation is f32(P + G[t', b]).
//   (3) lstm_row below, for every row with t < len[b] (the others are skipped: their
//       gates are never read).
//   (4) as the twin: Y rows of ended steps are 0; h_prev is Y's row (0 for ended rows)
//       when Y is requested, else the running Y_h (ended rows keep their last h).
//
// Weights: prepacked once (qgemm::pack_weights, the qgemm layout of the ISA, with column
// sums and the scalar zero point ORT reads); the ISA of the packed W is the ISA of the
// whole kernel (the elementwise steps below use the same variant).
//
// Threads: a bidirectional node with num_threads >= 2 runs its two directions on two
// threads, each with one-thread GEMMs; otherwise the input GEMM uses num_threads and the
// per-step GEMM uses them when it is large enough (K·N >= kStepThreadMacs). Every output
// element is computed by the same instructions whichever thread runs it, so the bytes
// are identical for any num_threads.
#pragma once

#include <cstdint>

#include "dispatch.h"
#include "qgemm/qgemm.h"

namespace quanta {
namespace recurrent {

// Per-step GEMMs below this many multiply-adds run on one thread (a pool wake-up costs
// more than it saves there).
constexpr int64_t kStepThreadMacs = int64_t{1} << 18;

// The elementwise steps of one ISA.
struct Kernels {
  // lo = min(0, min x), hi = max(0, max x) over n >= 1 values (step (1)).
  void (*min_max)(const float* x, int64_t n, float* lo, float* hi);
  // q[i] = clamp(rne(f32(x[i] / scale)) + zp, 0, 255) (step (1); zp integral in [0, 255]).
  void (*quantize_u8)(const float* x, int64_t n, float scale, float zp, uint8_t* q);
  // One row of step (3) over H lanes: gates g = f32(p + xg) in ORT's order i, o, f, c
  // (p and xg [4H]); bias [4H] (Wb + Rb, fused) or null; peephole [3H] (i, o, f) or null;
  // c [H] in/out; h [H] out.
  void (*lstm_row)(const float* p, const float* xg, const float* bias, const float* peephole, float clip,
                   bool input_forget, int64_t H, float* c, float* h);
  // lstm_row with ONNX's sigmoid and tanh (float_ops' sigmoid_f32 / tanh_f32 of the ISA,
  // (Σ1)-(Σ2), (T1)-(T4)) in place of MLAS's: the float LSTM's (RNN2)-(RNN5)
  // (docs/float-ops.md; float_rnn.h), a = f32(p + xg).
  void (*onnx_lstm_row)(const float* p, const float* xg, const float* bias, const float* peephole, float clip,
                        bool input_forget, int64_t H, float* c, float* h);
  // One row of ONNX Runtime's float GRU (quanta::OrtGRU, docs/float-ops.md (RNN-ORT-GRU),
  // float_rnn.h), H lanes, recurrent_scalar.h's ort_gru_*_lane in their order; clip(v, b)
  // is ort_clip (with the bias b[j], or without: b null):
  //   reset   out[j] = f32(src[j] · Rσ(clip(zr_r[j], br)))                   (RNN-ORT-GRU2, 3)
  //   update  a = f32(a0[j] + a1[j]) (a1 non-null) or a0[j];  z = MlasLogistic(clip(zr_z[j], bz));
  //           h[j] = f32(f32(f32(1 − z) · Rt(clip(a, bh))) + f32(z · h[j]))  (RNN-ORT-GRU4, 5)
  // The float GRU's gates (docs/float-ops.md (RNN6)-(RNN9), float_rnn.h) with ONNX's
  // sigmoid and tanh (float_ops' of the ISA), recurrent_scalar.h's gru_*_lane in their order:
  //   zr  zr[n] = σ(clip(f32(f32(xg[n] + hg[n]) + bias[n])))            n < count (2H: z, r)
  //   h   a = f32(xg_h + f32(r · f32(hr_h + rb_h)))  (lbr; rb_h null: hr_h alone)
  //       or f32(xg_h + hr_h) (hr_h = (r ⊙ h)·R_hᵀ);  a = f32(a + bias_h) (bias_h non-null);
  //       h[j] = f32(f32(f32(1 − z) · tanh(clip(a))) + f32(z · h[j]))
  void (*onnx_gru_zr)(const float* xg, const float* hg, const float* bias, float clip, int64_t count, float* zr);
  void (*onnx_gru_h)(const float* xg_h, const float* hr_h, const float* rb_h, const float* r, const float* z,
                     const float* bias_h, float clip, bool lbr, int64_t H, float* h);
  void (*ort_gru_reset)(const float* zr_r, const float* br, float clip, const float* src, int64_t H, float* out);
  void (*ort_gru_update)(const float* zr_z, const float* bz, const float* a0, const float* a1, const float* bh,
                         float clip, int64_t H, float* h);
  // onnx_gru_zr and onnx_gru_h with MLAS's logistic and tanh (logistic_one, tanh_one): the
  // gates of quanta::DynamicQuantizeGRU, (DQG4)-(DQG6) of reference/dq_gru.py.
  void (*mlas_gru_zr)(const float* xg, const float* hg, const float* bias, float clip, int64_t count, float* zr);
  void (*mlas_gru_h)(const float* xg_h, const float* hr_h, const float* rb_h, const float* r, const float* z,
                     const float* bias_h, float clip, bool lbr, int64_t H, float* h);
};

const Kernels& kernels_for(Isa isa);

struct DqLstmParams {
  int64_t T = 0, B = 0, I = 0, H = 0;
  int D = 1;                                              // 1 or 2 (bidirectional)
  bool reverse = false;                                   // direction "reverse" (D == 1)
  const float* x = nullptr;                               // [T, B, I]
  const qgemm::PackedWeights* w[2] = {nullptr, nullptr};  // per direction: [I, 4H]
  const qgemm::PackedWeights* r[2] = {nullptr, nullptr};  // per direction: [H, 4H]
  const float* w_scale = nullptr;                         // [D, 4H] (a per-direction scale broadcast by the caller)
  const float* r_scale = nullptr;                         // [D, 4H]
  const float* bias = nullptr;                            // [D, 4H] f32(Wb + Rb), or null
  const float* peephole = nullptr;                        // [D, 3H], or null
  const float* initial_h = nullptr;                       // [D, B, H], or null (zeros)
  const float* initial_c = nullptr;                       // [D, B, H], or null (zeros)
  const int32_t* lens = nullptr;                          // [B] in [0, T], or null (all T)
  float clip = 0.0f;                                      // > 0 (FLT_MAX: none)
  bool input_forget = false;
  bool want_y = true;
  float* y = nullptr;    // [T, D, B, H], written whole (zeros when !want_y, as the twin)
  float* y_h = nullptr;  // [D, B, H], written whole
  float* y_c = nullptr;  // [D, B, H], written whole
  int num_threads = 1;
};

void dq_lstm(const DqLstmParams& p);

// quanta::DynamicQuantizeGRU (twin: reference/dq_gru.py, equations (DQG1)-(DQG6); docs/kernels.md
// "Dynamic int8 GRU"). Per direction, with L = max sequence_lens:
//   (DQG1)+(DQG2) X[:L] is one quantization block, Gx = qgemm(qx, W_d) [L·B, 3H] (kF32,
//           multiplier f32(s · w_scale[n])); a reverse row reads Gx's row t' = len[b] − 1 − t.
//   (DQG3) per step the running h with ended rows set to 0 is one block; P = qgemm with R_d's
//          z, r columns (r_zr) or, with linear_before_reset, all of R_d (r_zr holds [H, 3H]).
//   (DQG4)-(DQG6) mlas_gru_zr, then (without linear_before_reset) the block f32(r · h) of the
//          active rows (0 for the others) through r_h, then mlas_gru_h.
// An ended row's h is kept in Y_h and is 0 in the running block (a zero row moves neither lo
// nor hi). Weights are prepacked once (qgemm layout of the ISA, the scalar zero point); the
// ISA of the packed W is the kernel's. Threads as dq_lstm.
struct DqGruParams {
  int64_t T = 0, B = 0, I = 0, H = 0;
  int D = 1;
  bool reverse = false;
  bool linear_before_reset = false;
  const float* x = nullptr;                                  // [T, B, I]
  const qgemm::PackedWeights* w[2] = {nullptr, nullptr};     // per direction: [I, 3H]
  const qgemm::PackedWeights* r_zr[2] = {nullptr, nullptr};  // [H, 2H] (z, r), or [H, 3H] with lbr
  const qgemm::PackedWeights* r_h[2] = {nullptr, nullptr};   // [H, H] (h) without lbr, else null
  const float* w_scale = nullptr;                            // [D, 3H]
  const float* r_scale = nullptr;                            // [D, 3H]
  const float* bias = nullptr;                               // [D, 6H] (Wb then Rb), or null
  const float* initial_h = nullptr;                          // [D, B, H], or null (zeros)
  const int32_t* lens = nullptr;                             // [B] in [0, T], or null (all T)
  float clip = 0.0f;                                         // > 0 (FLT_MAX: none)
  float* y = nullptr;                                        // [T, D, B, H], written whole
  float* y_h = nullptr;                                      // [D, B, H], written whole
  int num_threads = 1;
};

void dq_gru(const DqGruParams& p);

}  // namespace recurrent
}  // namespace quanta
