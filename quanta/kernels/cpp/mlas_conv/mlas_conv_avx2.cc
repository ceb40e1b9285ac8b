// (MC3)-(MC4) with AVX2 + FMA for one K block on im2col rows (row stride ldb, whole
// 16-column groups, zero-padded): up to 6 rows × 16 columns a tile (12 accumulators), the register layout of
// MLAS's FMA3 SGEMM kernel. Each lane is one output's chain, so the tile shape changes no
// result. The first K block stores its sums; each further block adds its own to y (one
// addition per output, as MLAS's accumulate mode). Columns past `cols` are masked at the
// store.
#include <immintrin.h>

#include "mlas_conv/mlas_conv.h"

namespace quanta {
namespace mlas_conv {
namespace {

inline __m256i tail_mask(int64_t left) {
  const int n = left >= 8 ? 8 : left <= 0 ? 0 : static_cast<int>(left);
  return _mm256_cmpgt_epi32(_mm256_set1_epi32(n), _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7));
}

// Every loop over the rows is unrolled, so the 2·R accumulators stay in registers (a
// rolled loop indexing acc[r] keeps them in memory, one store per FMA: half the speed).
template <int R>
void tile(const float* a, int64_t lda, const float* b, int64_t ldb, float* y, int64_t ldy, int64_t cols, int64_t kb,
          bool accumulate) {
  __m256 acc[R][2];
#pragma GCC unroll 6
  for (int r = 0; r < R; ++r) acc[r][0] = acc[r][1] = _mm256_setzero_ps();
  const float* p = b;
  for (int64_t kk = 0; kk < kb; ++kk, p += ldb) {
    const __m256 b0 = _mm256_loadu_ps(p);
    const __m256 b1 = _mm256_loadu_ps(p + 8);
#pragma GCC unroll 6
    for (int r = 0; r < R; ++r) {
      const __m256 av = _mm256_broadcast_ss(a + r * lda + kk);
      acc[r][0] = _mm256_fmadd_ps(av, b0, acc[r][0]);
      acc[r][1] = _mm256_fmadd_ps(av, b1, acc[r][1]);
    }
  }
  if (cols == 16) {
#pragma GCC unroll 6
    for (int r = 0; r < R; ++r) {
      float* yr = y + r * ldy;
      if (accumulate) {
        acc[r][0] = _mm256_add_ps(_mm256_loadu_ps(yr), acc[r][0]);
        acc[r][1] = _mm256_add_ps(_mm256_loadu_ps(yr + 8), acc[r][1]);
      }
      _mm256_storeu_ps(yr, acc[r][0]);
      _mm256_storeu_ps(yr + 8, acc[r][1]);
    }
    return;
  }
  const __m256i m0 = tail_mask(cols), m1 = tail_mask(cols - 8);
#pragma GCC unroll 6
  for (int r = 0; r < R; ++r) {
    float* yr = y + r * ldy;
    if (accumulate) {
      acc[r][0] = _mm256_add_ps(_mm256_maskload_ps(yr, m0), acc[r][0]);
      acc[r][1] = _mm256_add_ps(_mm256_maskload_ps(yr + 8, m1), acc[r][1]);
    }
    _mm256_maskstore_ps(yr, m0, acc[r][0]);
    _mm256_maskstore_ps(yr + 8, m1, acc[r][1]);
  }
}

}  // namespace

void chains_avx2(const float* a, int64_t lda, const float* b, int64_t ldb, float* y, int64_t ldy, int64_t rows,
                 int64_t cn, int64_t kb, bool accumulate) {
  for (int64_t n0 = 0; n0 < cn; n0 += 16) {
    const int64_t cols = cn - n0 < 16 ? cn - n0 : 16;
    const float* bc = b + n0;
    float* yc = y + n0;
    int64_t r = 0;
    for (; r + 6 <= rows; r += 6) tile<6>(a + r * lda, lda, bc, ldb, yc + r * ldy, ldy, cols, kb, accumulate);
    switch (rows - r) {
      case 5: tile<5>(a + r * lda, lda, bc, ldb, yc + r * ldy, ldy, cols, kb, accumulate); break;
      case 4: tile<4>(a + r * lda, lda, bc, ldb, yc + r * ldy, ldy, cols, kb, accumulate); break;
      case 3: tile<3>(a + r * lda, lda, bc, ldb, yc + r * ldy, ldy, cols, kb, accumulate); break;
      case 2: tile<2>(a + r * lda, lda, bc, ldb, yc + r * ldy, ldy, cols, kb, accumulate); break;
      case 1: tile<1>(a + r * lda, lda, bc, ldb, yc + r * ldy, ldy, cols, kb, accumulate); break;
      default: break;
    }
  }
}

void chain_m1_avx2(const float* a, const float* b, int64_t ldb, int64_t kb, int64_t cn, float* y, bool accumulate) {
  // per output the portable chain's operations in its order (mul, then adds, no FMA);
  // the vector holds 8 independent outputs, the tail is the portable code itself
  const int64_t n8 = cn / 8 * 8;
  for (int64_t n = 0; n < n8; n += 8) {
    __m256 acc = accumulate ? _mm256_loadu_ps(y + n) : _mm256_setzero_ps();
    const float* bn = b + n;
    int64_t kk = 0;
    for (; kk + 4 <= kb; kk += 4) {
      const float* b0 = bn + kk * ldb;
      __m256 t = _mm256_mul_ps(_mm256_set1_ps(a[kk]), _mm256_loadu_ps(b0));
      t = _mm256_add_ps(t, _mm256_mul_ps(_mm256_set1_ps(a[kk + 1]), _mm256_loadu_ps(b0 + ldb)));
      t = _mm256_add_ps(t, _mm256_mul_ps(_mm256_set1_ps(a[kk + 2]), _mm256_loadu_ps(b0 + 2 * ldb)));
      t = _mm256_add_ps(t, _mm256_mul_ps(_mm256_set1_ps(a[kk + 3]), _mm256_loadu_ps(b0 + 3 * ldb)));
      acc = _mm256_add_ps(t, acc);
    }
    if (kb - kk >= 2) {
      const float* b0 = bn + kk * ldb;
      const __m256 t = _mm256_add_ps(_mm256_mul_ps(_mm256_set1_ps(a[kk]), _mm256_loadu_ps(b0)),
                                     _mm256_mul_ps(_mm256_set1_ps(a[kk + 1]), _mm256_loadu_ps(b0 + ldb)));
      acc = _mm256_add_ps(t, acc);
      kk += 2;
    }
    if (kb - kk == 1) acc = _mm256_add_ps(_mm256_mul_ps(_mm256_set1_ps(a[kk]), _mm256_loadu_ps(bn + kk * ldb)), acc);
    _mm256_storeu_ps(y + n, acc);
  }
  if (n8 < cn) chain_m1_portable(a, b + n8, ldb, kb, cn - n8, y + n8, accumulate);
}

}  // namespace mlas_conv
}  // namespace quanta
