// The AVX2 8-lane requantization output stage, shared by qgemm's AVX2 family and the
// AVX2 convolution kernels (direct, depthwise NCHW and channels_last):
//
//   q = round_half_even(clamp(float32(acc)·m, L − zy, H − zy)) + zy
//
// one float32 multiply (never fused with anything: the callers build with
// fp-contract=off), the clamp before the rounding (vroundps to nearest even), then
// int32 -> 8 bits by saturating packs, which are exact because q is already in the
// output's range [L, H].
//
// Internal linkage (an anonymous namespace), as simd.h: only AVX2 translation units
// include this, and no linker may merge it with another ISA's copy.
#pragma once

#if !defined(__AVX2__)
#error "requant_avx2.h is for translation units built with -mavx2"
#endif

#include <immintrin.h>

#include <cstdint>
#include <cstring>

namespace quanta {
namespace avx2 {
namespace {

// q (int32, 8 lanes) from the sums acc and the lanes' multipliers m
inline __m256i requant_q8(__m256i acc, __m256 m, float lo_minus_zy, float hi_minus_zy, int32_t zy) {
  __m256 f = _mm256_mul_ps(_mm256_cvtepi32_ps(acc), m);
  f = _mm256_min_ps(_mm256_max_ps(f, _mm256_set1_ps(lo_minus_zy)), _mm256_set1_ps(hi_minus_zy));
  f = _mm256_round_ps(f, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
  return _mm256_add_epi32(_mm256_cvttps_epi32(f), _mm256_set1_epi32(zy));
}

// requant_q8 without the final + zy: q − zy, in [L − zy, H − zy] (|.| <= 383)
inline __m256i requant_q8_nozy(__m256i acc, __m256 m, __m256 lo_minus_zy, __m256 hi_minus_zy) {
  __m256 f = _mm256_mul_ps(_mm256_cvtepi32_ps(acc), m);
  f = _mm256_min_ps(_mm256_max_ps(f, lo_minus_zy), hi_minus_zy);
  return _mm256_cvttps_epi32(_mm256_round_ps(f, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC));
}

// 16 lanes of q − zy (d0: lanes 0-7, d1: 8-15, from requant_q8_nozy) as the bytes of q in
// lane order: zy is added to the int16 lanes of the first pack (one vpaddw for 16
// lanes instead of two vpaddd; q − zy and q fit int16, so the packs stay exact)
inline __m128i pack_q8x16_zy(__m256i d0, __m256i d1, __m256i zy16, bool y_signed) {
  const __m256i p16 = _mm256_add_epi16(_mm256_permute4x64_epi64(_mm256_packs_epi32(d0, d1), 0xD8), zy16);
  const __m128i l = _mm256_castsi256_si128(p16), h = _mm256_extracti128_si256(p16, 1);
  return y_signed ? _mm_packs_epi16(l, h) : _mm_packus_epi16(l, h);
}

// The 8 lanes of q (each in the output's range) as int8 (y_signed) or uint8 bytes, in
// lane order, in the low 8 bytes
inline __m128i pack_q8(__m256i q, bool y_signed) {
  const __m128i p16 = _mm_packs_epi32(_mm256_castsi256_si128(q), _mm256_extracti128_si256(q, 1));
  return y_signed ? _mm_packs_epi16(p16, p16) : _mm_packus_epi16(p16, p16);
}

// lanes [0, n) of q to dst as bytes (all 8 when n >= 8)
inline void store_q8(__m256i q, bool y_signed, void* dst, int n = 8) {
  const __m128i p8 = pack_q8(q, y_signed);
  if (n >= 8) {
    _mm_storel_epi64(static_cast<__m128i*>(dst), p8);
  } else {
    alignas(16) uint8_t tmp[16];
    _mm_store_si128(reinterpret_cast<__m128i*>(tmp), p8);
    std::memcpy(dst, tmp, static_cast<size_t>(n));
  }
}

// 16 lanes (q0: lanes 0-7, q1: 8-15, each in the output's range) as bytes in lane order:
// one vpackssdw of both (128-bit lanes: 0-3 8-11 | 4-7 12-15), vpermq back to lane order,
// one pack to bytes
inline __m128i pack_q8x16(__m256i q0, __m256i q1, bool y_signed) {
  const __m256i p16 = _mm256_permute4x64_epi64(_mm256_packs_epi32(q0, q1), 0xD8);
  const __m128i l = _mm256_castsi256_si128(p16), h = _mm256_extracti128_si256(p16, 1);
  return y_signed ? _mm_packs_epi16(l, h) : _mm_packus_epi16(l, h);
}

// bytes [0, n) of p8 to dst (one 16-byte store when n >= 16)
inline void store_bytes16(__m128i p8, void* dst, int64_t n = 16) {
  if (n >= 16) {
    _mm_storeu_si128(static_cast<__m128i*>(dst), p8);
  } else {
    alignas(16) uint8_t tmp[16];
    _mm_store_si128(reinterpret_cast<__m128i*>(tmp), p8);
    std::memcpy(dst, tmp, static_cast<size_t>(n));
  }
}

// lanes [0, n) of q0 | q1 to dst as bytes
inline void store_q8x16(__m256i q0, __m256i q1, bool y_signed, void* dst, int64_t n = 16) {
  store_bytes16(pack_q8x16(q0, q1, y_signed), dst, n);
}

}  // namespace
}  // namespace avx2
}  // namespace quanta
