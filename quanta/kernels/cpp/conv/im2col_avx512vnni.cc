// im2col, AVX-512 (contract in kernels.h), for the avx512vnni ISA: the same rows as im2col.cc, each contiguous run copied with 64-byte vector moves
// and one masked move for its tail instead of a memcpy call per run (a 3x3 / 64-channel
// layer has 3 runs of 192 bytes per output pixel).
#if !defined(__clang__)
// GCC 12 reports false (maybe-)uninitialized uses inside its own AVX-512 headers (the
// `__Y = __Y` idiom of _mm512_undefined_*), fixed in GCC 13.
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#pragma GCC diagnostic ignored "-Wuninitialized"
#endif

#include <immintrin.h>

#include <algorithm>
#include <cstring>

#include "conv/im2col.h"
#include "conv/kernels.h"

namespace quanta {
namespace conv {
namespace {

inline __mmask64 first_bytes(int64_t n) { return n >= 64 ? ~0ull : (1ull << n) - 1; }

inline void copy_bytes(uint8_t* dst, const uint8_t* src, int64_t n) {
  int64_t i = 0;
  for (; i + 64 <= n; i += 64) _mm512_storeu_si512(dst + i, _mm512_loadu_si512(src + i));
  if (i < n) {
    const __mmask64 m = first_bytes(n - i);
    _mm512_mask_storeu_epi8(dst + i, m, _mm512_maskz_loadu_epi8(m, src + i));
  }
}

inline void fill_bytes(uint8_t* dst, __m512i v, int64_t n) {
  int64_t i = 0;
  for (; i + 64 <= n; i += 64) _mm512_storeu_si512(dst + i, v);
  if (i < n) _mm512_mask_storeu_epi8(dst + i, first_bytes(n - i), v);
}

struct Bytes {
  __m512i pad_value;
  void pad(uint8_t* d, int64_t n) const { fill_bytes(d, pad_value, n); }
  void zero(uint8_t* d, int64_t n) const { fill_bytes(d, _mm512_setzero_si512(), n); }
  void copy(uint8_t* d, const uint8_t* s, int64_t n) const { copy_bytes(d, s, n); }
};

}  // namespace

void im2col_nhwc_avx512vnni(const uint8_t* xt, int64_t xt_stride, const Geometry& geo, int64_t Cg, int64_t g,
                            int64_t r0, int64_t r1, uint8_t pad_value, int64_t Kp, uint8_t* dst) {
  im2col_nhwc_rows(xt, xt_stride, geo, Cg, g, r0, r1, Kp, dst, Bytes{_mm512_set1_epi8(static_cast<char>(pad_value))});
}

}  // namespace conv
}  // namespace quanta
