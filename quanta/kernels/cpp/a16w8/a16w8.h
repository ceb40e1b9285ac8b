// A16W8: 16-bit activations times 8-bit (or byte-split 16-bit) weights, accumulated
// exactly, requantized in float32 (docs/quantization-math.md eqs. (A1)-(A4)).
//
// Operands as the kernels see them (eq. (A2)):
//   A'[m, k] = a[m, k] − oa          int16; oa = 32768 for uint16 a, 0 otherwise
//   W'[k, n] = Σ_p 256^p · Wp[k, n]  one plane (|W'| ≤ 255: 8-bit weights) or two byte
//                                    planes hi (int8) / lo (0..255) of a 16-bit weight
// The micro-kernel computes S_p = Σ_k A'·Wp for one plane with int16 pair products
// (vpdpwssd / vpmaddwd) summed in int32 lanes. Bound: |A'| ≤ 2^15 and |Wp| ≤ 255, so one
// product is at most 32768·255 = 8 355 840 < 2^23 and 256 of them stay below 2^31 − 1;
// each int32 lane receives two products per pair step, so the lanes are added into int64
// every KC_PAIRS = 128 pair steps (256 values of k). The result is exact for any K.
//
// Packed weight layout (one plane): blocks of 16 columns; within a block, for every pair
// step p (k = 2p, 2p+1), 16 × 2 int16: [col0 k0, col0 k1, col1 k0, ...]; K is padded to
// even and N to a multiple of 32 with zeros.
#pragma once

#include <cstdint>
#include <cstring>

#include "dispatch.h"

namespace quanta {
namespace a16w8 {

constexpr int kMR = 4;         // rows per micro-kernel call
constexpr int kNR = 32;        // columns per micro-kernel call (two 16-column blocks)
constexpr int kKcPairs = 128;  // pair steps between int32 -> int64 flushes (bound above)

// c[r][j] = Σ_{p < k2} Σ_{t<2} a[r·lda + 2p + t] · b[(j/16)·k2·32 + p·32 + (j%16)·2 + t]
// for r < mr (rows ≥ mr of c are left untouched), j < 32; exact (int64).
using MicroKernel = void (*)(const int16_t* a, int64_t lda, int mr, int64_t k2, const int16_t* b, int64_t* c);

void ukernel_portable(const int16_t* a, int64_t lda, int mr, int64_t k2, const int16_t* b, int64_t* c);
void ukernel_avx2(const int16_t* a, int64_t lda, int mr, int64_t k2, const int16_t* b, int64_t* c);
void ukernel_avx512vnni(const int16_t* a, int64_t lda, int mr, int64_t k2, const int16_t* b, int64_t* c);

MicroKernel select_ukernel(Isa isa);

// One int16 pair as the int32 a broadcast takes (memcpy: no aliasing of the int16 panel).
inline int32_t pair(const int16_t* p) {
  int32_t v;
  std::memcpy(&v, p, sizeof v);
  return v;
}

enum class Elem : int { kU8 = 0, kI8 = 1, kU16 = 2, kI16 = 3 };

// The row steps of the convolutions, one set per ISA (rows.h has the generic loops):
//   dw_row:  acc[i] = Σ_{t < taps} src[t][i] · w[t], i < n, in float64: every operand is an
//            integer with |src|, |w| ≤ 65535, so each product is below 2^32 and the sum
//            of taps < 2^21 of them below 2^53: every float64 step is exact (in any
//            order, with or without fused multiply-add), and acc is the exact int64
//   requant: y[y0 + i] = eq. (A4) of v[i] = 256·hi[i] + lo[i] + c1·rx[i] + bias, i < n,
//            with multiplier m and zero point zy (hi, rx may be null: the term is 0);
//            |v| < 2^63 (the exact sums of eq. (A3)). AVX2 runs 8 outputs per step when
//            c1 and the step's rx fit int32 (vpmuldq) and its |v| < 2^51 (int64 -> float64
//            exactly by the 1.5·2^52 bit trick, then one rounding to float32), else the
//            scalar loop: the same bytes either way
//   dw_pairs: acc[i] = Σ_{t < pairs} lo(src[t][i])·lo(w[t]) + hi(src[t][i])·hi(w[t]), i < n:
//            each int32 of src and w holds two int16 (lo: bits 0-15, hi: 16-31), the
//            operands of two taps; the products and every partial sum are exact int32
//            under the caller's bound Σ|taps' weights| · 32768 ≤ 2^31 − 1 (the driver
//            checks it per call: 8-bit weights up to 257 taps), and acc is the exact int64.
//            One vpdpwssd per two taps and 16 outputs (AVX-512; AVX2 vpmaddwd + vpaddd).
struct RowKernels {
  void (*dw_row)(const double* const* src, const double* w, int64_t taps, int64_t n, int64_t* acc);
  void (*dw_pairs)(const int32_t* const* src, const int32_t* w, int64_t pairs, int64_t n, int64_t* acc);
  void (*requant)(const int64_t* hi, const int64_t* lo, const int64_t* rx, int64_t c1, int64_t bias, float m,
                  int64_t zy, Elem out, void* y, int64_t y0, int64_t n);
};
constexpr int64_t kMaxDepthwiseTaps = int64_t{1} << 20;  // kh · kw below this (dw_row's bound)
extern const RowKernels kRowsPortable, kRowsAvx2, kRowsAvx512Vnni;

// The per-column terms of eq. (A3) and the requantization of eq. (A4).
struct Epilogue {
  const int64_t* dw;    // [N] ow − zw[n]
  const int64_t* cw;    // [N] Σ_k W'[k, n]
  const int64_t* bias;  // [N] or null
  const float* mult;    // [N] float32 multipliers
  int64_t da;           // oa − za
  int64_t zy;
  Elem out;
};

// The packed weight of one GEMM: planes (1 or 2) of packed blocks.
struct Packed {
  const int16_t* data;  // [planes][nblocks32 · 2][k2][32]
  int planes;
  int64_t k;  // reduction length
  int64_t n;  // output columns
};

// y[m·N + n] for a: [M, K] of elem `a_elem`.
void matmul(const void* a, Elem a_elem, int64_t m, const Packed& w, const Epilogue& ep, void* y, int threads);

struct ConvGeom {
  int64_t batch, c, h, w;     // input
  int64_t m, kh, kw, oh, ow;  // output channels, kernel, output size
  int64_t sh, sw, dh, dw, pt, pl;
  int64_t group;
};

// NCHW convolution as Y[n, pix] = Σ_k W'[n, k] · X'[k, pix] per group: the weight rows are
// the micro-kernel's A operand and the im2col panel of 32 output pixels (X' = x − oa,
// padding zx − oa, in the packed layout above) its B operand, so that a 4 × 32 tile is
// four runs of 32 consecutive outputs of one channel each (one multiplier per run).
// `w` holds one weight per group (consecutive): `data` is [planes][n][2·k2] int16 rows of
// W' (the plane split of eq. (A2)), n = m / group, k = c / group · kh · kw; ep arrays
// cover all m output channels, with dw/cw as in matmul (eq. (A3) with the roles of the
// row and column sums exchanged).
void conv2d(const void* x, Elem x_elem, int64_t zx, const ConvGeom& g, const Packed* w, const Epilogue& ep, void* y,
            int threads);

// The direct convolution (AVX2; a16w8.cc conv2d takes it for convolutions with one weight
// plane and 16-bit activations when its int32 bound holds, else the GEMM above). Output
// pixels run along the flat plane (1×1, stride 1, no pads: x itself) or along one output
// row (else: from a copy of the input padded with zx, each row in sw column phases, column
// c at phase c mod sw and index c / sw, so that at any stride the 16 outputs of a tap read
// 16 consecutive values), 16 at a time; for input index k the kernel reads x[off[k] + j],
// so no im2col panel is built. For an
// output channel n, W''[n, k] = W'[n, k] + dw[n] = w − zw (eq. (A3): the dw·RX term moves
// into the weight, and no pixel sums are needed), added to the broadcast weight pair as
// int16 (|W'| ≤ 255 for one plane, |dw| ≤ 32512: no wrap). vpmaddwd multiplies the
// (X'[k], X'[k + 1]) pairs of 8 pixels (vpunpck{l,h}wd of two input rows) by
// (W''[n, k], W''[n, k + 1]); the sums stay in int32 for the whole K, exact because
//   |Σ_k W''·X' + c0[n]| ≤ 32768 · Σ_k |W''[n, k]| + |c0[n]| ≤ 2^31 − 1
// (every partial sum has the same bound), which the driver checks per channel: first as
// 32768 · K · (255 + |dw|) + |c0| (no scan), else with the scanned Σ_k |W''|; a channel
// beyond it sends the whole call to the GEMM. c0[n] = da·CW'[n] + K·da·dw[n] + bias[n], so
// v = Σ W''·X' + c0 is eq. (A3)'s sum, converted to float32 by vcvtdq2ps (the rounding of
// the scalar int64 -> float32 conversion of the same integer), then requantized as
// RowKernels::requant (eq. (A4)): the same bytes as the GEMM path.
struct DirectStrip {
  const int16_t* x;    // input element of channel k = 0 at the strip's first pixel (raw codes)
  const int64_t* off;  // [K] element offset of input channel k from x
  int64_t k;           // reduction length K
  bool u16;            // X' = x − 32768 (uint16 input: the sign bit flipped), else X' = x
  const int16_t* w;    // the group's W' rows [mg][lda] (one plane)
  int64_t lda;         // 2·ceil(K / 2)
  const int64_t* dw;   // [mg] ow − zw
  const int32_t* c0;   // [mg] the eq. (A3) constant (checked: see above)
  const float* mult;   // [mg]
  int64_t zy;
  Elem out;
  void* y;                  // output element of the group's channel 0 at the strip's first pixel
  int64_t y_stride;         // elements between output channels (OH·OW)
  int64_t len;              // output pixels in the strip
  int64_t mg, nblocks;      // the group's channels, split evenly into nblocks blocks of ≤ kDirectMR
  int64_t b0, b1;           // the blocks this strip computes
  int16_t* tail;            // scratch [2·ceil(K / 2)][16] for the last len % 16 pixels
  const int64_t* tail_off;  // [K] = 16·k
};
constexpr int kDirectMR = 6;  // output channels per tile: 12 ymm accumulators of 16 pixels
void direct_strip_avx2(const DirectStrip& s);

// Depthwise (c/group = m/group = 1): wd[m][kh·kw] = w − zw as int32, kh·kw below
// kMaxDepthwiseTaps; exact sums. Per channel, the input is laid out in `sw` column phases
// (column c of the padded plane in phase c mod sw at c / sw), so that every tap of an
// output row reads one contiguous run. When every |wd| ≤ 32767 and every channel's
// Σ_t |wd| · 32768 ≤ 2^31 − 1 (8-bit weights), the phases hold x' = x − ox (eq. (A2):
// int16; zx − ox in the padding) as int16 pairs (x'[c], x'[c + 1]), the taps of one
// kernel row that read consecutive columns of one phase go in pairs, and one
// RowKernels::dw_pairs per output row sums Σ x'·wd exactly; (ox − zx)·Σ_t wd joins the
// bias (eq. (A3)). Otherwise the phases hold x − zx (0 in the padding) as float64 and one
// dw_row per output row sums. Both are the exact sums, so the same bytes; each channel's
// rows are requantized at once.
void conv2d_depthwise(const void* x, Elem x_elem, int64_t zx, const ConvGeom& g, const int32_t* wd, const Epilogue& ep,
                      void* y, int threads);

}  // namespace a16w8
}  // namespace quanta
