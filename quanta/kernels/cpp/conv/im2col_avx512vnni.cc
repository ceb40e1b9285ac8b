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

}  // namespace

void im2col_nhwc_avx512vnni(const uint8_t* xt, int64_t xt_stride, const Geometry& geo, int64_t Cg, int64_t g,
                            int64_t r0, int64_t r1, uint8_t pad_value, int64_t Kp, uint8_t* dst) {
  const int64_t ohw = geo.OH * geo.OW;
  const int64_t K = geo.kh * geo.kw * Cg;
  const bool whole_rows = geo.dw == 1 && Cg == xt_stride;
  const __m512i pad = _mm512_set1_epi8(static_cast<char>(pad_value));
  // (n, oy, ox) of row r0, then stepped: no division per row
  int64_t n = r0 / ohw, oy = (r0 % ohw) / geo.OW, ox = (r0 % ohw) % geo.OW;
  for (int64_t r = r0; r < r1; ++r, ++ox) {
    if (ox == geo.OW) {
      ox = 0;
      if (++oy == geo.OH) {
        oy = 0;
        ++n;
      }
    }
    uint8_t* d = dst + (r - r0) * Kp;
    const int64_t ix0 = ox * geo.sw - geo.pad_left;
    for (int64_t ky = 0; ky < geo.kh; ++ky) {
      const int64_t iy = oy * geo.sh - geo.pad_top + ky * geo.dh;
      if (iy < 0 || iy >= geo.H) {
        fill_bytes(d, pad, geo.kw * Cg);
        d += geo.kw * Cg;
        continue;
      }
      const uint8_t* row = xt + ((n * geo.H + iy) * geo.W) * xt_stride + g * Cg;
      if (whole_rows && ix0 >= 0 && ix0 + geo.kw <= geo.W) {
        copy_bytes(d, row + ix0 * xt_stride, geo.kw * Cg);
        d += geo.kw * Cg;
        continue;
      }
      for (int64_t kx = 0; kx < geo.kw; ++kx) {
        const int64_t ix = ix0 + kx * geo.dw;
        if (ix < 0 || ix >= geo.W) {
          fill_bytes(d, pad, Cg);
        } else {
          copy_bytes(d, row + ix * xt_stride, Cg);
        }
        d += Cg;
      }
    }
    if (Kp > K) fill_bytes(d, _mm512_setzero_si512(), Kp - K);
  }
}

}  // namespace conv
}  // namespace quanta
