// AVX2 MaxPool 2x2 stride 2 (max_pool_2x2_avx2.h).
#include "pool/max_pool_2x2_avx2.h"

#include <immintrin.h>

namespace quanta {
namespace pool {
namespace {

// nanmax(m, v): vmaxps(v, m) gives m when either is NaN (and of equal values m), so only
// a NaN v is put back.
inline __m256 nanmax(__m256 m, __m256 v) {
  return _mm256_blendv_ps(_mm256_max_ps(v, m), v, _mm256_cmp_ps(v, v, _CMP_UNORD_Q));
}

inline float nanmax(float m, float v) { return (v > m || v != v) ? v : m; }

// The maxima of the column pairs (2i, 2i + 1) of 16 values: lanes in the shuffles' order
// (pairs 0 1 4 5 | 2 3 6 7), put in order by the caller's permute.
inline __m256 pair_max(const float* r) {
  const __m256 a = _mm256_loadu_ps(r), b = _mm256_loadu_ps(r + 8);
  return nanmax(_mm256_shuffle_ps(a, b, 0x88), _mm256_shuffle_ps(a, b, 0xDD));
}

}  // namespace

void max_plane_2x2s2_avx2(const float* x, float* y, const Geometry2d& g) {
  for (int64_t oy = 0; oy < g.out_h; ++oy) {
    const float* r0 = x + 2 * oy * g.w;
    const float* r1 = r0 + g.w;
    float* out = y + oy * g.out_w;
    int64_t ox = 0;
    for (; ox + 8 <= g.out_w; ox += 8) {
      const __m256 m = nanmax(pair_max(r0 + 2 * ox), pair_max(r1 + 2 * ox));
      _mm256_storeu_ps(out + ox, _mm256_castpd_ps(_mm256_permute4x64_pd(_mm256_castps_pd(m), 0xD8)));
    }
    for (; ox < g.out_w; ++ox) {
      const int64_t c = 2 * ox;
      out[ox] = nanmax(nanmax(r0[c], r0[c + 1]), nanmax(r1[c], r1[c + 1]));
    }
  }
}

}  // namespace pool
}  // namespace quanta
