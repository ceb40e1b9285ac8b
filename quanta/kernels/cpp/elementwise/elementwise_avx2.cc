// AVX2 elementwise runs, 8 lanes per step; the tail (< 8 elements) runs the scalar
// functions of elementwise_scalar.h. Each lane performs the same float32 operations in the
// same order as the scalar form: widen, subtract the zero point, convert (exact), multiply,
// add / divide (vdivps), add zc, round half to even (vroundps), NaN -> qmin, clamp, narrow
// with vpackssdw + vpack[u]swb (no saturation happens: the value is already in range).
#include <immintrin.h>

#include <cstdint>
#include <limits>
#include <type_traits>

#include "elementwise/elementwise.h"
#include "elementwise/elementwise_scalar.h"
#include "elementwise/elementwise_simd.h"

namespace quanta {
namespace elementwise {
namespace {

template <typename T>
inline void round_sat_store8(__m256 v, T* p) {
  const __m256 lo = _mm256_set1_ps(static_cast<float>(std::numeric_limits<T>::min()));
  const __m256 hi = _mm256_set1_ps(static_cast<float>(std::numeric_limits<T>::max()));
  v = _mm256_round_ps(v, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
  v = _mm256_blendv_ps(lo, v, _mm256_cmp_ps(v, v, _CMP_ORD_Q));  // NaN -> qmin
  v = _mm256_min_ps(_mm256_max_ps(v, lo), hi);
  const __m256i q = _mm256_cvtps_epi32(v);
  const __m128i w16 = _mm_packs_epi32(_mm256_castsi256_si128(q), _mm256_extracti128_si256(q, 1));
  const __m128i b8 = std::is_same_v<T, uint8_t> ? _mm_packus_epi16(w16, w16) : _mm_packs_epi16(w16, w16);
  _mm_storel_epi64(reinterpret_cast<__m128i*>(p), b8);
}

template <typename T>
inline __m256 dequantize8(const T* p, __m256i zp, __m256 scale) {
  return _mm256_mul_ps(scale, _mm256_cvtepi32_ps(_mm256_sub_epi32(simd::I32x8::widen<T>(p), zp)));
}

// The loop of binary_run_t (elementwise_simd.h).
template <template <class, typename, int, int> class Lanes, typename T, int AS, int BS, typename P>
void binary_run_t(const T* a, const T* b, T* c, int64_t n, const P& p) {
  const Lanes<simd::I32x8, T, AS, BS> lanes(a, b, p);
  int64_t i = 0;
  for (; i + 8 <= n; i += 8) round_sat_store8(lanes(a + i * AS, b + i * BS), c + i);
  for (; i < n; ++i) c[i] = lanes.one(a[i * AS], b[i * BS], p);
}

template <typename T>
void dequantize_run(const T* x, float* y, int64_t n, float scale, int32_t zp) {
  const __m256 vs = _mm256_set1_ps(scale);
  const __m256i vzp = _mm256_set1_epi32(zp);
  int64_t i = 0;
  for (; i + 8 <= n; i += 8) _mm256_storeu_ps(y + i, dequantize8(x + i, vzp, vs));
  for (; i < n; ++i) y[i] = dequantize_one(x[i], scale, zp);
}

void minmax(const float* x, int64_t n, float* lo, float* hi, bool* has_nan) {
  __m256 mn = _mm256_set1_ps(std::numeric_limits<float>::infinity());
  __m256 mx = _mm256_set1_ps(-std::numeric_limits<float>::infinity());
  __m256 nan = _mm256_setzero_ps();
  int64_t i = 0;
  for (; i + 8 <= n; i += 8) {
    const __m256 v = _mm256_loadu_ps(x + i);
    mn = _mm256_min_ps(mn, v);
    mx = _mm256_max_ps(mx, v);
    nan = _mm256_or_ps(nan, _mm256_cmp_ps(v, v, _CMP_UNORD_Q));
  }
  alignas(32) float a_mn[8], a_mx[8];
  _mm256_store_ps(a_mn, mn);
  _mm256_store_ps(a_mx, mx);
  bool any_nan = _mm256_movemask_ps(nan) != 0;
  float m0 = a_mn[0], m1 = a_mx[0];
  for (int j = 1; j < 8; ++j) {
    m0 = a_mn[j] < m0 ? a_mn[j] : m0;
    m1 = a_mx[j] > m1 ? a_mx[j] : m1;
  }
  for (; i < n; ++i) {
    const float v = x[i];
    any_nan |= v != v;
    m0 = v < m0 ? v : m0;
    m1 = v > m1 ? v : m1;
  }
  *lo = m0;
  *hi = m1;
  *has_nan = any_nan;
}

// y = table[x], 32 bytes per step: the table as 16 rows of 16 bytes (each row in both
// 128-bit lanes); vpshufb looks every byte's low nibble up in row k, and a blend keeps that
// entry where the byte's high nibble is k. (vpgatherdd from the table widened to int32, 8
// entries per gather, ran at less than half this speed on Zen 5.)
void lut(const uint8_t* x, uint8_t* y, int64_t n, const uint8_t* table) {
  __m256i rows[16];
  for (int k = 0; k < 16; ++k)
    rows[k] = _mm256_broadcastsi128_si256(_mm_loadu_si128(reinterpret_cast<const __m128i*>(table + 16 * k)));
  const __m256i nibble = _mm256_set1_epi8(0x0F);
  int64_t i = 0;
  for (; i + 32 <= n; i += 32) {
    const __m256i v = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(x + i));
    const __m256i lo = _mm256_and_si256(v, nibble);
    const __m256i hi = _mm256_and_si256(_mm256_srli_epi16(v, 4), nibble);
    __m256i r = _mm256_shuffle_epi8(rows[0], lo);
    for (int k = 1; k < 16; ++k) {
      const __m256i in_row = _mm256_cmpeq_epi8(hi, _mm256_set1_epi8(static_cast<char>(k)));
      r = _mm256_blendv_epi8(r, _mm256_shuffle_epi8(rows[k], lo), in_row);
    }
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(y + i), r);
  }
  lut_scalar(x + i, y + i, n - i, table);
}

}  // namespace

// y[i] = tables[(c0 + i) mod C][x[i]] for i < n, channels innermost: the AVX-512 form's
// offsets and padded tables (lut_channels_last_avx512), two vpgatherdd of 8 entries a step
// of 16 bytes, and vpshufb + vpermd to keep each dword's low byte in element order. The
// 16-entry step keeps `j` on the offsets' period (a multiple of 16); the tail (< 16
// elements) looks each element up through the same offsets. (The single-table `lut` above
// beats vpgatherdd; per-channel tables leave vpshufb nothing to share across lanes, and
// the scalar loop took 2.7 ns an element on Zen 3, this one 0.6-0.7.)
void lut_channels_last_avx2(const uint8_t* x, uint8_t* y, int64_t n, int64_t j0, const int32_t* offsets, int64_t period,
                            const uint8_t* padded) {
  const int* base = reinterpret_cast<const int*>(padded);
  // dword k of each 128-bit lane -> byte 4k's value in byte k of dword 0 (s0) or dword 1
  // (s1) of that lane; -1 bytes give zeros
  const __m256i to_dword0 = _mm256_setr_epi8(0, 4, 8, 12, -1, -1, -1, -1, -1, -1, -1, -1, -1, -1, -1, -1, 0, 4, 8, 12,
                                             -1, -1, -1, -1, -1, -1, -1, -1, -1, -1, -1, -1);
  const __m256i to_dword1 = _mm256_setr_epi8(-1, -1, -1, -1, 0, 4, 8, 12, -1, -1, -1, -1, -1, -1, -1, -1, -1, -1, -1,
                                             -1, 0, 4, 8, 12, -1, -1, -1, -1, -1, -1, -1, -1);
  // (lane 0: elements 0-3, 8-11; lane 1: 4-7, 12-15) -> 0-3, 4-7, 8-11, 12-15
  const __m256i order = _mm256_setr_epi32(0, 4, 1, 5, 2, 3, 6, 7);
  int64_t j = j0, i = 0;
  for (; i + 16 <= n; i += 16) {
    const __m128i xv = _mm_loadu_si128(reinterpret_cast<const __m128i*>(x + i));
    const __m256i idx0 =
        _mm256_add_epi32(_mm256_cvtepu8_epi32(xv), _mm256_loadu_si256(reinterpret_cast<const __m256i*>(offsets + j)));
    const __m256i idx1 = _mm256_add_epi32(_mm256_cvtepu8_epi32(_mm_srli_si128(xv, 8)),
                                          _mm256_loadu_si256(reinterpret_cast<const __m256i*>(offsets + j + 8)));
    const __m256i g0 = _mm256_i32gather_epi32(base, idx0, 1);
    const __m256i g1 = _mm256_i32gather_epi32(base, idx1, 1);
    const __m256i b = _mm256_or_si256(_mm256_shuffle_epi8(g0, to_dword0), _mm256_shuffle_epi8(g1, to_dword1));
    _mm_storeu_si128(reinterpret_cast<__m128i*>(y + i), _mm256_castsi256_si128(_mm256_permutevar8x32_epi32(b, order)));
    j += 16;
    if (j >= period) j -= period;
  }
  for (; i < n; ++i, ++j) y[i] = padded[offsets[j] + x[i]];
}

const Kernels kKernelsAvx2 = {
    add_run<uint8_t>,        add_run<int8_t>,        mul_run<uint8_t>, mul_run<int8_t>,
    dequantize_run<uint8_t>, dequantize_run<int8_t>, minmax,           lut,
    softmax_rows<uint8_t>,   softmax_rows<int8_t>,
};

}  // namespace elementwise
}  // namespace quanta
