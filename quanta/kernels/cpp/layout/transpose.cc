// See transpose.h.
#include "layout/transpose.h"

#include <algorithm>
#include <cstring>

#include "layout/tiles.h"
#include "dispatch.h"
#include "qgemm/thread_pool.h"

namespace quanta {
namespace layout {
namespace {

constexpr int64_t kTile = 16;
constexpr int64_t kFewRowsChunk = 4096;        // columns per unit of the few-rows path
constexpr int64_t kSimdBlockBytes = 64 << 10;  // bytes per unit of the SIMD paths (whole columns)

template <int R>
void interleave_portable(const uint8_t* x, int64_t cols, uint8_t* __restrict y, int64_t c0, int64_t c1) {
  for (int64_t c = c0; c < c1; ++c) {
    for (int r = 0; r < R; ++r) y[c * R + r] = x[r * cols + c];
  }
}

template <typename T>
void tile_typed(const T* x, T* y, int64_t rows, int64_t cols, int64_t r0, int64_t r1, int64_t c0, int64_t c1) {
  for (int64_t r = r0; r < r1; ++r) {
    const T* src = x + r * cols;
    for (int64_t c = c0; c < c1; ++c) y[c * rows + r] = src[c];
  }
}

template <typename T>
void rows_typed(const T* x, T* y, int64_t rows, int64_t cols, int64_t r_begin, int64_t r_end) {
  for (int64_t r0 = r_begin; r0 < r_end; r0 += kTile) {
    const int64_t r1 = std::min(r_end, r0 + kTile);
    for (int64_t c0 = 0; c0 < cols; c0 += kTile) {
      tile_typed(x, y, rows, cols, r0, r1, c0, std::min(cols, c0 + kTile));
    }
  }
}

void rows_bytes(const uint8_t* x, uint8_t* y, int64_t rows, int64_t cols, int64_t e, int64_t r_begin, int64_t r_end) {
  for (int64_t r = r_begin; r < r_end; ++r) {
    for (int64_t c = 0; c < cols; ++c) std::memcpy(y + (c * rows + r) * e, x + (r * cols + c) * e, e);
  }
}

void rows_any(const uint8_t* x, uint8_t* y, int64_t rows, int64_t cols, int64_t e, int64_t r_begin, int64_t r_end) {
  switch (e) {
    case 1: return rows_typed(x, y, rows, cols, r_begin, r_end);
    case 2:
      return rows_typed(reinterpret_cast<const uint16_t*>(x), reinterpret_cast<uint16_t*>(y), rows, cols, r_begin,
                        r_end);
    case 4:
      return rows_typed(reinterpret_cast<const uint32_t*>(x), reinterpret_cast<uint32_t*>(y), rows, cols, r_begin,
                        r_end);
    case 8:
      return rows_typed(reinterpret_cast<const uint64_t*>(x), reinterpret_cast<uint64_t*>(y), rows, cols, r_begin,
                        r_end);
    default: return rows_bytes(x, y, rows, cols, e, r_begin, r_end);
  }
}

// Few columns (C in {2, 3, 4}) of 4-byte elements: a pixel's C values scattered into C
// output rows, rows [r0, r1) of one plane. The 8 x 8 tiles would pad every 8 rows to a
// tile and copy them in and out (a 3-channel image going NCHW: 0.5 ms for 147k floats).
template <int C>
void deinterleave_s32(const uint32_t* x, int64_t rows, uint32_t* __restrict y, int64_t r0, int64_t r1) {
  for (int64_t r = r0; r < r1; ++r)
    for (int c = 0; c < C; ++c) y[c * rows + r] = x[r * C + c];
}

}  // namespace

void interleave_rows_u8_portable(const uint8_t* x, int64_t rows, int64_t cols, uint8_t* y, int64_t c0, int64_t c1) {
  switch (rows) {
    case 2: return interleave_portable<2>(x, cols, y, c0, c1);
    case 3: return interleave_portable<3>(x, cols, y, c0, c1);
    default: return interleave_portable<4>(x, cols, y, c0, c1);
  }
}

void transpose_batched(const void* x, void* y, int64_t batch, int64_t rows, int64_t cols, int64_t elem_bytes,
                       int num_threads) {
  if (batch <= 0 || rows <= 0 || cols <= 0) return;
  const auto* xb = static_cast<const uint8_t*>(x);
  auto* yb = static_cast<uint8_t*>(y);
  const int64_t plane = rows * cols * elem_bytes;
  const int threads_for_size = batch * plane < (int64_t{64} << 10) ? 1 : num_threads;
  // One row or one column: y's bytes are x's (a perm that only moves an axis of size 1, a
  // TF export's NHWC -> NCHW of a one-channel input). The tile paths would move the
  // plane an element at a time (243k floats: 0.76 ms against 0.02 ms for the copy).
  if (rows == 1 || cols == 1) {
    std::memcpy(yb, xb, static_cast<size_t>(batch * plane));
    return;
  }
  if (elem_bytes == 1 && rows >= 2 && rows <= 4) {
    const auto interleave = active_isa() == Isa::kPortable ? interleave_rows_u8_portable : interleave_rows_u8_avx2;
    const int64_t chunks = (cols + kFewRowsChunk - 1) / kFewRowsChunk;
    auto unit = [&](int64_t u, int) {
      const int64_t b = u / chunks, c0 = (u % chunks) * kFewRowsChunk;
      interleave(xb + b * plane, rows, cols, yb + b * plane, c0, std::min(cols, c0 + kFewRowsChunk));
    };
    // ~30 bytes per ns: below 512 KiB a second thread costs more than it saves (measured)
    if (threads_for_size <= 1 || batch * plane < (int64_t{512} << 10)) {
      for (int64_t u = 0; u < batch * chunks; ++u) unit(u, 0);
    } else {
      qgemm::parallel_for(threads_for_size, batch * chunks, unit);
    }
    return;
  }
  if (elem_bytes == 4 && cols <= 4) {
    const int64_t chunks = (rows + kFewRowsChunk - 1) / kFewRowsChunk;
    auto unit = [&](int64_t u, int) {
      const int64_t b = u / chunks, r0 = (u % chunks) * kFewRowsChunk, r1 = std::min(rows, r0 + kFewRowsChunk);
      const auto* src = reinterpret_cast<const uint32_t*>(xb + b * plane);
      auto* dst = reinterpret_cast<uint32_t*>(yb + b * plane);
      switch (cols) {
        case 2: return deinterleave_s32<2>(src, rows, dst, r0, r1);
        case 3: return deinterleave_s32<3>(src, rows, dst, r0, r1);
        default: return deinterleave_s32<4>(src, rows, dst, r0, r1);
      }
    };
    if (threads_for_size <= 1) {
      for (int64_t u = 0; u < batch * chunks; ++u) unit(u, 0);
    } else {
      qgemm::parallel_for(threads_for_size, batch * chunks, unit);
    }
    return;
  }
  // 1- and 4-byte elements: the SIMD tile transposes of the convolution paths (16 x 64
  // bytes through AVX-512 shuffles, 8 x 8 int32 through AVX2; conv/kernels.h), on units of
  // (b, block of kSimdRows rows). The scalar tiles below ran at ~2 GB/s for bytes.
  if ((elem_bytes == 1 && rows >= 8) || elem_bytes == 4) {
    const Isa isa = active_isa();
    const auto tr_u8 = transpose_u8_for(isa);
    const auto tr_s32 = transpose_s32_for(isa);
    // units: (b, block of source columns), so that each writes whole destination rows
    const int64_t bc = std::max<int64_t>(64, kSimdBlockBytes / (rows * elem_bytes) / 64 * 64);
    const int64_t blocks = (cols + bc - 1) / bc;
    auto unit = [&](int64_t u, int) {
      const int64_t b = u / blocks, c0 = (u % blocks) * bc, n = std::min(bc, cols - c0);
      if (elem_bytes == 1) {
        tr_u8(xb + b * plane + c0, cols, rows, n, yb + b * plane + c0 * rows, rows, 0);
      } else {
        tr_s32(reinterpret_cast<const int32_t*>(xb + b * plane) + c0, cols, rows, n,
               reinterpret_cast<int32_t*>(yb + b * plane) + c0 * rows, rows);
      }
    };
    if (threads_for_size <= 1) {
      for (int64_t u = 0; u < batch * blocks; ++u) unit(u, 0);
    } else {
      qgemm::parallel_for(threads_for_size, batch * blocks, unit);
    }
    return;
  }
  // Units: (b, tile of kTile rows). Below ~64 KiB a second thread does not pay.
  const int64_t row_tiles = (rows + kTile - 1) / kTile;
  const int64_t units = batch * row_tiles;
  const int threads = threads_for_size;
  auto body = [&](int64_t u, int) {
    const int64_t b = u / row_tiles, t = u % row_tiles;
    const int64_t r0 = t * kTile, r1 = std::min(rows, r0 + kTile);
    rows_any(xb + b * plane, yb + b * plane, rows, cols, elem_bytes, r0, r1);
  };
  if (threads <= 1) {
    for (int64_t u = 0; u < units; ++u) body(u, 0);
    return;
  }
  qgemm::parallel_for(threads, units, body);
}

}  // namespace layout
}  // namespace quanta
