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

// The row's constants, read once: y's stores may alias the fields of DepthwiseNhwc as far
// as the compiler knows, which made it reload them for every block of 16 channels.
struct RowConsts {
  const int16_t* w;
  int64_t cpad;
  const int32_t* colterm;
  const float* multiplier;
  const int32_t* zw;
  __m256 lo, hi;
  __m256i zy16;
  OutType out_type;
};

// The taps of one output pixel: its entries of DepthwiseNhwc::ptrs, or (the pixels whose
// taps are all inside x) its corner plus the tap offsets, which conv.cc then need not
// write per pixel (C = 16 at 320x320: 9 pointer stores a pixel were 1/4 of the row).
struct PtrTaps {
  const uint8_t* const* p;
  const uint8_t* operator[](int64_t t) const { return p[t]; }
};
struct DenseTaps {
  const uint8_t* corner;
  const int64_t* offset;
  const uint8_t* operator[](int64_t t) const { return corner + offset[t]; }
};

// C = 16 computes two pixels at a time up to this many taps (the scratch holds their
// weights: kernels.h dw_nhwc_scratch_bytes)
constexpr int64_t kPairPixelsMaxTaps = 25;

// channels [c0, c0 + n) (n <= 16) of one pixel; x rows p[t] + x_off
// kTaps: the tap count when fixed at compile time (3x3: the loop unrolls), 0 for any
template <bool kZw, bool kFlip, int kTaps, class Taps>
inline void block16(const RowConsts& k, int64_t n_taps, const Taps& p, int64_t x_off, int64_t c0, int n, void* y) {
  const __m128i flip = _mm_set1_epi8(static_cast<char>(0x80));
  const __m256i ones = _mm256_set1_epi16(1);
  const int16_t* w = k.w + c0 * 2;
  const int64_t taps = kTaps ? kTaps : n_taps;
  // the sums start at colterm (int32 sums wrap: the same bits as adding it last)
  __m256i acc0 = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(k.colterm + c0));
  __m256i acc1 = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(k.colterm + c0 + 8));
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
    const int16_t* wp = w + (t / 2) * k.cpad * 2;
    acc0 = _mm256_add_epi32(acc0, _mm256_madd_epi16(lo, _mm256_loadu_si256(reinterpret_cast<const __m256i*>(wp))));
    acc1 = _mm256_add_epi32(acc1, _mm256_madd_epi16(hi, _mm256_loadu_si256(reinterpret_cast<const __m256i*>(wp + 16))));
    if (kZw) {
      xs0 = _mm256_add_epi32(xs0, _mm256_madd_epi16(lo, ones));
      xs1 = _mm256_add_epi32(xs1, _mm256_madd_epi16(hi, ones));
    }
  }
  if (kZw) {
    acc0 = _mm256_sub_epi32(acc0,
                            _mm256_mullo_epi32(xs0, _mm256_loadu_si256(reinterpret_cast<const __m256i*>(k.zw + c0))));
    acc1 = _mm256_sub_epi32(
        acc1, _mm256_mullo_epi32(xs1, _mm256_loadu_si256(reinterpret_cast<const __m256i*>(k.zw + c0 + 8))));
  }
  if (k.out_type == OutType::kS32) {
    alignas(32) int32_t tmp[16];
    int32_t* dst = n == 16 ? static_cast<int32_t*>(y) : tmp;
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(dst), acc0);
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(dst + 8), acc1);
    if (n < 16) std::memcpy(y, tmp, static_cast<size_t>(n) * 4);
    return;
  }
  const __m256i d0 = avx2::requant_q8_nozy(acc0, _mm256_loadu_ps(k.multiplier + c0), k.lo, k.hi);
  const __m256i d1 = avx2::requant_q8_nozy(acc1, _mm256_loadu_ps(k.multiplier + c0 + 8), k.lo, k.hi);
  avx2::store_bytes16(avx2::pack_q8x16_zy(d0, d1, k.zy16, k.out_type == OutType::kS8), y, n);  // channel order
}

// 32 channels [c0, c0 + 32) of one pixel, C a multiple of 32, the per-channel arrays in
// the 32-channel order of kernels.h dw_nhwc_index. Per pair of taps, two 32-byte loads,
// vpunpck{l,h}bw of the two (in-lane: channels 0-7 | 16-23 and 8-15 | 24-31) and the four
// in-lane unpacks of those with zero give the int16 pairs of channels {0-3, 16-19},
// {4-7, 20-23}, {8-11, 24-27}, {12-15, 28-31}: 6 shuffles per 32 channels where two
// 16-channel blocks take 8, and an output order that the packs to bytes put back in
// channel order by themselves (vpackssdw of sums 0, 1 and of 2, 3, then vpackuswb: 3
// shuffles per 32 outputs instead of 10).
template <bool kZw, bool kFlip, int kTaps, class Taps>
inline void block32(const RowConsts& k, int64_t n_taps, const Taps& p, int64_t c0, void* y) {
  const __m256i flip = _mm256_set1_epi8(static_cast<char>(0x80));
  const __m256i zero = _mm256_setzero_si256();
  const __m256i ones = _mm256_set1_epi16(1);
  const int16_t* w = k.w + c0 * 2;
  const int64_t taps = kTaps ? kTaps : n_taps;
  __m256i acc[4], xs[4];
  for (int i = 0; i < 4; ++i) {
    acc[i] = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(k.colterm + c0 + 8 * i));
    xs[i] = zero;
  }
  for (int64_t t = 0; t < taps; t += 2) {
    __m256i v0 = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p[t] + c0));
    __m256i v1 = zero;
    if (kFlip) v0 = _mm256_xor_si256(v0, flip);
    if (t + 1 < taps) {
      v1 = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p[t + 1] + c0));
      if (kFlip) v1 = _mm256_xor_si256(v1, flip);
    }
    const __m256i u_lo = _mm256_unpacklo_epi8(v0, v1), u_hi = _mm256_unpackhi_epi8(v0, v1);
    const __m256i x[4] = {_mm256_unpacklo_epi8(u_lo, zero), _mm256_unpackhi_epi8(u_lo, zero),
                          _mm256_unpacklo_epi8(u_hi, zero), _mm256_unpackhi_epi8(u_hi, zero)};
    const int16_t* wp = w + (t / 2) * k.cpad * 2;
    for (int i = 0; i < 4; ++i) {
      acc[i] = _mm256_add_epi32(
          acc[i], _mm256_madd_epi16(x[i], _mm256_loadu_si256(reinterpret_cast<const __m256i*>(wp + 16 * i))));
      if (kZw) xs[i] = _mm256_add_epi32(xs[i], _mm256_madd_epi16(x[i], ones));
    }
  }
  if (kZw) {
    for (int i = 0; i < 4; ++i) {
      acc[i] = _mm256_sub_epi32(
          acc[i], _mm256_mullo_epi32(xs[i], _mm256_loadu_si256(reinterpret_cast<const __m256i*>(k.zw + c0 + 8 * i))));
    }
  }
  if (k.out_type == OutType::kS32) {  // sum i holds channels 4i .. 4i + 3 and 16 + 4i .. 16 + 4i + 3
    int32_t* dst = static_cast<int32_t*>(y);
    for (int i = 0; i < 4; ++i) {
      _mm_storeu_si128(reinterpret_cast<__m128i*>(dst + 4 * i), _mm256_castsi256_si128(acc[i]));
      _mm_storeu_si128(reinterpret_cast<__m128i*>(dst + 16 + 4 * i), _mm256_extracti128_si256(acc[i], 1));
    }
    return;
  }
  __m256i d[4];
  for (int i = 0; i < 4; ++i) {
    d[i] = avx2::requant_q8_nozy(acc[i], _mm256_loadu_ps(k.multiplier + c0 + 8 * i), k.lo, k.hi);
  }
  // int16: channels 0-7 | 16-23 and 8-15 | 24-31 (q − zy, then q); bytes: 0-15 | 16-31
  const __m256i p01 = _mm256_add_epi16(_mm256_packs_epi32(d[0], d[1]), k.zy16);
  const __m256i p23 = _mm256_add_epi16(_mm256_packs_epi32(d[2], d[3]), k.zy16);
  const __m256i q = k.out_type == OutType::kS8 ? _mm256_packs_epi16(p01, p23) : _mm256_packus_epi16(p01, p23);
  _mm256_storeu_si256(reinterpret_cast<__m256i*>(y), q);
}

// Whether every tap of the pixel after p's (its pointers follow p's) is 16 bytes past p's
// (4 pointer differences a vector: a branch per tap cost 1/3 of the pairs' gain).
inline bool next_pixel_adjacent(const uint8_t* const* p, int64_t taps) {
  const __m256i sixteen = _mm256_set1_epi64x(16);
  __m256i off = _mm256_setzero_si256();
  int64_t t = 0;
  for (; t + 4 <= taps; t += 4) {
    const __m256i a = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p + t));
    const __m256i b = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p + taps + t));
    off = _mm256_or_si256(off, _mm256_xor_si256(_mm256_sub_epi64(b, a), sixteen));
  }
  bool adjacent = _mm256_testz_si256(off, off) != 0;
  for (; t < taps; ++t) adjacent &= p[taps + t] == p[t] + 16;
  return adjacent;
}

template <bool kZw, bool kFlip, int kTaps>
void row_impl(const DepthwiseNhwc& a) {
  const int ob = out_bytes(a.out_type);
  const int64_t C = a.C, taps = a.taps, ow = a.ow, y_step = a.y_pixel_stride * ob;
  const int64_t full = C / 16 * 16, tail = C - full;
  const RowConsts k{reinterpret_cast<const int16_t*>(a.weights),
                    a.cpad,
                    a.colterm,
                    a.multiplier,
                    a.zw,
                    _mm256_set1_ps(a.lo_minus_zy),
                    _mm256_set1_ps(a.hi_minus_zy),
                    _mm256_set1_epi16(static_cast<int16_t>(a.zy)),
                    a.out_type};
  const uint8_t* const* ptrs = a.ptrs;
  uint8_t* const y0 = static_cast<uint8_t*>(a.y);
  // pixels [db, de) take their taps from dense_x (kernels.h), the others from ptrs
  const int64_t db = a.tap_offset ? a.dense_begin : 0, de = a.tap_offset ? a.dense_end : 0;
  auto dense = [&](int64_t o) { return DenseTaps{a.dense_x + (o - db) * a.dense_step, a.tap_offset}; };
  auto listed = [&](int64_t o) { return PtrTaps{ptrs + o * taps}; };

  if (C == 16 && taps <= kPairPixelsMaxTaps) {
    // Two pixels at a time: where pixel o + 1's taps are pixel o's plus 16 bytes (stride
    // and dilation 1, no pad among them), a 32-byte load at o's tap holds both pixels'
    // 16 channels, and block32 computes them as 32 "channels" with the weights, colterm,
    // multipliers (and zw) repeated for the second pixel, in its 32-channel order, made
    // here in the scratch (kernels.h dw_nhwc_scratch_bytes).
    const int64_t pairs = (taps + 1) / 2;
    int16_t* w2 = reinterpret_cast<int16_t*>(a.scratch);
    int32_t* ct2 = reinterpret_cast<int32_t*>(w2 + pairs * 64);
    float* m2 = reinterpret_cast<float*>(ct2 + 32);
    int32_t* zw2 = reinterpret_cast<int32_t*>(m2 + 32);
    for (int64_t j = 0; j < 32; ++j) {
      const int64_t at = dw_nhwc_index(Isa::kAvx2, j, 32), c = j % 16;
      for (int64_t q = 0; q < pairs; ++q) {
        w2[(q * 32 + at) * 2] = k.w[(q * k.cpad + c) * 2];
        w2[(q * 32 + at) * 2 + 1] = k.w[(q * k.cpad + c) * 2 + 1];
      }
      ct2[at] = k.colterm[c];
      m2[at] = k.out_type == OutType::kS32 ? 0.f : k.multiplier[c];
      zw2[at] = k.zw ? k.zw[c] : 0;
    }
    RowConsts k2 = k;
    k2.w = w2;
    k2.cpad = 32;
    k2.colterm = ct2;
    k2.multiplier = m2;
    k2.zw = k.zw ? zw2 : nullptr;
    // listed pixels [o, end): pairs where the pointers say so
    auto listed_run = [&](int64_t o, int64_t end) {
      for (; o + 1 < end; ++o) {
        if (next_pixel_adjacent(ptrs + o * taps, taps)) {
          block32<kZw, kFlip, kTaps>(k2, taps, listed(o), 0, y0 + o * y_step);
          ++o;
        } else {
          block16<kZw, kFlip, kTaps>(k, taps, listed(o), 0, 0, 16, y0 + o * y_step);
        }
      }
      if (o < end) block16<kZw, kFlip, kTaps>(k, taps, listed(o), 0, 0, 16, y0 + o * y_step);
    };
    listed_run(0, db);
    int64_t o = db;
    if (a.dense_step == 16) {
      for (; o + 1 < de; o += 2) block32<kZw, kFlip, kTaps>(k2, taps, dense(o), 0, y0 + o * y_step);
    }
    for (; o < de; ++o) block16<kZw, kFlip, kTaps>(k, taps, dense(o), 0, 0, 16, y0 + o * y_step);
    listed_run(std::max(de, db), ow);
    return;
  }

  // the tail's bytes of every tap, 16 per tap (zeros past C), and pointers to them
  uint8_t* tail_bytes = a.scratch;
  const uint8_t** tail_ptrs = reinterpret_cast<const uint8_t**>(a.scratch + 16 * taps);
  if (tail && full == 0) {
    std::memset(tail_bytes, 0, static_cast<size_t>(16 * taps));
    for (int64_t t = 0; t < taps; ++t) tail_ptrs[t] = tail_bytes + 16 * t;
  }
  auto pixel = [&](int64_t o, const auto& p) {
    uint8_t* y = y0 + o * y_step;
    if (C % 32 == 0) {  // the 32-channel order (kernels.h dw_nhwc_index)
      for (int64_t c0 = 0; c0 < C; c0 += 32) block32<kZw, kFlip, kTaps>(k, taps, p, c0, y + c0 * ob);
      return;
    }
    for (int64_t c0 = 0; c0 < full; c0 += 16) block16<kZw, kFlip, kTaps>(k, taps, p, c0, c0, 16, y + c0 * ob);
    if (tail && full > 0) {
      // the last 16 channels again, overlapping the previous block (the same bytes are
      // written twice): plain loads instead of a copy of the tail per tap (C = 24: 1.31
      // -> 1.0x ONNX Runtime's time)
      block16<kZw, kFlip, kTaps>(k, taps, p, C - 16, C - 16, 16, y + (C - 16) * ob);
    } else if (tail) {
      for (int64_t t = 0; t < taps; ++t) std::memcpy(tail_bytes + 16 * t, p[t] + full, static_cast<size_t>(tail));
      block16<kZw, kFlip, kTaps>(k, taps, PtrTaps{tail_ptrs}, 0, full, static_cast<int>(tail), y + full * ob);
    }
  };
  for (int64_t o = 0; o < db; ++o) pixel(o, listed(o));
  for (int64_t o = db; o < de; ++o) pixel(o, dense(o));
  for (int64_t o = std::max(de, db); o < ow; ++o) pixel(o, listed(o));
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
