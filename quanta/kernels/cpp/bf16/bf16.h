// bf16 islands: float32 activations rounded to bfloat16 (nearest, ties to even) times
// bfloat16 weights, summed in float32 (docs/float-ops.md "bf16 islands", eq. (BF1)).
//
// Every product of two bf16 values is exact in float32 (8-bit significands), so the
// result differs from the float64 product of the rounded operands only by the float32
// summation: |y − y64| ≤ γ_{K+1} · Σ_k |a_k·w_k| (γ_n = n·u/(1 − n·u), u = 2^-24), the
// float GEMM family's bound (FG1), whichever path runs:
//   avx512bf16  vdpbf16ps (two products per lane and step), on CPUs with AVX512_BF16
//   avx512vnni  / avx2 / portable: the bf16 values widened to float32 (exact), fma
// The widened paths are the fallback on CPUs without BF16 (run-time dispatch).
//
// Packed weight layout (as a16w8.h): blocks of 16 columns, per pair step 16 × 2 bf16
// [col0 k0, col0 k1, col1 k0, ...]; K padded to even, N to a multiple of 32, with zeros.
#pragma once

#include <cstdint>

namespace quanta {
namespace bf16 {

// c[r][j] = Σ_p a[r][2p]·b[2p][j] + a[r][2p+1]·b[2p+1][j] (float32), 4 rows × 32 columns
using MicroKernel = void (*)(const uint16_t* a, int64_t lda, int mr, int64_t k2, const uint16_t* b, float* c);

void ukernel_portable(const uint16_t* a, int64_t lda, int mr, int64_t k2, const uint16_t* b, float* c);
void ukernel_avx512(const uint16_t* a, int64_t lda, int mr, int64_t k2, const uint16_t* b, float* c);
void ukernel_avx512bf16(const uint16_t* a, int64_t lda, int mr, int64_t k2, const uint16_t* b, float* c);

// float32 -> bfloat16, round to nearest even (NaN stays a quiet NaN)
inline uint16_t to_bf16(float f) {
  uint32_t u;
  __builtin_memcpy(&u, &f, 4);
  if ((u & 0x7fffffffu) > 0x7f800000u) return static_cast<uint16_t>((u >> 16) | 0x40);
  u += 0x7fffu + ((u >> 16) & 1u);
  return static_cast<uint16_t>(u >> 16);
}

// "bf16": vdpbf16ps; "avx512": widened fma (AVX-512F); "portable": scalar fma.
const char* path_name();

// y[M, N] = bf16(a[M, K]) @ w (+ bias[N]); a row-major float32.
void matmul(const float* a, int64_t m, int64_t k, const uint16_t* packed, int64_t n, const float* bias, float* y,
            int threads);

}  // namespace bf16
}  // namespace quanta
