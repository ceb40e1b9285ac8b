// Layout transposes, AVX2 (contract in tiles.h). Also used by the avx512vnni ISA: at
// 8 bytes per shuffle they run near the memory bandwidth, so wider registers would not
// make the gemm path faster.
//
// Bytes: 16 x 32 tiles. Row i of the tile (32 bytes, i.e. source columns j0 .. j0+31)
// sits in one ymm; the unpack network of tiles_network.h leaves in one register the 16
// bytes of column j (low lane) and of column 16 + j (high lane). 64 unpacks per 512 bytes.
// int32: 8 x 8 tiles, unpack epi32 / epi64 then vperm2i128.
// Tiles that cross an edge go through a zeroed stack tile (copy in, transpose, copy out).
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

// dst row j (16 bytes at dst + j·dst_stride) = column j of the 16 x 32 tile whose row i
// starts at rows[i].
inline void tile_u8_16x32(const uint8_t* const* rows, uint8_t* dst, int64_t dst_stride, __m256i flip) {
  __m256i a[16];
#pragma GCC unroll 16
  for (int i = 0; i < 16; ++i) {
    a[i] = _mm256_xor_si256(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(rows[i])), flip);
  }
  transpose_16_rows<simd::I8x32>(a, [&](int hhh, __m256i e0, __m256i e1) __attribute__((always_inline)) {
    const int j = 2 * hhh;
    _mm_storeu_si128(reinterpret_cast<__m128i*>(dst + j * dst_stride), _mm256_castsi256_si128(e0));
    _mm_storeu_si128(reinterpret_cast<__m128i*>(dst + (16 + j) * dst_stride), _mm256_extracti128_si256(e0, 1));
    _mm_storeu_si128(reinterpret_cast<__m128i*>(dst + (j + 1) * dst_stride), _mm256_castsi256_si128(e1));
    _mm_storeu_si128(reinterpret_cast<__m128i*>(dst + (17 + j) * dst_stride), _mm256_extracti128_si256(e1, 1));
  });
}

inline void tile_s32_8x8(const int32_t* src, int64_t src_stride, int32_t* dst, int64_t dst_stride) {
  __m256i r[8], t[8], u[8];
#pragma GCC unroll 8
  for (int i = 0; i < 8; ++i) r[i] = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(src + i * src_stride));
#pragma GCC unroll 4
  for (int k = 0; k < 4; ++k) {
    t[2 * k] = _mm256_unpacklo_epi32(r[2 * k], r[2 * k + 1]);
    t[2 * k + 1] = _mm256_unpackhi_epi32(r[2 * k], r[2 * k + 1]);
  }
  // u[4s + c] = column c (c < 4) of rows 4s .. 4s+3 in the low lane, column c + 4 in the high
#pragma GCC unroll 2
  for (int s = 0; s < 2; ++s) {
    u[4 * s + 0] = _mm256_unpacklo_epi64(t[4 * s + 0], t[4 * s + 2]);
    u[4 * s + 1] = _mm256_unpackhi_epi64(t[4 * s + 0], t[4 * s + 2]);
    u[4 * s + 2] = _mm256_unpacklo_epi64(t[4 * s + 1], t[4 * s + 3]);
    u[4 * s + 3] = _mm256_unpackhi_epi64(t[4 * s + 1], t[4 * s + 3]);
  }
#pragma GCC unroll 4
  for (int c = 0; c < 4; ++c) {
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(dst + c * dst_stride),
                        _mm256_permute2x128_si256(u[c], u[4 + c], 0x20));
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(dst + (c + 4) * dst_stride),
                        _mm256_permute2x128_si256(u[c], u[4 + c], 0x31));
  }
}

}  // namespace

void transpose_u8_avx2(const uint8_t* src, int64_t src_stride, int64_t rows, int64_t cols, uint8_t* dst,
                       int64_t dst_stride, uint8_t flip) {
  if (rows < 8) {  // a few channels: mostly edge tiles, the scalar loop is as fast
    transpose_u8_portable(src, src_stride, rows, cols, dst, dst_stride, flip);
    return;
  }
  const __m256i vflip = _mm256_set1_epi8(static_cast<char>(flip));
  alignas(32) uint8_t tin[16][32];
  alignas(32) uint8_t tout[32][16];
  const uint8_t* ptrs[16];
  // Columns in chunks of jc, rows (i0) inside, columns (j0) innermost: a chunk's
  // destination (jc rows of `rows` bytes, <= 32 KiB) stays in L1 while its 16-byte pieces
  // arrive, and each source row is read as one sequential stream of jc bytes (one
  // stream per source row would defeat the prefetchers).
  const int64_t jc = std::max<int64_t>(32, (kTransposeChunkBytes / std::max<int64_t>(rows, 1)) / 32 * 32);
  for (int64_t jb = 0; jb < cols; jb += jc) {
    const int64_t je = std::min(cols, jb + jc);
    for (int64_t i0 = 0; i0 < rows; i0 += 16) {
      const int64_t ni = rows - i0 < 16 ? rows - i0 : 16;
      for (int64_t j0 = jb; j0 < je; j0 += 32) {
        const int64_t nj = je - j0 < 32 ? je - j0 : 32;
        if (ni == 16 && nj == 32) {
          for (int i = 0; i < 16; ++i) ptrs[i] = src + (i0 + i) * src_stride + j0;
          tile_u8_16x32(ptrs, dst + j0 * dst_stride + i0, dst_stride, vflip);
          continue;
        }
        std::memset(tin, 0, sizeof(tin));
        for (int64_t i = 0; i < ni; ++i) std::memcpy(tin[i], src + (i0 + i) * src_stride + j0, static_cast<size_t>(nj));
        for (int i = 0; i < 16; ++i) ptrs[i] = tin[i];
        tile_u8_16x32(ptrs, &tout[0][0], 16, vflip);
        for (int64_t j = 0; j < nj; ++j)
          std::memcpy(dst + (j0 + j) * dst_stride + i0, tout[j], static_cast<size_t>(ni));
      }
    }
  }
}

void transpose_s32_avx2(const int32_t* src, int64_t src_stride, int64_t rows, int64_t cols, int32_t* dst,
                        int64_t dst_stride) {
  alignas(32) int32_t tin[8][8];
  alignas(32) int32_t tout[8][8];
  for (int64_t j0 = 0; j0 < cols; j0 += 8) {
    const int64_t nj = cols - j0 < 8 ? cols - j0 : 8;
    for (int64_t i0 = 0; i0 < rows; i0 += 8) {
      const int64_t ni = rows - i0 < 8 ? rows - i0 : 8;
      if (ni == 8 && nj == 8) {
        tile_s32_8x8(src + i0 * src_stride + j0, src_stride, dst + j0 * dst_stride + i0, dst_stride);
        continue;
      }
      std::memset(tin, 0, sizeof(tin));
      for (int64_t i = 0; i < ni; ++i) {
        std::memcpy(tin[i], src + (i0 + i) * src_stride + j0, static_cast<size_t>(nj) * sizeof(int32_t));
      }
      tile_s32_8x8(&tin[0][0], 8, &tout[0][0], 8);
      for (int64_t j = 0; j < nj; ++j) {
        std::memcpy(dst + (j0 + j) * dst_stride + i0, tout[j], static_cast<size_t>(ni) * sizeof(int32_t));
      }
    }
  }
}

}  // namespace layout
}  // namespace quanta
