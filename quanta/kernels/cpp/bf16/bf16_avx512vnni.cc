// bf16 micro-kernels for AVX-512 CPUs: vdpbf16ps where the CPU has AVX512_BF16 (compiled
// for it with a target attribute; called only when dispatch says the CPU has it), and
// the widened float32 fma path for AVX-512 CPUs without it. 4 rows × 32 columns.
#include <immintrin.h>

#include <cstring>

#include "bf16/bf16.h"

namespace quanta {
namespace bf16 {

namespace {
inline int32_t pair(const uint16_t* p) {
  int32_t v;
  std::memcpy(&v, p, 4);
  return v;
}
}  // namespace

__attribute__((target("avx512f,avx512bw,avx512vl,avx512bf16"))) void ukernel_avx512bf16(const uint16_t* a, int64_t lda,
                                                                                        int mr, int64_t k2,
                                                                                        const uint16_t* b, float* c) {
  __m512 acc[4][2];
  for (int r = 0; r < 4; ++r) acc[r][0] = acc[r][1] = _mm512_setzero_ps();
  const uint16_t* b0 = b;
  const uint16_t* b1 = b + k2 * 32;
  for (int64_t p = 0; p < k2; ++p) {
    const __m512bh w0 = (__m512bh)_mm512_loadu_si512(b0 + p * 32);
    const __m512bh w1 = (__m512bh)_mm512_loadu_si512(b1 + p * 32);
    for (int r = 0; r < mr; ++r) {
      const __m512bh x = (__m512bh)_mm512_set1_epi32(pair(a + r * lda + 2 * p));
      acc[r][0] = _mm512_dpbf16_ps(acc[r][0], x, w0);
      acc[r][1] = _mm512_dpbf16_ps(acc[r][1], x, w1);
    }
  }
  for (int r = 0; r < mr; ++r) {
    _mm512_storeu_ps(c + r * 32, acc[r][0]);
    _mm512_storeu_ps(c + r * 32 + 16, acc[r][1]);
  }
}

void ukernel_avx512(const uint16_t* a, int64_t lda, int mr, int64_t k2, const uint16_t* b, float* c) {
  __m512 acc[4][2];
  for (int r = 0; r < 4; ++r) acc[r][0] = acc[r][1] = _mm512_setzero_ps();
  const uint16_t* b0 = b;
  const uint16_t* b1 = b + k2 * 32;
  const __m512i hi_mask = _mm512_set1_epi32(static_cast<int32_t>(0xffff0000u));
  for (int64_t p = 0; p < k2; ++p) {
    const __m512i v0 = _mm512_loadu_si512(b0 + p * 32);
    const __m512i v1 = _mm512_loadu_si512(b1 + p * 32);
    // even k: the low half of each pair shifted up; odd k: the high half in place
    const __m512 w0e = _mm512_castsi512_ps(_mm512_slli_epi32(v0, 16));
    const __m512 w0o = _mm512_castsi512_ps(_mm512_and_si512(v0, hi_mask));
    const __m512 w1e = _mm512_castsi512_ps(_mm512_slli_epi32(v1, 16));
    const __m512 w1o = _mm512_castsi512_ps(_mm512_and_si512(v1, hi_mask));
    for (int r = 0; r < mr; ++r) {
      const int32_t q = pair(a + r * lda + 2 * p);
      const uint32_t lo = static_cast<uint32_t>(q) << 16, hi = static_cast<uint32_t>(q) & 0xffff0000u;
      float fe, fo;
      std::memcpy(&fe, &lo, 4);
      std::memcpy(&fo, &hi, 4);
      const __m512 xe = _mm512_set1_ps(fe), xo = _mm512_set1_ps(fo);
      acc[r][0] = _mm512_fmadd_ps(xo, w0o, _mm512_fmadd_ps(xe, w0e, acc[r][0]));
      acc[r][1] = _mm512_fmadd_ps(xo, w1o, _mm512_fmadd_ps(xe, w1e, acc[r][1]));
    }
  }
  for (int r = 0; r < mr; ++r) {
    _mm512_storeu_ps(c + r * 32, acc[r][0]);
    _mm512_storeu_ps(c + r * 32 + 16, acc[r][1]);
  }
}

}  // namespace bf16
}  // namespace quanta
