// w8: the float GEMM of a MatMul whose constant weight is stored as 8-bit integers with
// one scale and zero point per column (quanta::MatMulW8, docs/float-ops.md "Weight-only
// 8-bit MatMul"). The weight stays int8 in memory (a quarter of the float32 bytes the
// product streams per run) and is dequantized one K-block × 32-column micro-panel at a
// time into an L1 buffer, by exactly the dequantization of the op:
//
//   w[k, j] = f32( f32(q[k, j] − zp[j]) · scale[j] )                              (W8)
//
// (q − zp is an integer of at most 9 bits: exact in float32, so the one rounding is the
// product's, as DequantizeLinear and Cast -> Mul compute it). The micro-panel then runs
// through the float GEMM family's tiles (sgemm.h) exactly as a packed float32 B panel
// does, so C is, byte for byte, matmul_f32 of the dequantized weight packed with pack_b.
#pragma once

#include <cstdint>

#include "dispatch.h"
#include "sgemm/sgemm.h"

namespace quanta {
namespace sgemm {

// q [⌈N/32⌉][K][32] int8 (pack_b's layout, zeros past N); zp and scale hold ⌈N/32⌉·32
// floats (0 past N).
inline int64_t packed_w8_size(int64_t k, int64_t n) { return packed_b_size(k, n); }
// q element (k, j) at q[k·rs + j·cs].
void pack_b_w8(const int8_t* q, int64_t rs, int64_t cs, int64_t k, int64_t n, int8_t* out);

// out[kk·32 + j] = (W8) of q[kk·32 + j] with zp[j], scale[j], for kk < kc, j < 32.
using DequantPanelFn = void (*)(const int8_t* q, const float* zp, const float* scale, int64_t kc, float* out);
void dequant_panel_portable(const int8_t* q, const float* zp, const float* scale, int64_t kc, float* out);
void dequant_panel_avx2(const int8_t* q, const float* zp, const float* scale, int64_t kc, float* out);
void dequant_panel_avx512vnni(const int8_t* q, const float* zp, const float* scale, int64_t kc, float* out);

// C (M × N, row-major, ldc = N) = ep(A · w), A row-major (element (i, k) at a[i·lda + k]),
// w the (W8) dequantization of the packed q. ep.post must be null.
void gemm_w8(int64_t m, int64_t n, int64_t k, const float* a, int64_t lda, const int8_t* q, const float* zp,
             const float* scale, float* c, const Epilogue& ep, int num_threads, Isa isa);

}  // namespace sgemm
}  // namespace quanta
