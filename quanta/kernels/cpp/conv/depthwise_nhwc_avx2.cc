// qconv_dwc_u8s8_s32_16c2__avx2: the channels_last depthwise kernel (contract in kernels.h
// "Depthwise, channels_last").
//
// Per output pixel and block of 16 channels, per pair of taps (t, t + 1): two 16-byte
// loads (the two input pixels' channels, flipped for int8 x), vpunpck{l,h}bw interleave
// them (channel c's bytes of tap t and t + 1 side by side), vpmovzxbw widens to int16, and
// vpmaddwd against the int16 weight pairs gives 8 int32 channel sums (exact: |x'0·w0 +
// x'1·w1| <= 2·255·128, no vpmaddubsw saturation). A missing second tap (odd taps) is a
// zero vector. Channels stay in order, so the epilogue is qgemm's AVX2 one; a channel
// tail (C mod 16) is the block of the last 16 channels (overlapping the one before), or,
// with fewer than 16 channels, the same code on copies of its bytes.
#if defined(__clang__)
#pragma clang fp contract(off)
#else
#pragma GCC optimize("fp-contract=off")
#endif

#include <immintrin.h>

#include <cstring>

#include "conv/kernels.h"
#include "requant_avx2.h"

namespace quanta {
namespace conv {
namespace {

inline __m256i requant8(__m256i acc, const float* mult, const DepthwiseNhwc& a) {
  return avx2::requant_q8(acc, _mm256_loadu_ps(mult), a.lo_minus_zy, a.hi_minus_zy, a.zy);
}

// channels [c0, c0 + n) (n <= 16) of one pixel; x rows p[t] + x_off
// kTaps: the tap count when fixed at compile time (3x3: the loop unrolls), 0 for any
template <bool kZw, bool kFlip, int kTaps>
inline void block16(const DepthwiseNhwc& a, const uint8_t* const* p, int64_t x_off, int64_t c0, int n, void* y) {
  const __m128i flip = _mm_set1_epi8(static_cast<char>(0x80));
  const __m256i ones = _mm256_set1_epi16(1);
  const int16_t* w = reinterpret_cast<const int16_t*>(a.weights) + c0 * 2;
  const int64_t taps = kTaps ? kTaps : a.taps;
  __m256i acc0 = _mm256_setzero_si256(), acc1 = _mm256_setzero_si256();
  __m256i xs0 = _mm256_setzero_si256(), xs1 = _mm256_setzero_si256();
  for (int64_t t = 0; t < taps; t += 2) {
    __m128i v0 = _mm_loadu_si128(reinterpret_cast<const __m128i*>(p[t] + x_off));
    __m128i v1 = _mm_setzero_si128();
    if (kFlip) v0 = _mm_xor_si128(v0, flip);
    if (t + 1 < taps) {
      v1 = _mm_loadu_si128(reinterpret_cast<const __m128i*>(p[t + 1] + x_off));
      if (kFlip) v1 = _mm_xor_si128(v1, flip);
    }
    const __m256i lo = _mm256_cvtepu8_epi16(_mm_unpacklo_epi8(v0, v1));
    const __m256i hi = _mm256_cvtepu8_epi16(_mm_unpackhi_epi8(v0, v1));
    const int16_t* wp = w + (t / 2) * a.cpad * 2;
    acc0 = _mm256_add_epi32(acc0, _mm256_madd_epi16(lo, _mm256_loadu_si256(reinterpret_cast<const __m256i*>(wp))));
    acc1 = _mm256_add_epi32(acc1, _mm256_madd_epi16(hi, _mm256_loadu_si256(reinterpret_cast<const __m256i*>(wp + 16))));
    if (kZw) {
      xs0 = _mm256_add_epi32(xs0, _mm256_madd_epi16(lo, ones));
      xs1 = _mm256_add_epi32(xs1, _mm256_madd_epi16(hi, ones));
    }
  }
  acc0 = _mm256_add_epi32(acc0, _mm256_loadu_si256(reinterpret_cast<const __m256i*>(a.colterm + c0)));
  acc1 = _mm256_add_epi32(acc1, _mm256_loadu_si256(reinterpret_cast<const __m256i*>(a.colterm + c0 + 8)));
  if (kZw) {
    acc0 = _mm256_sub_epi32(acc0,
                            _mm256_mullo_epi32(xs0, _mm256_loadu_si256(reinterpret_cast<const __m256i*>(a.zw + c0))));
    acc1 = _mm256_sub_epi32(
        acc1, _mm256_mullo_epi32(xs1, _mm256_loadu_si256(reinterpret_cast<const __m256i*>(a.zw + c0 + 8))));
  }
  if (a.out_type == OutType::kS32) {
    alignas(32) int32_t tmp[16];
    int32_t* dst = n == 16 ? static_cast<int32_t*>(y) : tmp;
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(dst), acc0);
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(dst + 8), acc1);
    if (n < 16) std::memcpy(y, tmp, static_cast<size_t>(n) * 4);
    return;
  }
  const __m256i q0 = requant8(acc0, a.multiplier + c0, a), q1 = requant8(acc1, a.multiplier + c0 + 8, a);
  avx2::store_q8x16(q0, q1, a.out_type == OutType::kS8, y, n);  // channel order, n bytes
}

template <bool kZw, bool kFlip, int kTaps>
void row_impl(const DepthwiseNhwc& a) {
  const int ob = out_bytes(a.out_type);
  const int64_t full = a.C / 16 * 16, tail = a.C - full;
  // the tail's bytes of every tap, 16 per tap (zeros past C), and pointers to them
  uint8_t* tail_bytes = a.scratch;
  const uint8_t** tail_ptrs = reinterpret_cast<const uint8_t**>(a.scratch + 16 * a.taps);
  if (tail) {
    std::memset(tail_bytes, 0, static_cast<size_t>(16 * a.taps));
    for (int64_t t = 0; t < a.taps; ++t) tail_ptrs[t] = tail_bytes + 16 * t;
  }
  for (int64_t o = 0; o < a.ow; ++o) {
    const uint8_t* const* p = a.ptrs + o * a.taps;
    uint8_t* y = static_cast<uint8_t*>(a.y) + o * a.y_pixel_stride * ob;
    for (int64_t c0 = 0; c0 < full; c0 += 16) block16<kZw, kFlip, kTaps>(a, p, c0, c0, 16, y + c0 * ob);
    if (tail && full > 0) {
      // the last 16 channels again, overlapping the previous block (the same bytes are
      // written twice): plain loads instead of a copy of the tail per tap (C = 24: 1.31
      // -> 1.0x ONNX Runtime's time)
      block16<kZw, kFlip, kTaps>(a, p, a.C - 16, a.C - 16, 16, y + (a.C - 16) * ob);
    } else if (tail) {
      for (int64_t t = 0; t < a.taps; ++t) std::memcpy(tail_bytes + 16 * t, p[t] + full, static_cast<size_t>(tail));
      block16<kZw, kFlip, kTaps>(a, tail_ptrs, 0, full, static_cast<int>(tail), y + full * ob);
    }
  }
}

template <bool kZw, bool kFlip>
void row_sized(const DepthwiseNhwc& a) {
  a.taps == 9 ? row_impl<kZw, kFlip, 9>(a) : row_impl<kZw, kFlip, 0>(a);
}

}  // namespace

void depthwise_nhwc_avx2(const DepthwiseNhwc& a) {
  if (a.zw) {
    a.flip ? row_sized<true, true>(a) : row_sized<true, false>(a);
  } else {
    a.flip ? row_sized<false, true>(a) : row_sized<false, false>(a);
  }
}

}  // namespace conv
}  // namespace quanta
