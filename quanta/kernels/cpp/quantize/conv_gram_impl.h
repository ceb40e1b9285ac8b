// conv_gram.h's sums, compiled once per instruction set (conv_gram_portable.cc,
// _avx2.cc, _avx512vnni.cc): the same integers from each (exact sums).
#pragma once

#include "quantize/conv_gram.h"

#include <algorithm>
#include <vector>

namespace quanta {
namespace conv_gram {
namespace {

// Positions a chunk holds: every int32 dot product of a chunk stays below 2^31
// (|x_int| <= 255, so each product is at most 65025: 4096 of them sum to < 2^28).
constexpr int64_t kChunk = 4096;

int32_t dot(const int16_t* a, const int16_t* b, int64_t n) {
  // int16 x int16 -> int32 products: the compiler's multiply-add of 16-bit lanes
  int32_t s = 0;
  for (int64_t i = 0; i < n; ++i) s += int32_t(a[i]) * int32_t(b[i]);
  return s;
}

// In this anonymous namespace: each instruction set's file keeps its own copy (one
// inline definition shared across files would let the linker pick one build for all).
void accumulate_body(const Args& a) {
  const int64_t cg = a.channels / a.groups;
  const int64_t taps = a.kh * a.kw;
  const int64_t k = cg * taps;
  const int64_t ho = (a.height + a.pad_top + a.pad_bottom - a.kh) / a.sh + 1;
  const int64_t wo = (a.width + a.pad_left + a.pad_right - a.kw) / a.sw + 1;
  if (ho <= 0 || wo <= 0) return;
  const int64_t positions = ho * wo;
  const int64_t chunk = std::min(positions, kChunk);
  std::vector<int16_t> cols(static_cast<size_t>(k * chunk));
  std::vector<int32_t> sums(static_cast<size_t>(k * k));
  const int32_t o = a.zero_point;
  const int64_t sample_size = a.channels * a.height * a.width;
  for (int64_t sample = 0; sample < a.samples; ++sample) {
    for (int64_t g = 0; g < a.groups; ++g) {
      int64_t* out = a.out + g * k * k;
      for (int64_t p0 = 0; p0 < positions; p0 += chunk) {
        const int64_t n = std::min(chunk, positions - p0);
        // im2col of the chunk: row r = (channel, tap), x_int = code − o, 0 where padded
        for (int64_t ci = 0; ci < cg; ++ci) {
          const uint8_t* plane = a.x + sample * sample_size + (g * cg + ci) * a.height * a.width;
          for (int64_t t = 0; t < taps; ++t) {
            const int64_t i = t / a.kw, j = t % a.kw;
            int16_t* row = cols.data() + (ci * taps + t) * chunk;
            int64_t oy = p0 / wo, ox = p0 % wo;
            for (int64_t q = 0; q < n;) {
              // one output row's run of positions at a time
              const int64_t run = std::min(wo - ox, n - q);
              const int64_t y = oy * a.sh + i - a.pad_top;
              if (y < 0 || y >= a.height) {
                std::fill(row + q, row + q + run, int16_t{0});
              } else {
                const uint8_t* line = plane + y * a.width;
                for (int64_t e = 0; e < run; ++e) {
                  const int64_t x = (ox + e) * a.sw + j - a.pad_left;
                  row[q + e] = (x >= 0 && x < a.width) ? static_cast<int16_t>(int32_t(line[x]) - o) : int16_t{0};
                }
              }
              q += run;
              ox = 0;
              ++oy;
            }
          }
        }
        for (int64_t r1 = 0; r1 < k; ++r1) {
          for (int64_t r2 = r1; r2 < k; ++r2) {
            sums[r1 * k + r2] = dot(cols.data() + r1 * chunk, cols.data() + r2 * chunk, n);
          }
        }
        for (int64_t r1 = 0; r1 < k; ++r1) {
          for (int64_t r2 = r1; r2 < k; ++r2) {
            const int64_t s = sums[r1 * k + r2];
            out[r1 * k + r2] += s;
            if (r2 != r1) out[r2 * k + r1] += s;
          }
        }
      }
    }
  }
}

}  // namespace
}  // namespace conv_gram
}  // namespace quanta
