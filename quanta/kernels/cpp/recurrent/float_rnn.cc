// Driver of the float32 LSTM and GRU (float_rnn.h; equations (RNN1)-(RNN9) of
// docs/float-ops.md): per direction, the X·Wᵀ products of every step up front, then the
// recurrence. The gates of a row are the recurrent family's row steps of the same ISA
// (recurrent.h Kernels: onnx_lstm_row, onnx_gru_zr / onnx_gru_h with float_ops' sigmoid
// and tanh; OrtLSTM's lstm_row and OrtGRU's ort_gru_* with ONNX Runtime's), each lane one
// IEEE operation at a time in the twin's order.
#include "recurrent/float_rnn.h"

#include <algorithm>
#include <cstring>
#include <stdexcept>
#include <vector>

#include "float_ops/float_ops.h"
#include "qgemm/thread_pool.h"
#include "recurrent/recurrent.h"

namespace quanta {
namespace recurrent {

extern const SeqGemmFn kSeqGemmPortable;
extern const SeqGemmFn kSeqGemmAvx2;
extern const SeqGemmFn kSeqGemmAvx512Vnni;

extern const SeqGemmMlasFn kSeqGemmMlasPortable;
extern const SeqGemmMlasFn kSeqGemmMlasAvx2;
extern const SeqGemmMlasFn kSeqGemmMlasAvx512Vnni;

SeqGemmMlasFn seq_gemm_mlas_for(Isa isa) {
  switch (isa) {
    case Isa::kAvx512Vnni: return kSeqGemmMlasAvx512Vnni;
    case Isa::kAvx2: return kSeqGemmMlasAvx2;
    case Isa::kPortable: break;
  }
  return kSeqGemmMlasPortable;
}

SeqGemmFn seq_gemm_for(Isa isa) {
  switch (isa) {
    case Isa::kAvx512Vnni: return kSeqGemmAvx512Vnni;
    case Isa::kAvx2: return kSeqGemmAvx2;
    case Isa::kPortable: break;
  }
  return kSeqGemmPortable;
}

namespace {

// A direction's input projection (X·Wᵀ of every step: one product of L·B rows) on up to
// `threads` threads, its rows in blocks of four, a few blocks a chunk: each chunk is the
// kernel's own call on its rows, and every lane computes its (RNN1) / (RNN-ORT1) chain
// whichever chunk holds it, so the bytes do not depend on the split. One pool job per
// direction (a batch-1 step's product is not split: a job per step waited for a late
// worker on the shared machine more than it saved). Under kSplitMacs the caller runs it.
constexpr int64_t kSplitMacs = int64_t{1} << 20;

template <class Call>
void split_rows(int threads, int64_t M, int64_t K, int64_t N, Call call) {
  if (threads >= 2 && M >= 8 && M * K * N >= kSplitMacs) {
    const int64_t blocks = (M + 3) / 4;
    const int64_t chunks = std::min<int64_t>(blocks, int64_t{4} * threads);
    auto body = [&](int64_t c, int) {
      const int64_t b0 = c * blocks / chunks, b1 = (c + 1) * blocks / chunks;
      call(b0 * 4, std::min(M, b1 * 4));
    };
    qgemm::parallel_for(threads, chunks, body);
    return;
  }
  call(int64_t{0}, M);
}

// One direction of ONNX Runtime's float GRU (quanta::OrtGRU, docs/float-ops.md
// (RNN-ORT-GRU)), in the twin's order (reference/rnn.py _ort_gru_direction).
void run_ort_gru_direction(const FloatRnnParams& p, int d, int threads) {
  const SeqGemmMlasFn gemm_mlas = seq_gemm_mlas_for(p.isa);
  const Kernels& rows = kernels_for(p.isa);  // the gates, a vector of lanes at a time
  const int64_t B = p.B, I = p.I, H = p.H, D = p.D, N = 3 * H;
  const bool reverse = p.reverse || d == 1;
  const bool lbr = p.linear_before_reset;
  std::vector<int64_t> len(B);
  int64_t L = 0;
  for (int64_t b = 0; b < B; ++b) {
    len[b] = p.lens ? p.lens[b] : p.T;
    L = std::max(L, len[b]);
  }
  if (L == 0) return;
  std::vector<float> xw(static_cast<size_t>(L * B * N));
  split_rows(threads, L * B, I, N, [&](int64_t m0, int64_t m1) {  // (RNN-ORT-GRU1)
    gemm_mlas(p.x + m0 * I, I, p.w[d], I, N, xw.data() + m0 * N, N, m1 - m0, false);
  });
  std::vector<float> bz, br, bh, rbh;
  if (p.bias) {
    const float* wb = p.bias + d * 2 * N;
    const float* rb = wb + N;
    bz.resize(H);
    br.resize(H);
    bh.resize(H);
    rbh.assign(rb + 2 * H, rb + N);
    for (int64_t j = 0; j < H; ++j) {
      bz[j] = wb[j] + rb[j];
      br[j] = wb[H + j] + rb[H + j];
      bh[j] = lbr ? wb[2 * H + j] : wb[2 * H + j] + rb[2 * H + j];
    }
  }
  const float* bzp = p.bias ? bz.data() : nullptr;
  const float* brp = p.bias ? br.data() : nullptr;
  const float* bhp = p.bias ? bh.data() : nullptr;
  std::vector<float> h(B * H, 0.0f), zr(B * 2 * H, 0.0f), lin(B * H, 0.0f), cur(B * H, 0.0f), hin(B * H, 0.0f);
  if (p.initial_h) std::memcpy(h.data(), p.initial_h + d * B * H, sizeof(float) * B * H);
  float* yh = p.y_h + d * B * H;
  auto row_t = [&](int64_t s, int64_t b) { return reverse ? len[b] - 1 - s : s; };
  for (int64_t s = 0; s < L; ++s) {
    for (int64_t b = 0; b < B; ++b) {
      if (s >= len[b]) continue;
      std::memcpy(zr.data() + b * 2 * H, xw.data() + (row_t(s, b) * B + b) * N, sizeof(float) * 2 * H);
    }
    gemm_mlas(h.data(), H, p.r[d], H, 2 * H, zr.data(), 2 * H, B, true);  // H·R[zr]ᵀ onto X·W[zr]ᵀ
    if (lbr) {  // (RNN-ORT-GRU3) L = H·R[h]ᵀ onto Rb_h, or from 0
      if (p.bias) {
        for (int64_t b = 0; b < B; ++b) std::memcpy(lin.data() + b * H, rbh.data(), sizeof(float) * H);
      }
      gemm_mlas(h.data(), H, p.r_h[d], H, H, lin.data(), H, B, p.bias != nullptr);
    }
    for (int64_t b = 0; b < B; ++b) {  // (RNN-ORT-GRU2) r, then r ⊙ L or r ⊙ H
      if (s >= len[b]) continue;
      const float* src = lbr ? lin.data() + b * H : h.data() + b * H;
      rows.ort_gru_reset(zr.data() + b * 2 * H + H, brp, p.clip, src, H, cur.data() + b * H);
    }
    if (!lbr) {  // (r ⊙ H)·R[h]ᵀ onto X·W[h]ᵀ
      for (int64_t b = 0; b < B; ++b) {
        if (s >= len[b]) continue;
        std::memcpy(hin.data() + b * H, xw.data() + (row_t(s, b) * B + b) * N + 2 * H, sizeof(float) * H);
      }
      gemm_mlas(cur.data(), H, p.r_h[d], H, H, hin.data(), H, B, true);
    }
    for (int64_t b = 0; b < B; ++b) {
      if (s >= len[b]) continue;
      const int64_t ts = row_t(s, b);
      const float* xh = xw.data() + (ts * B + b) * N + 2 * H;
      float* hb = h.data() + b * H;
      // (RNN-ORT-GRU4), (RNN-ORT-GRU5): A_h = f32(XW_h + r ⊙ L), or the product onto XW_h
      if (lbr) {
        rows.ort_gru_update(zr.data() + b * 2 * H, bzp, xh, cur.data() + b * H, bhp, p.clip, H, hb);
      } else {
        rows.ort_gru_update(zr.data() + b * 2 * H, bzp, hin.data() + b * H, nullptr, bhp, p.clip, H, hb);
      }
      std::memcpy(p.y + ((ts * D + d) * B + b) * H, hb, sizeof(float) * H);
      if (s + 1 == len[b]) std::memcpy(yh + b * H, hb, sizeof(float) * H);
    }
  }
}

void run_direction(const FloatRnnParams& p, int d, int threads) {
  if (p.gru && p.ort) {
    run_ort_gru_direction(p, d, threads);
    return;
  }
  const SeqGemmFn gemm = seq_gemm_for(p.isa);
  const SeqGemmMlasFn gemm_mlas = seq_gemm_mlas_for(p.isa);
  const int64_t T = p.T, B = p.B, I = p.I, H = p.H, D = p.D;
  const int64_t G = p.gru ? 3 : 4, N = G * H;
  const bool reverse = p.reverse || d == 1;
  std::vector<int64_t> len(B);
  int64_t L = 0;
  for (int64_t b = 0; b < B; ++b) {
    len[b] = p.lens ? p.lens[b] : T;
    L = std::max(L, len[b]);
  }
  if (L == 0) return;
  std::vector<float> xw(static_cast<size_t>(L * B * N));
  split_rows(threads, L * B, I, N, [&](int64_t m0, int64_t m1) {
    if (p.ort) {
      gemm_mlas(p.x + m0 * I, I, p.w[d], I, N, xw.data() + m0 * N, N, m1 - m0, false);  // (RNN-ORT): X[:L] · Wᵀ
    } else {
      gemm(p.x + m0 * I, I, p.w[d], I, N, xw.data() + m0 * N, N, m1 - m0);  // (RNN1): X[:L] · Wᵀ
    }
  });

  // bias: f32(Wb + Rb) per gate column ((RNN2)); the GRU's h gate keeps Wb and Rb apart
  // with linear_before_reset.
  std::vector<float> bias, rb_h;
  if (p.bias) {
    const float* wb = p.bias + d * 2 * N;
    const float* rb = wb + N;
    bias.resize(N);
    for (int64_t n = 0; n < N; ++n) bias[n] = wb[n] + rb[n];
    if (p.gru && p.linear_before_reset) {
      for (int64_t n = 2 * H; n < N; ++n) bias[n] = wb[n];
      rb_h.assign(rb + 2 * H, rb + N);
    }
  }
  const float* bp = p.bias ? bias.data() : nullptr;
  const float* peep = p.peephole ? p.peephole + d * 3 * H : nullptr;
  std::vector<float> h(B * H, 0.0f), c(B * H, 0.0f), hr(B * N), rh(B * H, 0.0f), hrh(B * H);
  if (p.initial_h) std::memcpy(h.data(), p.initial_h + d * B * H, sizeof(float) * B * H);
  if (p.initial_c && !p.gru) std::memcpy(c.data(), p.initial_c + d * B * H, sizeof(float) * B * H);
  float* yh = p.y_h + d * B * H;
  float* yc = p.y_c ? p.y_c + d * B * H : nullptr;
  const float* R = p.r[d];
  const bool lbr = p.gru && p.linear_before_reset;
  std::vector<float> zr_all(p.gru ? B * 2 * H : 0);  // the GRU's z and r of every row
  // The LSTM's gates: the recurrent family's row step of the same ISA, which computes
  // (RNN3)-(RNN5) in this order a vector of lanes at a time in registers, with ONNX's
  // sigmoid and tanh (onnx_lstm_row: a = f32(hr + xw), (RNN2)) or, for OrtLSTM, MLAS's
  // (DynamicQuantizeLSTM's lstm_row); plain loops and five activation calls a row took a
  // quarter of a 600-step, H = 25 LSTM's time. OrtLSTM's H·Rᵀ already holds its X·Wᵀ row
  // ((RNN-ORT1)), so its pre-activation is f32(p + xg) with xg = −0, which gives p itself
  // (x + (−0) = x for every float x, −0 and NaN included).
  const Kernels& rows = kernels_for(p.isa);
  std::vector<float> neg_zero(p.ort && !p.gru ? N : 0, -0.0f);

  for (int64_t s = 0; s < L; ++s) {
    // (RNN1): H·Rᵀ, all gates (LSTM, GRU with linear_before_reset) or z, r only
    if (p.ort) {
      // (RNN-ORT): each active row's X·Wᵀ row, then H·Rᵀ added onto it block by block
      for (int64_t b = 0; b < B; ++b) {
        if (s >= len[b]) continue;
        const int64_t ts = reverse ? len[b] - 1 - s : s;
        std::memcpy(hr.data() + b * N, xw.data() + (ts * B + b) * N, sizeof(float) * N);
      }
      gemm_mlas(h.data(), H, R, H, N, hr.data(), N, B, true);
    } else if (!p.gru) {
      gemm(h.data(), H, R, H, N, hr.data(), N, B);
    } else {
      gemm(h.data(), H, R, H, 2 * H, hr.data(), N, B);
      if (lbr) gemm(h.data(), H, p.r_h[d], H, H, hr.data() + 2 * H, N, B);
    }
    if (!p.gru) {
      for (int64_t b = 0; b < B; ++b) {
        if (s >= len[b]) continue;
        const int64_t ts = reverse ? len[b] - 1 - s : s;
        const float* xg = xw.data() + (ts * B + b) * N;
        const float* hg = hr.data() + b * N;
        float* hb = h.data() + b * H;
        float* cb = c.data() + b * H;
        if (p.ort) {
          rows.lstm_row(hg, neg_zero.data(), bp, peep, p.clip, p.input_forget, H, cb, hb);
        } else {
          rows.onnx_lstm_row(hg, xg, bp, peep, p.clip, p.input_forget, H, cb, hb);
        }
        std::memcpy(p.y + ((ts * D + d) * B + b) * H, hb, sizeof(float) * H);
        if (s + 1 == len[b]) {
          std::memcpy(yh + b * H, hb, sizeof(float) * H);
          std::memcpy(yc + b * H, cb, sizeof(float) * H);
        }
      }
      continue;
    }
    // GRU: z and r of every active row first ((RNN6)); r ⊙ h feeds the h gate's product
    // without linear_before_reset ((RNN7)).
    for (int64_t b = 0; b < B; ++b) {
      if (s >= len[b]) continue;
      const int64_t ts = reverse ? len[b] - 1 - s : s;
      const float* xg = xw.data() + (ts * B + b) * N;
      const float* hg = hr.data() + b * N;
      rows.onnx_gru_zr(xg, hg, bp, p.clip, 2 * H, zr_all.data() + b * 2 * H);
      if (!lbr) {
        const float* r = zr_all.data() + b * 2 * H + H;
        const float* hb = h.data() + b * H;
        for (int64_t j = 0; j < H; ++j) rh[b * H + j] = r[j] * hb[j];
      }
    }
    if (!lbr) gemm(rh.data(), H, p.r_h[d], H, H, hrh.data(), H, B);  // (RNN1): (r ⊙ h)·Rhᵀ
    for (int64_t b = 0; b < B; ++b) {
      if (s >= len[b]) continue;
      const int64_t ts = reverse ? len[b] - 1 - s : s;
      const float* xg = xw.data() + (ts * B + b) * N + 2 * H;
      const float* z = zr_all.data() + b * 2 * H;
      const float* r = z + H;
      float* hb = h.data() + b * H;
      // (RNN8) with linear_before_reset, else (RNN7); then (RNN9)
      const float* hr_h = lbr ? hr.data() + b * N + 2 * H : hrh.data() + b * H;
      rows.onnx_gru_h(xg, hr_h, bp && lbr ? rb_h.data() : nullptr, r, z, bp ? bp + 2 * H : nullptr, p.clip, lbr, H, hb);
      std::memcpy(p.y + ((ts * D + d) * B + b) * H, hb, sizeof(float) * H);
      if (s + 1 == len[b]) std::memcpy(yh + b * H, hb, sizeof(float) * H);
    }
  }
}

}  // namespace

void float_rnn(const FloatRnnParams& p) {
  if (p.D != 1 && p.D != 2) throw std::invalid_argument("float_rnn: D must be 1 or 2");
  std::fill(p.y, p.y + p.T * p.D * p.B * p.H, 0.0f);
  std::fill(p.y_h, p.y_h + p.D * p.B * p.H, 0.0f);
  if (p.y_c) std::fill(p.y_c, p.y_c + p.D * p.B * p.H, 0.0f);
  if (p.B == 0 || p.H == 0) return;
  if (p.D == 2 && p.num_threads >= 2) {
    auto body = [&](int64_t d, int) { run_direction(p, static_cast<int>(d), 1); };
    qgemm::parallel_for(2, 2, body);
  } else {
    for (int d = 0; d < p.D; ++d) run_direction(p, d, std::max(1, p.num_threads));
  }
}

void lstm_gates(const float* gates, const float* c, float* h_out, float* c_out, int64_t B, int64_t H,
                const int order[4], Isa isa) {
  const float_ops::Kernels& fk = float_ops::kernels_for(isa);
  const float_ops::UnaryRunFn sigmoid = fk.unary[static_cast<int>(float_ops::UnaryOp::kSigmoid)];
  const float_ops::UnaryRunFn tanh = fk.unary[static_cast<int>(float_ops::UnaryOp::kTanh)];
  std::vector<float> act(static_cast<size_t>(5 * H));
  float* i = act.data();
  float* f = i + H;
  float* g = f + H;
  float* o = g + H;
  float* t = o + H;
  for (int64_t b = 0; b < B; ++b) {
    const float* row = gates + b * 4 * H;
    sigmoid(row + order[0] * H, i, H);  // (LG1)
    sigmoid(row + order[1] * H, f, H);
    tanh(row + order[2] * H, g, H);
    sigmoid(row + order[3] * H, o, H);
    const float* cb = c + b * H;
    float* cn = c_out + b * H;
    for (int64_t j = 0; j < H; ++j) cn[j] = f[j] * cb[j] + i[j] * g[j];  // (LG2), no contraction
    tanh(cn, t, H);
    float* hn = h_out + b * H;
    for (int64_t j = 0; j < H; ++j) hn[j] = o[j] * t[j];
  }
}

}  // namespace recurrent
}  // namespace quanta
