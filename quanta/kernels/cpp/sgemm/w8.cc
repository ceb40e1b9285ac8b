// Driver of the weight-only 8-bit float GEMM (contract: w8.h).
#include "sgemm/w8.h"

#include <algorithm>

#include "qgemm/thread_pool.h"

namespace quanta {
namespace sgemm {

namespace {

// K rows dequantized per micro-panel: 128 x 32 floats (16 KB) leave half of the L1 to the
// A rows and the int8 stream (a 256-row panel is the whole 32 KB L1 of Zen 4). A K block
// ends each tile's chain in C and the next one continues it from there (load_c), so the
// bytes do not depend on it.
constexpr int64_t kKc = 128;
// sgemm.cc's parallel threshold.
constexpr int64_t kMinParallelMacs = int64_t{1} << 18;

int64_t ceil_div(int64_t a, int64_t b) { return (a + b - 1) / b; }

DequantPanelFn dequant_for(Isa isa) {
  switch (isa) {
    case Isa::kAvx512Vnni: return dequant_panel_avx512vnni;
    case Isa::kAvx2: return dequant_panel_avx2;
    default: return dequant_panel_portable;
  }
}

}  // namespace

void pack_b_w8(const int8_t* q, int64_t rs, int64_t cs, int64_t k, int64_t n, int8_t* out) {
  for (int64_t p = 0; p < ceil_div(n, kPackNr); ++p) {
    int8_t* dst = out + p * k * kPackNr;
    for (int64_t kk = 0; kk < k; ++kk) {
      for (int64_t r = 0; r < kPackNr; ++r) {
        const int64_t j = p * kPackNr + r;
        dst[kk * kPackNr + r] = j < n ? q[kk * rs + j * cs] : int8_t{0};
      }
    }
  }
}

void dequant_panel_portable(const int8_t* q, const float* zp, const float* scale, int64_t kc, float* out) {
  for (int64_t kk = 0; kk < kc; ++kk) {
    for (int j = 0; j < kPackNr; ++j) {
      const float d = static_cast<float>(q[kk * kPackNr + j]) - zp[j];
      out[kk * kPackNr + j] = d * scale[j];
    }
  }
}

void gemm_w8(int64_t m, int64_t n, int64_t k, const float* a, int64_t lda, const int8_t* q, const float* zp,
             const float* scale, float* c, const Epilogue& ep, int num_threads, Isa isa) {
  if (m <= 0 || n <= 0) return;
  const Kernels& kr = kernels_for(isa);
  const DequantPanelFn dequant = dequant_for(isa);
  if (k == 0) {
    empty_product(1, m, n, ep, c);
    return;
  }
  const int64_t panels = ceil_div(n, kPackNr);
  // A task is a run of whole 32-column panels over every row: each micro-panel is
  // dequantized once per run and serves all rows while it is in L1.
  const int threads = m * n * k < kMinParallelMacs ? 1 : num_threads;
  int64_t per = std::min<int64_t>(panels, k > 1024 ? 4 : 8);
  if (threads > 1) per = std::max<int64_t>(1, std::min(per, ceil_div(panels, 4 * int64_t{threads})));
  const int64_t tasks = ceil_div(panels, per);
  auto body = [&](int64_t task, int) {
    alignas(64) float buf[kKc * kPackNr];
    const int64_t p0 = task * per, p1 = std::min(panels, p0 + per);
    // Panel by panel, its K blocks in order: the int8 weight is read front to back in one
    // sequential stream (what the hardware prefetcher follows best), and the C tile a
    // K block leaves for the next is still in L1.
    for (int64_t p = p0; p < p1; ++p) {
      for (int64_t k0 = 0; k0 < k; k0 += kKc) {
        const int64_t kc = std::min(kKc, k - k0);
        const bool last = k0 + kc >= k;
        dequant(q + p * k * kPackNr + k0 * kPackNr, zp + p * kPackNr, scale + p * kPackNr, kc, buf);
        const int64_t pend = std::min(n, (p + 1) * kPackNr);
        for (int64_t j = p * kPackNr; j < pend; j += kr.nr) {
          Tile t;
          t.k = kc;
          t.nr = static_cast<int>(std::min<int64_t>(kr.nr, pend - j));
          t.b = buf + j % kPackNr;
          t.ldb = kPackNr;
          t.ldc = n;
          t.load_c = k0 > 0;
          t.ep = last ? &ep : nullptr;
          t.col0 = j;
          t.a_rs = lda;
          for (int64_t i = 0; i < m; i += kr.mr_rows) {
            const int r = static_cast<int>(std::min<int64_t>(kr.mr_rows, m - i));
            t.a = a + i * lda + k0;
            t.c = c + i * n + j;
            t.row0 = i;
            kr.tile[0][r](t);
          }
        }
      }
    }
  };
  qgemm::parallel_for(threads, tasks, body);  // inline on one thread or one task
}

}  // namespace sgemm
}  // namespace quanta
