// W4A8 driver and portable block dot (w4a8.h).
#include "w4/w4a8.h"

#include <cmath>
#include <vector>

#include "qgemm/thread_pool.h"

namespace quanta {
namespace w4a8 {

void block_dot_portable(const uint8_t* a, const int8_t* w, int64_t b4, int32_t* acc) {
  for (int j = 0; j < 16; ++j) acc[j] = 0;
  for (int64_t g = 0; g < b4; ++g) {
    for (int j = 0; j < 16; ++j) {
      int32_t s = 0;
      for (int t = 0; t < 4; ++t) s += static_cast<int32_t>(a[4 * g + t]) * w[g * 64 + j * 4 + t];
      acc[j] += s;
    }
  }
}

namespace {

BlockDot select(Isa isa) {
  switch (isa) {
    case Isa::kAvx512Vnni: return block_dot_avx512vnni;
    case Isa::kAvx2: return block_dot_avx2;
    default: return block_dot_portable;
  }
}

// Round to nearest even for |v| ≤ 2^22 (clamped to the 8-bit range here); see a16w8.cc.
inline float round_even(float v) {
  constexpr float kMagic = 12582912.0f;
  const float t = v + kMagic;
  return t - kMagic;
}

template <typename T>
inline T quantize(float t, float sy, int32_t zy, int32_t qmin, int32_t qmax) {
  // QuantizeLinear: sat(rne(t / sy) + zy), clamped before the conversion
  float v = t / sy;
  const float lo = static_cast<float>(qmin - zy), hi = static_cast<float>(qmax - zy);
  v = std::isnan(v) ? lo : (v < lo ? lo : (v > hi ? hi : v));
  int32_t q = static_cast<int32_t>(round_even(v)) + zy;
  q = q < qmin ? qmin : (q > qmax ? qmax : q);
  return static_cast<T>(q);
}

}  // namespace

void matmul(const void* a, const Params& p, void* y, int threads) {
  const BlockDot dot = select(select_kernel("w4a8", "u8s4->s32")->isa);
  const int64_t kb = (p.k + p.block - 1) / p.block, ntiles = (p.n + 15) / 16, npad = ntiles * 16;
  const int64_t b4 = p.block / 4, tile_bytes = b4 * 64;
  qgemm::parallel_ranges(threads, p.m, 4, [&](int64_t r0, int64_t r1) {
    std::vector<uint8_t> row(static_cast<size_t>(kb * p.block));
    std::vector<float> t(static_cast<size_t>(npad));
    int32_t acc[16];
    for (int64_t i = r0; i < r1; ++i) {
      const int64_t base = i * p.k;
      for (int64_t k = 0; k < p.k; ++k) {
        row[k] = p.a_signed ? static_cast<uint8_t>(static_cast<const int8_t*>(a)[base + k] + 128)
                            : static_cast<const uint8_t*>(a)[base + k];
      }
      // padding of the last block: any value (its packed weights are 0); za keeps acc exact
      for (int64_t k = p.k; k < kb * p.block; ++k) row[k] = static_cast<uint8_t>(p.za);
      for (int64_t j = 0; j < npad; ++j) t[j] = 0.0f;
      for (int64_t b = 0; b < kb; ++b) {
        const int8_t* wb = p.packed + b * ntiles * tile_bytes;
        const int32_t* cs = p.colsum + b * npad;
        const float* cb = p.c + b * npad;
        for (int64_t tile = 0; tile < ntiles; ++tile) {
          dot(row.data() + b * p.block, wb + tile * tile_bytes, b4, acc);
          for (int j = 0; j < 16; ++j) {
            const int64_t col = tile * 16 + j;
            const int32_t v = acc[j] - p.za * cs[col];
            const float prod = static_cast<float>(v) * cb[col];
            t[col] = t[col] + prod;
          }
        }
      }
      for (int64_t j = 0; j < p.n; ++j) {
        const int64_t o = i * p.n + j;
        switch (p.out_kind) {
          case 0: static_cast<float*>(y)[o] = t[j]; break;
          case 1: static_cast<uint8_t*>(y)[o] = quantize<uint8_t>(t[j], *p.y_scale, p.zy, 0, 255); break;
          default: static_cast<int8_t*>(y)[o] = quantize<int8_t>(t[j], *p.y_scale, p.zy, -128, 127); break;
        }
      }
    }
  });
}

}  // namespace w4a8
}  // namespace quanta
