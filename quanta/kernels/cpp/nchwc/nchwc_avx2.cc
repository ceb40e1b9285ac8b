// AVX2 + FMA NCHW16c micro-kernels (contract: nchwc.h): a 16-channel block is two ymm; a
// group-1 tile holds up to 6 pixels × 1 output block (12 accumulators, 2 weight vectors,
// 1 broadcast of the 16 ymm registers) or 3 pixels × 2 blocks. Rows of at least kWideRow
// pixels take the 6 × 1 tiles (max_nb 1): on Zen 3, one thread, they took 0.78-0.94x the
// 3 × 2 tiles' time on most layers measured (1x1 layers, 3x3 at 7 x 7 to 60 x 60), about
// the same on 96 -> 96 3x3 at 52 x 52 and 104 x 104, 1.03x at 26 x 26 (docs/kernels.md,
// NCHW16c). Narrower rows keep 3 × 2 (nchwc.h kWideRow).
#include <immintrin.h>

#include "nchwc/nchwc.h"

namespace quanta {
namespace nchwc {
namespace {

struct O {
  static constexpr int kEmbedMaxNb = 0;
  static constexpr bool kDwRowReuse = false;
  struct V {
    __m256 a, b;
  };
  static V zero() { return {_mm256_setzero_ps(), _mm256_setzero_ps()}; }
  static V set1(float v) { return {_mm256_set1_ps(v), _mm256_set1_ps(v)}; }
  static V load(const float* p) { return {_mm256_loadu_ps(p), _mm256_loadu_ps(p + 8)}; }
  static void store(float* p, V v) {
    _mm256_storeu_ps(p, v.a);
    _mm256_storeu_ps(p + 8, v.b);
  }
  static V add(V x, V y) { return {_mm256_add_ps(x.a, y.a), _mm256_add_ps(x.b, y.b)}; }
  static V div(V x, V y) { return {_mm256_div_ps(x.a, y.a), _mm256_div_ps(x.b, y.b)}; }
  // vmaxps(v, m) returns m when either is NaN: only a NaN v needs putting back
  static __m256 max_nan8(__m256 m, __m256 v) {
    return _mm256_blendv_ps(_mm256_max_ps(v, m), v, _mm256_cmp_ps(v, v, _CMP_UNORD_Q));
  }
  static V max_nan(V m, V v) { return {max_nan8(m.a, v.a), max_nan8(m.b, v.b)}; }
  static V max(V x, V y) { return {_mm256_max_ps(x.a, y.a), _mm256_max_ps(x.b, y.b)}; }
  static V min(V x, V y) { return {_mm256_min_ps(x.a, y.a), _mm256_min_ps(x.b, y.b)}; }
  static V fma(V x, V y, V c) { return {_mm256_fmadd_ps(x.a, y.a, c.a), _mm256_fmadd_ps(x.b, y.b, c.b)}; }
  static V fma_bcast(V w, const float* p, V c) {
    const __m256 s = _mm256_broadcast_ss(p);
    return {_mm256_fmadd_ps(w.a, s, c.a), _mm256_fmadd_ps(w.b, s, c.b)};
  }
};

#include "nchwc/tile.h"

}  // namespace

extern const Kernels kKernelsAvx2 = {
    "avx2",
    {6, 3, 0, 0},
    1,
    {QUANTA_NCHWC_ROW(O, 1, 6), QUANTA_NCHWC_ROW(O, 2, 3), QUANTA_NCHWC_ROW(O, 3, 0), QUANTA_NCHWC_ROW(O, 4, 0)},
    QUANTA_NCHWC_PAIRS(O),
    QUANTA_NCHWC_ROWS(O),
    4,
    QUANTA_NCHWC_DW_ROW(O, 4),
    nchwc_max_pool_plane<O>,
    nchwc_gap_block<O>,
};

}  // namespace nchwc
}  // namespace quanta
