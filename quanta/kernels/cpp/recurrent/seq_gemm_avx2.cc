// AVX2 seq_gemm (float_rnn.h (RNN1)): 8 columns per vector, one row x 4 vectors per block
// (32 columns); masked column tails (vmaskmovps). Each accumulator lane adds
// its products in increasing k, as the twin: separate vmulps and vaddps (no FMA).
#include <immintrin.h>

#include <cstdint>

#include "recurrent/float_rnn.h"

namespace quanta {
namespace recurrent {
namespace {

inline __m256i tail_mask(int64_t left) {
  const int n = left >= 8 ? 8 : left <= 0 ? 0 : static_cast<int>(left);
  return _mm256_cmpgt_epi32(_mm256_set1_epi32(n), _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7));
}

template <int RB, int NV>
void block(const float* a, int64_t lda, const float* w, int64_t ldw, float* y, int64_t ldy, int64_t K, int64_t N,
           int64_t n0) {
  __m256i m[NV];
#pragma GCC unroll 8
  for (int v = 0; v < NV; ++v) m[v] = tail_mask(N - n0 - 8 * v);
  __m256 acc[RB][NV];
#pragma GCC unroll 8
  for (int r = 0; r < RB; ++r)
#pragma GCC unroll 8
    for (int v = 0; v < NV; ++v) acc[r][v] = _mm256_setzero_ps();
  for (int64_t k = 0; k < K; ++k) {
    __m256 wv[NV];
#pragma GCC unroll 8
    for (int v = 0; v < NV; ++v) wv[v] = _mm256_maskload_ps(w + k * ldw + n0 + 8 * v, m[v]);
#pragma GCC unroll 8
    for (int r = 0; r < RB; ++r) {
      const __m256 av = _mm256_set1_ps(a[r * lda + k]);
#pragma GCC unroll 8
      for (int v = 0; v < NV; ++v) acc[r][v] = _mm256_add_ps(acc[r][v], _mm256_mul_ps(av, wv[v]));
    }
  }
  for (int r = 0; r < RB; ++r)
    for (int v = 0; v < NV; ++v) _mm256_maskstore_ps(y + r * ldy + n0 + 8 * v, m[v], acc[r][v]);
}

void seq_gemm(const float* a, int64_t lda, const float* w, int64_t K, int64_t N, float* y, int64_t ldy, int64_t M) {
  // Panel by panel (kSeqPanel columns, [K][kSeqPanel] contiguous): a panel stays in the
  // cache while every row block passes over it, and each k step reads contiguous bytes.
  for (int64_t p0 = 0; p0 < N; p0 += kSeqPanel) {
    const float* wp = w + p0 * K;
    const int64_t np = N - p0 < kSeqPanel ? N - p0 : kSeqPanel;
    // One row at a time over the panel (in L2 after the first row): a 4-row register
    // block ran 5-10x slower inside the module build (measured, H = 512), one row at a
    // time streams at the cache's speed.
    for (int64_t m0 = 0; m0 < M; ++m0)
      for (int64_t n0 = 0; n0 < np; n0 += 32)
        block<1, 4>(a + m0 * lda, lda, wp, kSeqPanel, y + m0 * ldy + p0, ldy, K, np, n0);
  }
}

}  // namespace

extern const SeqGemmFn kSeqGemmAvx2 = seq_gemm;

}  // namespace recurrent
}  // namespace quanta
