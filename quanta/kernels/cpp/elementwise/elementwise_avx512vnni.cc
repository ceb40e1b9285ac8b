// AVX-512 elementwise runs, 16 lanes per step with a masked tail (no scalar epilogue).
// Each lane performs the float32 operations of elementwise_scalar.h in the same order:
// widen to int32, subtract the zero point, convert (exact: |x − z| <= 255), multiply,
// add / divide (vdivps, a true division), add zc, round half to even (vrndscaleps), NaN ->
// qmin, clamp, and narrow with vpmov[u]sdb (cannot saturate: the value is in range).
//
// QLinearAdd / QLinearMul run 64 elements per step before that tail (round64_store):
// clamp to [qmin, qmax] first, then convert with round half to even (the same integer:
// qmin, qmax are integers, so rne(clamp(v)) = clamp(rne(v))); vmaxps(v, qmin) returns its
// second operand when v is NaN, which is the NaN -> qmin rule with no extra instruction;
// four int32 vectors narrow with vpackssdw + vpack{us,ss}wb (exact: in range) and one
// vpermd restores element order (the packs work within 128-bit lanes).
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

inline __mmask16 tail_mask(int64_t left) {
  return left >= 16 ? static_cast<__mmask16>(0xffff) : static_cast<__mmask16>((1u << left) - 1u);
}

// v already includes the zero point: rne, NaN -> qmin, clamp, narrow, store k lanes.
template <typename T>
inline void round_sat_store(__m512 v, T* p, __mmask16 k) {
  const __m512 lo = _mm512_set1_ps(static_cast<float>(std::numeric_limits<T>::min()));
  const __m512 hi = _mm512_set1_ps(static_cast<float>(std::numeric_limits<T>::max()));
  v = _mm512_roundscale_ps(v, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
  v = _mm512_mask_mov_ps(lo, _mm512_cmp_ps_mask(v, v, _CMP_ORD_Q), v);
  v = _mm512_min_ps(_mm512_max_ps(v, lo), hi);
  const __m512i q = _mm512_cvtps_epi32(v);
  if constexpr (std::is_same_v<T, uint8_t>) {
    _mm512_mask_cvtusepi32_storeu_epi8(p, k, q);
  } else {
    _mm512_mask_cvtsepi32_storeu_epi8(p, k, q);
  }
}

template <typename T>
inline __m512 dequantize16(const T* p, __mmask16 k, __m512i zp, __m512 scale) {
  return _mm512_mul_ps(scale, _mm512_cvtepi32_ps(_mm512_sub_epi32(simd::I32x16::widen<T>(p, k), zp)));
}

// v[j] (16 lanes each, zc included) for elements 16j .. 16j + 15: NaN -> qmin, clamp,
// rne, narrow, one 64-byte store.
template <typename T>
inline void round64_store(const __m512* v, T* p) {
  const __m512 lo = _mm512_set1_ps(static_cast<float>(std::numeric_limits<T>::min()));
  const __m512 hi = _mm512_set1_ps(static_cast<float>(std::numeric_limits<T>::max()));
  __m512i q[4];
  for (int j = 0; j < 4; ++j) {
    const __m512 r = _mm512_min_ps(_mm512_max_ps(v[j], lo), hi);  // max(NaN, lo) = lo
    q[j] = _mm512_cvt_roundps_epi32(r, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
  }
  const __m512i p01 = _mm512_packs_epi32(q[0], q[1]), p23 = _mm512_packs_epi32(q[2], q[3]);
  const __m512i b8 = std::is_same_v<T, uint8_t> ? _mm512_packus_epi16(p01, p23) : _mm512_packs_epi16(p01, p23);
  // dword 4l + j of b8 holds elements 16j + 4l .. + 3: out dword d = 4j + l <- 4l + j
  const __m512i order = _mm512_setr_epi32(0, 4, 8, 12, 1, 5, 9, 13, 2, 6, 10, 14, 3, 7, 11, 15);
  _mm512_storeu_si512(p, _mm512_permutexvar_epi32(order, b8));
}

// The loop of binary_run_t (elementwise_simd.h).
template <template <class, typename, int, int> class Lanes, typename T, int AS, int BS, typename P>
void binary_run_t(const T* a, const T* b, T* c, int64_t n, const P& p) {
  const Lanes<simd::I32x16, T, AS, BS> lanes(a, b, p);
  int64_t i = 0;
  for (; i + 64 <= n; i += 64) {
    __m512 v[4];
    for (int j = 0; j < 4; ++j) v[j] = lanes(a + (i + 16 * j) * AS, b + (i + 16 * j) * BS);
    round64_store(v, c + i);
  }
  for (; i < n; i += 16) {
    const __mmask16 k = tail_mask(n - i);
    round_sat_store(lanes(a + i * AS, b + i * BS, k), c + i, k);
  }
}

template <typename T>
void dequantize_run(const T* x, float* y, int64_t n, float scale, int32_t zp) {
  const __m512 vs = _mm512_set1_ps(scale);
  const __m512i vzp = _mm512_set1_epi32(zp);
  for (int64_t i = 0; i < n; i += 16) {
    const __mmask16 k = tail_mask(n - i);
    _mm512_mask_storeu_ps(y + i, k, dequantize16(x + i, k, vzp, vs));
  }
}

void minmax(const float* x, int64_t n, float* lo, float* hi, bool* has_nan) {
  __m512 mn = _mm512_set1_ps(std::numeric_limits<float>::infinity());
  __m512 mx = _mm512_set1_ps(-std::numeric_limits<float>::infinity());
  __mmask16 nan = 0;
  for (int64_t i = 0; i < n; i += 16) {
    const __mmask16 k = tail_mask(n - i);
    const __m512 v = _mm512_maskz_loadu_ps(k, x + i);
    mn = _mm512_mask_min_ps(mn, k, mn, v);
    mx = _mm512_mask_max_ps(mx, k, mx, v);
    nan |= _mm512_mask_cmp_ps_mask(k, v, v, _CMP_UNORD_Q);
  }
  *lo = _mm512_reduce_min_ps(mn);
  *hi = _mm512_reduce_max_ps(mx);
  *has_nan = nan != 0;
}

// y = table[x], 64 bytes per step, for AVX-512 without VBMI: the table as 16 rows of 16
// bytes (each row in all four 128-bit lanes); vpshufb looks every byte's low nibble up in
// row k under the mask of the bytes whose high nibble is k. The tail is masked.
void lut(const uint8_t* x, uint8_t* y, int64_t n, const uint8_t* table) {
  __m512i rows[16];
  for (int k = 0; k < 16; ++k)
    rows[k] = _mm512_broadcast_i32x4(_mm_loadu_si128(reinterpret_cast<const __m128i*>(table + 16 * k)));
  const __m512i nibble = _mm512_set1_epi8(0x0F);
  for (int64_t i = 0; i < n; i += 64) {
    const __mmask64 k64 = n - i >= 64 ? ~0ULL : (1ULL << (n - i)) - 1;
    const __m512i v = _mm512_maskz_loadu_epi8(k64, x + i);
    const __m512i lo = _mm512_and_si512(v, nibble);
    const __m512i hi = _mm512_and_si512(_mm512_srli_epi16(v, 4), nibble);
    __m512i r = _mm512_shuffle_epi8(rows[0], lo);
    for (int k = 1; k < 16; ++k) {
      const __mmask64 in_row = _mm512_cmpeq_epi8_mask(hi, _mm512_set1_epi8(static_cast<char>(k)));
      r = _mm512_mask_shuffle_epi8(r, in_row, rows[k], lo);
    }
    _mm512_mask_storeu_epi8(y + i, k64, r);
  }
}

}  // namespace

// y = table[x], 64 bytes per step: vpermi2b looks up the low 7 bits of each index in a
// 128-byte table held in two registers, once in the table's first half (entries 0..127)
// and once in its second (128..255); the index's top bit picks between the two. The tail
// is a masked load and store of the same steps.
__attribute__((target("avx512f,avx512bw,avx512vbmi"))) void lut_avx512vbmi(const uint8_t* x, uint8_t* y, int64_t n,
                                                                           const uint8_t* table) {
  const __m512i t0 = _mm512_loadu_si512(table);
  const __m512i t1 = _mm512_loadu_si512(table + 64);
  const __m512i t2 = _mm512_loadu_si512(table + 128);
  const __m512i t3 = _mm512_loadu_si512(table + 192);
  int64_t i = 0;
  for (; i + 64 <= n; i += 64) {
    const __m512i idx = _mm512_loadu_si512(x + i);
    const __m512i lo = _mm512_permutex2var_epi8(t0, idx, t1);
    const __m512i hi = _mm512_permutex2var_epi8(t2, idx, t3);
    _mm512_storeu_si512(y + i, _mm512_mask_blend_epi8(_mm512_movepi8_mask(idx), lo, hi));
  }
  if (i < n) {
    const __mmask64 k = (1ULL << (n - i)) - 1;  // 0 < n - i < 64
    const __m512i idx = _mm512_maskz_loadu_epi8(k, x + i);
    const __m512i lo = _mm512_permutex2var_epi8(t0, idx, t1);
    const __m512i hi = _mm512_permutex2var_epi8(t2, idx, t3);
    _mm512_mask_storeu_epi8(y + i, k, _mm512_mask_blend_epi8(_mm512_movepi8_mask(idx), lo, hi));
  }
}

// y[i] = tables[(c0 + i) mod C][x[i]] for i < n: a table per channel with the channels
// innermost (channels last). Sixteen bytes per step: index = offsets[j] + x (offsets[j] =
// (j mod C)·256, j running modulo `period`, a multiple of 16 and of C, over an array of
// period + 16 entries), one vpgatherdd of 4 bytes at each index from `padded` (the tables
// followed by 4 bytes, so the last entry's read stays in the buffer), the low byte kept.
void lut_channels_last_avx512(const uint8_t* x, uint8_t* y, int64_t n, int64_t j0, const int32_t* offsets,
                              int64_t period, const uint8_t* padded) {
  int64_t j = j0;
  for (int64_t i = 0; i < n; i += 16) {
    const __mmask16 k = n - i >= 16 ? static_cast<__mmask16>(0xFFFF) : static_cast<__mmask16>((1u << (n - i)) - 1u);
    const __m512i xv = _mm512_cvtepu8_epi32(_mm_maskz_loadu_epi8(k, x + i));
    const __m512i idx = _mm512_add_epi32(xv, _mm512_loadu_si512(offsets + j));
    const __m512i g = _mm512_mask_i32gather_epi32(_mm512_setzero_si512(), k, idx, padded, 1);
    _mm_mask_storeu_epi8(y + i, k, _mm512_cvtepi32_epi8(g));
    j += 16;
    if (j >= period) j -= period;
  }
}

const Kernels kKernelsAvx512Vnni = {
    add_run<uint8_t>,        add_run<int8_t>,        mul_run<uint8_t>, mul_run<int8_t>,
    dequantize_run<uint8_t>, dequantize_run<int8_t>, minmax,           lut,
    softmax_rows<uint8_t>,   softmax_rows<int8_t>,
};

}  // namespace elementwise
}  // namespace quanta
