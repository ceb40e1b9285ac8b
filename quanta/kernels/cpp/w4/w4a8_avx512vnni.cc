// W4A8 block dot, AVX-512 VNNI: vpdpbusd (u8 × s8 quads -> int32), 16 columns per tile.
#include <immintrin.h>

#include <cstring>

#include "w4/w4a8.h"

namespace quanta {
namespace w4a8 {

void block_dot_avx512vnni(const uint8_t* a, const int8_t* w, int64_t b4, int32_t* acc) {
  __m512i s0 = _mm512_setzero_si512(), s1 = _mm512_setzero_si512();
  int64_t g = 0;
  for (; g + 1 < b4; g += 2) {
    int32_t q0, q1;
    std::memcpy(&q0, a + 4 * g, 4);
    std::memcpy(&q1, a + 4 * g + 4, 4);
    s0 = _mm512_dpbusd_epi32(s0, _mm512_set1_epi32(q0), _mm512_loadu_si512(w + g * 64));
    s1 = _mm512_dpbusd_epi32(s1, _mm512_set1_epi32(q1), _mm512_loadu_si512(w + g * 64 + 64));
  }
  if (g < b4) {
    int32_t q0;
    std::memcpy(&q0, a + 4 * g, 4);
    s0 = _mm512_dpbusd_epi32(s0, _mm512_set1_epi32(q0), _mm512_loadu_si512(w + g * 64));
  }
  _mm512_storeu_si512(acc, _mm512_add_epi32(s0, s1));
}

}  // namespace w4a8
}  // namespace quanta
