// MatMulNBits at accuracy_level 4: float32 activations quantized to int8 per row and block
// of K on the fly, times 4- or 8-bit weights per block, docs/quantization-math.md eqs.
// (W6)-(W10), (NB8-1).
//
//   m_ib   = max_{k ∈ b} |a_ik|,  sa_ib = f32(m_ib / 127),  r_ib = f32(127 / m_ib) (0 if m_ib = 0)
//   qa_ik  = rne( f32(a_ik · r_ib) ) ∈ [−127, 127]                                  (W6)
//   acc_ib = Σ_{k ∈ b} qa_ik · (q_kn − zp_bn)                                 exact int32 (W7)
//          = Σ_{k ∈ b} q_kn · qa_ik − zp_bn · Σ_{k ∈ b} qa_ik                           (W10)
//   t_in   ← f32( t_in + f32( f32(acc_ib) · f32(sa_ib · s_bn) ) ),  b = 0, 1, ...  (W8)
//   y_in   = t_in, or f32(t_in + bias_n)                                           (W9)
//
// A block whose maximum is not finite gets qa = 0 and sa = NaN: its row of y is NaN.
// The weights stay raw 4-bit codes q ∈ [0, 15], two to a byte (half the bytes of w' = q − zp,
// which needs a sign): q is vpdpbusd's unsigned operand and qa its signed one, and the zero
// point comes in once per block through the row's code sum sqa_ib = Σ_k qa_ik, eq. (W10).
// |acc| and |zp · sqa| ≤ 4096·127·15 < 2^24 for 4-bit blocks up to 4096, so f32(acc) is
// exact; 8-bit codes (q, zp ∈ [0, 255]) keep acc exact in int32 (4096·127·255·2 < 2^31) and
// f32(acc) is one rounding to nearest even, the twin's (a float64 dot rounded once). Every
// float step is one IEEE float32 operation in block order (no fused multiply-add:
// -ffp-contract=off), so every ISA and thread count gives the twin's bits
// (reference/w4.py::matmul_nbits_a8).
//
// Weight layout (quanta.targets.native.w4.pack_nibbles): panels of 32 columns (two tiles of
// 16), [panels][kb][block/4][16][4] bytes: byte (g, c, t) of block b holds q[b·block + 4g + t]
// of the panel's column c in its low nibble and of column 16 + c in its high nibble (0 past N
// or K). 8-bit codes (bits = 8): [panels][kb][block/4][2][16][4] bytes, byte (g, h, c, t)
// holding q[b·block + 4g + t] of column 16·h + c whole. A panel's whole K is one run of bytes, and its zero points (uint8) and scales
// (float32) are [panels][kb][32] beside it: one row of A (an LLM's decode step) streams the
// weight once, in order, as the hardware prefetcher follows it.
#pragma once

#include <cstdint>

#include "dispatch.h"

namespace quanta {
namespace nbits_a8 {

// One panel of up to 4 rows and nt (1 or 2) 16-column tiles over every block of K: the
// float32 sums t of eq. (W8), [rows][32] (columns past nt·16 untouched).
struct PanelArgs {
  const int8_t* qa;    // row 0 of the panel, [rows][lda]
  int64_t lda;         // kb · block
  const float* sa;     // row 0's block scales, [rows][kb]
  const int32_t* sqa;  // row 0's block code sums, [rows][kb]
  int64_t kb, b4;      // blocks, groups of 4 per block
  const uint8_t* w;    // block 0 of the panel
  int64_t wb_stride;   // bytes from one block to the next (block · 16 · bits / 4)
  const uint8_t* zp;   // the panel's [kb][32]
  const float* sw;     // the panel's [kb][32]
  float* t;            // [rows][32]
  int bits;            // 4: two codes a byte; 8: one
};

using Panel = void (*)(const PanelArgs& p, int rows, int nt);

void panel_portable(const PanelArgs& p, int rows, int nt);
void panel_avx2(const PanelArgs& p, int rows, int nt);
void panel_avx512vnni(const PanelArgs& p, int rows, int nt);

struct Params {
  int64_t m, k, n, block;
  const uint8_t* packed;  // [panels][kb][block/4][64 · bits / 4] (the layout above)
  const uint8_t* zp;      // [panels][kb][32]
  const float* sw;        // [panels][kb][32]
  const float* bias;      // [n] or nullptr
  int bits;               // 4 or 8
};

// Eq. (W6) for rows [r0, r1): qa [m][kb·block] (a short last block padded with 0), sa and
// the code sums sqa [m][kb]. Every ISA computes the same operations: the maximum is exact in
// any order, f32(a · r) one multiply, and the conversion rounds to nearest even (the default
// rounding mode, as std::nearbyint).
using QuantizeRows = void (*)(const float* a, const Params& p, int64_t r0, int64_t r1, int8_t* qa, float* sa,
                              int32_t* sqa);

void quantize_rows(const float* a, const Params& p, int64_t r0, int64_t r1, int8_t* qa, float* sa, int32_t* sqa);
void quantize_rows_avx2(const float* a, const Params& p, int64_t r0, int64_t r1, int8_t* qa, float* sa, int32_t* sqa);
void quantize_rows_avx512vnni(const float* a, const Params& p, int64_t r0, int64_t r1, int8_t* qa, float* sa,
                              int32_t* sqa);

void matmul(const float* a, const Params& p, float* y, int threads);

}  // namespace nbits_a8
}  // namespace quanta
