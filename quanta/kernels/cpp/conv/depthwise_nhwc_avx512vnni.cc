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
// (C = 16: four pixels per vector) fill every lane; no tap pointers. A 3x3 kernel is two
// full groups and a last group of one tap, whose dword spread needs 6 shuffles instead of 8.
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

// Tap t of the 64 elements from f0 (x' bytes). kEdge: some may lie outside x (masked
// load merged into zx; masked-off bytes are neither read nor faulted on).
template <bool kFlip, bool kEdge>
inline __m512i flat_tap(const DepthwiseNhwcFlat& a, int64_t t, int64_t f0, __m512i pad) {
  const uint8_t* row = a.row[t];
  __m512i v = pad;
  if (row != nullptr) {
    if (!kEdge) {
      v = _mm512_loadu_si512(row + (a.shift[t] + f0));
    } else {
      const __mmask64 m = byte_range(a.lo[t] - f0, a.hi[t] - f0);
      // the vector may start before x (left edge): an address, never dereferenced there
      const auto at = reinterpret_cast<const void*>(reinterpret_cast<uintptr_t>(row) + (a.shift[t] + f0));
      if (m != 0) v = _mm512_mask_loadu_epi8(pad, m, at);
    }
  }
  if (kFlip) v = _mm512_xor_si512(v, _mm512_set1_epi8(static_cast<char>(0x80)));
  return v;
}

// Elements [f0, f0 + min(64, n − f0)) with weight block `block`.
template <bool kZw, bool kFlip, bool kEdge>
inline void flat_vector(const DepthwiseNhwcFlat& a, int64_t f0, int64_t block, __m512i pad) {
  const int64_t groups = (a.taps + 3) / 4;
  const int8_t* w = reinterpret_cast<const int8_t*>(a.weights) + block * groups * 256;
  const int64_t e0 = block * 64;
  __m512i acc[4], xs[4];
  init_acc(a.colterm + e0, acc, xs);
  const __m512i zero = _mm512_setzero_si512();
  int64_t t = 0;
  for (; t + 4 <= a.taps; t += 4) {
    dot4<kZw, false>(flat_tap<kFlip, kEdge>(a, t, f0, pad), flat_tap<kFlip, kEdge>(a, t + 1, f0, pad),
                     flat_tap<kFlip, kEdge>(a, t + 2, f0, pad), flat_tap<kFlip, kEdge>(a, t + 3, f0, pad),
                     w + (t / 4) * 256, acc, xs);
  }
  const int64_t left = a.taps - t;
  if (left == 1) {
    dot4<kZw, true>(flat_tap<kFlip, kEdge>(a, t, f0, pad), zero, zero, zero, w + (t / 4) * 256, acc, xs);
  } else if (left > 1) {
    const __m512i v2 = left > 2 ? flat_tap<kFlip, kEdge>(a, t + 2, f0, pad) : zero;
    dot4<kZw, false>(flat_tap<kFlip, kEdge>(a, t, f0, pad), flat_tap<kFlip, kEdge>(a, t + 1, f0, pad), v2, zero,
                     w + (t / 4) * 256, acc, xs);
  }
  const int ob = out_bytes(a.out_type);
  void* y = static_cast<uint8_t*>(a.y) + f0 * ob;
  finish64<kZw, kEdge>(acc, xs, a.multiplier + e0, a.zw ? a.zw + e0 : nullptr, a.out_type, a.zy, a.lo_minus_zy,
                       a.hi_minus_zy, a.n - f0, y);
}

template <bool kZw, bool kFlip>
void flat_impl(const DepthwiseNhwcFlat& a) {
  const __m512i pad = _mm512_set1_epi8(static_cast<char>(a.zx));
  const int64_t nv = (a.n + 63) / 64;
  int64_t block = 0;
  for (int64_t v = 0; v < nv; ++v) {
    if (v >= a.v_lo && v < a.v_hi) {
      flat_vector<kZw, kFlip, false>(a, 64 * v, block, pad);
    } else {
      flat_vector<kZw, kFlip, true>(a, 64 * v, block, pad);
    }
    block = block + 1 == a.blocks ? 0 : block + 1;
  }
}

}  // namespace

void depthwise_nhwc_flat_avx512vnni(const DepthwiseNhwcFlat& a) {
  if (a.zw) {
    a.flip ? flat_impl<true, true>(a) : flat_impl<true, false>(a);
  } else {
    a.flip ? flat_impl<false, true>(a) : flat_impl<false, false>(a);
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
