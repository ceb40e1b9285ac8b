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
#if defined(__clang__)
#pragma clang fp contract(off)
#else
#pragma GCC optimize("fp-contract=off")
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"  // GCC 12, inside its AVX-512 headers
#endif

#include <immintrin.h>

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

// channels [c0, c0 + n) (n <= 64) of one pixel
template <bool kZw, bool kFlip, bool kTail>
inline void block64(const DepthwiseNhwc& a, const uint8_t* const* p, int64_t c0, int64_t n, uint8_t* y) {
  const __mmask64 mask = first_bytes(n);
  const int64_t groups = (a.taps + 3) / 4;
  const int8_t* w = reinterpret_cast<const int8_t*>(a.weights) + (c0 / 64) * groups * 256;
  const __m512i ones = _mm512_set1_epi8(1);
  __m512i acc[4], xs[4];
  for (int j = 0; j < 4; ++j) acc[j] = xs[j] = _mm512_setzero_si512();
  for (int64_t q = 0; q < groups; ++q) {
    const int64_t t = 4 * q;
    const __m512i zero = _mm512_setzero_si512();
    const __m512i v0 = load_tap<kFlip, kTail>(p[t] + c0, mask);
    const __m512i v1 = t + 1 < a.taps ? load_tap<kFlip, kTail>(p[t + 1] + c0, mask) : zero;
    const __m512i v2 = t + 2 < a.taps ? load_tap<kFlip, kTail>(p[t + 2] + c0, mask) : zero;
    const __m512i v3 = t + 3 < a.taps ? load_tap<kFlip, kTail>(p[t + 3] + c0, mask) : zero;
    const __m512i lo01 = _mm512_unpacklo_epi8(v0, v1), hi01 = _mm512_unpackhi_epi8(v0, v1);
    const __m512i lo23 = _mm512_unpacklo_epi8(v2, v3), hi23 = _mm512_unpackhi_epi8(v2, v3);
    __m512i x[4];
    x[0] = _mm512_unpacklo_epi16(lo01, lo23);
    x[1] = _mm512_unpackhi_epi16(lo01, lo23);
    x[2] = _mm512_unpacklo_epi16(hi01, hi23);
    x[3] = _mm512_unpackhi_epi16(hi01, hi23);
    const int8_t* wq = w + q * 256;
    for (int j = 0; j < 4; ++j) {
      acc[j] = _mm512_dpbusd_epi32(acc[j], x[j], _mm512_loadu_si512(wq + 64 * j));
      if (kZw) xs[j] = _mm512_dpbusd_epi32(xs[j], x[j], ones);
    }
  }
  for (int j = 0; j < 4; ++j) {
    acc[j] = _mm512_add_epi32(acc[j], _mm512_loadu_si512(a.colterm + c0 + 16 * j));
    if (kZw) acc[j] = _mm512_sub_epi32(acc[j], _mm512_mullo_epi32(xs[j], _mm512_loadu_si512(a.zw + c0 + 16 * j)));
  }
  if (a.out_type == OutType::kS32) {
    // acc[j] lane L = channels 16L + 4j .. + 3 -> out[k] lane m = acc[m] lane k
    const __m512i t0 = _mm512_shuffle_i32x4(acc[0], acc[1], 0x44), t1 = _mm512_shuffle_i32x4(acc[0], acc[1], 0xEE);
    const __m512i t2 = _mm512_shuffle_i32x4(acc[2], acc[3], 0x44), t3 = _mm512_shuffle_i32x4(acc[2], acc[3], 0xEE);
    const __m512i out[4] = {_mm512_shuffle_i32x4(t0, t2, 0x88), _mm512_shuffle_i32x4(t0, t2, 0xDD),
                            _mm512_shuffle_i32x4(t1, t3, 0x88), _mm512_shuffle_i32x4(t1, t3, 0xDD)};
    int32_t* dst = reinterpret_cast<int32_t*>(y);
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
    __m512 f = _mm512_mul_ps(_mm512_cvtepi32_ps(acc[j]), _mm512_loadu_ps(a.multiplier + c0 + 16 * j));
    f = _mm512_min_ps(_mm512_max_ps(f, _mm512_set1_ps(a.lo_minus_zy)), _mm512_set1_ps(a.hi_minus_zy));
    q[j] = _mm512_add_epi32(_mm512_cvt_roundps_epi32(f, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC),
                            _mm512_set1_epi32(a.zy));
  }
  // q is in the output's range: the packs are exact
  const __m512i p01 = _mm512_packs_epi32(q[0], q[1]), p23 = _mm512_packs_epi32(q[2], q[3]);
  const __m512i p8 = a.out_type == OutType::kS8 ? _mm512_packs_epi16(p01, p23) : _mm512_packus_epi16(p01, p23);
  if (kTail) {
    _mm512_mask_storeu_epi8(y, mask, p8);
  } else {
    _mm512_storeu_si512(y, p8);
  }
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

}  // namespace

void depthwise_nhwc_avx512vnni(const DepthwiseNhwc& a) {
  if (a.zw) {
    a.flip ? row_impl<true, true>(a) : row_impl<true, false>(a);
  } else {
    a.flip ? row_impl<false, true>(a) : row_impl<false, false>(a);
  }
}

}  // namespace conv
}  // namespace quanta
