// Portable seq_gemm (float_rnn.h (RNN1)): per row, the N accumulators take their products
// in increasing k (the compiler may vectorize over n; that keeps every lane's order).
#include <cstdint>

#include "recurrent/float_rnn.h"

namespace quanta {
namespace recurrent {
namespace {

void seq_gemm(const float* a, int64_t lda, const float* w, int64_t K, int64_t N, float* y, int64_t ldy, int64_t M) {
  for (int64_t p0 = 0; p0 < N; p0 += kSeqPanel) {
    const float* wp = w + p0 * K;
    const int64_t np = N - p0 < kSeqPanel ? N - p0 : kSeqPanel;
    for (int64_t m = 0; m < M; ++m) {
      float* acc = y + m * ldy + p0;
      for (int64_t n = 0; n < np; ++n) acc[n] = 0.0f;
      for (int64_t k = 0; k < K; ++k) {
        const float av = a[m * lda + k];
        const float* wk = wp + k * kSeqPanel;
        for (int64_t n = 0; n < np; ++n) acc[n] = acc[n] + av * wk[n];
      }
    }
  }
}

}  // namespace

extern const SeqGemmFn kSeqGemmPortable = seq_gemm;

}  // namespace recurrent
}  // namespace quanta
