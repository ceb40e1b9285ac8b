// Vector traits of float32 lanes, for kernels written once as templates over them (the
// shape of MLAS's and XNNPACK's per-ISA micro-kernel generators): F32x8 (AVX2 + FMA, 8
// lanes per ymm, lane masks in a ymm) and F32x16 (AVX-512F, 16 lanes per zmm, __mmask16).
// A template instantiated with one of them compiles to the intrinsics of that ISA alone.
//
// Everything here has internal linkage (an anonymous namespace): the header is included
// by translation units built for different ISAs, and an inline function with external
// linkage could be merged across them by the linker (an AVX-512 encoding running on an
// AVX2-only CPU). Each struct exists only where its ISA is enabled.
//
// NaN: vminps / vmaxps return their SECOND operand when either is NaN (min(a, b), max(a, b)
// here keep that order).
#pragma once

#include <immintrin.h>

#include <cstdint>
#include <type_traits>

namespace quanta {
namespace simd {
namespace {

#if defined(__AVX2__) && defined(__FMA__)
struct F32x8 {
  using V = __m256;
  using M = __m256i;  // lanes [0, n) all ones
  static constexpr int kLanes = 8;
  static V zero() { return _mm256_setzero_ps(); }
  static V set1(float v) { return _mm256_set1_ps(v); }
  static V add(V a, V b) { return _mm256_add_ps(a, b); }
  static V sub(V a, V b) { return _mm256_sub_ps(a, b); }
  static V mul(V a, V b) { return _mm256_mul_ps(a, b); }
  static V div(V a, V b) { return _mm256_div_ps(a, b); }
  static V fmadd(V a, V b, V c) { return _mm256_fmadd_ps(a, b, c); }
  static V min(V a, V b) { return _mm256_min_ps(a, b); }
  static V max(V a, V b) { return _mm256_max_ps(a, b); }
  static V loadu(const float* p) { return _mm256_loadu_ps(p); }
  static void storeu(float* p, V v) { _mm256_storeu_ps(p, v); }
  // The mask of `left` remaining elements (all lanes when left >= 8, none when <= 0).
  static M tail(int64_t left) {
    const int n = left >= 8 ? 8 : left <= 0 ? 0 : static_cast<int>(left);
    return _mm256_cmpgt_epi32(_mm256_set1_epi32(n), _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7));
  }
  static V load(M m, const float* p) { return _mm256_maskload_ps(p, m); }  // 0 in the other lanes
  static void store(float* p, M m, V v) { _mm256_maskstore_ps(p, m, v); }
  static V and_(V a, V b) { return _mm256_and_ps(a, b); }
  static V or_(V a, V b) { return _mm256_or_ps(a, b); }
  static V andnot(V a, V b) { return _mm256_andnot_ps(a, b); }  // ~a & b
  static V xor_(V a, V b) { return _mm256_xor_ps(a, b); }
  static V round(V v) { return _mm256_round_ps(v, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC); }
  // A lane predicate (_CMP_* of a and b), and the lanes of b where it holds, of a elsewhere.
  using C = __m256;
  template <int kCmp>
  static C cmp(V a, V b) {
    return _mm256_cmp_ps(a, b, kCmp);
  }
  static V select(C c, V a, V b) { return _mm256_blendv_ps(a, b, c); }
  // p · 2^n for integral n in [−150, 128]: two products by the normal powers 2^n1, 2^n2
  // (n1 = n >> 1, n2 = n − n1); the first is exact, the second rounds once.
  static V scale_pow2(V p, V n) {
    const __m256i ni = _mm256_cvtps_epi32(n);  // n is integral (NaN: p is NaN anyway)
    const __m256i n1 = _mm256_srai_epi32(ni, 1);
    const __m256i n2 = _mm256_sub_epi32(ni, n1);
    return _mm256_mul_ps(_mm256_mul_ps(p, _mm256_castsi256_ps(pow2_bits(n1))), _mm256_castsi256_ps(pow2_bits(n2)));
  }
  static __m256i pow2_bits(__m256i k) { return _mm256_slli_epi32(_mm256_add_epi32(k, _mm256_set1_epi32(127)), 23); }
  // kLanes floats p[i·S] (S = 1, 2) or p[i·sw] (S = 0): a load, two loads and a permute,
  // or a gather.
  template <int S>
  static V strided(const float* p, int sw) {
    if (S == 1) return _mm256_loadu_ps(p);
    if (S == 2) {
      // a0 a2 b0 b2 | a4 a6 b4 b6 -> a0 a2 a4 a6 b0 b2 b4 b6
      const __m256 e = _mm256_shuffle_ps(_mm256_loadu_ps(p), _mm256_loadu_ps(p + 8), 0x88);
      return _mm256_castpd_ps(_mm256_permute4x64_pd(_mm256_castps_pd(e), 0xD8));
    }
    const __m256i idx = _mm256_mullo_epi32(_mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7), _mm256_set1_epi32(sw));
    return _mm256_i32gather_ps(p, idx, 4);
  }
};
#endif

#if defined(__AVX512F__)
struct F32x16 {
  using V = __m512;
  using M = __mmask16;
  static constexpr int kLanes = 16;
  static V zero() { return _mm512_setzero_ps(); }
  static V set1(float v) { return _mm512_set1_ps(v); }
  static V add(V a, V b) { return _mm512_add_ps(a, b); }
  static V sub(V a, V b) { return _mm512_sub_ps(a, b); }
  static V mul(V a, V b) { return _mm512_mul_ps(a, b); }
  static V div(V a, V b) { return _mm512_div_ps(a, b); }
  static V fmadd(V a, V b, V c) { return _mm512_fmadd_ps(a, b, c); }
  static V min(V a, V b) { return _mm512_min_ps(a, b); }
  static V max(V a, V b) { return _mm512_max_ps(a, b); }
  static V loadu(const float* p) { return _mm512_loadu_ps(p); }
  static void storeu(float* p, V v) { _mm512_storeu_ps(p, v); }
  static M tail(int64_t left) {
    return left >= 16 ? static_cast<M>(0xFFFF) : left <= 0 ? static_cast<M>(0) : static_cast<M>((1u << left) - 1u);
  }
  static V load(M m, const float* p) { return _mm512_maskz_loadu_ps(m, p); }
  static void store(float* p, M m, V v) { _mm512_mask_storeu_ps(p, m, v); }
  static V and_(V a, V b) { return _mm512_and_ps(a, b); }
  static V or_(V a, V b) { return _mm512_or_ps(a, b); }
  static V andnot(V a, V b) { return _mm512_andnot_ps(a, b); }
  static V xor_(V a, V b) { return _mm512_xor_ps(a, b); }
  static V round(V v) { return _mm512_roundscale_ps(v, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC); }
  using C = __mmask16;
  template <int kCmp>
  static C cmp(V a, V b) {
    return _mm512_cmp_ps_mask(a, b, kCmp);
  }
  static V select(C c, V a, V b) { return _mm512_mask_blend_ps(c, a, b); }
  // The sum of the 16 lanes in the order of (R2)-(R3) (docs/float-ops.md): lanes j and
  // j + 8, then j and j + 4, j + 2, j + 1 (not _mm512_reduce_add_ps, whose order is
  // unspecified). One definition, so the float Softmax and SoftmaxQuant sum alike.
  static float tree16(V acc) {
    const __m256 a8 = _mm256_add_ps(_mm512_castps512_ps256(acc), _mm512_extractf32x8_ps(acc, 1));
    const __m128 a4 = _mm_add_ps(_mm256_castps256_ps128(a8), _mm256_extractf128_ps(a8, 1));
    const __m128 a2 = _mm_add_ps(a4, _mm_movehl_ps(a4, a4));
    const __m128 a1 = _mm_add_ss(a2, _mm_movehdup_ps(a2));
    return _mm_cvtss_f32(a1);
  }
  // One vscalefps: p · 2^n rounded once, the bytes of F32x8's two products: with n in
  // [−150, 128] both halves 2^n1, 2^n2 are normal, the first product is exact and the
  // second rounds once, so both give rne(p · 2^n), for subnormal and overflowing results
  // too (FTZ/DAZ off, as everywhere here). NaN n or p: NaN.
  static V scale_pow2(V p, V n) { return _mm512_scalef_ps(p, n); }
  // Lanes [K, K + 16) of the 32 lanes lo ‖ hi (one valignd): the vector an unaligned load
  // at lo's address + K floats would read, from two aligned loads.
  template <int K>
  static V shift_concat(V lo, V hi) {
    return _mm512_castsi512_ps(_mm512_alignr_epi32(_mm512_castps_si512(hi), _mm512_castps_si512(lo), K));
  }
  template <int S>
  static V strided(const float* p, int sw) {
    if (S == 1) return _mm512_loadu_ps(p);
    if (S == 2) {
      const __m512i even = _mm512_setr_epi32(0, 2, 4, 6, 8, 10, 12, 14, 16, 18, 20, 22, 24, 26, 28, 30);
      return _mm512_permutex2var_ps(_mm512_loadu_ps(p), even, _mm512_loadu_ps(p + 16));
    }
    const __m512i idx = _mm512_mullo_epi32(_mm512_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15),
                                           _mm512_set1_epi32(sw));
    return _mm512_i32gather_ps(idx, p, 4);
  }
};
#endif

// Integer lanes, for the int8 kernels written once over them: I32x8 / I32x16 (int32
// lanes: widening byte loads, the zero-point arithmetic) and I8x32 / I8x64 (byte lanes:
// the unpack network of the byte transposes, max pooling). F is the float traits of the same width.
#if defined(__AVX2__) && defined(__FMA__)
struct I32x8 {
  using V = __m256i;
  using F = F32x8;
  static constexpr int kLanes = 8;
  static V zero() { return _mm256_setzero_si256(); }
  static V set1(int32_t v) { return _mm256_set1_epi32(v); }
  static V loadu(const int32_t* p) { return _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p)); }
  static V add(V a, V b) { return _mm256_add_epi32(a, b); }
  static V sub(V a, V b) { return _mm256_sub_epi32(a, b); }
  static V mullo(V a, V b) { return _mm256_mullo_epi32(a, b); }
  static F::V to_f32(V v) { return _mm256_cvtepi32_ps(v); }
  // kLanes bytes from p, zero- (uint8_t) or sign-extended (int8_t).
  template <typename T>
  static V widen(const T* p) {
    return widen_bytes<T>(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(p)));
  }
  // The low kLanes bytes, widened.
  template <typename T>
  static V widen_bytes(__m128i bytes) {
    if constexpr (std::is_same_v<T, uint8_t>) {
      return _mm256_cvtepu8_epi32(bytes);
    } else {
      return _mm256_cvtepi8_epi32(bytes);
    }
  }
};

struct I8x16 {
  using V = __m128i;
  template <typename T>
  static V max(V a, V b) {
    if constexpr (std::is_same_v<T, uint8_t>) return _mm_max_epu8(a, b);
    return _mm_max_epi8(a, b);
  }
};

struct I8x32 {
  using V = __m256i;
  // The lane-wise maximum of uint8_t or int8_t lanes.
  template <typename T>
  static V max(V a, V b) {
    if constexpr (std::is_same_v<T, uint8_t>) return _mm256_max_epu8(a, b);
    return _mm256_max_epi8(a, b);
  }
  static V unpacklo8(V a, V b) { return _mm256_unpacklo_epi8(a, b); }
  static V unpackhi8(V a, V b) { return _mm256_unpackhi_epi8(a, b); }
  static V unpacklo16(V a, V b) { return _mm256_unpacklo_epi16(a, b); }
  static V unpackhi16(V a, V b) { return _mm256_unpackhi_epi16(a, b); }
  static V unpacklo32(V a, V b) { return _mm256_unpacklo_epi32(a, b); }
  static V unpackhi32(V a, V b) { return _mm256_unpackhi_epi32(a, b); }
  static V unpacklo64(V a, V b) { return _mm256_unpacklo_epi64(a, b); }
  static V unpackhi64(V a, V b) { return _mm256_unpackhi_epi64(a, b); }
};
#endif

#if defined(__AVX512F__) && defined(__AVX512BW__)
struct I32x16 {
  using V = __m512i;
  using F = F32x16;
  using M = __mmask16;
  static constexpr int kLanes = 16;
  static V zero() { return _mm512_setzero_si512(); }
  static V set1(int32_t v) { return _mm512_set1_epi32(v); }
  static V loadu(const int32_t* p) { return _mm512_loadu_si512(p); }
  static V add(V a, V b) { return _mm512_add_epi32(a, b); }
  static V sub(V a, V b) { return _mm512_sub_epi32(a, b); }
  static V mullo(V a, V b) { return _mm512_mullo_epi32(a, b); }
  static F::V to_f32(V v) { return _mm512_cvtepi32_ps(v); }
  template <typename T>
  static V widen(const T* p) {
    return widen_bytes<T>(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p)));
  }
  // The lanes of k only (the others 0), nothing read outside them.
  template <typename T>
  static V widen(const T* p, M k) {
    return widen_bytes<T>(_mm_maskz_loadu_epi8(k, p));
  }
  template <typename T>
  static V widen_bytes(__m128i bytes) {
    if constexpr (std::is_same_v<T, uint8_t>) {
      return _mm512_cvtepu8_epi32(bytes);
    } else {
      return _mm512_cvtepi8_epi32(bytes);
    }
  }
};

struct I8x64 {
  using V = __m512i;
  // The lane-wise maximum of uint8_t or int8_t lanes.
  template <typename T>
  static V max(V a, V b) {
    if constexpr (std::is_same_v<T, uint8_t>) return _mm512_max_epu8(a, b);
    return _mm512_max_epi8(a, b);
  }
  static V unpacklo8(V a, V b) { return _mm512_unpacklo_epi8(a, b); }
  static V unpackhi8(V a, V b) { return _mm512_unpackhi_epi8(a, b); }
  static V unpacklo16(V a, V b) { return _mm512_unpacklo_epi16(a, b); }
  static V unpackhi16(V a, V b) { return _mm512_unpackhi_epi16(a, b); }
  static V unpacklo32(V a, V b) { return _mm512_unpacklo_epi32(a, b); }
  static V unpackhi32(V a, V b) { return _mm512_unpackhi_epi32(a, b); }
  static V unpacklo64(V a, V b) { return _mm512_unpacklo_epi64(a, b); }
  static V unpackhi64(V a, V b) { return _mm512_unpackhi_epi64(a, b); }
};
#endif

}  // namespace
}  // namespace simd
}  // namespace quanta
