// W4A8: 8-bit activations times 4-bit weights quantized per block of K (block size B,
// one scale and zero point per block and column), docs/quantization-math.md eqs. (W3)-(W5).
//
//   acc_b[i, n] = Σ_{k ∈ block b} (a[i, k] − za) · (w[k, n] − zw[b, n])     exact int32
//   t[i, n]     = f32( t + f32( f32(acc_b) · c[b, n] ) ),  b = 0, 1, ...   (c = f32(sa·sw))
//
// The zero points of the weights are folded into the packed values w' = w − zw ∈ [−15, 15]
// (int8) when the weight is packed; za through the block column sums Σ_k w'. Bound: one
// product is at most 255·15 = 3825, a block of B ≤ 4096 values sums below 2^24 < 2^31.
// The float steps are separate roundings (no fused multiply-add: -ffp-contract=off), in
// block order, as the NumPy twin computes them.
//
// Packed layout: per block b, per 16-column tile t: B/4 groups of [16 columns][4 k] int8.
#pragma once

#include <cstdint>

#include "dispatch.h"

namespace quanta {
namespace w4a8 {

// acc[j] = Σ_{g < b4} Σ_{t<4} a[4g + t] · w[g·64 + j·4 + t] for 16 columns j (u8 × s8)
using BlockDot = void (*)(const uint8_t* a, const int8_t* w, int64_t b4, int32_t* acc);

void block_dot_portable(const uint8_t* a, const int8_t* w, int64_t b4, int32_t* acc);
void block_dot_avx2(const uint8_t* a, const int8_t* w, int64_t b4, int32_t* acc);
void block_dot_avx512vnni(const uint8_t* a, const int8_t* w, int64_t b4, int32_t* acc);

struct Params {
  int64_t m, k, n, block;
  const int8_t* packed;   // [kb][ntiles][block/4][16][4]
  const int32_t* colsum;  // [kb][ntiles·16]  Σ_k w' per block and column
  const float* c;         // [kb][ntiles·16]  f32(sa · sw[b, n])
  int32_t za;             // activation zero point (after the int8 -> uint8 shift)
  bool a_signed;          // int8 a: shifted by +128 on load
  // output: float t (y_scale == nullptr), or quantized sat(rne(t / sy) + zy)
  const float* y_scale;
  int32_t zy;
  int out_kind;  // 0 float32, 1 uint8, 2 int8
};

void matmul(const void* a, const Params& p, void* y, int threads);

}  // namespace w4a8
}  // namespace quanta
