// Driver of the float32 LSTM and GRU (float_rnn.h; equations (RNN1)-(RNN9) of
// docs/float-ops.md): per direction, the X·Wᵀ products of every step up front, then the
// recurrence. The gates of a row are the recurrent family's row steps of the same ISA
// (recurrent.h Kernels: onnx_lstm_row, onnx_gru_zr / onnx_gru_h with float_ops' sigmoid
// and tanh; OrtLSTM's lstm_row and OrtGRU's ort_gru_* with ONNX Runtime's), each lane one
// IEEE operation at a time in the twin's order.
#include "recurrent/float_rnn.h"

#include <algorithm>
#include <atomic>
#include <cstring>
#include <memory>
#include <stdexcept>
#include <thread>
#include <vector>

#if defined(__x86_64__) || defined(__i386__)
#include <immintrin.h>
#define QUANTA_RNN_PAUSE() _mm_pause()
#else
#define QUANTA_RNN_PAUSE() ((void)0)
#endif

#include "float_ops/float_ops.h"
#include "qgemm/thread_pool.h"
#include "recurrent/recurrent.h"

namespace quanta {
namespace recurrent {

extern const SeqGemmFn kSeqGemmPortable;
extern const SeqGemmFn kSeqGemmAvx2;
extern const SeqGemmFn kSeqGemmAvx512Vnni;
extern const SeqGemmFn kSeqGemmStripsAvx512Vnni;

extern const SeqGemmMlasFn kSeqGemmMlasPortable;
extern const SeqGemmMlasFn kSeqGemmMlasAvx2;
extern const SeqGemmMlasFn kSeqGemmMlasAvx512Vnni;
extern const SeqGemmMlasFn kSeqRowStripsAvx2;
extern const SeqGemmMlasFn kSeqRowStripsMlasAvx2;
extern const SeqGemmMlasFn kSeqWStripsAvx2;
extern const SeqGemmMlasFn kSeqWStripsMlasAvx2;

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

SeqGemmFn seq_gemm_strips_for(Isa isa) { return isa == Isa::kAvx512Vnni ? kSeqGemmStripsAvx512Vnni : nullptr; }

SeqGemmMlasFn seq_row_strips_for(Isa isa, bool mlas) {
  if (isa != Isa::kAvx2) return nullptr;
  return mlas ? kSeqRowStripsMlasAvx2 : kSeqRowStripsAvx2;
}

SeqGemmMlasFn seq_gemm_wstrips_for(Isa isa, bool mlas) {
  if (isa != Isa::kAvx2) return nullptr;
  return mlas ? kSeqWStripsMlasAvx2 : kSeqWStripsAvx2;
}

int64_t float_rnn_w_cols(Isa isa) { return seq_gemm_wstrips_for(isa, false) != nullptr ? kSeqWStrip : kSeqPanel; }

int64_t float_rnn_r_cols(Isa isa) { return seq_row_strips_for(isa, false) != nullptr ? kSeqRowStrip : kSeqPanel; }

namespace {

// A batch-6+ LSTM recurrence of this many steps or more runs its H·Rᵀ on R repacked into
// strips (float_rnn.h kSeqStrip): the repack is one pass over R (1 MB at H = 256, ~50 us),
// a step saves ~1 us of ~13 there (benchmarks/results/2026-12-06b-lstm12.md).
constexpr int64_t kStripMinSteps = 64;

// w [K, N] in blocks of `from` columns -> blocks of `to` columns (kSeqPanel, kSeqStrip,
// kSeqRowStrip: one divides the other), in a buffer left uninitialized: every float is
// copied from an input block or, past the input's blocks, set to zero (the padding). One
// pass over the input, each row of the wider blocks read or written once and split into
// or gathered from the narrower ones (a narrow block at a time read each panel row
// kSeqPanel / S times and zero-filled the buffer first: a fifth of ddddocr's batch-1
// LSTM, 4 MB of R).
class Blocks {
 public:
  Blocks(const float* w, int64_t K, int64_t N, int64_t from, int64_t to) {
    const int64_t in_blocks = (N + from - 1) / from, out_blocks = (N + to - 1) / to;
    p_.reset(new float[static_cast<size_t>(out_blocks * K * to)]);
    if (from >= to) {
      const int64_t per = from / to;
      for (int64_t q = 0; q < in_blocks; ++q) {
        const int64_t in_block = std::min(per, out_blocks - q * per);
        const float* src = w + q * from * K;
        float* out = p_.get() + q * per * K * to;
        for (int64_t k = 0; k < K; ++k)
          for (int64_t j = 0; j < in_block; ++j)
            std::memcpy(out + (j * K + k) * to, src + k * from + j * to, sizeof(float) * to);
      }
      return;
    }
    const int64_t per = to / from;
    for (int64_t q = 0; q < out_blocks; ++q) {
      float* out = p_.get() + q * to * K;
      for (int64_t k = 0; k < K; ++k)
        for (int64_t j = 0; j < per; ++j) {
          float* o = out + k * to + j * from;
          if (q * per + j < in_blocks) {
            std::memcpy(o, w + (q * per + j) * from * K + k * from, sizeof(float) * from);
          } else {
            std::fill(o, o + from, 0.0f);
          }
        }
    }
  }
  const float* data() const { return p_.get(); }

 private:
  std::unique_ptr<float[]> p_;
};

// w [K, N] (W, R or R_h) given in blocks of `given` columns, as a call's products take it:
// in blocks of `want` columns, repacked into `keep` when they differ.
const float* in_blocks(const float* w, int64_t K, int64_t N, int64_t given, int64_t want,
                       std::unique_ptr<Blocks>& keep) {
  if (given == want) return w;
  keep = std::make_unique<Blocks>(w, K, N, given, want);
  return keep->data();
}

// A direction's input projection xw [L·B, N] = X[:L] · W[d]ᵀ ((RNN1), or (RNN-ORT1) with
// ort), on W's strips where the ISA has the kernel and W comes in them, else on panels
// (W repacked for the call when it comes in strips).
template <class Split>
void project(const FloatRnnParams& p, int d, int64_t rows, int64_t N, float* xw, bool ort, Split split) {
  const int64_t I = p.I;
  const SeqGemmMlasFn wfn = seq_gemm_wstrips_for(p.isa, ort);
  if (wfn != nullptr && p.w_cols == kSeqWStrip) {
    split(rows, [&](int64_t m0, int64_t m1) { wfn(p.x + m0 * I, I, p.w[d], I, N, xw + m0 * N, N, m1 - m0, false); });
    return;
  }
  std::unique_ptr<Blocks> keep;
  const float* w = in_blocks(p.w[d], I, N, p.w_cols, kSeqPanel, keep);
  const SeqGemmFn gemm = seq_gemm_for(p.isa);
  const SeqGemmMlasFn gemm_mlas = seq_gemm_mlas_for(p.isa);
  split(rows, [&](int64_t m0, int64_t m1) {
    if (ort) {
      gemm_mlas(p.x + m0 * I, I, w, I, N, xw + m0 * N, N, m1 - m0, false);
    } else {
      gemm(p.x + m0 * I, I, w, I, N, xw + m0 * N, N, m1 - m0);
    }
  });
}

// A batch-1 recurrence given its recurrence weights in panels runs its products on them
// repacked into row strips (float_rnn.h kSeqRowStrip) from this many steps on: the
// repack is one pass over them, about what one step reads; a step then takes ~0.6 of its
// time on the panels. Given row strips (the binder's layout on such an ISA), every
// batch-1 recurrence runs on them.
constexpr int64_t kRowStripMinSteps = 4;

// A buffer of n floats left uninitialized: the X·Wᵀ products of every step (4 MB for
// Resemblyzer's LSTMs: 160 steps x 6 rows x 1024 gates), all of which the product writes
// before anything reads them; std::vector's zero fill of it was a memset of the whole
// buffer per call.
class ScratchF32 {
 public:
  explicit ScratchF32(size_t n) : p_(new float[n]) {}
  float* data() { return p_.get(); }

 private:
  std::unique_ptr<float[]> p_;
};

// A direction's input projection (X·Wᵀ of every step: one product of L·B rows) on up to
// `threads` threads, its rows in blocks of four, a few blocks a chunk: each chunk is the
// kernel's own call on its rows, and every lane computes its (RNN1) / (RNN-ORT1) chain
// whichever chunk holds it, so the bytes do not depend on the split. One pool job per
// direction (a batch-1 step's product is not split: a job per step waited for a late
// worker on the shared machine more than it saved). Under kSplitMacs the caller runs it.
constexpr int64_t kSplitMacs = int64_t{1} << 20;
// A recurrence step of this many multiply-adds (B·H·G·H) or more runs on two threads
// (StepTeam): an H = 256 GRU step at batch 1 (196,608) is.
constexpr int64_t kTeamMacs = int64_t{1} << 17;

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

// A direction's recurrence on two threads, step by step (float_rnn.h "Threads"): the
// driver runs the step loop and publishes each phase of a step (the columns of the step's
// products, panel by panel; the gates, row by row) as n units that it and a helper claim
// one at a time; the phase ends when every unit is done. A unit computes the same columns
// or rows with the same instructions whichever thread claims it, so the bytes do not
// depend on the split. Nothing waits for a thread that has not started: the driver claims
// every unit a late or absent helper leaves, and waits only for units the helper holds.
// One word holds the phase (epoch), its unit count and the next unit, so a claim on a
// phase that has moved on fails by itself.
class StepTeam {
 public:
  explicit StepTeam(bool concurrent) : concurrent_(concurrent) {}

  // fn(i) for i in [0, n), n <= kMaxUnits; returns when all are done.
  template <class F>
  void phase(int64_t n, F& fn) {
    if (!concurrent_) {
      for (int64_t i = 0; i < n; ++i) fn(i);
      return;
    }
    ctx_.store(static_cast<void*>(&fn), std::memory_order_relaxed);
    call_.store(&call<F>, std::memory_order_relaxed);
    ++epoch_;
    published_ += n;
    word_.store(uint64_t{epoch_} << 32 | static_cast<uint64_t>(n) << 16, std::memory_order_release);
    for (;;) {
      const uint64_t w = word_.fetch_add(1, std::memory_order_acq_rel);
      const int64_t i = static_cast<int64_t>(w & 0xffff);
      if (i >= n) break;
      fn(i);
      done_.fetch_add(1, std::memory_order_release);
    }
    while (done_.load(std::memory_order_acquire) < published_) QUANTA_RNN_PAUSE();
  }

  // The helper: claims units until the driver finishes.
  void help() {
    int spins = 0;
    for (;;) {
      uint64_t w = word_.load(std::memory_order_acquire);
      if ((w & 0xffff) < ((w >> 16) & 0xffff)) {
        w = word_.fetch_add(1, std::memory_order_acq_rel);
        if ((w & 0xffff) < ((w >> 16) & 0xffff)) {
          call_.load(std::memory_order_relaxed)(ctx_.load(std::memory_order_relaxed), static_cast<int64_t>(w & 0xffff));
          done_.fetch_add(1, std::memory_order_release);
        }
        spins = 0;
        continue;
      }
      if (finished_.load(std::memory_order_acquire)) return;
      QUANTA_RNN_PAUSE();
      // off the core now and then: on a shared machine the driver may be waiting for it
      if (++spins == kSpinsBeforeYield) {
        spins = 0;
        std::this_thread::yield();
      }
    }
  }

  void finish() { finished_.store(true, std::memory_order_release); }

  static constexpr int64_t kMaxUnits = 4096;

 private:
  template <class F>
  static void call(void* ctx, int64_t i) {
    (*static_cast<F*>(ctx))(i);
  }
  static constexpr int kSpinsBeforeYield = 1 << 14;
  const bool concurrent_;
  alignas(64) std::atomic<uint64_t> word_{0};
  alignas(64) std::atomic<int64_t> done_{0};
  std::atomic<void*> ctx_{nullptr};
  std::atomic<void (*)(void*, int64_t)> call_{nullptr};
  std::atomic<bool> finished_{false};
  uint32_t epoch_ = 0;
  int64_t published_ = 0;
};

// Runs recurrence(team) on up to two threads: the first thread to enter drives, the
// second helps (a pool that runs both chunks on one thread runs the driver first, then
// a helper that finds the work finished).
template <class Recurrence>
void run_team(bool concurrent, Recurrence recurrence) {
  StepTeam team(concurrent);
  if (!concurrent) {
    recurrence(team);
    return;
  }
  std::atomic<int> entered{0};
  auto body = [&](int64_t, int) {
    if (entered.fetch_add(1) == 0) {
      recurrence(team);
      team.finish();
    } else {
      team.help();
    }
  };
  qgemm::parallel_for(2, 2, body);
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
  ScratchF32 xw(static_cast<size_t>(L * B * N));                           // every element written by the product
  project(p, d, L * B, N, xw.data(), true, [&](int64_t rows, auto call) {  // (RNN-ORT-GRU1)
    split_rows(threads, rows, I, N, call);
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
  // a batch-1 recurrence: its products on R_zr and R_h in row strips; else the panels
  const SeqGemmMlasFn row_fn = seq_row_strips_for(p.isa, true);
  const bool on_rows = row_fn != nullptr && B == 1 && (p.r_cols == kSeqRowStrip || L >= kRowStripMinSteps);
  const SeqGemmMlasFn step_mlas = on_rows ? row_fn : gemm_mlas;
  const int64_t cols = on_rows ? kSeqRowStrip : kSeqPanel;
  std::unique_ptr<Blocks> r_keep, rh_keep;
  const float* Rzr = in_blocks(p.r[d], H, 2 * H, p.r_cols, cols, r_keep);
  const float* Rh = in_blocks(p.r_h[d], H, H, p.r_cols, cols, rh_keep);
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
    step_mlas(h.data(), H, Rzr, H, 2 * H, zr.data(), 2 * H, B, true);  // H·R[zr]ᵀ onto X·W[zr]ᵀ
    if (lbr) {  // (RNN-ORT-GRU3) L = H·R[h]ᵀ onto Rb_h, or from 0
      if (p.bias) {
        for (int64_t b = 0; b < B; ++b) std::memcpy(lin.data() + b * H, rbh.data(), sizeof(float) * H);
      }
      step_mlas(h.data(), H, Rh, H, H, lin.data(), H, B, p.bias != nullptr);
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
      step_mlas(cur.data(), H, Rh, H, H, hin.data(), H, B, true);
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
  ScratchF32 xw(static_cast<size_t>(L * B * N));  // every element written by the product
  // (RNN1), or (RNN-ORT) for OrtLSTM: X[:L] · Wᵀ
  project(p, d, L * B, N, xw.data(), p.ort, [&](int64_t rows, auto call) { split_rows(threads, rows, I, N, call); });

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
  // a batch-1 recurrence: its products on R (and the GRU's R_h) in row strips; else the
  // panels
  const SeqGemmMlasFn row_fn = seq_row_strips_for(p.isa, p.ort);
  const bool on_rows = row_fn != nullptr && B == 1 && (p.r_cols == kSeqRowStrip || L >= kRowStripMinSteps);
  const int64_t cols = on_rows ? kSeqRowStrip : kSeqPanel;
  std::unique_ptr<Blocks> r_keep, rh_keep, r_strips;
  const float* R = in_blocks(p.r[d], H, p.gru ? 2 * H : N, p.r_cols, cols, r_keep);
  const float* Rh = p.gru ? in_blocks(p.r_h[d], H, H, p.r_cols, cols, rh_keep) : nullptr;
  // a long batch-6+ LSTM: H·Rᵀ on R's strips (same chains, same bytes)
  SeqGemmFn rgemm = gemm;
  const SeqGemmFn strips_fn = seq_gemm_strips_for(p.isa);
  if (!p.gru && !p.ort && strips_fn != nullptr && B >= 6 && L >= kStripMinSteps) {
    r_strips = std::make_unique<Blocks>(R, H, N, kSeqPanel, kSeqStrip);
    R = r_strips->data();
    rgemm = strips_fn;
  }
  // a step's product of ncols columns at w (R or R_h at a column): (RNN1), or for OrtLSTM
  // (RNN-ORT1) added onto y
  auto step_product = [&](const float* a, const float* w, int64_t ncols, float* y, int64_t ldy) {
    if (on_rows) {
      row_fn(a, H, w, H, ncols, y, ldy, B, p.ort);
    } else if (p.ort) {
      gemm_mlas(a, H, w, H, ncols, y, ldy, B, true);
    } else {
      rgemm(a, H, w, H, ncols, y, ldy, B);
    }
  };
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

  // threads: a step of kTeamMacs multiply-adds or more on two threads (StepTeam), its
  // products by column ranges of whole panels (pairs of panels for one row, seq_gemm's
  // batch-1 stream), its gates by rows; else one unit a phase.
  const bool concurrent = threads >= 2 && B * H * N >= kTeamMacs && N > kSeqPanel;
  auto col_units = [&](int64_t ncols) {
    const int64_t unit_cols = B == 1 && ncols >= 4 * kSeqPanel ? 2 * kSeqPanel : kSeqPanel;
    return concurrent ? std::min(StepTeam::kMaxUnits, (ncols + unit_cols - 1) / unit_cols) : int64_t{1};
  };
  // unit u of n over ncols columns: [c0, c1), whole panels but the last
  auto col_range = [&](int64_t ncols, int64_t n, int64_t u, int64_t* c0, int64_t* c1) {
    const int64_t panels = (ncols + kSeqPanel - 1) / kSeqPanel;
    *c0 = std::min(ncols, u * panels / n * kSeqPanel);
    *c1 = std::min(ncols, (u + 1) * panels / n * kSeqPanel);
  };
  const int64_t row_units = concurrent ? std::min<int64_t>(B, 256) : 1;
  auto rows_of = [&](int64_t u, int64_t* b0, int64_t* b1) {
    *b0 = u * B / row_units;
    *b1 = (u + 1) * B / row_units;
  };
  const int64_t nz = col_units(p.gru ? 2 * H : N), nh = p.gru ? col_units(H) : 0;

  run_team(concurrent, [&](StepTeam& team) {
    for (int64_t s = 0; s < L; ++s) {
      // (RNN1): H·Rᵀ, all gates (LSTM, GRU with linear_before_reset) or z, r only
      auto products = [&](int64_t u) {
        int64_t c0, c1;
        if (p.gru) {
          if (u < nz) {
            col_range(2 * H, nz, u, &c0, &c1);
            if (c0 < c1) step_product(h.data(), R + c0 * H, c1 - c0, hr.data() + c0, N);
          } else {
            col_range(H, nh, u - nz, &c0, &c1);
            if (c0 < c1) step_product(h.data(), Rh + c0 * H, c1 - c0, hr.data() + 2 * H + c0, N);
          }
          return;
        }
        col_range(N, nz, u, &c0, &c1);
        if (c0 >= c1) return;
        if (p.ort) {
          // (RNN-ORT): each active row's X·Wᵀ columns, then H·Rᵀ added onto them block by block
          for (int64_t b = 0; b < B; ++b) {
            if (s >= len[b]) continue;
            const int64_t ts = reverse ? len[b] - 1 - s : s;
            std::memcpy(hr.data() + b * N + c0, xw.data() + (ts * B + b) * N + c0, sizeof(float) * (c1 - c0));
          }
        }
        step_product(h.data(), R + c0 * H, c1 - c0, hr.data() + c0, N);
      };
      team.phase(nz + (lbr ? nh : 0), products);
      if (!p.gru) {
        auto gates = [&](int64_t u) {
          int64_t b0, b1;
          rows_of(u, &b0, &b1);
          for (int64_t b = b0; b < b1; ++b) {
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
        };
        team.phase(row_units, gates);
        continue;
      }
      // GRU: z and r of every active row first ((RNN6)); r ⊙ h feeds the h gate's product
      // without linear_before_reset ((RNN7)).
      auto zr_rows = [&](int64_t u) {
        int64_t b0, b1;
        rows_of(u, &b0, &b1);
        for (int64_t b = b0; b < b1; ++b) {
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
      };
      team.phase(row_units, zr_rows);
      if (!lbr) {  // (RNN1): (r ⊙ h)·Rhᵀ
        auto product_h = [&](int64_t u) {
          int64_t c0, c1;
          col_range(H, nh, u, &c0, &c1);
          if (c0 < c1) step_product(rh.data(), Rh + c0 * H, c1 - c0, hrh.data() + c0, H);
        };
        team.phase(nh, product_h);
      }
      auto h_rows = [&](int64_t u) {
        int64_t b0, b1;
        rows_of(u, &b0, &b1);
        for (int64_t b = b0; b < b1; ++b) {
          if (s >= len[b]) continue;
          const int64_t ts = reverse ? len[b] - 1 - s : s;
          const float* xg = xw.data() + (ts * B + b) * N + 2 * H;
          const float* z = zr_all.data() + b * 2 * H;
          const float* r = z + H;
          float* hb = h.data() + b * H;
          // (RNN8) with linear_before_reset, else (RNN7); then (RNN9)
          const float* hr_h = lbr ? hr.data() + b * N + 2 * H : hrh.data() + b * H;
          rows.onnx_gru_h(xg, hr_h, bp && lbr ? rb_h.data() : nullptr, r, z, bp ? bp + 2 * H : nullptr, p.clip, lbr, H,
                          hb);
          std::memcpy(p.y + ((ts * D + d) * B + b) * H, hb, sizeof(float) * H);
          if (s + 1 == len[b]) std::memcpy(yh + b * H, hb, sizeof(float) * H);
        }
      };
      team.phase(row_units, h_rows);
    }
  });
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

void gru_gates(const float* gx, const float* gh, const float* h, float* h_out, int64_t B, int64_t H, const int order[3],
               Isa isa) {
  const float_ops::Kernels& fk = float_ops::kernels_for(isa);
  const float_ops::UnaryRunFn sigmoid = fk.unary[static_cast<int>(float_ops::UnaryOp::kSigmoid)];
  const float_ops::UnaryRunFn tanh = fk.unary[static_cast<int>(float_ops::UnaryOp::kTanh)];
  std::vector<float> act(static_cast<size_t>(4 * H));
  float* a = act.data();
  float* r = a + H;
  float* z = r + H;
  float* n = z + H;
  for (int64_t b = 0; b < B; ++b) {
    const float* x = gx + b * 3 * H;
    const float* y = gh + b * 3 * H;
    const float *xr = x + order[0] * H, *xz = x + order[1] * H, *xn = x + order[2] * H;
    const float *yr = y + order[0] * H, *yz = y + order[1] * H, *yn = y + order[2] * H;
    for (int64_t j = 0; j < H; ++j) a[j] = yr[j] + xr[j];  // (GG1)
    sigmoid(a, r, H);
    for (int64_t j = 0; j < H; ++j) a[j] = yz[j] + xz[j];
    sigmoid(a, z, H);
    for (int64_t j = 0; j < H; ++j) a[j] = xn[j] + r[j] * yn[j];  // (GG2), no contraction
    tanh(a, n, H);
    const float* hb = h + b * H;
    float* ho = h_out + b * H;
    for (int64_t j = 0; j < H; ++j) ho[j] = (hb[j] - n[j]) * z[j] + n[j];  // (GG3)
  }
}

}  // namespace recurrent
}  // namespace quanta
