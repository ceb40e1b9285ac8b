// Few-row byte transposes with AVX2 (transpose.h "Few rows"): R = 2, 3 or 4 source rows
// interleaved into pixels of R bytes, 32 columns per step.
//
// Output byte k of a 16-column chunk is x[k mod R][k / R]; the R 16-byte output vectors of
// the chunk are each an OR of R vpshufb (one per source row, zeroing the bytes of the
// other rows: mask byte 0x80). With 256-bit registers the two 128-bit lanes hold two
// chunks (columns 0..15 and 16..31), so output vector m holds piece m of each chunk; the
// 2R pieces are paired for R 32-byte stores by vperm2i128.
#include <immintrin.h>

#include <cstdint>

#include "layout/transpose.h"

namespace quanta {
namespace layout {
namespace {

template <int R>
void interleave(const uint8_t* x, int64_t cols, uint8_t* y, int64_t c0, int64_t c1) {
  // masks[m][r]: byte i of output vector m takes source row r's column (16m + i) / R
  alignas(32) int8_t masks[R][R][32];
  for (int m = 0; m < R; ++m) {
    for (int r = 0; r < R; ++r) {
      for (int i = 0; i < 32; ++i) {
        const int k = 16 * m + i % 16;
        masks[m][r][i] = static_cast<int8_t>(k % R == r ? k / R : 0x80);
      }
    }
  }
  int64_t c = c0;
  for (; c + 32 <= c1; c += 32) {
    __m256i rows[R], out[R];
    for (int r = 0; r < R; ++r) rows[r] = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(x + r * cols + c));
    for (int m = 0; m < R; ++m) {
      out[m] = _mm256_shuffle_epi8(rows[0], _mm256_load_si256(reinterpret_cast<const __m256i*>(masks[m][0])));
      for (int r = 1; r < R; ++r) {
        out[m] = _mm256_or_si256(
            out[m], _mm256_shuffle_epi8(rows[r], _mm256_load_si256(reinterpret_cast<const __m256i*>(masks[m][r]))));
      }
    }
    // pieces p = 0 .. 2R − 1 in output order: vector p mod R, lane p / R
    uint8_t* dst = y + c * R;
    for (int s = 0; s < R; ++s) {
      const int p = 2 * s, q = 2 * s + 1;
      __m256i v;
      const __m256i lo = out[p % R], hi = out[q % R];
      if (p / R == 0 && q / R == 0) {
        v = _mm256_permute2x128_si256(lo, hi, 0x20);
      } else if (p / R == 0) {
        v = _mm256_permute2x128_si256(lo, hi, 0x30);
      } else {
        v = _mm256_permute2x128_si256(lo, hi, 0x31);
      }
      _mm256_storeu_si256(reinterpret_cast<__m256i*>(dst + 32 * s), v);
    }
  }
  for (; c < c1; ++c) {
    for (int r = 0; r < R; ++r) y[c * R + r] = x[r * cols + c];
  }
}

}  // namespace

void interleave_rows_u8_avx2(const uint8_t* x, int64_t rows, int64_t cols, uint8_t* y, int64_t c0, int64_t c1) {
  switch (rows) {
    case 2: return interleave<2>(x, cols, y, c0, c1);
    case 3: return interleave<3>(x, cols, y, c0, c1);
    default: return interleave<4>(x, cols, y, c0, c1);
  }
}

}  // namespace layout
}  // namespace quanta
