// ort_spatial.h kernels with AVX2: the resize row 8 output columns at a time (vgatherdps
// for the four input values of each column, then (RB2)-(RB3) lane by lane in the
// contract's order, no FMA); the average is the generic loop compiled with AVX2's flags.
#include <immintrin.h>

#include <cstdint>

#include "ort_spatial/ort_spatial_kernels.h"

namespace quanta {
namespace ort_spatial {
namespace {

void resize_row_avx2(const float* r1, const float* r2, float dy1, float dy2, const ResizeTaps& t, float* y) {
  const __m256 vdy1 = _mm256_set1_ps(dy1), vdy2 = _mm256_set1_ps(dy2);
  int64_t j = 0;
  for (; j + 8 <= t.n_w; j += 8) {
    const __m256i i1 = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(t.x1 + j));
    const __m256i i2 = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(t.x2 + j));
    const __m256 dx1 = _mm256_loadu_ps(t.dx1 + j), dx2 = _mm256_loadu_ps(t.dx2 + j);
    const __m256 a = _mm256_i32gather_ps(r1, i1, 4), b = _mm256_i32gather_ps(r1, i2, 4);
    const __m256 c = _mm256_i32gather_ps(r2, i1, 4), d = _mm256_i32gather_ps(r2, i2, 4);
    __m256 s = _mm256_add_ps(_mm256_mul_ps(_mm256_mul_ps(dx2, vdy2), a), _mm256_mul_ps(_mm256_mul_ps(dx1, vdy2), b));
    s = _mm256_add_ps(s, _mm256_mul_ps(_mm256_mul_ps(dx2, vdy1), c));
    _mm256_storeu_ps(y + j, _mm256_add_ps(s, _mm256_mul_ps(_mm256_mul_ps(dx1, vdy1), d)));
  }
  resize_columns(r1, r2, dy1, dy2, t, y, j);
}

}  // namespace

const Kernels kKernelsAvx2 = {resize_row_avx2, average_planes_generic, average_planes_vector};

}  // namespace ort_spatial
}  // namespace quanta
