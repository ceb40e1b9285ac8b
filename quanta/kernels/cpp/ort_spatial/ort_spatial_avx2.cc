// ort_spatial.h kernels with AVX2: the resize's column gather 8 columns at a time
// (vgatherdps); the rest is the generic code compiled with AVX2's flags (the compiler
// vectorises the per-column and per-output loops; -ffp-contract=off keeps every product and
// sum its own rounding).
#include <immintrin.h>

#include <cstdint>

#include "ort_spatial/ort_spatial_kernels.h"

namespace quanta {
namespace ort_spatial {
namespace {

void resize_gather_avx2(const float* row, const ResizeTaps& t, float* c1, float* c2) {
  int64_t j = 0;
  for (; j + 8 <= t.n_w; j += 8) {
    const __m256i i1 = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(t.x1 + j));
    const __m256i i2 = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(t.x2 + j));
    _mm256_storeu_ps(c1 + j, _mm256_i32gather_ps(row, i1, 4));
    _mm256_storeu_ps(c2 + j, _mm256_i32gather_ps(row, i2, 4));
  }
  resize_gather_from(row, t, c1, c2, j);
}

}  // namespace

const Kernels kKernelsAvx2 = {resize_gather_avx2, resize_combine, average_planes_generic, average_planes_vector};

}  // namespace ort_spatial
}  // namespace quanta
