// AVX-512 NCHW16c micro-kernels (contract: nchwc.h): a 16-channel block is one zmm; a
// group-1 tile holds up to 6 pixels × 4 output blocks (24 accumulators, 4 weight vectors)
// or 8 pixels × up to 3 blocks, each step one vfmadd231ps per accumulator with the input
// value broadcast (embedded in the fma for 1-2 blocks, one vbroadcastss for 3-4).
#include <immintrin.h>

#include "nchwc/nchwc.h"

namespace quanta {
namespace nchwc {
namespace {

struct O {
  using V = __m512;
  // one or two output blocks: the broadcast in each fma (a separate vbroadcastss would be a
  // second vector uop per fma); three or four: one vbroadcastss shared by the blocks' fmas
  static constexpr int kEmbedMaxNb = 2;
  static constexpr bool kDwRowReuse = true;
  static V zero() { return _mm512_setzero_ps(); }
  static V set1(float v) { return _mm512_set1_ps(v); }
  static V load(const float* p) { return _mm512_loadu_ps(p); }
  static void store(float* p, V v) { _mm512_storeu_ps(p, v); }
  static V add(V a, V b) { return _mm512_add_ps(a, b); }
  static V div(V a, V b) { return _mm512_div_ps(a, b); }
  // vmaxps(v, m) returns m when either is NaN: only a NaN v needs putting back
  static V max_nan(V m, V v) { return _mm512_mask_blend_ps(_mm512_cmp_ps_mask(v, v, _CMP_UNORD_Q), max(v, m), v); }
  // The masked forms with every lane set: the plain ones start from _mm512_undefined_ps,
  // which GCC 12 reports as maybe-uninitialized once inlined into the tiles.
  static V max(V a, V b) { return _mm512_mask_max_ps(b, static_cast<__mmask16>(0xFFFF), a, b); }
  static V min(V a, V b) { return _mm512_mask_min_ps(b, static_cast<__mmask16>(0xFFFF), a, b); }
  static V fma(V a, V b, V c) { return _mm512_fmadd_ps(a, b, c); }
  // The broadcast embedded in the fma (one fused load uop per fma, as MLAS's kernel): with
  // the intrinsics GCC shares one vbroadcastss among the output blocks, an extra uop on
  // the vector pipes the fmas need.
  static V fma_bcast(V w, const float* p, V c) {
    asm("vfmadd231ps %2%{1to16%}, %1, %0" : "+v"(c) : "v"(w), "m"(*p));
    return c;
  }
};

#include "nchwc/tile.h"

}  // namespace

extern const Kernels kKernelsAvx512Vnni = {
    "avx512vnni",
    {8, 8, 8, 6},
    4,
    {QUANTA_NCHWC_ROW(O, 1, 8), QUANTA_NCHWC_ROW(O, 2, 8), QUANTA_NCHWC_ROW(O, 3, 8), QUANTA_NCHWC_ROW(O, 4, 6)},
    QUANTA_NCHWC_PAIRS(O),
    QUANTA_NCHWC_ROWS(O),
    8,
    QUANTA_NCHWC_DW_ROW(O, 8),
    nchwc_max_pool_plane<O>,
    nchwc_gap_block<O>,
};

}  // namespace nchwc
}  // namespace quanta
