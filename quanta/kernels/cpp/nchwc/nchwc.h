// nchwc: float32 kernels on the blocked layout NCHW16c (docs/kernels.md "NCHW16c").
//
// ---------------------------------------------------------------------------------------
// Layout
// ---------------------------------------------------------------------------------------
// An NCHW16c tensor is a plain [N, Cb, H, W, 16] float32 array, Cb = ⌈C / 16⌉, channel
// c = cb·16 + lane. Lanes of channels ≥ C ("pad lanes") hold finite values every consumer
// ignores; reorder_nchwc writes 0 there. The block is 16 on every ISA (AVX2: two ymm).
//
// ---------------------------------------------------------------------------------------
// Convolution contract (docs/float-ops.md "The float GEMM family" (FG1))
// ---------------------------------------------------------------------------------------
//   y[n, m, oy, ox] = post(clamp(Σ x[n, c, iy, ix] · w[m, c, ky, kx] + b[m] + s[n, m, oy, ox], lo, hi))
// Each output is one chain of fused multiply-adds from +0 over the taps inside the image,
// in the order (input channel block cb, ky, kx, lane) — channel c = cb·16 + lane — then
// + bias (when given), then + the sum operand s (when given: a residual Add after the
// Conv, group 1 only; an NCHW16c tensor of y's shape), then the clamp, then the post op
// (sgemm.h PostOp). Each + rounds once, as the Conv and Add nodes it replaces. Group 1:
// K = C·kh·kw terms; depthwise: K = kh·kw terms in (ky, kx) order. Taps outside the image
// are skipped, not multiplied by a zero: the chain is shorter, (FG1) still bounds it.
// Threads take (image, output channel blocks, output row) items; the reduction is never
// split, so every thread count gives the same bytes.
//
// Packed weights (conv_nchwc_pack):
//   group 1:   [Mb][Cb][kh][kw][16 input lanes][16 output lanes], zero past C and M
//   depthwise: [Cb][kh][kw][16 lanes], zero past C
#pragma once

#include <cstdint>

#include "dispatch.h"
#include "sgemm/sgemm.h"

namespace quanta {
namespace nchwc {

constexpr int kBlock = 16;
constexpr int kMaxP = 8;   // output pixels of one tile (per-ISA limits in Kernels)
constexpr int kMaxNb = 4;  // output channel blocks of one tile

inline int64_t blocks(int64_t c) { return (c + kBlock - 1) / kBlock; }

// One output tile of the group-1 convolution: `p` output pixels of one row × `nb` output
// channel blocks (the template sizes of the function), the taps [0, nky) × [0, nkx)
// (pointers already at the first tap inside the image), `cbs` input channel blocks.
//   x element (cb, ky, kx, lane) of pixel i at x + cb·xs_cb + ky·xs_row + kx·xs_col +
//   lane·xs_lane + i·xs_pix; weights (ob, cb, ky, kx, lane) at w + ob·ws_ob + cb·ws_cb +
//   ky·ws_row + kx·256 + lane·16; output pixel i of block ob at y + ob·ys_ob + i·16.
struct ConvTile {
  const float* x;
  int64_t xs_cb, xs_row, xs_col, xs_lane, xs_pix;
  int64_t cbs;     // input channel blocks
  int last_lanes;  // lanes of the last input block that are channels (1..16)
  int nky, nkx;    // taps
  const float* w;
  int64_t ws_ob, ws_cb, ws_row;
  const float* bias;  // [nb·16] at the tile's first output channel, or null
  float lo, hi;
  float* y;
  int64_t ys_ob;
  const float* sum = nullptr;  // the sum operand at y's position (same strides), or null
  // The driver runs the input channel blocks in passes (a pass's weights stay in L1 across
  // a row's tiles): first, the chains start from +0, else from the partial sums in y (a
  // float stored and reloaded is the same float: one chain either way); last, the
  // epilogue finishes them, else the partial sums are stored.
  bool first = true, last = true;
};
// `count` tiles of P pixels side by side from t: tile i reads x + i·P·xs_pix and writes
// y (and reads sum) + i·P·16. One call a row segment: the tile's set-up is paid once.
using ConvTileFn = void (*)(const ConvTile& t, int64_t count);
// Two single pixels (border pixels: each its own x, w, nkx, y; the rest from a) of `nb`
// output blocks, their chains interleaved.
using ConvPairFn = void (*)(const ConvTile& a, const ConvTile& b);

// A whole output row of p = 2 or 3 pixels (the 3 x 3 planes of a VGG's last block), each
// pixel over its own taps: pixel i takes the window's taps kx in [kx0[i], kx1[i]) (those
// inside the image), its input at tap kx at t.x + x_pix[i] + kx·t.xs_col (x_pix[i] may be
// negative: only taps inside are formed). t.x, t.w are the row's input and weights at tap
// kx = 0; t.nkx the window's width; y pixel i at t.y + i·16. The chains and their order
// are those of the tiles and pairs.
constexpr int kMaxRowP = 3;
struct RowTaps {
  int p;
  int kx0[kMaxRowP], kx1[kMaxRowP];
  int64_t x_pix[kMaxRowP];
};
using ConvRowFn = void (*)(const ConvTile& t, const RowTaps& r);
// Depthwise: `p` output pixels of one row of one channel block, taps [0, nky) × [0, nkx).
//   x of pixel i at tap (ky, kx): x + ky·xs_row + kx·xs_col + i·xs_pix (16 floats);
//   weight (ky, kx) at w + ky·ws_row + kx·16; output pixel i at y + i·16.
struct DwTile {
  const float* x;
  int64_t xs_row, xs_col, xs_pix;
  int nky, nkx;
  const float* w;
  int64_t ws_row;
  const float* bias;  // 16 floats or null
  float lo, hi;
  float* y;
};
// `count` tiles of P pixels side by side from t (x + i·P·xs_pix, y + i·P·16).
using DwTileFn = void (*)(const DwTile& t, int64_t count);

// MaxPool of one channel block's plane x [h][w][16] into y [oh][ow][16] (ONNX MaxPool, 2-D):
// each output the maximum over the window's positions inside the input, −inf when there is
// none; a NaN in the window gives NaN. Exact: max only selects (the sign of a zero maximum
// among +0 and −0 is not pinned, as pool.h max_pool_2d_f32).
struct PoolGeom {
  int64_t h, w, kh, kw, sh, sw, dh, dw, pt, pl, oh, ow;
};
using MaxPoolPlaneFn = void (*)(const float* x, const PoolGeom& g, float* y);
// GlobalAveragePool of one channel block: x [hw][16] -> y [16], per lane
// f32(sum16(x[:, lane]) / f32(hw)), sum16 of docs/float-ops.md (R1)-(R3): position i adds
// into partial sum i mod 16 in increasing i, then the fixed halving tree.
using GapBlockFn = void (*)(const float* x, int64_t hw, float* y);

// Output rows of at least kWideRow pixels (and the flat lines of a 1x1 convolution) group
// the output blocks by Kernels::max_nb; narrower rows by the widest block count that has
// tiles (max_p[nb − 1] > 0), whose tiles keep more chains per pixel where a row's interior
// is a few pixels (AVX2, one thread, a plain compile, 512 -> 512 3x3: at 5 x 5 3 × 2 tiles 1.9 ms, 6 × 1
// tiles 2.2 ms; at 6 x 6 3.3 ms and 2.7 ms).
constexpr int64_t kWideRow = 6;

struct Kernels {
  const char* isa;
  int max_p[kMaxNb];  // conv tile pixels per block count: tile[nb − 1][p − 1] non-null for p ≤ max_p[nb − 1]
  int max_nb;         // the group width on wide rows (kWideRow)
  ConvTileFn tile[kMaxNb][kMaxP];
  ConvPairFn pair[kMaxNb];  // pair[nb − 1]
  ConvRowFn row[kMaxNb];    // row[nb − 1]; null: rows of 2-3 pixels run as pairs and tiles
  int dw_max_p;
  DwTileFn dw[kMaxP];
  MaxPoolPlaneFn max_pool_plane;
  GapBlockFn gap_block;
};

extern const Kernels kKernelsPortable;
extern const Kernels kKernelsAvx2;
extern const Kernels kKernelsAvx512Vnni;
const Kernels& kernels_for(Isa isa);

// ---- reorders (moves only: bit-exact) ---------------------------------------------------

// x [n][c][hw] -> y [n][⌈c/16⌉][hw][16], pad lanes 0. Where the ISA has them (AVX-512),
// 16 × 16 in-register transposes (sgemm.h interleave16 / deinterleave16), else one scalar
// per element; the same bytes either way.
void reorder_to_nchwc(const float* x, int64_t n, int64_t c, int64_t hw, float* y, int num_threads, Isa isa);
// x [n][⌈c/16⌉][hw][16] -> y [n][c][hw].
void reorder_to_nchw(const float* x, int64_t n, int64_t c, int64_t hw, float* y, int num_threads, Isa isa);

// ---- convolution ------------------------------------------------------------------------

struct ConvGeom {
  int64_t n, c, h, w;  // input
  int64_t m;           // output channels
  bool depthwise;      // group == c == m (else group 1)
  bool input_nchw;     // x is plain [n][c][h][w] (group 1 only)
  int64_t kh, kw, sh, sw, dh, dw;
  int64_t pt, pl;
  int64_t oh, ow;
};

inline int64_t packed_size(int64_t m, int64_t c, int64_t kh, int64_t kw, bool depthwise) {
  return depthwise ? blocks(c) * kh * kw * kBlock : blocks(m) * blocks(c) * kh * kw * kBlock * kBlock;
}
// w: [m][c][kh][kw] (group 1) or [c][1][kh][kw] (depthwise, m == c) -> out (packed_size floats).
void pack_weights(const float* w, int64_t m, int64_t c, int64_t kh, int64_t kw, bool depthwise, float* out);

// ---- pools and resize (exact) -------------------------------------------------------------

// x [n·cb planes][h][w][16] -> y [n·cb][oh][ow][16]; threads over planes.
void max_pool(const float* x, int64_t planes, const PoolGeom& g, float* y, int num_threads, Isa isa);
// x [planes][hw][16] -> y [planes][16].
void global_avg_pool(const float* x, int64_t planes, int64_t hw, float* y, int num_threads, Isa isa);
// x [planes][h][w][16] -> y [planes][h·fy][w·fx][16], y[oy][ox] = x[oy / fy][ox / fx].
void resize_nearest(const float* x, int64_t planes, int64_t h, int64_t w, int64_t fy, int64_t fx, float* y,
                    int num_threads);

// bias16: null or ⌈m/16⌉·16 floats (zero past m); y: [n][⌈m/16⌉][oh][ow][16].
void conv(const ConvGeom& g, const float* x, const float* w_packed, const float* bias16, float lo, float hi,
          const sgemm::PostOp* post, float* y, int num_threads, Isa isa, const float* sum = nullptr);

}  // namespace nchwc
}  // namespace quanta
