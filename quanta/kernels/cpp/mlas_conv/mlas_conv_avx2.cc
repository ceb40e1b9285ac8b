// (MC3)-(MC4) with AVX2 + FMA: 4 rows × 16 columns a tile (8 accumulators), the layout of
// MLAS's FMA3 SGEMM kernel; each lane is one output's chain, so the tile shape does not
// change any result. Columns past cn are masked.
#include <immintrin.h>

#include "mlas_conv/mlas_conv.h"

namespace quanta {
namespace mlas_conv {
namespace {

inline __m256i tail_mask(int64_t left) {
  const int n = left >= 8 ? 8 : left <= 0 ? 0 : static_cast<int>(left);
  return _mm256_cmpgt_epi32(_mm256_set1_epi32(n), _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7));
}

template <int R>
void tile(const float* a, int64_t lda, const float* b, int64_t ldb, float* y, int64_t ldy, int64_t cols, int64_t k,
          int64_t sk) {
  const __m256i m0 = tail_mask(cols), m1 = tail_mask(cols - 8);
  __m256 out[R][2];
  for (int r = 0; r < R; ++r) out[r][0] = out[r][1] = _mm256_setzero_ps();  // K >= 1 overwrites it
  for (int64_t k0 = 0; k0 < k; k0 += sk) {
    const int64_t k1 = k < k0 + sk ? k : k0 + sk;
    __m256 acc[R][2];
    for (int r = 0; r < R; ++r) acc[r][0] = acc[r][1] = _mm256_setzero_ps();
    for (int64_t kk = k0; kk < k1; ++kk) {
      const __m256 b0 = _mm256_maskload_ps(b + kk * ldb, m0);
      const __m256 b1 = _mm256_maskload_ps(b + kk * ldb + 8, m1);
      for (int r = 0; r < R; ++r) {
        const __m256 av = _mm256_broadcast_ss(a + r * lda + kk);
        acc[r][0] = _mm256_fmadd_ps(av, b0, acc[r][0]);
        acc[r][1] = _mm256_fmadd_ps(av, b1, acc[r][1]);
      }
    }
    for (int r = 0; r < R; ++r) {
      if (k0 == 0) {
        out[r][0] = acc[r][0];
        out[r][1] = acc[r][1];
      } else {
        out[r][0] = _mm256_add_ps(out[r][0], acc[r][0]);
        out[r][1] = _mm256_add_ps(out[r][1], acc[r][1]);
      }
    }
  }
  for (int r = 0; r < R; ++r) {
    _mm256_maskstore_ps(y + r * ldy, m0, out[r][0]);
    _mm256_maskstore_ps(y + r * ldy + 8, m1, out[r][1]);
  }
}

}  // namespace

void chains_avx2(const float* a, int64_t lda, const float* b, int64_t ldb, float* y, int64_t ldy, int64_t rows,
                 int64_t cn, int64_t k, int64_t sk) {
  for (int64_t n0 = 0; n0 < cn; n0 += 16) {
    const int64_t cols = cn - n0 < 16 ? cn - n0 : 16;
    int64_t r = 0;
    for (; r + 4 <= rows; r += 4) tile<4>(a + r * lda, lda, b + n0, ldb, y + r * ldy + n0, ldy, cols, k, sk);
    for (; r < rows; ++r) tile<1>(a + r * lda, lda, b + n0, ldb, y + r * ldy + n0, ldy, cols, k, sk);
  }
}

}  // namespace mlas_conv
}  // namespace quanta
