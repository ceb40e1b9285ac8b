// MatMulNBits at accuracy_level 4: float32 activations quantized to int8 per row and block
// of K on the fly, times 4-bit weights per block, docs/quantization-math.md eqs. (W6)-(W9).
//
//   m_ib   = max_{k ∈ b} |a_ik|,  sa_ib = f32(m_ib / 127),  r_ib = f32(127 / m_ib) (0 if m_ib = 0)
//   qa_ik  = rne( f32(a_ik · r_ib) ) ∈ [−127, 127]                                  (W6)
//   acc_ib = Σ_{k ∈ b} qa_ik · (q_kn − zp_bn)                                 exact int32 (W7)
//   t_in   ← f32( t_in + f32( f32(acc_ib) · f32(sa_ib · s_bn) ) ),  b = 0, 1, ...  (W8)
//   y_in   = t_in, or f32(t_in + bias_n)                                           (W9)
//
// A block whose maximum is not finite gets qa = 0 and sa = NaN: its row of y is NaN.
// The kernel stores qa + 128 as uint8 (vpdpbusd's unsigned operand) and the weights as
// w' = q − zp ∈ [−15, 15] int8 in w4a8's layout (quanta.targets.native.w4.pack_blocks); the
// shift comes back out through corr[b, n] = 128 · Σ_{k ∈ b} w'_kn. |acc| ≤ 4096·127·15 < 2^24
// for blocks up to 4096, so f32(acc) is exact; every float step is one IEEE float32
// operation in block order (no fused multiply-add: -ffp-contract=off), so every ISA and
// thread count gives the twin's bits (reference/w4.py::matmul_nbits_a8).
#pragma once

#include <cstdint>

#include "dispatch.h"

namespace quanta {
namespace nbits_a8 {

// One panel of up to 4 rows and nt (1 or 2) 16-column tiles over every block of K: the
// float32 sums t of eq. (W8), [rows][32] (columns past nt·16 untouched).
struct PanelArgs {
  const uint8_t* qa;    // row 0 of the panel, [rows][lda] (qa + 128)
  int64_t lda;          // kb · block
  const float* sa;      // row 0's block scales, [rows][kb]
  int64_t kb, b4;       // blocks, groups of 4 per block
  const int8_t* w;      // block 0, tile 0 of the panel
  int64_t wb_stride;    // bytes from one block to the next (ntiles · block · 16)
  int64_t tile_bytes;   // block · 16
  const int32_t* corr;  // [kb][npad] at the panel's first column
  const float* sw;      // [kb][npad] at the panel's first column
  int64_t npad;
  float* t;  // [rows][32]
};

using Panel = void (*)(const PanelArgs& p, int rows, int nt);

void panel_portable(const PanelArgs& p, int rows, int nt);
void panel_avx2(const PanelArgs& p, int rows, int nt);
void panel_avx512vnni(const PanelArgs& p, int rows, int nt);

struct Params {
  int64_t m, k, n, block;
  const int8_t* packed;  // [kb][ntiles][block/4][16][4]
  const int32_t* corr;   // [kb][ntiles·16]
  const float* sw;       // [kb][ntiles·16]
  const float* bias;     // [n] or nullptr
};

// Eq. (W6) for rows [r0, r1): qa [m][kb·block] (qa + 128; a short last block padded with
// 128, i.e. 0), sa [m][kb].
void quantize_rows(const float* a, const Params& p, int64_t r0, int64_t r1, uint8_t* qa, float* sa);

void matmul(const float* a, const Params& p, float* y, int threads);

}  // namespace nbits_a8
}  // namespace quanta
