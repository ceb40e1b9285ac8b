// A16W8 micro-kernel, AVX-512 VNNI: vpdpwssd (int16 pairs -> int32 lanes), 4 rows × 32
// columns = 8 zmm accumulators, flushed to int64 every kKcPairs pair steps (a16w8.h bound).
#include <immintrin.h>

#include <limits>
#include <type_traits>

#include "a16w8/a16w8.h"

namespace quanta {
namespace a16w8 {
void ukernel_avx512vnni(const int16_t* a, int64_t lda, int mr, int64_t k2, const int16_t* b, int64_t* c) {
  for (int r = 0; r < mr; ++r) {
    for (int j = 0; j < kNR; ++j) c[r * kNR + j] = 0;
  }
  const int16_t* b0 = b;
  const int16_t* b1 = b + k2 * 32;
  for (int64_t p0 = 0; p0 < k2; p0 += kKcPairs) {
    const int64_t p1 = p0 + kKcPairs < k2 ? p0 + kKcPairs : k2;
    __m512i acc[kMR][2];
    for (int r = 0; r < kMR; ++r) acc[r][0] = acc[r][1] = _mm512_setzero_si512();
    if (mr == kMR) {
      const int16_t *a0 = a, *a1 = a + lda, *a2 = a + 2 * lda, *a3 = a + 3 * lda;
      for (int64_t p = p0; p < p1; ++p) {
        const __m512i w0 = _mm512_loadu_si512(b0 + p * 32);
        const __m512i w1 = _mm512_loadu_si512(b1 + p * 32);
        __m512i x = _mm512_set1_epi32(pair(a0 + 2 * p));
        acc[0][0] = _mm512_dpwssd_epi32(acc[0][0], x, w0);
        acc[0][1] = _mm512_dpwssd_epi32(acc[0][1], x, w1);
        x = _mm512_set1_epi32(pair(a1 + 2 * p));
        acc[1][0] = _mm512_dpwssd_epi32(acc[1][0], x, w0);
        acc[1][1] = _mm512_dpwssd_epi32(acc[1][1], x, w1);
        x = _mm512_set1_epi32(pair(a2 + 2 * p));
        acc[2][0] = _mm512_dpwssd_epi32(acc[2][0], x, w0);
        acc[2][1] = _mm512_dpwssd_epi32(acc[2][1], x, w1);
        x = _mm512_set1_epi32(pair(a3 + 2 * p));
        acc[3][0] = _mm512_dpwssd_epi32(acc[3][0], x, w0);
        acc[3][1] = _mm512_dpwssd_epi32(acc[3][1], x, w1);
      }
    } else {
      for (int64_t p = p0; p < p1; ++p) {
        const __m512i w0 = _mm512_loadu_si512(b0 + p * 32);
        const __m512i w1 = _mm512_loadu_si512(b1 + p * 32);
        for (int r = 0; r < mr; ++r) {
          const __m512i x = _mm512_set1_epi32(pair(a + r * lda + 2 * p));
          acc[r][0] = _mm512_dpwssd_epi32(acc[r][0], x, w0);
          acc[r][1] = _mm512_dpwssd_epi32(acc[r][1], x, w1);
        }
      }
    }
    for (int r = 0; r < mr; ++r) {
      for (int h = 0; h < 2; ++h) {
        int64_t* cp = c + r * kNR + h * 16;
        const __m512i lo = _mm512_cvtepi32_epi64(_mm512_castsi512_si256(acc[r][h]));
        const __m512i hi = _mm512_cvtepi32_epi64(_mm512_extracti64x4_epi64(acc[r][h], 1));
        _mm512_storeu_si512(cp, _mm512_add_epi64(_mm512_loadu_si512(cp), lo));
        _mm512_storeu_si512(cp + 8, _mm512_add_epi64(_mm512_loadu_si512(cp + 8), hi));
      }
    }
  }
}

}  // namespace a16w8
}  // namespace quanta

namespace quanta {
namespace a16w8 {
namespace {

// acc[i] = Σ_t src[t][i] · w[t] (exact in float64, a16w8.h): 32 outputs in four
// independent FMA chains, then 8 at a time with a masked tail.
void dw_row(const double* const* src, const double* w, int64_t taps, int64_t n, int64_t* acc) {
  int64_t i = 0;
  for (; i + 32 <= n; i += 32) {
    __m512d a0 = _mm512_setzero_pd(), a1 = a0, a2 = a0, a3 = a0;
    for (int64_t t = 0; t < taps; ++t) {
      const __m512d wv = _mm512_set1_pd(w[t]);
      const double* s = src[t] + i;
      a0 = _mm512_fmadd_pd(_mm512_loadu_pd(s), wv, a0);
      a1 = _mm512_fmadd_pd(_mm512_loadu_pd(s + 8), wv, a1);
      a2 = _mm512_fmadd_pd(_mm512_loadu_pd(s + 16), wv, a2);
      a3 = _mm512_fmadd_pd(_mm512_loadu_pd(s + 24), wv, a3);
    }
    _mm512_storeu_si512(acc + i, _mm512_cvtpd_epi64(a0));
    _mm512_storeu_si512(acc + i + 8, _mm512_cvtpd_epi64(a1));
    _mm512_storeu_si512(acc + i + 16, _mm512_cvtpd_epi64(a2));
    _mm512_storeu_si512(acc + i + 24, _mm512_cvtpd_epi64(a3));
  }
  for (; i < n; i += 8) {
    const __mmask8 k = n - i >= 8 ? static_cast<__mmask8>(0xff) : static_cast<__mmask8>((1u << (n - i)) - 1u);
    __m512d a0 = _mm512_setzero_pd();
    for (int64_t t = 0; t < taps; ++t)
      a0 = _mm512_fmadd_pd(_mm512_maskz_loadu_pd(k, src[t] + i), _mm512_set1_pd(w[t]), a0);
    _mm512_mask_storeu_epi64(acc + i, k, _mm512_cvtpd_epi64(a0));
  }
}

// a16w8.h RowKernels::dw_pairs: vpdpwssd (two int16 products summed into int32 lanes),
// 64 outputs in four independent chains, then 16 at a time with a masked tail; widened to
// int64 on the store.
inline void store_widened(int64_t* acc, __m512i v) {
  _mm512_storeu_si512(acc, _mm512_cvtepi32_epi64(_mm512_castsi512_si256(v)));
  _mm512_storeu_si512(acc + 8, _mm512_cvtepi32_epi64(_mm512_extracti64x4_epi64(v, 1)));
}

void dw_pairs(const int32_t* const* src, const int32_t* w, int64_t pairs, int64_t n, int64_t* acc) {
  int64_t i = 0;
  for (; i + 64 <= n; i += 64) {
    __m512i a0 = _mm512_setzero_si512(), a1 = a0, a2 = a0, a3 = a0;
    for (int64_t t = 0; t < pairs; ++t) {
      const __m512i wv = _mm512_set1_epi32(w[t]);
      const int32_t* s = src[t] + i;
      a0 = _mm512_dpwssd_epi32(a0, _mm512_loadu_si512(s), wv);
      a1 = _mm512_dpwssd_epi32(a1, _mm512_loadu_si512(s + 16), wv);
      a2 = _mm512_dpwssd_epi32(a2, _mm512_loadu_si512(s + 32), wv);
      a3 = _mm512_dpwssd_epi32(a3, _mm512_loadu_si512(s + 48), wv);
    }
    store_widened(acc + i, a0);
    store_widened(acc + i + 16, a1);
    store_widened(acc + i + 32, a2);
    store_widened(acc + i + 48, a3);
  }
  for (; i < n; i += 16) {
    const __mmask16 k = n - i >= 16 ? static_cast<__mmask16>(0xffff) : static_cast<__mmask16>((1u << (n - i)) - 1u);
    __m512i a0 = _mm512_setzero_si512();
    for (int64_t t = 0; t < pairs; ++t)
      a0 = _mm512_dpwssd_epi32(a0, _mm512_maskz_loadu_epi32(k, src[t] + i), _mm512_set1_epi32(w[t]));
    const __mmask8 k0 = static_cast<__mmask8>(k & 0xff), k1 = static_cast<__mmask8>(k >> 8);
    _mm512_mask_storeu_epi64(acc + i, k0, _mm512_cvtepi32_epi64(_mm512_castsi512_si256(a0)));
    _mm512_mask_storeu_epi64(acc + i + 8, k1, _mm512_cvtepi32_epi64(_mm512_extracti64x4_epi64(a0, 1)));
  }
}

// eq. (A4) on 8 lanes of v = 256·hi + lo + c1·rx + bias (vpmullq: the exact product, as
// |c1·rx| < 2^63): vcvtqq2ps rounds the int64 to nearest-even as the scalar cast does;
// vmaxps returns its second operand for a NaN product, so NaN -> lo as in store(); the
// clamped value rounds (vcvtps2dq, nearest-even) inside the storage range.
template <typename T>
void requant_row(const int64_t* hi, const int64_t* lo, const int64_t* rx, int64_t c1, int64_t bias, float m, int64_t zy,
                 void* yv, int64_t y0, int64_t n) {
  constexpr int64_t qmin = std::numeric_limits<T>::min(), qmax = std::numeric_limits<T>::max();
  T* y = static_cast<T*>(yv) + y0;
  const __m256 vm = _mm256_set1_ps(m), vlo = _mm256_set1_ps(static_cast<float>(qmin - zy)),
               vhi = _mm256_set1_ps(static_cast<float>(qmax - zy));
  const __m512i vb = _mm512_set1_epi64(bias), vc1 = _mm512_set1_epi64(c1);
  const __m256i vz = _mm256_set1_epi32(static_cast<int32_t>(zy));
  for (int64_t i = 0; i < n; i += 8) {
    const __mmask8 k = n - i >= 8 ? static_cast<__mmask8>(0xff) : static_cast<__mmask8>((1u << (n - i)) - 1u);
    __m512i a = _mm512_add_epi64(_mm512_maskz_loadu_epi64(k, lo + i), vb);
    if (hi) a = _mm512_add_epi64(a, _mm512_slli_epi64(_mm512_maskz_loadu_epi64(k, hi + i), 8));
    if (rx) a = _mm512_add_epi64(a, _mm512_mullo_epi64(_mm512_maskz_loadu_epi64(k, rx + i), vc1));
    __m256 v = _mm256_mul_ps(_mm512_cvtepi64_ps(a), vm);
    v = _mm256_min_ps(_mm256_max_ps(v, vlo), vhi);
    const __m256i q = _mm256_add_epi32(_mm256_cvtps_epi32(v), vz);
    if constexpr (std::is_same_v<T, uint8_t>) {
      _mm_mask_storeu_epi8(y + i, k, _mm256_cvtusepi32_epi8(q));
    } else if constexpr (std::is_same_v<T, int8_t>) {
      _mm_mask_storeu_epi8(y + i, k, _mm256_cvtsepi32_epi8(q));
    } else if constexpr (std::is_same_v<T, uint16_t>) {
      _mm_mask_storeu_epi16(y + i, k, _mm256_cvtusepi32_epi16(q));
    } else {
      _mm_mask_storeu_epi16(y + i, k, _mm256_cvtsepi32_epi16(q));
    }
  }
}

void requant_row_any(const int64_t* hi, const int64_t* lo, const int64_t* rx, int64_t c1, int64_t bias, float m,
                     int64_t zy, Elem out, void* y, int64_t y0, int64_t n) {
  switch (out) {
    case Elem::kU8: requant_row<uint8_t>(hi, lo, rx, c1, bias, m, zy, y, y0, n); break;
    case Elem::kI8: requant_row<int8_t>(hi, lo, rx, c1, bias, m, zy, y, y0, n); break;
    case Elem::kU16: requant_row<uint16_t>(hi, lo, rx, c1, bias, m, zy, y, y0, n); break;
    default: requant_row<int16_t>(hi, lo, rx, c1, bias, m, zy, y, y0, n); break;
  }
}

}  // namespace

const RowKernels kRowsAvx512Vnni = {dw_row, dw_pairs, requant_row_any};

}  // namespace a16w8
}  // namespace quanta
