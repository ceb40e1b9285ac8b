// A16W8 micro-kernel, AVX2: vpmaddwd (int16 pairs -> int32) + vpaddd, 4 rows × 16 columns
// at a time (8 ymm accumulators), flushed to int64 every kKcPairs pair steps (a16w8.h).
#include <immintrin.h>

#include <cstdint>
#include <limits>
#include <type_traits>

#include "a16w8/a16w8.h"
#include "a16w8/rows.h"

namespace quanta {
namespace a16w8 {
void ukernel_avx2(const int16_t* a, int64_t lda, int mr, int64_t k2, const int16_t* b, int64_t* c) {
  for (int r = 0; r < mr; ++r) {
    for (int j = 0; j < kNR; ++j) c[r * kNR + j] = 0;
  }
  for (int blk = 0; blk < 2; ++blk) {
    const int16_t* bb = b + blk * k2 * 32;
    for (int64_t p0 = 0; p0 < k2; p0 += kKcPairs) {
      const int64_t p1 = p0 + kKcPairs < k2 ? p0 + kKcPairs : k2;
      __m256i acc[kMR][2];
      for (int r = 0; r < kMR; ++r) acc[r][0] = acc[r][1] = _mm256_setzero_si256();
      for (int64_t p = p0; p < p1; ++p) {
        const __m256i w0 = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(bb + p * 32));
        const __m256i w1 = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(bb + p * 32 + 16));
        for (int r = 0; r < mr; ++r) {
          const __m256i x = _mm256_set1_epi32(pair(a + r * lda + 2 * p));
          acc[r][0] = _mm256_add_epi32(acc[r][0], _mm256_madd_epi16(x, w0));
          acc[r][1] = _mm256_add_epi32(acc[r][1], _mm256_madd_epi16(x, w1));
        }
      }
      for (int r = 0; r < mr; ++r) {
        for (int h = 0; h < 2; ++h) {
          int64_t* cp = c + r * kNR + blk * 16 + h * 8;
          const __m256i lo = _mm256_cvtepi32_epi64(_mm256_castsi256_si128(acc[r][h]));
          const __m256i hi = _mm256_cvtepi32_epi64(_mm256_extracti128_si256(acc[r][h], 1));
          const __m256i* src = reinterpret_cast<const __m256i*>(cp);
          _mm256_storeu_si256(reinterpret_cast<__m256i*>(cp), _mm256_add_epi64(_mm256_loadu_si256(src), lo));
          _mm256_storeu_si256(reinterpret_cast<__m256i*>(cp + 4), _mm256_add_epi64(_mm256_loadu_si256(src + 1), hi));
        }
      }
    }
  }
}

}  // namespace a16w8
}  // namespace quanta

namespace quanta {
namespace a16w8 {
namespace {

// a16w8.h RowKernels::dw_pairs: vpmaddwd (two int16 products summed in int32) + vpaddd,
// 32 outputs in four chains, then 8 at a time; the tail through a copy.
inline void store_widened(int64_t* acc, __m256i v) {
  _mm256_storeu_si256(reinterpret_cast<__m256i*>(acc), _mm256_cvtepi32_epi64(_mm256_castsi256_si128(v)));
  _mm256_storeu_si256(reinterpret_cast<__m256i*>(acc + 4), _mm256_cvtepi32_epi64(_mm256_extracti128_si256(v, 1)));
}

inline __m256i load8(const int32_t* p) { return _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p)); }

void dw_pairs(const int32_t* const* src, const int32_t* w, int64_t pairs, int64_t n, int64_t* acc) {
  int64_t i = 0;
  for (; i + 32 <= n; i += 32) {
    __m256i a0 = _mm256_setzero_si256(), a1 = a0, a2 = a0, a3 = a0;
    for (int64_t t = 0; t < pairs; ++t) {
      const __m256i wv = _mm256_set1_epi32(w[t]);
      const int32_t* s = src[t] + i;
      a0 = _mm256_add_epi32(a0, _mm256_madd_epi16(load8(s), wv));
      a1 = _mm256_add_epi32(a1, _mm256_madd_epi16(load8(s + 8), wv));
      a2 = _mm256_add_epi32(a2, _mm256_madd_epi16(load8(s + 16), wv));
      a3 = _mm256_add_epi32(a3, _mm256_madd_epi16(load8(s + 24), wv));
    }
    store_widened(acc + i, a0);
    store_widened(acc + i + 8, a1);
    store_widened(acc + i + 16, a2);
    store_widened(acc + i + 24, a3);
  }
  for (; i + 8 <= n; i += 8) {
    __m256i a0 = _mm256_setzero_si256();
    for (int64_t t = 0; t < pairs; ++t)
      a0 = _mm256_add_epi32(a0, _mm256_madd_epi16(load8(src[t] + i), _mm256_set1_epi32(w[t])));
    store_widened(acc + i, a0);
  }
  if (i < n) dw_pairs_generic_tail(src, w, pairs, i, n, acc);
}

// a16w8.h RowKernels::dw_row: float64 FMA chains (exact: every partial sum is an integer
// below 2^53, a16w8.h), 16 outputs in four chains, then 4 at a time; each sum converts to
// int64 by the 1.5·2^52 bit trick when |sum| < 2^51 (the float64 1.5·2^52 + sum holds sum
// in its low mantissa bits), else by the scalar conversion; the tail as dw_row_generic.
inline void store_sums(int64_t* acc, __m256d v) {
  const __m256d magic = _mm256_set1_pd(0x1.8p52), abs_mask = _mm256_castsi256_pd(_mm256_set1_epi64x(INT64_MAX));
  const __m256d big = _mm256_cmp_pd(_mm256_and_pd(v, abs_mask), _mm256_set1_pd(0x1p51), _CMP_NLT_UQ);
  if (_mm256_movemask_pd(big) == 0) {
    const __m256i bits = _mm256_castpd_si256(_mm256_add_pd(v, magic));
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(acc), _mm256_sub_epi64(bits, _mm256_castpd_si256(magic)));
    return;
  }
  alignas(32) double d[4];
  _mm256_store_pd(d, v);
  for (int j = 0; j < 4; ++j) acc[j] = static_cast<int64_t>(d[j]);
}

void dw_row(const double* const* src, const double* w, int64_t taps, int64_t n, int64_t* acc) {
  int64_t i = 0;
  for (; i + 16 <= n; i += 16) {
    __m256d a0 = _mm256_setzero_pd(), a1 = a0, a2 = a0, a3 = a0;
    for (int64_t t = 0; t < taps; ++t) {
      const __m256d wv = _mm256_broadcast_sd(w + t);
      const double* s = src[t] + i;
      a0 = _mm256_fmadd_pd(_mm256_loadu_pd(s), wv, a0);
      a1 = _mm256_fmadd_pd(_mm256_loadu_pd(s + 4), wv, a1);
      a2 = _mm256_fmadd_pd(_mm256_loadu_pd(s + 8), wv, a2);
      a3 = _mm256_fmadd_pd(_mm256_loadu_pd(s + 12), wv, a3);
    }
    store_sums(acc + i, a0);
    store_sums(acc + i + 4, a1);
    store_sums(acc + i + 8, a2);
    store_sums(acc + i + 12, a3);
  }
  for (; i + 4 <= n; i += 4) {
    __m256d a0 = _mm256_setzero_pd();
    for (int64_t t = 0; t < taps; ++t)
      a0 = _mm256_fmadd_pd(_mm256_loadu_pd(src[t] + i), _mm256_broadcast_sd(w + t), a0);
    store_sums(acc + i, a0);
  }
  for (; i < n; ++i) {
    double v = 0.0;
    for (int64_t t = 0; t < taps; ++t) v += src[t][i] * w[t];
    acc[i] = static_cast<int64_t>(v);
  }
}

// a16w8.h RowKernels::requant, 8 outputs per step; the bytes of requant_row_generic:
//   v = lo + bias (+ 256·hi) (+ c1·rx) in int64 lanes (c1·rx by vpmuldq, so c1 and every rx
//   lane of the step must fit int32; the step checks rx), then f32(v) through float64:
//   v + 1.5·2^52 added to the bit pattern is the float64 1.5·2^52 + v exactly when
//   |v| < 2^51 (the step checks it), so subtracting 1.5·2^52 gives v exactly and vcvtpd2ps
//   rounds it once to float32, as the scalar int64 -> float32 conversion does; then
//   · m in float32, clamp (vmaxps returns its second operand for NaN: NaN -> lo), round
//   half to even (vcvtps2dq, MXCSR; |v| ≤ 65536 so equal to round_even), + zy, narrow with
//   packs (exact: in range). A step that fails a check takes the scalar loop.
template <typename T>
void requant_row_t(const int64_t* hi, const int64_t* lo, const int64_t* rx, int64_t c1, int64_t bias, float m,
                   int64_t zy, Elem out, void* y, int64_t y0, int64_t n) {
  constexpr int64_t qmin = std::numeric_limits<T>::min(), qmax = std::numeric_limits<T>::max();
  const __m256 vm = _mm256_set1_ps(m), vlo = _mm256_set1_ps(static_cast<float>(qmin - zy)),
               vhi = _mm256_set1_ps(static_cast<float>(qmax - zy));
  const __m256i vzy = _mm256_set1_epi32(static_cast<int32_t>(zy));
  const __m256i vbias = _mm256_set1_epi64x(bias), vc1 = _mm256_set1_epi64x(c1);
  const __m256i vmagic = _mm256_set1_epi64x(0x4338000000000000), vhalf = _mm256_set1_epi64x(int64_t{1} << 51);
  const __m256d dmagic = _mm256_castsi256_pd(vmagic);
  const bool rx_vec = rx == nullptr || (c1 >= INT32_MIN && c1 <= INT32_MAX);
  auto lanes = [&](int64_t i, __m128* f) {  // 4 outputs from i: false when a check fails
    const auto* l = reinterpret_cast<const __m256i*>(lo + i);
    __m256i v = _mm256_add_epi64(_mm256_loadu_si256(l), vbias);
    if (hi) v = _mm256_add_epi64(v, _mm256_slli_epi64(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(hi + i)), 8));
    if (rx) {
      const __m256i r = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(rx + i));
      // every lane's high half is the sign of its low half: the lane fits int32
      const __m256i sign = _mm256_shuffle_epi32(_mm256_srai_epi32(r, 31), 0xA0);
      constexpr unsigned kHighHalves = 0xF0F0F0F0u;  // the bytes of the odd int32 lanes
      const auto eq = static_cast<unsigned>(_mm256_movemask_epi8(_mm256_cmpeq_epi32(r, sign)));
      if ((eq & kHighHalves) != kHighHalves) return false;
      v = _mm256_add_epi64(v, _mm256_mul_epi32(r, vc1));
    }
    if (!_mm256_testz_si256(_mm256_srli_epi64(_mm256_add_epi64(v, vhalf), 52), _mm256_set1_epi64x(-1))) return false;
    const __m256d d = _mm256_sub_pd(_mm256_castsi256_pd(_mm256_add_epi64(v, vmagic)), dmagic);
    *f = _mm256_cvtpd_ps(d);
    return true;
  };
  T* out_p = static_cast<T*>(y) + y0;
  int64_t i = 0;
  if (rx_vec) {
    for (; i + 8 <= n; i += 8) {
      __m128 f0, f1;
      if (!lanes(i, &f0) || !lanes(i + 4, &f1)) {
        requant_row_generic(hi ? hi + i : nullptr, lo + i, rx ? rx + i : nullptr, c1, bias, m, zy, out, y, y0 + i, 8);
        continue;
      }
      __m256 f = _mm256_mul_ps(_mm256_set_m128(f1, f0), vm);
      f = _mm256_min_ps(_mm256_max_ps(f, vlo), vhi);
      const __m256i q = _mm256_add_epi32(_mm256_cvtps_epi32(f), vzy);
      const __m128i q0 = _mm256_castsi256_si128(q), q1 = _mm256_extracti128_si256(q, 1);
      if constexpr (sizeof(T) == 2) {
        const __m128i w = std::is_same_v<T, uint16_t> ? _mm_packus_epi32(q0, q1) : _mm_packs_epi32(q0, q1);
        _mm_storeu_si128(reinterpret_cast<__m128i*>(out_p + i), w);
      } else {
        const __m128i w = _mm_packs_epi32(q0, q1);
        const __m128i b = std::is_same_v<T, uint8_t> ? _mm_packus_epi16(w, w) : _mm_packs_epi16(w, w);
        _mm_storel_epi64(reinterpret_cast<__m128i*>(out_p + i), b);
      }
    }
  }
  if (i < n)
    requant_row_generic(hi ? hi + i : nullptr, lo + i, rx ? rx + i : nullptr, c1, bias, m, zy, out, y, y0 + i, n - i);
}

void requant_row(const int64_t* hi, const int64_t* lo, const int64_t* rx, int64_t c1, int64_t bias, float m, int64_t zy,
                 Elem out, void* y, int64_t y0, int64_t n) {
  switch (out) {
    case Elem::kU8: return requant_row_t<uint8_t>(hi, lo, rx, c1, bias, m, zy, out, y, y0, n);
    case Elem::kI8: return requant_row_t<int8_t>(hi, lo, rx, c1, bias, m, zy, out, y, y0, n);
    case Elem::kU16: return requant_row_t<uint16_t>(hi, lo, rx, c1, bias, m, zy, out, y, y0, n);
    default: return requant_row_t<int16_t>(hi, lo, rx, c1, bias, m, zy, out, y, y0, n);
  }
}

}  // namespace

const RowKernels kRowsAvx2 = {dw_row, dw_pairs, requant_row};
}  // namespace a16w8
}  // namespace quanta

namespace quanta {
namespace a16w8 {
namespace {

// One tile of the direct convolution (a16w8.h DirectStrip): MR output channels × 16 pixels,
// the whole K in int32 lanes (the driver's bound), written to acc [MR][16] in pixel order.
// vpunpcklwd of rows k, k + 1 holds the pairs of pixels 0-3 and 8-11, vpunpckhwd those of
// 4-7 and 12-15; vperm2i128 puts the sums back in order.
template <int MR, bool kU16, bool kDw>
void direct_tile(const int16_t* x, const int64_t* off, int64_t k, const int16_t* w, int64_t lda, const int64_t* dw,
                 int32_t* acc) {
  __m256i a0[MR], a1[MR], dwv[MR];
  for (int r = 0; r < MR; ++r) {
    a0[r] = a1[r] = _mm256_setzero_si256();
    dwv[r] = _mm256_set1_epi16(static_cast<int16_t>(kDw ? dw[r] : 0));
  }
  const __m256i flip = _mm256_set1_epi16(INT16_MIN);
  auto step = [&](__m256i xa, __m256i xb, int64_t kk) {
    if (kU16) {
      xa = _mm256_xor_si256(xa, flip);
      xb = _mm256_xor_si256(xb, flip);
    }
    const __m256i lo = _mm256_unpacklo_epi16(xa, xb), hi = _mm256_unpackhi_epi16(xa, xb);
    for (int r = 0; r < MR; ++r) {
      __m256i wv = _mm256_set1_epi32(pair(w + r * lda + kk));
      if (kDw) wv = _mm256_add_epi16(wv, dwv[r]);
      a0[r] = _mm256_add_epi32(a0[r], _mm256_madd_epi16(lo, wv));
      a1[r] = _mm256_add_epi32(a1[r], _mm256_madd_epi16(hi, wv));
    }
  };
  auto row = [&](int64_t kk) { return _mm256_loadu_si256(reinterpret_cast<const __m256i*>(x + off[kk])); };
  int64_t kk = 0;
  for (; kk + 2 <= k; kk += 2) step(row(kk), row(kk + 1), kk);
  // odd K: the last pair's second row is X' = 0 (its weight W'' = dw is then multiplied by 0)
  if (kk < k) step(row(kk), kU16 ? flip : _mm256_setzero_si256(), kk);
  for (int r = 0; r < MR; ++r) {
    auto* dst = reinterpret_cast<__m256i*>(acc + r * 16);
    _mm256_storeu_si256(dst, _mm256_permute2x128_si256(a0[r], a1[r], 0x20));
    _mm256_storeu_si256(dst + 1, _mm256_permute2x128_si256(a0[r], a1[r], 0x31));
  }
}

using DirectTile = void (*)(const int16_t*, const int64_t*, int64_t, const int16_t*, int64_t, const int64_t*, int32_t*);

template <int MR>
DirectTile direct_tile_for(bool u16, bool has_dw) {
  if (u16) return has_dw ? direct_tile<MR, true, true> : direct_tile<MR, true, false>;
  return has_dw ? direct_tile<MR, false, true> : direct_tile<MR, false, false>;
}

DirectTile select_direct_tile(int mr, bool u16, bool has_dw) {
  switch (mr) {
    case 1: return direct_tile_for<1>(u16, has_dw);
    case 2: return direct_tile_for<2>(u16, has_dw);
    case 3: return direct_tile_for<3>(u16, has_dw);
    case 4: return direct_tile_for<4>(u16, has_dw);
    case 5: return direct_tile_for<5>(u16, has_dw);
    default: return direct_tile_for<6>(u16, has_dw);
  }
}

// eq. (A4) of 8 int32 sums v = s + c0 (exact in int32: the driver's bound), as
// requant_row_t after its float64 step: vcvtdq2ps rounds the integer once, as the scalar
// int64 -> float32 conversion does.
template <typename T>
inline void requant8_i32(__m256i v, __m256 vm, __m256 vlo, __m256 vhi, __m256i vzy, T* dst) {
  __m256 f = _mm256_mul_ps(_mm256_cvtepi32_ps(v), vm);
  f = _mm256_min_ps(_mm256_max_ps(f, vlo), vhi);
  const __m256i q = _mm256_add_epi32(_mm256_cvtps_epi32(f), vzy);
  const __m128i q0 = _mm256_castsi256_si128(q), q1 = _mm256_extracti128_si256(q, 1);
  if constexpr (sizeof(T) == 2) {
    const __m128i w = std::is_same_v<T, uint16_t> ? _mm_packus_epi32(q0, q1) : _mm_packs_epi32(q0, q1);
    _mm_storeu_si128(reinterpret_cast<__m128i*>(dst), w);
  } else {
    const __m128i w = _mm_packs_epi32(q0, q1);
    const __m128i b = std::is_same_v<T, uint8_t> ? _mm_packus_epi16(w, w) : _mm_packs_epi16(w, w);
    _mm_storel_epi64(reinterpret_cast<__m128i*>(dst), b);
  }
}

template <typename T>
void direct_strip_t(const DirectStrip& s) {
  constexpr int64_t qmin = std::numeric_limits<T>::min(), qmax = std::numeric_limits<T>::max();
  const __m256 vlo = _mm256_set1_ps(static_cast<float>(qmin - s.zy)),
               vhi = _mm256_set1_ps(static_cast<float>(qmax - s.zy));
  const __m256i vzy = _mm256_set1_epi32(static_cast<int32_t>(s.zy));
  const int64_t full = s.len / 16 * 16;
  if (full < s.len) {
    // the last pixels, copied once per strip into 16-wide rows (the rest of a row is never stored)
    const int64_t rest = s.len - full;
    for (int64_t kk = 0; kk < s.k; ++kk) {
      const int16_t* src = s.x + s.off[kk] + full;
      int16_t* dst = s.tail + kk * 16;
      for (int64_t j = 0; j < rest; ++j) dst[j] = src[j];
      for (int64_t j = rest; j < 16; ++j) dst[j] = 0;
    }
  }
  T* y = static_cast<T*>(s.y);
  alignas(32) int32_t acc[kDirectMR * 16];
  alignas(32) T part[16];
  for (int64_t b = s.b0; b < s.b1; ++b) {
    const int64_t n0 = b * s.mg / s.nblocks, n1 = (b + 1) * s.mg / s.nblocks;
    const int mr = static_cast<int>(n1 - n0);
    bool has_dw = false;
    for (int64_t n = n0; n < n1; ++n) has_dw = has_dw || s.dw[n] != 0;
    const DirectTile tile = select_direct_tile(mr, s.u16, has_dw);
    for (int64_t j0 = 0; j0 < s.len; j0 += 16) {
      const bool whole = j0 + 16 <= s.len;
      if (whole) {
        tile(s.x + j0, s.off, s.k, s.w + n0 * s.lda, s.lda, s.dw + n0, acc);
      } else {
        tile(s.tail, s.tail_off, s.k, s.w + n0 * s.lda, s.lda, s.dw + n0, acc);
      }
      for (int r = 0; r < mr; ++r) {
        const int64_t n = n0 + r;
        const __m256 vm = _mm256_set1_ps(s.mult[n]);
        const __m256i vc0 = _mm256_set1_epi32(s.c0[n]);
        T* dst = y + n * s.y_stride + j0;
        for (int h = 0; h < 2; ++h) {
          const __m256i v =
              _mm256_add_epi32(_mm256_load_si256(reinterpret_cast<const __m256i*>(acc + r * 16 + h * 8)), vc0);
          requant8_i32<T>(v, vm, vlo, vhi, vzy, whole ? dst + h * 8 : part + h * 8);
        }
        if (!whole)
          for (int64_t j = 0; j < s.len - j0; ++j) dst[j] = part[j];
      }
    }
  }
}

}  // namespace

void direct_strip_avx2(const DirectStrip& s) {
  switch (s.out) {
    case Elem::kU8: return direct_strip_t<uint8_t>(s);
    case Elem::kI8: return direct_strip_t<int8_t>(s);
    case Elem::kU16: return direct_strip_t<uint16_t>(s);
    default: return direct_strip_t<int16_t>(s);
  }
}

}  // namespace a16w8
}  // namespace quanta
