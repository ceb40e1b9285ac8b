// Internal interface between the conv drivers (conv.cc, conv_gemm.cc) and their pieces:
// the plan of a call, the thread split, the depthwise micro-kernels (depthwise_<isa>.cc),
// the tile transposes (layout/tiles.h) and im2col (im2col.cc, im2col_avx512vnni.cc).
// Nothing here sees a Python object.
#pragma once

#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstdint>
#include <cstring>

#include "conv/conv.h"
#include "layout/tiles.h"
#include "qgemm/thread_pool.h"

namespace quanta {
namespace conv {

inline int64_t round_up(int64_t v, int64_t to) { return (v + to - 1) / to * to; }
inline int64_t div_up(int64_t v, int64_t by) { return (v + by - 1) / by; }
inline size_t align64(size_t v) { return (v + 63) / 64 * 64; }
inline int out_bytes(OutType t) { return t == OutType::kS32 ? 4 : 1; }

// dst[i] = src[i] ^ flip (the u8 shift of int8 x, eq. (8)); vectorised by the compiler.
inline void copy_flipped(const uint8_t* __restrict src, uint8_t* __restrict dst, int64_t n, uint8_t flip) {
  if (flip == 0 && n >= 32) {
    std::memcpy(dst, src, static_cast<size_t>(n));
    return;
  }
  for (int64_t i = 0; i < n; ++i) dst[i] = static_cast<uint8_t>(src[i] ^ flip);  // short rows: no call
}

// Runs fn(unit, thread) once for every unit in [0, units), split into one home range per
// thread index: thread t takes units from its own range first, then from the others'
// (one atomic cursor per range), so that nothing waits for a thread the OS runs late.
// The pool's thread indices are stable across calls, so two phases split this way over
// the same pixels (the padded image, then the output rows that read it) keep most data
// on the core that wrote it; claimed in plain order, half of the units read rows the
// other core had just written (3x3 64 -> 64 at 56x56, two threads: 900 -> 1050 GOPS).
template <typename F>
inline void run_with_affinity(int threads, int64_t units, F& fn) {
  constexpr int kMaxRanges = 64;
  struct alignas(64) Range {
    std::atomic<int64_t> next{0};
    int64_t end = 0;
  };
  const int ranges = static_cast<int>(std::min<int64_t>({int64_t{threads}, int64_t{kMaxRanges}, units}));
  if (ranges <= 1) {
    for (int64_t u = 0; u < units; ++u) fn(u, 0);
    return;
  }
  Range range[kMaxRanges];  // on the stack: no allocation
  for (int r = 0; r < ranges; ++r) {
    range[r].next.store(units * r / ranges, std::memory_order_relaxed);
    range[r].end = units * (r + 1) / ranges;
  }
  auto claim = [&](int64_t, int thread) {
    for (int k = 0; k < ranges; ++k) {
      Range& own = range[(thread + k) % ranges];
      for (int64_t u = own.next.fetch_add(1, std::memory_order_relaxed); u < own.end;
           u = own.next.fetch_add(1, std::memory_order_relaxed)) {
        fn(u, thread);
      }
    }
  };
  qgemm::parallel_for(ranges, ranges, claim);
}

// How one call runs (QConv::make_plan): path, work split, workspace layout.
enum class Path {
  kDepthwise,
  kDepthwiseNhwc,
  kDepthwiseTransposed,
  kIm2col,
  kImplicit,
  kDirect,
  kDirectTransposed,
  kPointwiseNchw
};

struct QConv::Plan {
  Path path = Path::kIm2col;
  int threads = 1;
  size_t main_bytes = 0, thread_bytes = 0, gemm_bytes = 0;
  int n_thread_ws = 0;  // per-thread buffers (and qgemm workspaces) in use
  int64_t units = 0;    // work items claimed by the threads
  // im2col path
  bool direct = false;    // 1x1, stride 1, no pads, one group: xt rows are the GEMM rows
  int64_t xt_stride = 0;  // bytes per pixel in xt
  int64_t rows = 0, chunk_rows = 0, n_chunks = 0;
  bool parallel_units = true;  // else qgemm gets the threads
  size_t off_ybuf = 0;         // in a thread buffer, after the im2col rows
  // implicit path (conv_gemm.cc)
  int64_t Hp = 0, Wp = 0;                           // padded image
  bool fused_transpose = false;                     // 1x1 / stride 1 / no pads: units transpose their own rows
  int64_t run_len = 0, blocks_per_run = 0, mc = 0;  // a run: the OH·OW output pixels of (image, group)
  int64_t chunk_k = 0, n_taps = 0;                  // K per tap chunk, and the number of tap chunks
  int64_t taps_per_call = 1;                        // tap chunks per tile call (sums in registers across them)
  bool rowsums = false;                             // some group has a weight zero point: Σx' per row needed
  // the family's x' is int16 (avx2, 8-bit weights): the uint8 padded image is widened
  // into a second one at off_xpad16, which the tiles read (conv_gemm.cc)
  bool wide = false;
  size_t off_xpad16 = 0;
  size_t off_xpad = 0, off_pixsum = 0, off_colterm = 0, off_mult = 0;  // main buffer (also depthwise)
  size_t off_partial = 0, off_rowsum = 0;                              // thread buffer
  // depthwise path
  bool dw_direct = false;  // the kernel reads the NCHW planes in place
  bool dw_pairs = false;   // avx2 pair kernel: the thread buffer holds the int16 rows it builds
  int64_t dw_stride = 0, dw_rows_per_unit = 0, dw_row_blocks = 0, dw_in_rows = 0;
  size_t off_ready = 0;  // main buffer (colterm at off_colterm)
  // channels_last (ConvArgs::channels_last)
  bool x_in_place = false;                // gemm paths: the A rows are read from x itself (uint8, no pads)
  size_t off_padrow = 0, off_tapoff = 0;  // depthwise: main buffer (and colterm, mult); implicit: tap offsets
  size_t off_ptrs = 0, off_scratch = 0;   // depthwise: thread buffer; implicit: the unit's row pointers
  size_t off_flat = 0;                    // depthwise flat rows: main buffer
  size_t off_xt = 0, off_yt = 0;          // *Transposed paths: NHWC x and y, main buffer
  // implicit path, channels_last uint8 x with pads (conv_gemm.cc "border mode"): interior
  // output pixels read x in place (tap offsets with x's own row pitch W); those whose
  // window leaves x read a padded copy of only their window, with the same pitch: a strip
  // of band_rows input rows per border output row (columns inside x), or a patch of
  // span_w columns per pixel whose window leaves x sideways (per_band patches side by
  // side in a band of band_rows rows)
  bool border = false;
  int64_t band_rows = 0, span_w = 0, per_band = 0, n_strips = 0, n_bands = 0, n_colborder = 0;
  size_t off_strip_index = 0, off_col_index = 0;  // main buffer: OH / OW int32 (−1: inside)
  // pointwise NCHW path: units are (image, pixel range of pw_cols), pw_parts per image
  int64_t pw_cols = 0, pw_parts = 0;
};

// ---------------------------------------------------------------------------------------
// Depthwise (conv.h "Paths"). One call computes `rows` output rows of one channel plane.
//
// Input: a padded copy of the input rows the call needs, in the x' domain (uint8),
//   in[r·in_stride + col]  =  xpad'[iy0 + r, col]     (col 0 is input column −pad_left)
// with every position outside x holding zx'. in_stride leaves at least 64 bytes of slack
// past the last column any output reads (depthwise_row_stride), so the SIMD kernels may
// load whole vectors past the row's end; the values read there only reach output lanes
// that are never stored.
//
// Weights (DepthwiseWeights): per channel and kernel row ky, groups4 = ceil(kw/4) groups
// of 4 horizontal taps, one int32 each:
//   taps4[(c·kh + ky)·groups4 + q] = bytes (w_eff[c,ky,4q], .., w_eff[c,ky,4q+3]), 0 past kw
// w_eff = w − zw when that fits int8 for every tap of the channel (symmetric int8
// weights, uint8 weights around 128; zw_eff = 0: no Σx' term), else w' (int8 w, or
// uint8 w − 128) with zw_eff = zw' (eq. (8)).
//
// Per output (oy, ox) of the call (oy relative to its first row):
//   acc = Σ_{ky, kx} in[(oy·sh + ky·dh)·in_stride + ox·sw + kx·dw] · w_eff[ky, kx]
//         − zw_eff·Σ_{ky, kx} in[...]   +   colterm                         eq. (5)
//   colterm = bias[c] − zx'·cs[c]   (wrapping; cs[c] = Σ (w − zw))
// then the output stage of conv.h for this channel's multiplier.
//
// SIMD lanes are output pixels along the row and the 4 bytes of a lane are 4 taps:
// AVX-512 VNNI: 16 outputs per vpdpbusd (rows of at most 8 outputs two to a vector) (vpermd + vpshufb gather the 4 taps of 16 pixels
// from one 64-byte load); AVX2: 4 outputs per 16-byte vpshufb, widened to int16 for
// vpmaddwd, two vectors combined by vphaddd. The one-load gathers need every tap offset
// o·sw + t·dw (o, t < 4) within 16 bytes and, for VNNI, sw <= 4 (dw_gather_fits); other
// geometries gather with scalar loads into the same vectors.
// ---------------------------------------------------------------------------------------
struct DepthwiseRows {
  const uint8_t* in = nullptr;  // the padded rows, or null for the direct mode below
  int64_t in_stride = 0;
  // Direct mode (avx512vnni, one-load gathers, groups4 = 1, OW <= 16): no padded copy; the kernel
  // reads the NCHW plane with masked loads whose masked-off bytes merge in zx':
  // xpad'[r, col] = x[src_row0 + r, src_col0 + col] ^ flip inside x, zx' outside.
  const uint8_t* plane = nullptr;
  int64_t src_h = 0, src_w = 0, src_row0 = 0, src_col0 = 0;
  uint8_t pad = 0, flip = 0;  // zx', and 0x80 for int8 x
  const int32_t* gather_perm2 = nullptr;
  int64_t rows = 0, ow = 0;
  int64_t sh = 1, sw = 1, dh = 1, dw = 1, kh = 1, kw = 1, groups4 = 1;
  const int32_t* gather_perm = nullptr;  // DepthwiseWeights' gather tables
  const int8_t* gather_full = nullptr;
  const int8_t* gather_last = nullptr;
  const int32_t* taps4 = nullptr;  // this channel's [kh][groups4]
  const int8_t* taps = nullptr;    // this channel's [kh][kw]
  int32_t zw = 0;                  // zw_eff
  int32_t colterm = 0;
  OutType out_type = OutType::kS32;
  float multiplier = 0.f;
  int32_t zy = 0;
  float lo_minus_zy = 0.f, hi_minus_zy = 0.f;  // qmin − zy, qmax − zy (kU8/kS8)
  void* y = nullptr;                           // output row 0 of the call (elements of out_type)
  int64_t y_stride = 0;                        // elements between output rows (OW)
  // avx2 pair mode (dw_pairs_fit; in = null): the kernel reads the plane as the direct
  // mode above and builds the padded rows itself, widened to int16: scratch16 holds
  // dw_pairs_width() elements per row (xpad' as in the direct mode, zx' outside x)
  int16_t* scratch16 = nullptr;
};

// The avx2 pair kernel (depthwise_avx2.cc) takes sw = 1 or 2, dw = 1 and at most 64 tap
// pairs: each pair (kx, kx + 1) of output pixel o is one dword of the int16 row.
constexpr int64_t kDwMaxPairs = 64;
inline bool dw_pairs_fit(int64_t sw, int64_t dw, int64_t kh, int64_t kw) {
  return (sw == 1 || sw == 2) && dw == 1 && kh * ((kw + 1) / 2) <= kDwMaxPairs;
}
// int16 elements per padded row of the pair kernel: what its 16-pixel blocks read (the
// last block's second vector ends before ow16·sw + 2·pairs), in whole 32-byte vectors
inline int64_t dw_pairs_width(int64_t ow, int64_t sw, int64_t kw) {
  return ((ow + 15) / 16 * 16 * sw + 2 * ((kw + 1) / 2) + 15) / 16 * 16;
}

// byte 4o + t of a 16-byte lane: tap t of the lane's pixel o, at o·sw + t·dw; 0x80 (a
// zero) for taps past `taps`. vpermd index of dword e: (e / 4)·sw + e % 4.
// perm2 (two rows of at most 8 outputs): lanes 0, 1 from the first row, 2, 3 (index + 16)
// from the second.
inline void dw_gather_tables(int64_t sw, int64_t dw, int64_t kw, int32_t* perm, int32_t* perm2, int8_t* full,
                             int8_t* last) {
  const int64_t last_taps = kw - 4 * ((kw + 3) / 4 - 1);
  for (int e = 0; e < 16; ++e) {
    perm[e] = static_cast<int32_t>((e / 4) * sw + e % 4);
    perm2[e] = e < 8 ? perm[e] : static_cast<int32_t>(16 + ((e - 8) / 4) * sw + e % 4);
  }
  for (int i = 0; i < 64; ++i) {
    const int64_t o = (i % 16) / 4, t = i % 4;
    const int64_t at = o * sw + t * dw;
    const int8_t byte = at < 16 ? static_cast<int8_t>(at) : static_cast<int8_t>(0x80);  // >= 16: unused (slow path)
    full[i] = byte;
    last[i] = t < last_taps ? byte : static_cast<int8_t>(0x80);
  }
}

inline bool dw_gather_fits(int64_t sw, int64_t dw, int64_t kw) {
  const int64_t taps = kw < 4 ? kw : 4;
  return sw <= 4 && 3 * sw + (taps - 1) * dw <= 15;
}

// Bytes per padded row: the last 16-wide block's reads, plus 64 bytes of slack.
inline int64_t depthwise_row_stride(int64_t ow, int64_t sw, int64_t dw, int64_t groups4) {
  const int64_t ow16 = (ow + 15) / 16 * 16;
  const int64_t need = (ow16 - 1) * sw + 4 * groups4 * dw + 64;
  return (need + 63) / 64 * 64;
}

void depthwise_rows_portable(const DepthwiseRows& a);
void depthwise_rows_avx2(const DepthwiseRows& a);
void depthwise_rows_avx512vnni(const DepthwiseRows& a);

// Output stage of one element (the scalar arithmetic of qgemm's finish_element).
inline void dw_store(int32_t acc, const DepthwiseRows& a, int64_t at) {
  if (a.out_type == OutType::kS32) {
    static_cast<int32_t*>(a.y)[at] = acc;
    return;
  }
  float v = static_cast<float>(acc) * a.multiplier;
  v = v < a.lo_minus_zy ? a.lo_minus_zy : v;
  v = v > a.hi_minus_zy ? a.hi_minus_zy : v;
  const int32_t q = static_cast<int32_t>(std::nearbyint(v)) + a.zy;
  if (a.out_type == OutType::kS8) {
    static_cast<int8_t*>(a.y)[at] = static_cast<int8_t>(q);
  } else {
    static_cast<uint8_t*>(a.y)[at] = static_cast<uint8_t>(q);
  }
}

// ---------------------------------------------------------------------------------------
// Depthwise, channels_last. One call computes one output row (ow pixels) of all C
// channels of an NHWC image; SIMD lanes are channels, so every load is a contiguous run
// of one input pixel's channels and nothing is transposed or copied.
//
// Input, by indirection (XNNPACK's): ptrs[o·taps + t] is the input pixel (C bytes, x's
// own domain) under tap t = ky·kw + kx of output pixel o, or a pad pixel whose C bytes
// are zx. The kernels apply the flip (x' = x ^ 0x80 for int8 x, eq. (8)) on load, so a pad
// tap reads zx'.
//
// Per channel c of pixel o, as the NCHW kernel (eq. (5)):
//   acc = Σ_t x'[t, c]·w_eff[c, t] − zw_eff[c]·Σ_t x'[t, c] + colterm[c]
// then the output stage of conv.h with multiplier[c].
//
// Channel order of the per-channel arrays (weights, colterm, multiplier, zw): "the ISA's
// channel order", dw_nhwc_index() below, with cpad = C rounded up to the ISA's block
// (entries past C are 0):
//   portable    block 1, natural order; weights int8 [taps][C]
//   avx2        block 16, natural order (C a multiple of 32: the 32-channel order of
//               dw_nhwc_index); weights int16 [ceil(taps/2)][cpad][2]: the pair
//               (w_eff[c, 2p], w_eff[c, 2p + 1]) (0 past taps) for vpmaddwd
//   avx512vnni  block 64: channel 64b + 16L + 4j + i at 64b + 16j + 4L + i (register j,
//               dword 4L + i: what vpunpck{l,h}bw then vpunpck{l,h}wd of 4 tap loads
//               produce); weights int8 [cpad/64][ceil(taps/4)][64][4]: the 4 taps
//               4q .. 4q + 3 of that channel for vpdpbusd (0 past taps).
// ---------------------------------------------------------------------------------------
struct DepthwiseNhwc {
  const uint8_t* const* ptrs = nullptr;  // [ow][taps]
  int64_t ow = 0, taps = 0, C = 0, cpad = 0;
  uint8_t flip = 0;
  const uint8_t* weights = nullptr;   // DepthwiseWeights::nhwc_taps
  const int32_t* colterm = nullptr;   // [cpad], the ISA's order
  const float* multiplier = nullptr;  // [cpad], the ISA's order (kU8/kS8)
  const int32_t* zw = nullptr;        // [cpad], the ISA's order, or null (every zw_eff 0)
  OutType out_type = OutType::kS32;
  int32_t zy = 0;
  float lo_minus_zy = 0.f, hi_minus_zy = 0.f;
  void* y = nullptr;           // output pixel 0 of the row (elements of out_type)
  int64_t y_pixel_stride = 0;  // elements between output pixels (C)
  uint8_t* scratch = nullptr;  // dw_nhwc_scratch_bytes() of per-thread scratch
  // avx2 (when tap_offset is set): output pixels [dense_begin, dense_end) have every tap
  // inside x, tap t of pixel o at dense_x + (o − dense_begin)·dense_step + tap_offset[t],
  // and no entries in ptrs; the other kernels read ptrs only, which conv.cc fills for them
  const int64_t* tap_offset = nullptr;
  const uint8_t* dense_x = nullptr;
  int64_t dense_step = 0, dense_begin = 0, dense_end = 0;
};

inline int64_t dw_nhwc_block(Isa isa) { return isa == Isa::kAvx512Vnni ? 64 : isa == Isa::kAvx2 ? 16 : 1; }

// The entry of channel c in the per-channel arrays of the channels_last kernel of C
// channels. avx2 with C a multiple of 32 (depthwise_nhwc_avx2.cc block32): within each
// 32 channels, the lanes of its four sums, {0-3, 16-19}, {4-7, 20-23}, {8-11, 24-27},
// {12-15, 28-31}; C = 0: the order of C not a multiple of 32.
inline int64_t dw_nhwc_index(Isa isa, int64_t c, int64_t C = 0) {
  if (isa == Isa::kAvx2) {
    if (C == 0 || C % 32 != 0) return c;
    const int64_t j = c % 32;
    return c - j + (j % 16) / 4 * 8 + j / 16 * 4 + j % 4;
  }
  if (isa != Isa::kAvx512Vnni) return c;
  const int64_t p = c % 64;
  return c - p + ((p % 16) / 4) * 16 + (p / 16) * 4 + p % 4;
}

inline size_t dw_nhwc_scratch_bytes(int64_t C, int64_t taps) {
  // portable sums / avx2 tail copies; avx2 C = 16: two pixels' weights (up to 25 taps),
  // colterm, multipliers, zw in their 32-channel order
  return static_cast<size_t>(std::max<int64_t>(8 * C + 24 * taps + 64, 13 * 128 + 3 * 128 + 64));
}

void depthwise_nhwc_portable(const DepthwiseNhwc& a);
void depthwise_nhwc_avx2(const DepthwiseNhwc& a);
void depthwise_nhwc_avx512vnni(const DepthwiseNhwc& a);

// ---------------------------------------------------------------------------------------
// Depthwise, channels_last, flat rows (avx512vnni, horizontal stride 1;
// DepthwiseWeights::nhwc_flat). With sw = 1 the output row's OW·C bytes and each tap's
// input bytes are the same flat stream shifted: output element f = o·C + c reads, for tap
// (ky, kx), the byte at
//   row(iy) + shift[kx] + f,   iy = oy·sh − pad_top + ky·dh,
//                              shift[kx] = (kx·dw − pad_left)·C          (bytes, may be < 0)
// when f lies in [lo[kx], hi[kx]) (the output pixels whose tap is inside x, times C) and
// row iy is inside x, and the pad value zx elsewhere. So the kernel walks the row in
// 64-byte vectors of elements regardless of pixel boundaries: a vector holds 64 / C pixels
// when C divides 64 (C = 16: four), or straddles pixels. Most vectors ([v_lo, v_hi)) read
// every tap with one plain load; the vectors at the row's ends use masked loads merged
// into zx. Lanes and dwords are those of the 64c4 kernel above (ISA order within 64
// elements).
//
// The horizontal taps of one x row are the same for every output row that reads it, so
// they are interleaved once per x row: the "prepared row" P(iy) holds, per vector of 64
// elements and tap group g < gx = ceil(kw/4), the 4 registers of dwords
// (x'[iy, f + shift[4g]], .. x'[iy, f + shift[4g + 3]]) (0 past kw) that one vpdpbusd
// each multiplies by the weights of taps (ky, 4g .. 4g + 3). An output vector is then
// kh·gx groups of 4 plain loads and 4 vpdpbusd, no shuffles. One call computes output
// rows [oy0, oy1) of one image, in strips of dw_flat_strip() vectors so that a ring of
// (kh − 1)·dh + 1 prepared rows stays in L1 (slot iy mod ring: the kh rows of an output
// row never share a slot); each x row is prepared once per strip and call.
//
// Channel of element f: f mod C, which repeats every lcm(C, 64) elements, i.e. every
// blocks = C / gcd(C, 64) vectors: vector v takes weight block v mod blocks. The
// per-channel arrays (colterm, multiplier, zw [blocks·64]) hold entry e = 64·b + i (ISA
// index dw_nhwc_index(i)) for channel e mod C (nhwc_cpad = blocks·64 entries); the weights
// are [blocks][kh·gx][64][4]: byte i of group ky·gx + g of entry e is w_eff[e mod C, ky,
// 4g + i] (0 past kw).
//
// 5x5 at sh = dh = 1, the vertical tail (vtail): group 1 of P(iy) holds tap 4 of x rows
// iy .. iy + 3 (slot k: row iy + k) instead of row iy's tap 4 alone with 3 empty slots, so
// an output row reads 5 groups of taps 0..3, P(t0)'s group 1 (tap 4 of its tap rows 0..3)
// and P(t0 + 4)'s group 1 slot 0 (tap (4, 4)): 7 groups instead of 10; a step of rows
// t0 + r shares P(t0 + 4)'s group 1 (row r takes its slot r). Weights [blocks][10][64][4]:
// groups 0..4 the taps (ky, 0..3), group 5 the taps (0..3, 4), group 6 + r tap (4, 4) in
// slot r (others 0).
// ---------------------------------------------------------------------------------------
struct DepthwiseNhwcFlat {
  int64_t n = 0, kh = 1, kw = 1, blocks = 1;  // n = OW·C elements of an output row
  const uint8_t* image = nullptr;             // x row 0 of the image
  int64_t H = 0, row_bytes = 0;               // x rows, bytes per x row (W·C)
  int64_t sh = 1, dh = 1, pad_top = 0;
  int64_t oy0 = 0, oy1 = 0;           // output rows of this call
  const int64_t* shift = nullptr;     // [kw]
  const int64_t* lo = nullptr;        // [kw]
  const int64_t* hi = nullptr;        // [kw]
  int64_t v_lo = 0, v_hi = 0;         // vectors whose in-x taps read 64 bytes of x each
  uint8_t zx = 0, flip = 0;           // pad value (x's own domain), and 0x80 for int8 x
  const uint8_t* weights = nullptr;   // DepthwiseWeights::nhwc_taps
  const int32_t* colterm = nullptr;   // [blocks·64]
  const float* multiplier = nullptr;  // [blocks·64] (kU8/kS8)
  const int32_t* zw = nullptr;        // [blocks·64], or null
  OutType out_type = OutType::kS32;
  int32_t zy = 0;
  float lo_minus_zy = 0.f, hi_minus_zy = 0.f;
  bool vtail = false;          // 5x5 with the vertical tail (DepthwiseWeights::nhwc_vtail)
  void* y = nullptr;           // element 0 of output row oy0 (rows n elements apart)
  uint8_t* scratch = nullptr;  // dw_flat_scratch_bytes(kh, dh, kw)
};

// Weight blocks of the flat layout for C channels: lcm(C, 64) / 64.
inline int64_t dw_flat_blocks(int64_t C) {
  int64_t a = C, b = 64;
  while (b != 0) {
    const int64_t t = a % b;
    a = b;
    b = t;
  }
  return C / a;
}

// Output rows one flat-rows step computes at most (sh = dh = 1), and the ring of prepared
// rows: (kh − 1)·dh + 1 for one output row, kh + kDwFlatRows − 1 for a step of rows.
constexpr int64_t kDwFlatRows = 4;
inline int64_t dw_flat_ring(int64_t kh, int64_t dh) { return (kh - 1) * dh + kDwFlatRows; }

// Vectors per strip: the ring of a strip (256·gx bytes a vector and row) in about 24 KiB,
// at least 4 vectors.
inline int64_t dw_flat_strip(int64_t kh, int64_t dh, int64_t kw) {
  const int64_t per_vector = dw_flat_ring(kh, dh) * ((kw + 3) / 4) * 256;
  const int64_t s = 24576 / per_vector;
  return s < 4 ? 4 : s;
}

// Scratch of one flat-rows call: the ring's tags (int64) and the window's slot pointers
// (kh + kDwFlatRows − 1), then the ring from the next 64-byte boundary.
inline size_t dw_flat_scratch_bytes(int64_t kh, int64_t dh, int64_t kw) {
  const int64_t ring = dw_flat_ring(kh, dh);
  return static_cast<size_t>((ring + kh + kDwFlatRows - 1) * 8 + 64 +
                             ring * dw_flat_strip(kh, dh, kw) * ((kw + 3) / 4) * 256);
}

void depthwise_nhwc_flat_avx512vnni(const DepthwiseNhwcFlat& a);

// ---------------------------------------------------------------------------------------
// Direct, small C (avx512vnni and avx2, channels_last; QConv::create): one call computes
// one output row (ow pixels) of all M <= 64 channels from a padded NHWC image in the x'
// domain (pads zx', 64 slack bytes past its end). For pixel o the kernel row ky starts
// at in + ky·row_step + o·pixel_step; its run of kw·C bytes is read in `groups` dwords.
// Weights [kh][groups][ceil(M/16)][16 lanes][4]: byte t of lane m of group q is
// w_eff[m, c, ky, kx] with 4q + t = kx·C + c (0 past kw·C); w_eff = w − zw fits int8, so
//   acc[m] = Σ_{ky, q, t} x'·w_eff + colterm[m],   colterm = bias − zx'·Σ w_eff   eq. (5)
// then the output stage of conv.h; y row of ow pixels x M (elements of out_type).
//
// avx2 (no int8 dot product without saturation): the padded image is widened to int16
// (in16; row_step and pixel_step count elements), the run is read in `groups` pairs of
// int16 (one dword each, 0-weight past kw·C), and the weights are int16
// [kh][groups][ceil(M/8)][8 lanes][2] (weights16): w_eff = w − zw, which fits int16 for
// any weights, so this form has no int8 condition and no Σx' term either.
// ---------------------------------------------------------------------------------------
struct DirectRow {
  const uint8_t* in = nullptr;
  const int16_t* in16 = nullptr;         // avx2
  int64_t row_step = 0, pixel_step = 0;  // bytes: dh·Wp·C, sw·C (avx2: elements)
  int64_t kh = 1, groups = 1, ow = 0, M = 0;
  const int8_t* weights = nullptr;
  const int16_t* weights16 = nullptr;  // avx2
  const int32_t* colterm = nullptr;    // [ceil(M/16)·16]
  const float* multiplier = nullptr;   // [ceil(M/16)·16] (kU8/kS8)
  OutType out_type = OutType::kS32;
  int32_t zy = 0;
  float lo_minus_zy = 0.f, hi_minus_zy = 0.f;
  void* y = nullptr;
};

void direct_row_avx2(const DirectRow& a);
void direct_row_avx512vnni(const DirectRow& a);

// Tile transposes: layout/tiles.h.
using layout::transpose_s32_for;
using layout::transpose_u8_for;
using layout::TransposeS32Fn;
using layout::TransposeU8Fn;

// ---------------------------------------------------------------------------------------
// im2col (im2col.cc portable and AVX2, im2col_avx512vnni.cc), NHWC: rows [r0, r1) of the flattened (n, oy, ox) output pixels, for
// group g. Row r gets, at dst[(r − r0)·Kp + (ky·kw + kx)·Cg + c],
//   xt[((n·H + iy)·W + ix)·xt_stride + g·Cg + c]   (iy = oy·sh − pad_top + ky·dh, ...)
// or zx' where (iy, ix) is outside x, then zeros up to Kp.
// ---------------------------------------------------------------------------------------
void im2col_nhwc(const uint8_t* xt, int64_t xt_stride, const Geometry& geo, int64_t Cg, int64_t g, int64_t r0,
                 int64_t r1, uint8_t pad_value, int64_t Kp, uint8_t* dst);
void im2col_nhwc_avx512vnni(const uint8_t* xt, int64_t xt_stride, const Geometry& geo, int64_t Cg, int64_t g,
                            int64_t r0, int64_t r1, uint8_t pad_value, int64_t Kp, uint8_t* dst);
using Im2colFn = decltype(&im2col_nhwc);

}  // namespace conv
}  // namespace quanta
