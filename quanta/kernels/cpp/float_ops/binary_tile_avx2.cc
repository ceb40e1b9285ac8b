// AVX2 rows of binary_tile.h: one vector operation per 8 elements, the row's last
// inner % 8 elements scalar (the same IEEE operation).
#include <immintrin.h>

#include "float_ops/binary_tile.h"

namespace quanta {
namespace float_ops {
namespace {

template <typename V, typename S>
void rows_of(const float* a, int64_t as, const float* b, int64_t bs, float* c, int64_t rows, int64_t inner, V vop,
             S sop) {
  const int64_t whole = inner & ~int64_t{7};
  for (int64_t r = 0; r < rows; ++r) {
    const float* ar = a + r * as;
    const float* br = b + r * bs;
    float* cr = c + r * inner;
    int64_t i = 0;
    for (; i < whole; i += 8) _mm256_storeu_ps(cr + i, vop(_mm256_loadu_ps(ar + i), _mm256_loadu_ps(br + i)));
    for (; i < inner; ++i) cr[i] = sop(ar[i], br[i]);
  }
}

}  // namespace

void binary_tile_rows_avx2(BinaryOp op, const float* a, int64_t as, const float* b, int64_t bs, float* c, int64_t rows,
                           int64_t inner) {
  switch (op) {
    case BinaryOp::kAdd:
      rows_of(
          a, as, b, bs, c, rows, inner, [](__m256 x, __m256 y) { return _mm256_add_ps(x, y); },
          [](float x, float y) { return x + y; });
      break;
    case BinaryOp::kSub:
      rows_of(
          a, as, b, bs, c, rows, inner, [](__m256 x, __m256 y) { return _mm256_sub_ps(x, y); },
          [](float x, float y) { return x - y; });
      break;
    case BinaryOp::kMul:
      rows_of(
          a, as, b, bs, c, rows, inner, [](__m256 x, __m256 y) { return _mm256_mul_ps(x, y); },
          [](float x, float y) { return x * y; });
      break;
    case BinaryOp::kDiv:
      rows_of(
          a, as, b, bs, c, rows, inner, [](__m256 x, __m256 y) { return _mm256_div_ps(x, y); },
          [](float x, float y) { return x / y; });
      break;
    default: break;  // the caller walks the other ops' runs
  }
}

}  // namespace float_ops
}  // namespace quanta
