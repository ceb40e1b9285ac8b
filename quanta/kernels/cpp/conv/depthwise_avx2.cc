// qconv_dw_u8s8_s32_8c4__avx2: the depthwise kernel (contract in kernels.h).
//
// Pair form (dw_pairs_fit: sw = 1 or 2, dw = 1). The kernel builds the unit's padded rows
// from the plane, widened to int16 (scratch16, once per unit; no uint8 copy first). The
// taps (kx, kx + 1) of output pixel o are then the two int16 at element o·sw + kx of a
// row, i.e. one dword, and vpmaddwd against the dword (w_eff[kx], w_eff[kx + 1]) (0 past
// kw) gives their two products summed in int32 (exact: |pair| <= 2·255·128, no
// vpmaddubsw saturation). With sw = 2 the 8 dwords of one 32-byte load at element
// 2·o0 + kx are the pairs of pixels o0 .. o0 + 7: no shuffle at all. With sw = 1 the load
// at element o0 + kx holds the pairs of the even pixels o0, o0 + 2, .., o0 + 14 and the
// load one element further those of the odd ones; the epilogue puts the 16 results back
// in pixel order (one vpshufb on the packed bytes, or unpacks for int32). A 3x3 kernel
// is 2 pairs per kernel row: 6 vpmaddwd + 6 vpaddd per 8 outputs, no widening or
// gathering in the loop (3x3 and 5x5 are compiled with their sizes: the weight vectors
// stay in registers). A row's last block stores all 16 outputs when the ones past the
// row belong to later rows of the call (written again, in order), so only the call's
// last row needs a partial store (144 channels at 28x28, stride 2, rows of 14 outputs:
// 1.87 -> 1.17x ONNX Runtime's time with the partial stores gone and the row build
// vectorised).
//
// Gather form (the other geometries): per 4 output pixels of a row, one 16-byte load and
// one vpshufb gather the 4 x 4 tap bytes (byte 4o + t = in[(ox0 + o)·sw + (4q + t)·dw],
// zero past kw), vpmovzxbw widens them to int16 and vpmaddwd against the taps (w_eff as
// int16, repeated per pixel) gives two int32 partial sums per pixel (taps 0+1, 2+3). A
// block is 8 pixels = two such vectors; after the last tap vphaddd adds the pairs and
// vpermq restores pixel order. Geometries whose taps do not fit one 16-byte load
// (dw_gather_fits) gather with scalar loads.
// Epilogue as qgemm's AVX2 family (float32 multiply, clamp, vroundps to nearest even).
#if defined(__clang__)
#pragma clang fp contract(off)
#else
#pragma GCC optimize("fp-contract=off")
#endif

#include <immintrin.h>

#include <algorithm>
#include <cstring>

#include "conv/kernels.h"
#include "requant_avx2.h"

namespace quanta {
namespace conv {
namespace {

struct Gather {
  __m128i shuf_full, shuf_last;
};

Gather make_gather(const DepthwiseRows& a) {
  Gather g;
  g.shuf_full = _mm_loadu_si128(reinterpret_cast<const __m128i*>(a.gather_full));
  g.shuf_last = _mm_loadu_si128(reinterpret_cast<const __m128i*>(a.gather_last));
  return g;
}

template <bool kFast>
inline __m256i gather4(const uint8_t* src, const Gather& g, bool last_group, const DepthwiseRows& a, int64_t taps) {
  if (kFast) {
    const __m128i v = _mm_loadu_si128(reinterpret_cast<const __m128i*>(src));
    return _mm256_cvtepu8_epi16(_mm_shuffle_epi8(v, last_group ? g.shuf_last : g.shuf_full));
  }
  alignas(16) uint8_t tmp[16];
  for (int o = 0; o < 4; ++o) {
    for (int t = 0; t < 4; ++t) tmp[4 * o + t] = t < taps ? src[o * a.sw + t * a.dw] : 0;
  }
  return _mm256_cvtepu8_epi16(_mm_load_si128(reinterpret_cast<const __m128i*>(tmp)));
}

inline __m256i requant(__m256i acc, const DepthwiseRows& a) {
  return avx2::requant_q8(acc, _mm256_set1_ps(a.multiplier), a.lo_minus_zy, a.hi_minus_zy, a.zy);
}

inline void finish(__m256i acc, const DepthwiseRows& a, int64_t at, int valid) {
  if (a.out_type == OutType::kS32) {
    if (valid >= 8) {
      _mm256_storeu_si256(reinterpret_cast<__m256i*>(static_cast<int32_t*>(a.y) + at), acc);
    } else {
      alignas(32) int32_t tmp[8];
      _mm256_store_si256(reinterpret_cast<__m256i*>(tmp), acc);
      std::memcpy(static_cast<int32_t*>(a.y) + at, tmp, static_cast<size_t>(valid) * sizeof(int32_t));
    }
    return;
  }
  avx2::store_q8(requant(acc, a), a.out_type == OutType::kS8, static_cast<uint8_t*>(a.y) + at, valid);
}

template <bool kZw, bool kFast>
void rows_impl(const DepthwiseRows& a) {
  const Gather g = make_gather(a);
  const int64_t last_taps = a.kw - 4 * (a.groups4 - 1);
  const __m256i ones = _mm256_set1_epi16(1);
  const __m256i colterm = _mm256_set1_epi32(a.colterm);
  const __m256i zw = _mm256_set1_epi32(a.zw);
  for (int64_t oy = 0; oy < a.rows; ++oy) {
    const uint8_t* base = a.in + oy * a.sh * a.in_stride;
    for (int64_t ox0 = 0; ox0 < a.ow; ox0 += 8) {
      __m256i acc0 = _mm256_setzero_si256(), acc1 = _mm256_setzero_si256();
      __m256i xs0 = _mm256_setzero_si256(), xs1 = _mm256_setzero_si256();
      for (int64_t ky = 0; ky < a.kh; ++ky) {
        const uint8_t* row = base + ky * a.dh * a.in_stride + ox0 * a.sw;
        for (int64_t q = 0; q < a.groups4; ++q) {
          const bool last = q == a.groups4 - 1;
          const int64_t taps = last ? last_taps : 4;
          const __m256i w = _mm256_cvtepi8_epi16(_mm_set1_epi32(a.taps4[ky * a.groups4 + q]));
          const uint8_t* src = row + 4 * q * a.dw;
          const __m256i v0 = gather4<kFast>(src, g, last, a, taps);
          const __m256i v1 = gather4<kFast>(src + 4 * a.sw, g, last, a, taps);
          acc0 = _mm256_add_epi32(acc0, _mm256_madd_epi16(v0, w));
          acc1 = _mm256_add_epi32(acc1, _mm256_madd_epi16(v1, w));
          if (kZw) {
            xs0 = _mm256_add_epi32(xs0, _mm256_madd_epi16(v0, ones));
            xs1 = _mm256_add_epi32(xs1, _mm256_madd_epi16(v1, ones));
          }
        }
      }
      // (o0, o1, o4, o5 | o2, o3, o6, o7) -> pixel order
      __m256i v = _mm256_permute4x64_epi64(_mm256_hadd_epi32(acc0, acc1), 0xD8);
      v = _mm256_add_epi32(v, colterm);
      if (kZw) {
        const __m256i xs = _mm256_permute4x64_epi64(_mm256_hadd_epi32(xs0, xs1), 0xD8);
        v = _mm256_sub_epi32(v, _mm256_mullo_epi32(xs, zw));
      }
      const int64_t left = a.ow - ox0;
      finish(v, a, oy * a.y_stride + ox0, static_cast<int>(left < 8 ? left : 8));
    }
  }
}

// 16 outputs at y + at (valid of them): acc0 / acc1 hold pixels 0..7 / 8..15 (kInterleaved
// false), or the even / odd pixels (true)
template <bool kInterleaved>
inline void finish16(__m256i acc0, __m256i acc1, const DepthwiseRows& a, int64_t at, int valid) {
  if (a.out_type == OutType::kS32) {
    if (kInterleaved) {
      const __m256i lo = _mm256_unpacklo_epi32(acc0, acc1),
                    hi = _mm256_unpackhi_epi32(acc0, acc1);  // 0-3 8-11, 4-7 12-15
      acc0 = _mm256_permute2x128_si256(lo, hi, 0x20);
      acc1 = _mm256_permute2x128_si256(lo, hi, 0x31);
    }
    int32_t* y = static_cast<int32_t*>(a.y) + at;
    alignas(32) int32_t tmp[16];
    int32_t* dst = valid >= 16 ? y : tmp;
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(dst), acc0);
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(dst + 8), acc1);
    if (valid < 16) std::memcpy(y, tmp, static_cast<size_t>(valid) * sizeof(int32_t));
    return;
  }
  // q is in the output's range: the packs are exact
  const __m256i q0 = requant(acc0, a), q1 = requant(acc1, a);
  const bool y_signed = a.out_type == OutType::kS8;
  __m128i p8;
  if (kInterleaved) {
    // lane 0: int16 of pixels 0 2 4 6 1 3 5 7, lane 1: 8 .. 15 alike
    const __m256i p16 = _mm256_packs_epi32(q0, q1);
    const __m256i b = y_signed ? _mm256_packs_epi16(p16, p16) : _mm256_packus_epi16(p16, p16);
    const __m256i order = _mm256_setr_epi8(0, 4, 1, 5, 2, 6, 3, 7, 8, 12, 9, 13, 10, 14, 11, 15, 0, 4, 1, 5, 2, 6, 3, 7,
                                           8, 12, 9, 13, 10, 14, 11, 15);
    p8 = _mm256_castsi256_si128(_mm256_permute4x64_epi64(_mm256_shuffle_epi8(b, order), 0x08));
  } else {
    p8 = avx2::pack_q8x16(q0, q1, y_signed);  // (0-3, 8-11 | 4-7, 12-15) -> pixel order
  }
  avx2::store_bytes16(p8, static_cast<uint8_t*>(a.y) + at, valid);
}

// Rows [0, in_rows) of xpad' widened to int16, `width` elements each (kernels.h "Direct
// mode": x ^ flip inside x, zx' outside).
void build_rows(const DepthwiseRows& a, int64_t in_rows, int64_t width) {
  const __m128i flip = _mm_set1_epi8(static_cast<char>(a.flip));
  const __m256i pad = _mm256_set1_epi16(a.pad);
  for (int64_t r = 0; r < in_rows; ++r) {
    int16_t* dst = a.scratch16 + r * width;
    for (int64_t c = 0; c < width; c += 16) _mm256_storeu_si256(reinterpret_cast<__m256i*>(dst + c), pad);
    const int64_t iy = a.src_row0 + r;
    if (iy < 0 || iy >= a.src_h) continue;
    // columns [c0, c1) come from x: column c of x row iy is at src + c
    const int64_t c0 = std::min(std::max<int64_t>(-a.src_col0, 0), width);
    const int64_t c1 = std::max(c0, std::min(a.src_w - a.src_col0, width));
    const uint8_t* src = a.plane + iy * a.src_w + a.src_col0;
    auto put16 = [&](int64_t c) {
      const __m128i v = _mm_xor_si128(_mm_loadu_si128(reinterpret_cast<const __m128i*>(src + c)), flip);
      _mm256_storeu_si256(reinterpret_cast<__m256i*>(dst + c), _mm256_cvtepu8_epi16(v));
    };
    if (c1 - c0 >= 16) {
      for (int64_t c = c0; c + 16 <= c1; c += 16) put16(c);
      put16(c1 - 16);  // the last 16 columns again: no read past x's row
    } else {
      for (int64_t c = c0; c < c1; ++c) dst[c] = static_cast<int16_t>(src[c] ^ a.flip);
    }
  }
}

// kKh, kPairs: the kernel's rows and pairs per row when fixed at compile time (3x3: 3, 2;
// 5x5: 5, 3: the weights then stay in registers), 0 for any
template <bool kZw, int kSw, int kKh, int kPairs>
void pairs_impl(const DepthwiseRows& a) {
  const int64_t kh = kKh ? kKh : a.kh, pairs = kPairs ? kPairs : (a.kw + 1) / 2;
  const int64_t width = dw_pairs_width(a.ow, kSw, a.kw);
  const int64_t st = a.dh * width;  // elements from one kernel row's x row to the next
  build_rows(a, (a.rows - 1) * a.sh + (kh - 1) * a.dh + 1, width);
  // per kernel row ky and pair p: the dword (w_eff[ky, 2p], w_eff[ky, 2p + 1]) (0 past kw),
  // and the pair's Σx' multipliers (1, 1), or (1, 0) for a lone last tap
  __m256i wv[kKh ? kKh * kPairs : kDwMaxPairs], ones[kKh ? kKh * kPairs : kDwMaxPairs];
  for (int64_t ky = 0; ky < kh; ++ky) {
    for (int64_t p = 0; p < pairs; ++p) {
      const bool two = 2 * p + 1 < a.kw;
      const uint16_t w0 = static_cast<uint16_t>(static_cast<int16_t>(a.taps[ky * a.kw + 2 * p]));
      const uint16_t w1 = two ? static_cast<uint16_t>(static_cast<int16_t>(a.taps[ky * a.kw + 2 * p + 1])) : 0;
      wv[ky * pairs + p] = _mm256_set1_epi32(static_cast<int32_t>(w0 | (static_cast<uint32_t>(w1) << 16)));
      ones[ky * pairs + p] = _mm256_set1_epi32(two ? 0x00010001 : 1);
    }
  }
  const __m256i colterm = _mm256_set1_epi32(a.colterm);
  const __m256i zw = _mm256_set1_epi32(a.zw);
  // second vector: the odd pixels one element on (sw = 1), or pixels 8..15 16 on (sw = 2)
  constexpr int64_t kSecond = kSw == 1 ? 1 : 16;
  for (int64_t oy = 0; oy < a.rows; ++oy) {
    const int16_t* base = a.scratch16 + oy * a.sh * width;
    for (int64_t ox0 = 0; ox0 < a.ow; ox0 += 16) {
      __m256i acc0 = colterm, acc1 = colterm;
      __m256i xs0 = _mm256_setzero_si256(), xs1 = _mm256_setzero_si256();
      for (int64_t ky = 0; ky < kh; ++ky) {
        const int16_t* row = base + ky * st + ox0 * kSw;
        for (int64_t p = 0; p < pairs; ++p) {
          const __m256i w = wv[ky * pairs + p];
          const __m256i v0 = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(row + 2 * p));
          const __m256i v1 = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(row + 2 * p + kSecond));
          acc0 = _mm256_add_epi32(acc0, _mm256_madd_epi16(v0, w));
          acc1 = _mm256_add_epi32(acc1, _mm256_madd_epi16(v1, w));
          if (kZw) {
            xs0 = _mm256_add_epi32(xs0, _mm256_madd_epi16(v0, ones[ky * pairs + p]));
            xs1 = _mm256_add_epi32(xs1, _mm256_madd_epi16(v1, ones[ky * pairs + p]));
          }
        }
      }
      if (kZw) {
        acc0 = _mm256_sub_epi32(acc0, _mm256_mullo_epi32(xs0, zw));
        acc1 = _mm256_sub_epi32(acc1, _mm256_mullo_epi32(xs1, zw));
      }
      // a row's last block writes all 16 outputs when the ones past the row belong to
      // later rows of this call (written again, in order): no partial store
      const int64_t left = a.ow - ox0, later = (a.rows - 1 - oy) * a.y_stride;
      finish16<kSw == 1>(acc0, acc1, a, oy * a.y_stride + ox0, static_cast<int>(left + later < 16 ? left : 16));
    }
  }
}

template <bool kZw, int kSw>
void pairs_sized(const DepthwiseRows& a) {
  if (a.kh == 3 && a.kw == 3) {
    pairs_impl<kZw, kSw, 3, 2>(a);
  } else if (a.kh == 5 && a.kw == 5) {
    pairs_impl<kZw, kSw, 5, 3>(a);
  } else {
    pairs_impl<kZw, kSw, 0, 0>(a);
  }
}

}  // namespace

void depthwise_rows_avx2(const DepthwiseRows& a) {
  if (a.scratch16 != nullptr) {  // the driver gives the int16 rows when dw_pairs_fit
    if (a.sw == 1) {
      a.zw != 0 ? pairs_sized<true, 1>(a) : pairs_sized<false, 1>(a);
    } else {
      a.zw != 0 ? pairs_sized<true, 2>(a) : pairs_sized<false, 2>(a);
    }
    return;
  }
  const bool fast = dw_gather_fits(a.sw, a.dw, a.kw);
  if (a.zw != 0) {
    fast ? rows_impl<true, true>(a) : rows_impl<true, false>(a);
  } else {
    fast ? rows_impl<false, true>(a) : rows_impl<false, false>(a);
  }
}

}  // namespace conv
}  // namespace quanta
