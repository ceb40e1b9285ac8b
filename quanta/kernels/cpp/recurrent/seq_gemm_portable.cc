// Portable seq_gemm (float_rnn.h (RNN1)): per row, the N accumulators take their products
// in increasing k (the compiler may vectorize over n; that keeps every lane's order).
#include <cmath>
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

// seq_gemm_mlas (float_rnn.h): std::fma is the fused multiply-add, one rounding.
void seq_gemm_mlas(const float* a, int64_t lda, const float* w, int64_t K, int64_t N, float* y, int64_t ldy, int64_t M,
                   bool accumulate) {
  for (int64_t p0 = 0; p0 < N; p0 += kSeqPanel) {
    const float* wp = w + p0 * K;
    const int64_t np = N - p0 < kSeqPanel ? N - p0 : kSeqPanel;
    float acc[kSeqPanel];
    for (int64_t m = 0; m < M; ++m) {
      float* out = y + m * ldy + p0;
      for (int64_t k0 = 0; k0 < K || k0 == 0; k0 += kMlasStrideK) {
        for (int64_t n = 0; n < np; ++n) acc[n] = 0.0f;
        const int64_t k1 = K < k0 + kMlasStrideK ? K : k0 + kMlasStrideK;
        for (int64_t k = k0; k < k1; ++k) {
          const float av = a[m * lda + k];
          const float* wk = wp + k * kSeqPanel;
          for (int64_t n = 0; n < np; ++n) acc[n] = std::fma(av, wk[n], acc[n]);
        }
        const bool add = accumulate || k0 > 0;
        for (int64_t n = 0; n < np; ++n) out[n] = add ? acc[n] + out[n] : acc[n];
      }
    }
  }
}

}  // namespace

extern const SeqGemmFn kSeqGemmPortable = seq_gemm;
extern const SeqGemmMlasFn kSeqGemmMlasPortable = seq_gemm_mlas;

}  // namespace recurrent
}  // namespace quanta
