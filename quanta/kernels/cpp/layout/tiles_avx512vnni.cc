// Tile transposes, AVX-512 (contracts in tiles.h), for the avx512vnni ISA.
//
// Bytes: 16 x 64 tiles, the unpack network of tiles_network.h on zmm registers: after
// the four rounds, 128-bit lane L of register e(j) holds column 16·L + j. Twice the bytes
// per shuffle of the AVX2 tile; the lanes leave through vextracti32x4 stores (no shuffle
// port). int32 transposes (ConvInteger outputs) use the AVX2 tile.
#if !defined(__clang__)
// GCC 12 reports false (maybe-)uninitialized uses inside its own AVX-512 headers (the
// `__Y = __Y` idiom of _mm512_undefined_*), fixed in GCC 13.
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#pragma GCC diagnostic ignored "-Wuninitialized"
#endif

#include <immintrin.h>

#include <algorithm>
#include <cstring>

#include "layout/tiles.h"
#include "layout/tiles_network.h"
#include "simd.h"

namespace quanta {
namespace layout {
namespace {

constexpr int64_t kTransposeChunkBytes = 32 * 1024;

inline __mmask64 first_bytes(int64_t n) { return n >= 64 ? ~0ull : (1ull << n) - 1; }

// Columns j < nj (16 bytes each, rows i < ni) of the 16 x 64 tile whose row i starts at
// src + i·src_stride; kPartial: ni < 16 or nj < 64 (masked loads and stores, nothing
// read or written outside the tile).
template <bool kPartial>
inline void tile_u8_16x64(const uint8_t* src, int64_t src_stride, int ni, int nj, uint8_t* dst, int64_t dst_stride,
                          __m512i flip) {
  __m512i a[16];
  const __mmask64 load_mask = first_bytes(nj);
#pragma GCC unroll 16
  for (int i = 0; i < 16; ++i) {
    if (!kPartial) {
      a[i] = _mm512_xor_si512(_mm512_loadu_si512(src + i * src_stride), flip);
    } else {
      a[i] = i < ni ? _mm512_xor_si512(_mm512_maskz_loadu_epi8(load_mask, src + i * src_stride), flip)
                    : _mm512_setzero_si512();
    }
  }
  const __mmask16 store_mask = ni >= 16 ? static_cast<__mmask16>(0xffff) : static_cast<__mmask16>((1u << ni) - 1u);
  transpose_16_rows<simd::I8x64>(a, [&](int hhh, __m512i e0, __m512i e1) __attribute__((always_inline)) {
    __m128i lanes[8];
    lanes[0] = _mm512_castsi512_si128(e0);
    lanes[1] = _mm512_extracti32x4_epi32(e0, 1);
    lanes[2] = _mm512_extracti32x4_epi32(e0, 2);
    lanes[3] = _mm512_extracti32x4_epi32(e0, 3);
    lanes[4] = _mm512_castsi512_si128(e1);
    lanes[5] = _mm512_extracti32x4_epi32(e1, 1);
    lanes[6] = _mm512_extracti32x4_epi32(e1, 2);
    lanes[7] = _mm512_extracti32x4_epi32(e1, 3);
#pragma GCC unroll 8
    for (int l = 0; l < 8; ++l) {
      const int j = 16 * (l % 4) + 2 * hhh + l / 4;  // lane L of e0 / e1: column 16L + 2·hhh (+ 1)
      if (!kPartial) {
        _mm_storeu_si128(reinterpret_cast<__m128i*>(dst + j * dst_stride), lanes[l]);
      } else if (j < nj) {
        _mm_mask_storeu_epi8(dst + j * dst_stride, store_mask, lanes[l]);
      }
    }
  });
}

}  // namespace

void transpose_u8_avx512vnni(const uint8_t* src, int64_t src_stride, int64_t rows, int64_t cols, uint8_t* dst,
                             int64_t dst_stride, uint8_t flip) {
  if (rows < 8) {  // a few channels: mostly empty tiles, the scalar loop is as fast
    transpose_u8_portable(src, src_stride, rows, cols, dst, dst_stride, flip);
    return;
  }
  const __m512i vflip = _mm512_set1_epi8(static_cast<char>(flip));
  // Columns in chunks of jc, rows (i0) inside, columns (j0) innermost: a chunk's
  // destination (jc rows of `rows` bytes, <= 32 KiB) stays in L1 while its 16-byte pieces
  // arrive, and each source row is read as one sequential stream of jc bytes (one
  // stream per source row would defeat the prefetchers).
  const int64_t jc = std::max<int64_t>(64, (kTransposeChunkBytes / std::max<int64_t>(rows, 1)) / 64 * 64);
  for (int64_t jb = 0; jb < cols; jb += jc) {
    const int64_t je = std::min(cols, jb + jc);
    for (int64_t i0 = 0; i0 < rows; i0 += 16) {
      const int ni = static_cast<int>(std::min<int64_t>(16, rows - i0));
      for (int64_t j0 = jb; j0 < je; j0 += 64) {
        const int nj = static_cast<int>(std::min<int64_t>(64, je - j0));
        const uint8_t* s = src + i0 * src_stride + j0;
        uint8_t* d = dst + j0 * dst_stride + i0;
        if (ni == 16 && nj == 64) {
          tile_u8_16x64<false>(s, src_stride, 16, 64, d, dst_stride, vflip);
        } else {
          tile_u8_16x64<true>(s, src_stride, ni, nj, d, dst_stride, vflip);
        }
      }
    }
  }
}

}  // namespace layout
}  // namespace quanta
