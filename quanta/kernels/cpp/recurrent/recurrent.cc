// Driver of the recurrent kernels (recurrent.h): the per-direction loop of
// DynamicQuantizeLSTM over the qgemm core and the ISA's elementwise steps.
#include "recurrent/recurrent.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <stdexcept>
#include <vector>

#include "qgemm/thread_pool.h"

namespace quanta {
namespace recurrent {

extern const Kernels kKernelsPortable;
extern const Kernels kKernelsAvx2;
extern const Kernels kKernelsAvx512Vnni;

const Kernels& kernels_for(Isa isa) {
  switch (isa) {
    case Isa::kAvx512Vnni: return kKernelsAvx512Vnni;
    case Isa::kAvx2: return kKernelsAvx2;
    case Isa::kPortable: break;
  }
  return kKernelsPortable;
}

namespace {

// Step (1)'s parameters from the block's (lo, hi): scale and the integral zero point.
void quant_params(float lo, float hi, float* scale, float* zp) {
  const float s = hi == lo ? 1.0f : (hi - lo) / 255.0f;
  float z = 0.0f - lo / s;
  z = z < 0.0f ? 0.0f : (z > 255.0f ? 255.0f : z);
  *scale = s;
  *zp = std::nearbyint(z);
}

// Quantizes a block of n floats (step (1)) into q; returns its scale and zero point.
void quantize_block(const Kernels& k, const float* x, int64_t n, uint8_t* q, float* scale, int32_t* zp) {
  float lo = 0.0f, hi = 0.0f, z = 0.0f;
  if (n > 0) k.min_max(x, n, &lo, &hi);
  quant_params(lo, hi, scale, &z);
  if (n > 0) k.quantize_u8(x, n, *scale, z, q);
  *zp = static_cast<int32_t>(z);
}

// y[m, :] = f32(f32(acc) · mult) for the u8 rows q [M, K] against packed weights w.
void gemm_f32(const uint8_t* q, int64_t M, int32_t zq, const qgemm::PackedWeights& w, const float* mult, float* y,
              int threads, qgemm::Workspace& ws) {
  qgemm::QGemmParams g;
  g.M = M;
  g.x = q;
  g.x_row_stride = w.K;
  g.x_signed = false;
  g.zx = zq;
  g.w = &w;
  g.out_type = qgemm::OutType::kF32;
  g.multiplier = mult;
  g.multiplier_per_channel = true;
  g.y = y;
  g.y_row_stride = w.N;
  g.num_threads = threads;
  ws.reserve(qgemm::qgemm_workspace_bytes(g));
  qgemm::qgemm(g, ws);
}

// Each row's length (T without sequence_lens) into len; the longest, L.
int64_t row_lengths(const int32_t* lens, int64_t T, int64_t B, std::vector<int64_t>& len) {
  len.resize(static_cast<size_t>(B));
  int64_t L = 0;
  for (int64_t b = 0; b < B; ++b) {
    len[b] = lens ? lens[b] : T;
    L = std::max(L, len[b]);
  }
  return L;
}

// The input products of every step at once: X's first rows (L·B of I floats) quantized as
// one block, then G [rows, W.N] = qgemm with W, multiplier f32(s · w_scale[n]) (the LSTM's
// (1)+(2), the GRU's (DQG1)+(DQG2)).
std::vector<float> input_products(const Kernels& k, const float* x, int64_t rows, int64_t I,
                                  const qgemm::PackedWeights& W, const float* w_scale, int threads,
                                  qgemm::Workspace& ws) {
  const int64_t N = W.N;
  std::vector<uint8_t> qx(static_cast<size_t>(rows * I));
  std::vector<float> G(static_cast<size_t>(rows * N)), mult(static_cast<size_t>(N));
  float s = 0.0f;
  int32_t z = 0;
  quantize_block(k, x, rows * I, qx.data(), &s, &z);
  for (int64_t n = 0; n < N; ++n) mult[n] = s * w_scale[n];
  gemm_f32(qx.data(), rows, z, W, mult.data(), G.data(), threads, ws);
  return G;
}

void run_direction(const DqLstmParams& p, int d, int threads) {
  const qgemm::PackedWeights& W = *p.w[d];
  const qgemm::PackedWeights& R = *p.r[d];
  const Kernels& k = kernels_for(W.isa);
  const int64_t B = p.B, I = p.I, H = p.H, N = 4 * H, D = p.D;
  const bool reverse = p.reverse || d == 1;
  std::vector<int64_t> len;
  const int64_t L = row_lengths(p.lens, p.T, B, len);
  if (L == 0) return;  // outputs stay zero

  qgemm::Workspace ws;
  // (1)+(2): X[:L] is one block; G [L·B, 4H].
  const std::vector<float> G = input_products(k, p.x, L * B, I, W, p.w_scale + d * N, threads, ws);
  const float* r_scale = p.r_scale + d * N;
  std::vector<float> mult(N);
  float s = 0.0f;
  int32_t z = 0;

  const float* bias = p.bias ? p.bias + d * N : nullptr;
  const float* peep = p.peephole ? p.peephole + d * 3 * H : nullptr;
  std::vector<float> h_prev(B * H, 0.0f), c(B * H, 0.0f), P(B * N);
  std::vector<uint8_t> qh(B * H);
  if (p.initial_h) std::memcpy(h_prev.data(), p.initial_h + d * B * H, sizeof(float) * B * H);
  if (p.initial_c) std::memcpy(c.data(), p.initial_c + d * B * H, sizeof(float) * B * H);
  const int step_threads = B * H * N >= kStepThreadMacs ? threads : 1;
  float* yh = p.y_h + d * B * H;
  float* yc = p.y_c + d * B * H;

  for (int64_t t = 0; t < L; ++t) {
    // (2): the previous H, one block of B rows.
    quantize_block(k, h_prev.data(), B * H, qh.data(), &s, &z);
    for (int64_t n = 0; n < N; ++n) mult[n] = s * r_scale[n];
    gemm_f32(qh.data(), B, z, R, mult.data(), P.data(), step_threads, ws);
    for (int64_t b = 0; b < B; ++b) {
      float* hb = h_prev.data() + b * H;
      if (t >= len[b]) {
        // (4): Y's row is 0 and feeds the next step when Y is requested; else the running
        // Y_h (the last h, or 0 for a row that never started) does.
        if (p.want_y || len[b] == 0) std::fill(hb, hb + H, 0.0f);
        continue;
      }
      const int64_t ts = reverse ? len[b] - 1 - t : t;  // the row's time index in X and Y
      float* cb = c.data() + b * H;
      k.lstm_row(P.data() + b * N, G.data() + (ts * B + b) * N, bias, peep, p.clip, p.input_forget, H, cb, hb);
      if (p.want_y) std::memcpy(p.y + ((ts * D + d) * B + b) * H, hb, sizeof(float) * H);
      if (t + 1 == len[b]) {
        std::memcpy(yh + b * H, hb, sizeof(float) * H);
        std::memcpy(yc + b * H, cb, sizeof(float) * H);
      }
    }
  }
}

// One direction of quanta::DynamicQuantizeGRU (recurrent.h), (DQG1)-(DQG6) in the twin's order.
void run_gru_direction(const DqGruParams& p, int d, int threads) {
  const qgemm::PackedWeights& W = *p.w[d];
  const qgemm::PackedWeights& Rzr = *p.r_zr[d];
  const Kernels& k = kernels_for(W.isa);
  const int64_t B = p.B, I = p.I, H = p.H, N = 3 * H, D = p.D;
  const bool reverse = p.reverse || d == 1;
  const bool lbr = p.linear_before_reset;
  std::vector<int64_t> len;
  const int64_t L = row_lengths(p.lens, p.T, B, len);
  if (L == 0) return;  // outputs stay zero

  qgemm::Workspace ws;
  // (DQG1)+(DQG2): X[:L] is one block; Gx [L·B, 3H].
  const std::vector<float> G = input_products(k, p.x, L * B, I, W, p.w_scale + d * N, threads, ws);
  const float* r_scale = p.r_scale + d * N;
  float s = 0.0f;
  int32_t z = 0;

  // biases: f32(Wb + Rb) for z, r; the h gate's Wb_h and Rb_h apart with lbr, else summed
  std::vector<float> b_zr, b_h, rb_h;
  if (p.bias) {
    const float* wb = p.bias + d * 2 * N;
    const float* rb = wb + N;
    b_zr.resize(2 * H);
    b_h.resize(H);
    for (int64_t n = 0; n < 2 * H; ++n) b_zr[n] = wb[n] + rb[n];
    for (int64_t j = 0; j < H; ++j) b_h[j] = lbr ? wb[2 * H + j] : wb[2 * H + j] + rb[2 * H + j];
    if (lbr) rb_h.assign(rb + 2 * H, rb + N);
  }
  const float* bzr = p.bias ? b_zr.data() : nullptr;
  const float* bh = p.bias ? b_h.data() : nullptr;
  const float* rbh = p.bias && lbr ? rb_h.data() : nullptr;

  const int64_t NP = Rzr.N;  // 2H, or 3H with lbr
  std::vector<float> h(B * H, 0.0f), P(B * NP), zr(B * 2 * H), Q, PH;
  std::vector<uint8_t> qh(B * H);
  if (!lbr) {
    Q.assign(B * H, 0.0f);
    PH.resize(B * H);
  }
  if (p.initial_h) std::memcpy(h.data(), p.initial_h + d * B * H, sizeof(float) * B * H);
  const int step_threads = B * H * N >= kStepThreadMacs ? threads : 1;
  float* yh = p.y_h + d * B * H;
  std::vector<float> mult_r(N);

  for (int64_t t = 0; t < L; ++t) {
    // (DQG3): ended rows are 0 in the block (their last h is in Y_h already)
    for (int64_t b = 0; b < B; ++b) {
      if (t >= len[b]) std::fill(h.data() + b * H, h.data() + (b + 1) * H, 0.0f);
    }
    quantize_block(k, h.data(), B * H, qh.data(), &s, &z);
    for (int64_t n = 0; n < NP; ++n) mult_r[n] = s * r_scale[n];
    gemm_f32(qh.data(), B, z, Rzr, mult_r.data(), P.data(), step_threads, ws);
    for (int64_t b = 0; b < B; ++b) {  // (DQG4)
      if (t >= len[b]) continue;
      const int64_t ts = reverse ? len[b] - 1 - t : t;
      k.mlas_gru_zr(G.data() + (ts * B + b) * N, P.data() + b * NP, bzr, p.clip, 2 * H, zr.data() + b * 2 * H);
    }
    if (!lbr) {  // (DQG5): the block f32(r · h) of the active rows
      for (int64_t b = 0; b < B; ++b) {
        float* qb = Q.data() + b * H;
        if (t >= len[b]) {
          std::fill(qb, qb + H, 0.0f);
          continue;
        }
        const float* r = zr.data() + b * 2 * H + H;
        const float* hb = h.data() + b * H;
        for (int64_t j = 0; j < H; ++j) qb[j] = r[j] * hb[j];
      }
      quantize_block(k, Q.data(), B * H, qh.data(), &s, &z);
      for (int64_t n = 0; n < H; ++n) mult_r[n] = s * r_scale[2 * H + n];
      gemm_f32(qh.data(), B, z, *p.r_h[d], mult_r.data(), PH.data(), step_threads, ws);
    }
    for (int64_t b = 0; b < B; ++b) {  // (DQG5)-(DQG6)
      if (t >= len[b]) continue;
      const int64_t ts = reverse ? len[b] - 1 - t : t;
      const float* zb = zr.data() + b * 2 * H;
      float* hb = h.data() + b * H;
      const float* hr_h = lbr ? P.data() + b * NP + 2 * H : PH.data() + b * H;
      k.mlas_gru_h(G.data() + (ts * B + b) * N + 2 * H, hr_h, rbh, zb + H, zb, bh, p.clip, lbr, H, hb);
      std::memcpy(p.y + ((ts * D + d) * B + b) * H, hb, sizeof(float) * H);
      if (t + 1 == len[b]) std::memcpy(yh + b * H, hb, sizeof(float) * H);
    }
  }
}

}  // namespace

void dq_gru(const DqGruParams& p) {
  if (p.D != 1 && p.D != 2) throw std::invalid_argument("dq_gru: D must be 1 or 2");
  std::fill(p.y, p.y + p.T * p.D * p.B * p.H, 0.0f);
  std::fill(p.y_h, p.y_h + p.D * p.B * p.H, 0.0f);
  if (p.B == 0 || p.H == 0) return;
  const int threads = std::max(1, p.num_threads);
  if (p.D == 2 && threads >= 2) {
    auto body = [&](int64_t d, int) { run_gru_direction(p, static_cast<int>(d), 1); };
    qgemm::parallel_for(2, 2, body);
  } else {
    for (int d = 0; d < p.D; ++d) run_gru_direction(p, d, threads);
  }
}

void dq_lstm(const DqLstmParams& p) {
  if (p.D != 1 && p.D != 2) throw std::invalid_argument("dq_lstm: D must be 1 or 2");
  std::fill(p.y, p.y + p.T * p.D * p.B * p.H, 0.0f);
  std::fill(p.y_h, p.y_h + p.D * p.B * p.H, 0.0f);
  std::fill(p.y_c, p.y_c + p.D * p.B * p.H, 0.0f);
  if (p.B == 0 || p.H == 0) return;
  const int threads = std::max(1, p.num_threads);
  if (p.D == 2 && threads >= 2) {
    auto body = [&](int64_t d, int) { run_direction(p, static_cast<int>(d), 1); };
    qgemm::parallel_for(2, 2, body);
  } else {
    for (int d = 0; d < p.D; ++d) run_direction(p, d, threads);
  }
}

}  // namespace recurrent
}  // namespace quanta
