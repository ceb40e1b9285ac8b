// sgemm: the float32 GEMM family (float Conv, ConvTranspose, MatMul, Gemm) on one
// register-blocked FMA micro-kernel, plus a direct depthwise convolution.
//
// ---------------------------------------------------------------------------------------
// Contract (docs/float-ops.md "The float GEMM family"; NumPy twins: reference nn.py Gemm /
// MatMul, nn_conv.py Conv / ConvTranspose)
// ---------------------------------------------------------------------------------------
//
//   C[i, j] = ep( Σ_{k<K} A[i, k] · B[k, j] )         ep(v) = clamp(α·v + r[i] + c[j], lo, hi)
//
// - Each C[i, j] is one chain of fused multiply-adds (explicit fma intrinsics; the
//   portable variant uses std::fma) from +0 in increasing k, then the epilogue:
//   a multiply by α (skipped when α = 1), the row bias r (per output channel of a
//   convolution), the column bias c (Gemm's C / a MatMul+Add bias), a clamp. The
//   reduction is never split across threads: threads take (rows, columns) tiles, and a
//   tile computes every element with the same instructions whichever thread runs it, so
//   the bytes are identical for any thread count. ISA variants may differ from one
//   another (each stays within the bound below).
// - Error bound against float64 (the chain has K roundings, the epilogue at most 3):
//       |C − C64| ≤ (K + 3) · u · (|α| · Σ_k |A[i,k]| |B[k,j]| + |r[i]| + |c[j]|),  u = 2^-24   (FG1)
//   (Higham's γ_n bound for a recursive sum; tests/kernels/test_sgemm.py checks it).
//
// Operands:
//   A (M × K): packed ([⌈M/8⌉][K][8] panels, zero rows past M; pack_a) or row-major
//              (element (i, k) at a[i·rs + k]; the binding copies a transposed A).
//   B (K × N): packed ([⌈N/32⌉][K][32] panels, zero columns past N; pack_b) or row-major
//              with leading dimension ldb (element (k, j) at b[k·ldb + j]).
//   C (M × N): row-major, leading dimension ldc.
//
// Layering (as qgemm): micro-kernels per ISA (sgemm_<isa>.cc: an MR × NR tile over a
// K-block, fma into registers, masked at the right edge), the driver (sgemm.cc: K blocks
// of kKc, tiles of rows × columns claimed by the thread pool), the convolution drivers
// (sgemm.cc: pointwise as GEMM, the others as an implicit GEMM over a phase-split copy
// of the input (path "im2col": the same matrix, never written out),
// depthwise direct) and the binding (bindings_sgemm.cc: shape checks, packing).
#pragma once

#include <cstdint>

#include "dispatch.h"

namespace quanta {
namespace sgemm {

constexpr int kPackMr = 8;   // rows of a packed A panel (a multiple of every ISA's MR)
constexpr int kPackNr = 32;  // columns of a packed B panel (a multiple of every ISA's NR)

// An activation after the epilogue's clamp, applied in place by the drivers to each
// thread task's finished block of C (still in L2): the graph's Conv -> activation pair
// in one pass over the output. Each kind is the chain of the separate float32
// kernels it replaces, called on the tile's elements (float_ops / tensor_ops run
// functions of the same ISA), so the bytes are those of the unfused steps:
//   kSilu         y = f32(x · sigmoid(x))                     Sigmoid (Σ1)-(Σ2), Mul
//   kHardSwish    y = f32(x · clip01(f32(f32(x · f32(1/6)) + 0.5)))        HardSwish
//   kHardSigmoid  y = clip01(f32(f32(p0 · x) + p1))                          HardSigmoid
//   (clip01: np.clip(t, 0, 1), docs/float-ops.md "Elementwise")
//   kClipGateDiv  y = f32(f32(x · min(max(f32(x + p0), p1), p2)) / p3)
//                 (Paddle's written-out hardswish: Add, Clip, Mul, Div)
//   kLeakyRelu    t = x < 0 ? f32(x · p0) : x; y = max(t, p1)    LeakyRelu, then Max of a
//                 scalar (p1 = −inf: no Max; TensorFlow exports' Maximum(LeakyRelu(x), c))
enum class PostKind : int { kNone = 0, kSilu = 1, kHardSwish = 2, kHardSigmoid = 3, kClipGateDiv = 4, kLeakyRelu = 5 };
constexpr int kNumPostKinds = 6;
struct PostOp {
  PostKind kind = PostKind::kNone;
  float p[4] = {0, 0, 0, 0};
  Isa isa = Isa::kPortable;
};
// y[i] = post(y[i]) for i < n (post_op.cc; a thread-local scratch row, no allocation once warm).
void apply_post(const PostOp& op, float* y, int64_t n);

struct Epilogue {
  float alpha = 1.0f;
  const float* bias_row = nullptr;  // indexed by the row of C (absolute)
  const float* bias_col = nullptr;  // indexed by the column of C (absolute)
  float lo = -__builtin_inff();
  float hi = __builtin_inff();
  const PostOp* post = nullptr;  // applied by the GEMM drivers to each finished task block (null: none)
};

// One r × nr tile over one K-block (MR' is the template row count of the function
// chosen from the table, nr ≤ the ISA's NR):
//   acc = load_c ? C : 0;  acc += Σ_k a(i, k) · b(k, j);  C = last ? ep(acc) : acc.
struct Tile {
  int64_t k;
  const float* a;
  int64_t a_rs;  // row-major A only
  const float* b;
  int64_t ldb;
  float* c;
  int64_t ldc;
  int nr;
  bool load_c;
  const Epilogue* ep;  // null: not the last K-block, store the raw accumulators
  int64_t row0, col0;  // absolute indices of the tile's first element (bias lookups)
  // tile_indirect only: B row kk of this K-block is the run b + boff[kk] (the implicit
  // GEMM's tap offsets into its phase-split input; ldb unused)
  const int64_t* boff = nullptr;
  // Packed B only, a hint (null: none; ISAs without it ignore it): the tile prefetches
  // the 128 bytes at pf + kk·kPackNr for each of its k steps, the packed panels a fixed
  // distance ahead of the one it reads (sgemm.cc run_block_stream). Never dereferenced.
  const float* pf = nullptr;
};
using TileFn = void (*)(const Tile& t);

// One depthwise output row: y[x] = Σ_{ky, kx} w[ky·kw + kx] · rows[ky][x·sw + kx·dw]
// (fma from +0, taps in (ky, kx) order), then + bias, clamped; for x in [0, ow). The
// rows are readable up to round_up(ow, 16)·sw + (kw − 1)·dw + 32 floats (whole vectors).
using DwRowFn = void (*)(const float* const* rows, const float* w, int kh, int kw, int sw, int dw, float bias, float lo,
                         float hi, float* y, int64_t ow);

// Two depthwise output rows, r0 and r1 each kh row pointers as for DwRowFn, into y0 and y1,
// every output the chain of DwRowFn; false: this (kh, kw, sw) is not specialized, nothing
// was written. Null where the ISA has none.
using DwRows2Fn = bool (*)(const float* const* r0, const float* const* r1, const float* w, int kh, int kw, int sw,
                           int dw, float bias, float lo, float hi, float* y0, float* y1, int64_t ow);

// Two depthwise output rows at stride 2 and dilation 1 from split rows: r0[ky] and r1[ky]
// point at a row's even columns (64-byte aligned), its odd columns at + half (also
// aligned), each readable for round_up(ow, 16) + 16 floats; the columns are those of the
// padded row DwRowFn reads (padded column 2i at [i], 2i + 1 at [half + i]). Every output
// the chain of DwRowFn; false: this (kh, kw) is not specialized, nothing was written.
// Null where the ISA has none.
using DwRows2SplitFn = bool (*)(const float* const* r0, const float* const* r1, int64_t half, const float* w, int kh,
                                int kw, float bias, float lo, float hi, float* y0, float* y1, int64_t ow);
// even[i] = src[2i] for i < ceil(n / 2), odd[i] = src[2i + 1] for i < floor(n / 2): the
// split rows of DwRows2SplitFn. Null with dw_rows2_split.
using Split2Fn = void (*)(const float* src, int64_t n, float* even, float* odd);

// y[i·ldy] for the rows of `panels` packed A panels (rows ≥ rows_left are not written):
// Σ_k a(i, k) · x[k·ldx], the tile's fma chain, then the epilogue (row0: the absolute
// index of the first row, for the bias; the column is 0).
using GemvFn = void (*)(const float* a_panels, int64_t panels, int64_t k, const float* x, int64_t ldx, float* y,
                        int64_t ldy, int64_t rows_left, int64_t row0, const Epilogue& ep);

// Depthwise on small planes, 16 channels per vector: buf holds 16 channels' zero-padded
// input interleaved ([row][col][16], rows wp columns apart), w16 [kh·kw][16] and bias16
// [16] the channels' taps and biases (0 without bias); out16 [oh·ow][16] receives, per
// lane, the same chain as DwRowFn (fma from +0, taps in (ky, kx) order, + bias, clamp),
// so a channel's bytes do not depend on the path. Null where the ISA has none.
using DwBlockFn = void (*)(const float* buf, int64_t wp, const float* w16, const float* bias16, int kh, int kw, int sh,
                           int sw, int dh, int dw, int64_t oh, int64_t ow, float lo, float hi, float* out16);

// The lane moves around DwBlockFn (null where dw_block16 is): interleave16 writes
// dst[i·16 + l] = src[l·ld + i] for l < cb and 0 for cb ≤ l < 16, i < n;
// deinterleave16 writes dst[l·ld + i] = src[i·16 + l] for l < cb, i < n. Bytes moved,
// never computed: 16 x 16 in-register transposes instead of one scalar per element.
using Interleave16Fn = void (*)(const float* src, int64_t ld, int cb, int64_t n, float* dst);
using Deinterleave16Fn = void (*)(const float* src, int64_t n, int cb, float* dst, int64_t ld);

// dst[kk·8 + r] = src[tap[kk] + base[r]] for kk < k, r < 8: an A panel of 8 output
// pixels (their window origins base[r] in a zero-padded input) over the taps tap[kk]
// (the pixels-as-rows im2col, ConvPath::kIm2colRows). Bytes moved, never computed.
using PackGather8Fn = void (*)(const float* src, const int32_t* base, const int64_t* tap, int64_t k, float* dst);

// One output row of m channels of a stride-1, dilation-1, group-1 convolution, computed
// directly from the input rows (ConvPath::kIm2col with few output channels, sgemm.cc
// conv_direct): for r < m and ox < ow,
//   y[r·ldy + ox] = ep(Σ_k a[(r / 4)·4·K + 4·k + r % 4] · in(k, ox)),
//   k = (c·kh + ky)·kw + kx < K = c·kh·kw,  in(k, ox) = rows[ky][c·cstride[ky] + ox − pl + kx],
// the fma chain from +0 in increasing k of the implicit GEMM's tile, then + bias[r] (if
// bias), max(lo, ·), min(hi, ·): its bytes. The rows are the zero-padded input rows (a
// padding tap is an fma with 0, as there), readable for ox − pl + kx in [−pl,
// round_up(ow, 8) − pl + kw − 1); a row the window leaves is a zero row (cstride 0).
// a holds the weights of each 4 channels k-major, ceil(m / 4) such blocks (the rows
// past m: any finite values).
struct DirectRow {
  const float* const* rows;
  const int64_t* cstride;
  int64_t c, kh, kw, pl, ow;
  const float* a;
  int64_t m;
  const float* bias;
  float lo, hi;
  float* y;
  int64_t ldy;
};
using DirectRowFn = void (*)(const DirectRow& d);

struct Kernels {
  const char* isa;
  int mr, nr;               // the micro-kernel's tile
  int mr_rows;              // rows of a tile on a row-major A (≥ mr; tile[0][1 … mr_rows])
  TileFn tile[2][9];        // tile[packed A][r] computes r rows (1 ≤ r ≤ mr or mr_rows); A row-major
                            // (a[i·a_rs + k]) or packed (a[i + kPackMr·k])
  TileFn tile_indirect[9];  // packed A, B rows through Tile::boff (null: the ISA has none;
                            // the driver packs B panels instead); the same fma chains
  DwRowFn dw_row;
  GemvFn gemv;
  DwBlockFn dw_block16;
  DwRows2Fn dw_rows2;
  Interleave16Fn interleave16;
  Deinterleave16Fn deinterleave16;
  DwRows2SplitFn dw_rows2_split;
  Split2Fn split2;
  PackGather8Fn pack_gather8;
  DirectRowFn direct_row;  // null: the implicit GEMM runs every kIm2col convolution
};

extern const Kernels kKernelsPortable;
extern const Kernels kKernelsAvx2;
extern const Kernels kKernelsAvx512Vnni;
const Kernels& kernels_for(Isa isa);

// ---- packing (sgemm.cc) ------------------------------------------------------------------

inline int64_t packed_a_size(int64_t m, int64_t k) { return (m + kPackMr - 1) / kPackMr * kPackMr * k; }
inline int64_t packed_b_size(int64_t k, int64_t n) { return (n + kPackNr - 1) / kPackNr * kPackNr * k; }
// A element (i, k) at a[i·rs + k·cs].
void pack_a(const float* a, int64_t rs, int64_t cs, int64_t m, int64_t k, float* out);
// B element (k, j) at b[k·rs + j·cs].
void pack_b(const float* b, int64_t rs, int64_t cs, int64_t k, int64_t n, float* out);

// ---- GEMM ---------------------------------------------------------------------------------

struct MatA {
  const float* p;
  bool packed;
  int64_t rs;  // row-major only: element (i, k) at p[i·rs + k]
};
struct MatB {
  const float* p;
  bool packed;
  int64_t ld;  // row-major only
};

void gemm(int64_t m, int64_t n, int64_t k, const MatA& a, const MatB& b, float* c, int64_t ldc, const Epilogue& ep,
          int num_threads, Isa isa);

// batch × (m × n) products of an empty reduction (K = 0), C row-major: every element the
// epilogue of +0, as the micro-kernel would finish it, then the post-op.
void empty_product(int64_t batch, int64_t m, int64_t n, const Epilogue& ep, float* c);

// `batch` products C_t = A_t · B_t: A_t at a.p + a_off[t] (strided, never packed) or the
// one packed A when a.packed; B_t at b.p + b_off[t] (or the one packed B); C_t at
// c + t·m·n (row-major, ldc = n). Tiles of every product share one pool run.
void gemm_batched(int64_t batch, int64_t m, int64_t n, int64_t k, const MatA& a, const int64_t* a_off, const MatB& b,
                  const int64_t* b_off, float* c, const Epilogue& ep, int num_threads, Isa isa);

// ---- convolution, NCHW (1-D runs as H = 1) -------------------------------------------------

struct ConvGeom {
  int64_t n, c, h, w;  // input
  int64_t m, g;        // output channels, groups
  int64_t kh, kw, sh, sw, dh, dw;
  int64_t pt, pl;  // top / left pads (bottom / right follow from oh / ow)
  int64_t oh, ow;
};

// w: for the GEMM paths the G packed A matrices (Mg × Cg·kh·kw each, packed_a_size apart);
// for depthwise (G = C = M) the raw [C][kh·kw] weights; for the rows paths the packed B
// of Wᵀ (pack_b of the [M][C·kh·kw] weights read transposed, packed_b_size(C·kh·kw, M)).
//
// kPointwiseRows: a 1x1 convolution without pads or groups on a small output plane runs
// with the output pixels as the GEMM's rows, Cᵀ (OH·OW × M) = Xᵀ · Wᵀ, then transposed
// into NCHW. The plane's pixels fill few of a tile's 16-lane columns (7x7: 49 of 64)
// while the channels fill them all. Every element is the same fma chain (a product
// commutes; k increasing) with the same epilogue (the channel's bias as a column bias):
// the bytes of kPointwise. A stride (no pads) samples the plane first, as kIm2col's
// strided 1x1 does.
//
// kIm2colRows: any other convolution of group 1 on a small output plane, the same way:
// Cᵀ = im2col(x)ᵀ · Wᵀ with the im2col rows (one per output pixel, taps in (c, ky, kx)
// order) gathered from a zero-padded copy of the input straight into A panels
// (Kernels::pack_gather8); the weights packed as for kPointwiseRows (pack_b of the
// [M][C·kh·kw] weights read transposed). kIm2col's chains (the im2col values in the same
// k order): its bytes. kIm2col computes a grid of OH × (padded width) positions and drops
// the extra columns (2 of 9 at 7x7 with 3x3 taps), and its pixels fill few lanes.
enum class ConvPath : int { kPointwise = 0, kIm2col = 1, kDepthwise = 2, kPointwiseRows = 3, kIm2colRows = 4 };
// `rows_allowed`: whether kPointwiseRows may be chosen (the weights were packed for it).
ConvPath conv_path(const ConvGeom& g, bool rows_allowed = false);
// post: an activation after the clamp (null: none), PostOp above.
void conv(const ConvGeom& g, ConvPath path, const float* x, const float* w, const float* bias, float lo, float hi,
          float* y, int num_threads, Isa isa, const PostOp* post = nullptr);

// ConvTranspose's col2im, as a gather: cols [n·m][kh][kw][h][w] (the GEMM's columns:
// channel, kernel offset, input position) into y [n·m][oh][ow], the crop
// [bt, bt + oh) × [bl, bl + ow) of the canvas of (h − 1)·sh + (kh − 1)·dh + 1 rows (and
// likewise columns); canvas positions outside it read 0. Per element, from +0, the
// contributions cols[ky][kx][iy][ix] with iy·sh + ky·dh = canvas row (and likewise
// columns) are added in increasing (ky, kx) — the order of the NumPy twin's scatter
// (nn_conv._scatter_windows: one whole-canvas add per kernel offset) — then bias[c],
// then the clamp: the twin's bytes for the same columns. Threads take whole planes.
void col2im(const float* cols, int64_t planes, int64_t m, int64_t kh, int64_t kw, int64_t h, int64_t w, int64_t sh,
            int64_t sw, int64_t dh, int64_t dw, int64_t bt, int64_t bl, int64_t oh, int64_t ow, const float* bias,
            float lo, float hi, float* y, int num_threads);

}  // namespace sgemm
}  // namespace quanta
