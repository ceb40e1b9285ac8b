// Internal interface between the conv driver (conv.cc) and its pieces: the depthwise
// micro-kernels (depthwise_<isa>.cc), the layout transposes (layout*.cc) and im2col
// (im2col.cc). Nothing here sees a Python object.
#pragma once

#include <cmath>
#include <cstdint>

#include "conv/conv.h"

namespace quanta {
namespace conv {

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
// w_eff = w − zw when that fits int8 for every tap of the tensor (symmetric int8 weights,
// uint8 weights around 128: "shifted", zw_eff = 0), else w' (int8 w, or uint8 w − 128)
// with zw_eff = zw' (eq. (8)).
//
// Per output (oy, ox) of the call (oy relative to its first row):
//   acc = Σ_{ky, kx} in[(oy·sh + ky·dh)·in_stride + ox·sw + kx·dw] · w_eff[ky, kx]
//         − zw_eff·Σ_{ky, kx} in[...]   +   colterm                         eq. (5)
//   colterm = bias[c] − zx'·cs[c]   (wrapping; cs[c] = Σ (w − zw))
// then the output stage of conv.h for this channel's multiplier.
//
// SIMD lanes are output pixels along the row and the 4 bytes of a lane are 4 taps:
// AVX-512 VNNI: 16 outputs per vpdpbusd (vpermd + vpshufb gather the 4 taps of 16 pixels
// from one 64-byte load); AVX2: 4 outputs per 16-byte vpshufb, widened to int16 for
// vpmaddwd, two vectors combined by vphaddd. The one-load gathers need every tap offset
// o·sw + t·dw (o, t < 4) within 16 bytes and, for VNNI, sw <= 4 (dw_gather_fits); other
// geometries gather with scalar loads into the same vectors.
// ---------------------------------------------------------------------------------------
struct DepthwiseRows {
  const uint8_t* in = nullptr;
  int64_t in_stride = 0;
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
  void* y = nullptr;               // output row 0 of the call (elements of out_type)
  int64_t y_stride = 0;            // elements between output rows (OW)
};

// byte 4o + t of a 16-byte lane: tap t of the lane's pixel o, at o·sw + t·dw; 0x80 (a
// zero) for taps past `taps`. vpermd index of dword e: (e / 4)·sw + e % 4.
inline void dw_gather_tables(int64_t sw, int64_t dw, int64_t kw, int32_t* perm, int8_t* full, int8_t* last) {
  const int64_t last_taps = kw - 4 * ((kw + 3) / 4 - 1);
  for (int e = 0; e < 16; ++e) perm[e] = static_cast<int32_t>((e / 4) * sw + e % 4);
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
// Layout transposes (layout.cc portable, layout_avx2.cc; the avx512vnni ISA uses the AVX2
// ones: they are bandwidth-bound, not shuffle-bound).
//
// transpose_u8: dst[j·dst_stride + i] = src[i·src_stride + j] ^ flip, for i < rows,
//   j < cols (a rows x cols byte matrix becomes cols x rows).
// transpose_s32: the same for int32 elements (strides in elements), no flip.
// ---------------------------------------------------------------------------------------
using TransposeU8Fn = void (*)(const uint8_t* src, int64_t src_stride, int64_t rows, int64_t cols, uint8_t* dst,
                               int64_t dst_stride, uint8_t flip);
using TransposeS32Fn = void (*)(const int32_t* src, int64_t src_stride, int64_t rows, int64_t cols, int32_t* dst,
                                int64_t dst_stride);

void transpose_u8_portable(const uint8_t* src, int64_t src_stride, int64_t rows, int64_t cols, uint8_t* dst,
                           int64_t dst_stride, uint8_t flip);
void transpose_u8_avx2(const uint8_t* src, int64_t src_stride, int64_t rows, int64_t cols, uint8_t* dst,
                       int64_t dst_stride, uint8_t flip);
void transpose_s32_portable(const int32_t* src, int64_t src_stride, int64_t rows, int64_t cols, int32_t* dst,
                            int64_t dst_stride);
void transpose_s32_avx2(const int32_t* src, int64_t src_stride, int64_t rows, int64_t cols, int32_t* dst,
                        int64_t dst_stride);

// ---------------------------------------------------------------------------------------
// im2col (im2col.cc), NHWC: rows [r0, r1) of the flattened (n, oy, ox) output pixels, for
// group g. Row r gets, at dst[(r − r0)·Kp + (ky·kw + kx)·Cg + c],
//   xt[((n·H + iy)·W + ix)·xt_stride + g·Cg + c]   (iy = oy·sh − pad_top + ky·dh, ...)
// or zx' where (iy, ix) is outside x, then zeros up to Kp.
// ---------------------------------------------------------------------------------------
void im2col_nhwc(const uint8_t* xt, int64_t xt_stride, const Geometry& geo, int64_t Cg, int64_t g, int64_t r0,
                 int64_t r1, uint8_t pad_value, int64_t Kp, uint8_t* dst);

}  // namespace conv
}  // namespace quanta
