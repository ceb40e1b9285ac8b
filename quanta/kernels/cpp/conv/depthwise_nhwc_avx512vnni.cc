// qconv_dwc_u8s8_s32_64c4__avx512vnni: the channels_last depthwise kernel (contract in
// kernels.h "Depthwise, channels_last").
//
// Per output pixel and block of 64 channels, per group of 4 taps: four 64-byte loads (the
// four input pixels' channels, masked for a channel tail, flipped for int8 x), then
// vpunpck{l,h}bw and vpunpck{l,h}wd put the 4 taps of each channel into one dword:
// register j, dword 4L + i holds channel 16L + 4j + i (the ISA's channel order of
// kernels.h, in which the weights, colterm, multipliers and zw are packed), and one
// vpdpbusd per register adds 4 taps x 16 channels. 8 shuffles and 4 vpdpbusd per 4 taps x
// 64 channels. Missing taps of the last group are zero vectors (they add nothing, to
// Σx'·w nor to Σx'). The output stage runs in the permuted order; for 8-bit outputs
// vpackssdw then vpack{us,ss}wb (in-lane, the inverse of the unpacks) restore channel
// order; int32 outputs take a 4 x 4 transpose of 128-bit lanes.
//
// qconv_dwc_flat_u8s8_s32_64c4__avx512vnni, the flat-row form (kernels.h "Depthwise,
// channels_last, flat rows"; horizontal stride 1): the same inner product and output
// stage on 64-element vectors of the output row's flat OW·C stream, so that few channels
// (C = 16: four pixels per vector) fill every lane; no tap pointers. The interleave is done
// once per x row (the prepared rows of kernels.h, in a per-thread ring) instead of once per
// output row and tap group, so an output vector is kh·ceil(kw/4) groups of 4 loads and 4
// vpdpbusd with no shuffle (3x3: 22 shuffles fewer per vector), and a step of 2-4 output
// rows loads each prepared group and each weight group once for all of them. 5x5 at sh =
// dh = 1 packs tap column 4 as vertical groups of 4 rows: 7 groups a row instead of 10.
#if defined(__clang__)
#pragma clang fp contract(off)
#else
#pragma GCC optimize("fp-contract=off")
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"  // GCC 12, inside its AVX-512 headers
#endif

#include <immintrin.h>

#include <cstdint>

#include "conv/kernels.h"

namespace quanta {
namespace conv {
namespace {

inline __mmask64 first_bytes(int64_t n) { return n >= 64 ? ~0ull : n <= 0 ? 0ull : (1ull << n) - 1; }
inline __mmask16 first_lanes(int64_t n) {
  return n >= 16 ? static_cast<__mmask16>(0xffff) : n <= 0 ? 0 : static_cast<__mmask16>((1u << n) - 1u);
}

template <bool kFlip, bool kTail>
inline __m512i load_tap(const uint8_t* p, __mmask64 mask) {
  __m512i v = kTail ? _mm512_maskz_loadu_epi8(mask, p) : _mm512_loadu_si512(p);
  if (kFlip) v = _mm512_xor_si512(v, _mm512_set1_epi8(static_cast<char>(0x80)));
  return v;
}

// Adds the 4 taps v0..v3 (x' bytes, lanes in element order) of 64 elements into acc[j]
// (and their Σx' into xs[j]): register j, dword 4L + i is element 16L + 4j + i.
// kOne: v1 = v2 = v3 = 0 (a last group of one tap).
template <bool kZw, bool kOne>
inline void dot4(__m512i v0, __m512i v1, __m512i v2, __m512i v3, const int8_t* wq, __m512i* acc, __m512i* xs) {
  const __m512i ones = _mm512_set1_epi8(1);
  __m512i x[4];
  if (kOne) {
    const __m512i zero = _mm512_setzero_si512();
    const __m512i lo = _mm512_unpacklo_epi8(v0, zero), hi = _mm512_unpackhi_epi8(v0, zero);
    x[0] = _mm512_unpacklo_epi16(lo, zero);
    x[1] = _mm512_unpackhi_epi16(lo, zero);
    x[2] = _mm512_unpacklo_epi16(hi, zero);
    x[3] = _mm512_unpackhi_epi16(hi, zero);
  } else {
    const __m512i lo01 = _mm512_unpacklo_epi8(v0, v1), hi01 = _mm512_unpackhi_epi8(v0, v1);
    const __m512i lo23 = _mm512_unpacklo_epi8(v2, v3), hi23 = _mm512_unpackhi_epi8(v2, v3);
    x[0] = _mm512_unpacklo_epi16(lo01, lo23);
    x[1] = _mm512_unpackhi_epi16(lo01, lo23);
    x[2] = _mm512_unpacklo_epi16(hi01, hi23);
    x[3] = _mm512_unpackhi_epi16(hi01, hi23);
  }
  for (int j = 0; j < 4; ++j) {
    acc[j] = _mm512_dpbusd_epi32(acc[j], x[j], _mm512_loadu_si512(wq + 64 * j));
    if (kZw) xs[j] = _mm512_dpbusd_epi32(xs[j], x[j], ones);
  }
}

// acc[j] = colterm (the accumulators start from it: integer sums wrap, any order).
inline void init_acc(const int32_t* colterm, __m512i* acc, __m512i* xs) {
  for (int j = 0; j < 4; ++j) {
    acc[j] = _mm512_loadu_si512(colterm + 16 * j);
    xs[j] = _mm512_setzero_si512();
  }
}

// The output stage of 64 elements in ISA order (acc includes colterm; multiplier, zw: 64
// entries of that order) into y's first n <= 64 elements (element order).
template <bool kZw, bool kTail>
inline void finish64(__m512i* acc, const __m512i* xs, const float* multiplier, const int32_t* zw, OutType out_type,
                     int32_t zy, float lo_minus_zy, float hi_minus_zy, int64_t n, void* y) {
  if (kZw) {
    for (int j = 0; j < 4; ++j) {
      acc[j] = _mm512_sub_epi32(acc[j], _mm512_mullo_epi32(xs[j], _mm512_loadu_si512(zw + 16 * j)));
    }
  }
  if (out_type == OutType::kS32) {
    // acc[j] lane L = elements 16L + 4j .. + 3 -> out[k] lane m = acc[m] lane k
    const __m512i t0 = _mm512_shuffle_i32x4(acc[0], acc[1], 0x44), t1 = _mm512_shuffle_i32x4(acc[0], acc[1], 0xEE);
    const __m512i t2 = _mm512_shuffle_i32x4(acc[2], acc[3], 0x44), t3 = _mm512_shuffle_i32x4(acc[2], acc[3], 0xEE);
    const __m512i out[4] = {_mm512_shuffle_i32x4(t0, t2, 0x88), _mm512_shuffle_i32x4(t0, t2, 0xDD),
                            _mm512_shuffle_i32x4(t1, t3, 0x88), _mm512_shuffle_i32x4(t1, t3, 0xDD)};
    int32_t* dst = static_cast<int32_t*>(y);
    for (int k = 0; k < 4; ++k) {
      if (kTail) {
        _mm512_mask_storeu_epi32(dst + 16 * k, first_lanes(n - 16 * k), out[k]);
      } else {
        _mm512_storeu_si512(dst + 16 * k, out[k]);
      }
    }
    return;
  }
  __m512i q[4];
  for (int j = 0; j < 4; ++j) {
    __m512 f = _mm512_mul_ps(_mm512_cvtepi32_ps(acc[j]), _mm512_loadu_ps(multiplier + 16 * j));
    f = _mm512_min_ps(_mm512_max_ps(f, _mm512_set1_ps(lo_minus_zy)), _mm512_set1_ps(hi_minus_zy));
    q[j] = _mm512_cvt_roundps_epi32(f, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
  }
  // q in [qmin − zy, qmax − zy]: the int16 packs are exact, + zy in int16 lands in the
  // output's range, and the 8-bit packs are exact
  const __m512i vzy = _mm512_set1_epi16(static_cast<int16_t>(zy));
  const __m512i p01 = _mm512_add_epi16(_mm512_packs_epi32(q[0], q[1]), vzy);
  const __m512i p23 = _mm512_add_epi16(_mm512_packs_epi32(q[2], q[3]), vzy);
  const __m512i p8 = out_type == OutType::kS8 ? _mm512_packs_epi16(p01, p23) : _mm512_packus_epi16(p01, p23);
  if (kTail) {
    _mm512_mask_storeu_epi8(y, first_bytes(n), p8);
  } else {
    _mm512_storeu_si512(y, p8);
  }
}

// channels [c0, c0 + n) (n <= 64) of one pixel
template <bool kZw, bool kFlip, bool kTail>
inline void block64(const DepthwiseNhwc& a, const uint8_t* const* p, int64_t c0, int64_t n, uint8_t* y) {
  const __mmask64 mask = first_bytes(n);
  const int64_t groups = (a.taps + 3) / 4;
  const int8_t* w = reinterpret_cast<const int8_t*>(a.weights) + (c0 / 64) * groups * 256;
  __m512i acc[4], xs[4];
  init_acc(a.colterm + c0, acc, xs);
  for (int64_t q = 0; q < groups; ++q) {
    const int64_t t = 4 * q;
    const __m512i zero = _mm512_setzero_si512();
    const __m512i v0 = load_tap<kFlip, kTail>(p[t] + c0, mask);
    const __m512i v1 = t + 1 < a.taps ? load_tap<kFlip, kTail>(p[t + 1] + c0, mask) : zero;
    const __m512i v2 = t + 2 < a.taps ? load_tap<kFlip, kTail>(p[t + 2] + c0, mask) : zero;
    const __m512i v3 = t + 3 < a.taps ? load_tap<kFlip, kTail>(p[t + 3] + c0, mask) : zero;
    if (t + 1 < a.taps) {
      dot4<kZw, false>(v0, v1, v2, v3, w + q * 256, acc, xs);
    } else {
      dot4<kZw, true>(v0, zero, zero, zero, w + q * 256, acc, xs);
    }
  }
  finish64<kZw, kTail>(acc, xs, a.multiplier + c0, a.zw ? a.zw + c0 : nullptr, a.out_type, a.zy, a.lo_minus_zy,
                       a.hi_minus_zy, n, y);
}

template <bool kZw, bool kFlip>
void row_impl(const DepthwiseNhwc& a) {
  const int ob = out_bytes(a.out_type);
  const int64_t full = a.C / 64 * 64;
  for (int64_t o = 0; o < a.ow; ++o) {
    const uint8_t* const* p = a.ptrs + o * a.taps;
    uint8_t* y = static_cast<uint8_t*>(a.y) + o * a.y_pixel_stride * ob;
    for (int64_t c0 = 0; c0 < full; c0 += 64) block64<kZw, kFlip, false>(a, p, c0, 64, y + c0 * ob);
    if (full < a.C) block64<kZw, kFlip, true>(a, p, full, a.C - full, y + full * ob);
  }
}

// ---- flat rows ------------------------------------------------------------------------

inline __mmask64 byte_range(int64_t begin, int64_t end) {  // bytes [begin, end) of a vector, clamped to [0, 64)
  begin = begin < 0 ? 0 : begin;
  end = end > 64 ? 64 : end;
  return end <= begin ? 0ull : first_bytes(end) & ~first_bytes(begin);
}

// Horizontal tap kx of the 64 elements from f0 of x row `row` (null: outside x), x'
// bytes. kEdge: some may lie outside x (masked load merged into zx; masked-off bytes are
// neither read nor faulted on).
template <bool kFlip, bool kEdge>
inline __m512i flat_tap(const DepthwiseNhwcFlat& a, const uint8_t* row, int64_t kx, int64_t f0, __m512i pad) {
  __m512i v = pad;
  if (row != nullptr) {
    if (!kEdge) {
      v = _mm512_loadu_si512(row + (a.shift[kx] + f0));
    } else {
      const __mmask64 m = byte_range(a.lo[kx] - f0, a.hi[kx] - f0);
      // the vector may start before x (left edge): an address, never dereferenced there
      const auto at = reinterpret_cast<const void*>(reinterpret_cast<uintptr_t>(row) + (a.shift[kx] + f0));
      if (m != 0) v = _mm512_mask_loadu_epi8(pad, m, at);
    }
  }
  if (kFlip) v = _mm512_xor_si512(v, _mm512_set1_epi8(static_cast<char>(0x80)));
  return v;
}

// The prepared vector (kernels.h "flat rows") of the 64 elements from f0 of x row `row`:
// gx groups of 4 registers, register j dword 4L + i = the 4 horizontal taps of element
// 16L + 4j + i (as dot4's interleave).
template <bool kFlip, bool kEdge>
inline void prep_vector(const DepthwiseNhwcFlat& a, const uint8_t* row, int64_t f0, __m512i pad, uint8_t* dst) {
  const __m512i zero = _mm512_setzero_si512();
  for (int64_t kx = 0; kx < a.kw; kx += 4, dst += 256) {
    const __m512i v0 = flat_tap<kFlip, kEdge>(a, row, kx, f0, pad);
    const __m512i v1 = kx + 1 < a.kw ? flat_tap<kFlip, kEdge>(a, row, kx + 1, f0, pad) : zero;
    const __m512i v2 = kx + 2 < a.kw ? flat_tap<kFlip, kEdge>(a, row, kx + 2, f0, pad) : zero;
    const __m512i v3 = kx + 3 < a.kw ? flat_tap<kFlip, kEdge>(a, row, kx + 3, f0, pad) : zero;
    const __m512i lo01 = _mm512_unpacklo_epi8(v0, v1), hi01 = _mm512_unpackhi_epi8(v0, v1);
    const __m512i lo23 = _mm512_unpacklo_epi8(v2, v3), hi23 = _mm512_unpackhi_epi8(v2, v3);
    _mm512_storeu_si512(dst, _mm512_unpacklo_epi16(lo01, lo23));
    _mm512_storeu_si512(dst + 64, _mm512_unpackhi_epi16(lo01, lo23));
    _mm512_storeu_si512(dst + 128, _mm512_unpacklo_epi16(hi01, hi23));
    _mm512_storeu_si512(dst + 192, _mm512_unpackhi_epi16(hi01, hi23));
  }
}

// The 4 registers of dwords (v0, v1, v2, v3) of 64 elements (dot4's interleave) into dst.
inline void store_interleaved(__m512i v0, __m512i v1, __m512i v2, __m512i v3, uint8_t* dst) {
  const __m512i lo01 = _mm512_unpacklo_epi8(v0, v1), hi01 = _mm512_unpackhi_epi8(v0, v1);
  const __m512i lo23 = _mm512_unpacklo_epi8(v2, v3), hi23 = _mm512_unpackhi_epi8(v2, v3);
  _mm512_storeu_si512(dst, _mm512_unpacklo_epi16(lo01, lo23));
  _mm512_storeu_si512(dst + 64, _mm512_unpackhi_epi16(lo01, lo23));
  _mm512_storeu_si512(dst + 128, _mm512_unpacklo_epi16(hi01, hi23));
  _mm512_storeu_si512(dst + 192, _mm512_unpackhi_epi16(hi01, hi23));
}

// The prepared vector of a 5x5 kernel with the vertical tail (kernels.h): group 0 the taps
// 0..3 of x row rows[0], group 1 tap 4 of x rows rows[0..3] (dword slot k: rows[k]).
template <bool kFlip, bool kEdge>
inline void prep_vtail(const DepthwiseNhwcFlat& a, const uint8_t* const* rows, int64_t f0, __m512i pad, uint8_t* dst) {
  store_interleaved(flat_tap<kFlip, kEdge>(a, rows[0], 0, f0, pad), flat_tap<kFlip, kEdge>(a, rows[0], 1, f0, pad),
                    flat_tap<kFlip, kEdge>(a, rows[0], 2, f0, pad), flat_tap<kFlip, kEdge>(a, rows[0], 3, f0, pad),
                    dst);
  store_interleaved(flat_tap<kFlip, kEdge>(a, rows[0], 4, f0, pad), flat_tap<kFlip, kEdge>(a, rows[1], 4, f0, pad),
                    flat_tap<kFlip, kEdge>(a, rows[2], 4, f0, pad), flat_tap<kFlip, kEdge>(a, rows[3], 4, f0, pad),
                    dst + 256);
}

// Vectors [v0, v1) of x row iy, prepared into dst (256·gx bytes a vector).
template <bool kFlip>
void prep_strip(const DepthwiseNhwcFlat& a, int64_t iy, int64_t v0, int64_t v1, __m512i pad, uint8_t* dst) {
  const uint8_t* row = iy >= 0 && iy < a.H ? a.image + iy * a.row_bytes : nullptr;
  const int64_t step = (a.kw + 3) / 4 * 256;
  if (a.vtail) {
    const uint8_t* rows[4];
    for (int64_t k = 0; k < 4; ++k) rows[k] = iy + k >= 0 && iy + k < a.H ? a.image + (iy + k) * a.row_bytes : nullptr;
    for (int64_t v = v0; v < v1; ++v, dst += step) {
      if (v >= a.v_lo && v < a.v_hi) {
        prep_vtail<kFlip, false>(a, rows, 64 * v, pad, dst);
      } else {
        prep_vtail<kFlip, true>(a, rows, 64 * v, pad, dst);
      }
    }
    return;
  }
  for (int64_t v = v0; v < v1; ++v, dst += step) {
    if (row != nullptr && v >= a.v_lo && v < a.v_hi) {
      prep_vector<kFlip, false>(a, row, 64 * v, pad, dst);
    } else {
      prep_vector<kFlip, true>(a, row, 64 * v, pad, dst);
    }
  }
}

// One output vector in kR consecutive output rows (row r at y + r·y_row_bytes) from the
// prepared rows of its window: kR = 1: win[ky] is the x row of tap row ky; kR > 1 (sh =
// dh = 1): win[i], i < kh + kR − 1, is x row oy − pad_top + i, which output row r reads
// with tap row i − r; each prepared group is loaded once for every row that reads it and
// each weight group once. kKh, kGx: kh and gx fixed at compile time, or 0: a.kh, gx_run.
template <int kKh, int kGx, int kR, bool kZw, bool kTail>
inline void flat_out(const DepthwiseNhwcFlat& a, uint8_t* const* win, int64_t at, int64_t gx_run, int64_t block,
                     int64_t f0, uint8_t* y, int64_t y_row_bytes) {
  const int64_t kh = kKh > 0 ? kKh : a.kh, gx = kGx > 0 ? kGx : gx_run;
  const int8_t* w = reinterpret_cast<const int8_t*>(a.weights) + block * kh * gx * 256;
  const int64_t e0 = block * 64;
  const __m512i ones = _mm512_set1_epi8(1);
  __m512i acc[kR][4], xs[kR][4];
  for (int r = 0; r < kR; ++r) init_acc(a.colterm + e0, acc[r], xs[r]);
  for (int64_t i = 0; i < kh + kR - 1; ++i) {
    const uint8_t* p = win[i] + at;
    for (int64_t g = 0; g < gx; ++g) {
      __m512i x[4];
      for (int j = 0; j < 4; ++j) x[j] = _mm512_loadu_si512(p + 256 * g + 64 * j);
      for (int r = 0; r < kR; ++r) {
        const int64_t ky = i - r;
        if (ky < 0 || ky >= kh) continue;
        const int8_t* wg = w + (ky * gx + g) * 256;
        for (int j = 0; j < 4; ++j) {
          acc[r][j] = _mm512_dpbusd_epi32(acc[r][j], x[j], _mm512_loadu_si512(wg + 64 * j));
          if (kZw) xs[r][j] = _mm512_dpbusd_epi32(xs[r][j], x[j], ones);
        }
      }
    }
  }
  for (int r = 0; r < kR; ++r) {
    finish64<kZw, kTail>(acc[r], xs[r], a.multiplier + e0, a.zw ? a.zw + e0 : nullptr, a.out_type, a.zy, a.lo_minus_zy,
                         a.hi_minus_zy, a.n - f0, y + r * y_row_bytes);
  }
}

// flat_out for a 5x5 kernel with the vertical tail (kernels.h; sh = dh = 1): output row r
// of the step (window rows t0 + i, prepared vector at win[i] + at) reads group 0 of its
// five window rows with weight groups ky = 0..4, group 1 of row t0 + r (tap 4 of tap rows
// 0..3) with weight group 5, and group 1 of row t0 + 4 (tap 4 of rows t0 + 4 .. t0 + 7)
// with weight group 6 + r, whose only non-zero slot r is tap (4, 4); its Σx' takes slot r
// alone.
template <int kR, bool kZw, bool kTail>
inline void flat_out_vtail(const DepthwiseNhwcFlat& a, uint8_t* const* win, int64_t at, int64_t block, int64_t f0,
                           uint8_t* y, int64_t y_row_bytes) {
  const int8_t* w = reinterpret_cast<const int8_t*>(a.weights) + block * 10 * 256;
  const int64_t e0 = block * 64;
  const __m512i ones = _mm512_set1_epi8(1);
  __m512i acc[kR][4], xs[kR][4];
  for (int r = 0; r < kR; ++r) init_acc(a.colterm + e0, acc[r], xs[r]);
  for (int i = 0; i < kR + 4; ++i) {
    __m512i x[4];
    for (int j = 0; j < 4; ++j) x[j] = _mm512_loadu_si512(win[i] + at + 64 * j);
    for (int r = 0; r < kR; ++r) {
      const int ky = i - r;
      if (ky < 0 || ky >= 5) continue;
      for (int j = 0; j < 4; ++j) {
        acc[r][j] = _mm512_dpbusd_epi32(acc[r][j], x[j], _mm512_loadu_si512(w + ky * 256 + 64 * j));
        if (kZw) xs[r][j] = _mm512_dpbusd_epi32(xs[r][j], x[j], ones);
      }
    }
  }
  for (int r = 0; r < kR; ++r) {
    for (int j = 0; j < 4; ++j) {
      const __m512i x = _mm512_loadu_si512(win[r] + at + 256 + 64 * j);
      acc[r][j] = _mm512_dpbusd_epi32(acc[r][j], x, _mm512_loadu_si512(w + 5 * 256 + 64 * j));
      if (kZw) xs[r][j] = _mm512_dpbusd_epi32(xs[r][j], x, ones);
    }
  }
  for (int j = 0; j < 4; ++j) {
    const __m512i x = _mm512_loadu_si512(win[4] + at + 256 + 64 * j);
    for (int r = 0; r < kR; ++r) {
      acc[r][j] = _mm512_dpbusd_epi32(acc[r][j], x, _mm512_loadu_si512(w + (6 + r) * 256 + 64 * j));
      if (kZw) xs[r][j] = _mm512_dpbusd_epi32(xs[r][j], x, _mm512_set1_epi32(1 << (8 * r)));
    }
  }
  for (int r = 0; r < kR; ++r) {
    finish64<kZw, kTail>(acc[r], xs[r], a.multiplier + e0, a.zw ? a.zw + e0 : nullptr, a.out_type, a.zy, a.lo_minus_zy,
                         a.hi_minus_zy, a.n - f0, y + r * y_row_bytes);
  }
}

// Vectors [s0, s1) of kR output rows from oy (kR > 1: sh = dh = 1) from the prepared rows
// of their window (win: slot pointers, as flat_out).
template <int kKh, int kGx, int kR, bool kZw>
void flat_vectors(const DepthwiseNhwcFlat& a, uint8_t* const* win, int64_t s0, int64_t s1, int64_t oy) {
  const int64_t gx = (a.kw + 3) / 4, full = a.n / 64;  // full: vectors before the row's tail
  const int ob = out_bytes(a.out_type);
  uint8_t* y = static_cast<uint8_t*>(a.y) + (oy - a.oy0) * a.n * ob;
  int64_t block = s0 % a.blocks;
  for (int64_t v = s0; v < s1; ++v) {
    const int64_t at = (v - s0) * gx * 256;
    if (kKh == 5 && kGx == 2 && kR <= 4 && a.vtail) {
      if (v < full) {
        flat_out_vtail<kR, kZw, false>(a, win, at, block, 64 * v, y + 64 * v * ob, a.n * ob);
      } else {
        flat_out_vtail<kR, kZw, true>(a, win, at, block, 64 * v, y + 64 * v * ob, a.n * ob);
      }
    } else if (v < full) {
      flat_out<kKh, kGx, kR, kZw, false>(a, win, at, gx, block, 64 * v, y + 64 * v * ob, a.n * ob);
    } else {
      flat_out<kKh, kGx, kR, kZw, true>(a, win, at, gx, block, 64 * v, y + 64 * v * ob, a.n * ob);
    }
    block = block + 1 == a.blocks ? 0 : block + 1;
  }
}

template <int kKh, int kGx, int kR, bool kZw, bool kFlip>
void flat_impl(const DepthwiseNhwcFlat& a) {
  const __m512i pad = _mm512_set1_epi8(static_cast<char>(a.zx));
  const int64_t nv = (a.n + 63) / 64, gx = (a.kw + 3) / 4, ring = dw_flat_ring(a.kh, a.dh);
  const int64_t strip = dw_flat_strip(a.kh, a.dh, a.kw), slot_bytes = strip * gx * 256;
  const bool multi = kR > 1 && a.sh == 1 && a.dh == 1;
  int64_t* tag = reinterpret_cast<int64_t*>(a.scratch);
  uint8_t** win = reinterpret_cast<uint8_t**>(tag + ring);
  // the ring on a 64-byte boundary (dw_flat_scratch_bytes leaves room for it)
  uint8_t* buf = a.scratch + (ring + a.kh + kDwFlatRows - 1) * 8;
  buf += (64 - reinterpret_cast<uintptr_t>(buf) % 64) % 64;
  for (int64_t s0 = 0; s0 < nv; s0 += strip) {
    const int64_t s1 = s0 + strip < nv ? s0 + strip : nv;
    for (int64_t r = 0; r < ring; ++r) tag[r] = INT64_MIN;
    for (int64_t oy = a.oy0; oy < a.oy1;) {
      const int64_t rows = multi && oy + kR <= a.oy1 ? kR : 1;
      // the window's x rows: tap rows ky (one output row), or kh + kR − 1 consecutive rows
      const int64_t n_win = rows == 1 ? a.kh : a.kh + kR - 1;
      for (int64_t i = 0; i < n_win; ++i) {
        const int64_t iy = rows == 1 ? oy * a.sh - a.pad_top + i * a.dh : oy - a.pad_top + i;
        const int64_t r = ((iy % ring) + ring) % ring;
        win[i] = buf + r * slot_bytes;
        if (tag[r] != iy) {
          prep_strip<kFlip>(a, iy, s0, s1, pad, win[i]);
          tag[r] = iy;
        }
      }
      if (rows == kR) {
        flat_vectors<kKh, kGx, kR, kZw>(a, win, s0, s1, oy);
      } else {
        flat_vectors<kKh, kGx, 1, kZw>(a, win, s0, s1, oy);
      }
      oy += rows;
    }
  }
}

// Rows a step computes (sh = dh = 1), measured on EfficientNet-Lite0's layers (thread
// CPU time, loaded machine): 3x3 at 2 rows 16 % below 1 row and 3 rows 9-13 % below 2,
// while 4 rows are slower than 2 (16 accumulators and 12 weight registers spill); 5x5 at 4
// rows 20-23 % below 1 (each weight group serves four rows). 3 for 3x3, 4 for 5x5, else
// 2; with a weight zero point 2 (its Σx' accumulators double the registers).
template <int kKh, int kGx>
void flat_dispatch(const DepthwiseNhwcFlat& a) {
  constexpr int kRows = kKh == 3 ? 3 : kKh == 5 ? 4 : 2;
  if (a.zw) {
    a.flip ? flat_impl<kKh, kGx, 2, true, true>(a) : flat_impl<kKh, kGx, 2, true, false>(a);
  } else {
    a.flip ? flat_impl<kKh, kGx, kRows, false, true>(a) : flat_impl<kKh, kGx, kRows, false, false>(a);
  }
}

}  // namespace

void depthwise_nhwc_flat_avx512vnni(const DepthwiseNhwcFlat& a) {
  // 3x3 and 5x5 with the groups unrolled
  const int64_t gx = (a.kw + 3) / 4;
  if (a.kh == 3 && gx == 1) {
    flat_dispatch<3, 1>(a);
  } else if (a.kh == 5 && gx == 2) {
    flat_dispatch<5, 2>(a);
  } else {
    flat_dispatch<0, 0>(a);
  }
}

void depthwise_nhwc_avx512vnni(const DepthwiseNhwc& a) {
  if (a.zw) {
    a.flip ? row_impl<true, true>(a) : row_impl<true, false>(a);
  } else {
    a.flip ? row_impl<false, true>(a) : row_impl<false, false>(a);
  }
}

}  // namespace conv
}  // namespace quanta
