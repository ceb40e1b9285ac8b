// The lane functions of float_ops (exp, log, erf, tanh, sigmoid, relu, gelu: float_ops_scalar.h's
// operations in their order, equation numbers of docs/float-ops.md) over the vector traits
// of simd.h, shared by float_ops_avx2.cc (F32x8) and float_ops_avx512vnni.cc (F32x16).
//
// Operand order matters for NaN: vmaxps / vminps return their SECOND operand when either
// is NaN, so (E1) is max(lo, t) then min(hi, t) (a NaN t stays NaN).
#pragma once

#include <cstdint>
#include <limits>

#include "float_ops/float_ops.h"
#include "float_ops/float_ops_scalar.h"
#include "recurrent/mlas_simd.h"
#include "simd.h"

namespace quanta {
namespace float_ops {
namespace {

// (E2)-(E6) from the clamped argument t of (E1).
template <class T>
inline typename T::V exp_clamped_v(typename T::V t) {
  using V = typename T::V;
  const V n = T::round(T::mul(t, T::set1(kL2E)));                                   // (E2)
  const V r = T::sub(T::sub(t, T::mul(n, T::set1(kC1))), T::mul(n, T::set1(kC2)));  // (E3)
  V h = T::set1(kP0);                                                               // (E4)
  h = T::add(T::mul(h, r), T::set1(kP1));
  h = T::add(T::mul(h, r), T::set1(kP2));
  h = T::add(T::mul(h, r), T::set1(kP3));
  h = T::add(T::mul(h, r), T::set1(kP4));
  h = T::add(T::mul(h, r), T::set1(kP5));
  const V p = T::add(T::add(T::mul(h, T::mul(r, r)), r), T::set1(1.0f));  // (E5)
  return T::scale_pow2(p, n);                                             // (E6)
}

template <class T>
inline typename T::V exp_v(typename T::V x) {
  const typename T::V t = T::max(T::set1(kExpLo), x);  // (E1)
  return exp_clamped_v<T>(T::min(T::set1(kExpHi), t));
}

// exp of an argument that is <= 0 or NaN (Softmax's x_i − m): the upper clamp of (E1)
// is then the identity (vminps(89, t) returns t for t <= 89 and for NaN t) and is skipped.
template <class T>
inline typename T::V exp_nonpositive_v(typename T::V x) {
  return exp_clamped_v<T>(T::max(T::set1(kExpLo), x));
}

// (EN1)-(EN6) for x <= 0 or NaN: exp_fused_nonpositive_one's operations. n·C1 is exact
// (at most 17 significant bits), so (EN3)'s first fma rounds the same value once as the
// scalar code's subtraction of that product.
template <class T>
inline typename T::V exp_fused_nonpositive_v(typename T::V x) {
  using V = typename T::V;
  const V t = T::max(T::set1(kExpLo), x);                                 // (EN1)
  const V n = T::round(T::mul(t, T::set1(kL2E)));                         // (EN2)
  const V r = T::fmadd(n, T::set1(-kC2), T::fmadd(n, T::set1(-kC1), t));  // (EN3)
  V h = T::fmadd(T::set1(kP0), r, T::set1(kP1));                          // (EN4)
  h = T::fmadd(h, r, T::set1(kP2));
  h = T::fmadd(h, r, T::set1(kP3));
  h = T::fmadd(h, r, T::set1(kP4));
  h = T::fmadd(h, r, T::set1(kP5));
  const V p = T::add(T::fmadd(h, T::mul(r, r), r), T::set1(1.0f));  // (EN5)
  return T::scale_pow2(p, n);                                       // (EN6)
}

template <class T>
inline typename T::V abs_v(typename T::V x) {
  return T::andnot(T::set1(-0.0f), x);
}

// |r| with the sign bit of x (std::copysign; r is never negative here).
template <class T>
inline typename T::V copysign_v(typename T::V r, typename T::V x) {
  const typename T::V sign = T::set1(-0.0f);
  return T::or_(T::andnot(sign, r), T::and_(sign, x));
}

// Whether no lane / every lane of a comparison is set.
// both_set: the lanes set in both.
#if defined(__AVX2__)
inline bool none_set(__m256 c) { return _mm256_movemask_ps(c) == 0; }
inline bool all_set(__m256 c) { return _mm256_movemask_ps(c) == 0xFF; }
inline __m256 both_set(__m256 a, __m256 b) { return _mm256_and_ps(a, b); }
#endif
#if defined(__AVX512F__)
inline bool none_set(__mmask16 c) { return c == 0; }
inline bool all_set(__mmask16 c) { return c == 0xFFFF; }
inline __mmask16 both_set(__mmask16 a, __mmask16 b) { return static_cast<__mmask16>(a & b); }
#endif

// (LN2)-(LN3) for x > 0 finite: x' = x · 2^23 below FLT_MIN (exact), then x' = m · 2^e'
// read from the bits, m in [0.5, 1); e = e' − 23 for those lanes (small integers: exact
// in float32). Lanes of other x (handled by log_v's selects) get finite garbage.
#if defined(__AVX2__) && defined(__FMA__)
inline void log_frexp(__m256 x, __m256& m, __m256& e) {
  const __m256 tiny = _mm256_cmp_ps(x, _mm256_set1_ps(std::numeric_limits<float>::min()), _CMP_LT_OQ);
  const __m256 xs = _mm256_blendv_ps(x, _mm256_mul_ps(x, _mm256_set1_ps(kLogFlt2)), tiny);
  const __m256i bits = _mm256_castps_si256(xs);
  const __m256i ei = _mm256_sub_epi32(_mm256_srli_epi32(bits, 23), _mm256_set1_epi32(126));
  m = _mm256_castsi256_ps(
      _mm256_or_si256(_mm256_and_si256(bits, _mm256_set1_epi32(0x007FFFFF)), _mm256_set1_epi32(0x3F000000)));
  e = _mm256_sub_ps(_mm256_cvtepi32_ps(ei), _mm256_and_ps(tiny, _mm256_set1_ps(23.0f)));
}
#endif
#if defined(__AVX512F__)
inline void log_frexp(__m512 x, __m512& m, __m512& e) {
  const __mmask16 tiny = _mm512_cmp_ps_mask(x, _mm512_set1_ps(std::numeric_limits<float>::min()), _CMP_LT_OQ);
  const __m512 xs = _mm512_mask_mul_ps(x, tiny, x, _mm512_set1_ps(kLogFlt2));
  const __m512i bits = _mm512_castps_si512(xs);
  const __m512i ei = _mm512_sub_epi32(_mm512_srli_epi32(bits, 23), _mm512_set1_epi32(126));
  m = _mm512_castsi512_ps(
      _mm512_or_si512(_mm512_and_si512(bits, _mm512_set1_epi32(0x007FFFFF)), _mm512_set1_epi32(0x3F000000)));
  e = _mm512_mask_sub_ps(_mm512_cvtepi32_ps(ei), tiny, _mm512_cvtepi32_ps(ei), _mm512_set1_ps(23.0f));
}
#endif

// Rounding to an integer in a given direction (_MM_FROUND_TO_ZERO, _TO_NEG_INF,
// _TO_POS_INF): exact.
#if defined(__AVX2__) && defined(__FMA__)
template <int kMode>
inline __m256 round_dir(__m256 v) {
  return _mm256_round_ps(v, kMode | _MM_FROUND_NO_EXC);
}
#endif
#if defined(__AVX512F__)
template <int kMode>
inline __m512 round_dir(__m512 v) {
  return _mm512_roundscale_ps(v, kMode | _MM_FROUND_NO_EXC);
}
#endif

// (CS2)-(CS5) for t = min(|x|, 2^24): the octant o (q mod 8) and both polynomials.
template <class T>
inline void trig_parts_v(typename T::V t, typename T::V& o, typename T::V& yc, typename T::V& ys) {
  using V = typename T::V;
  const V j = round_dir<_MM_FROUND_TO_ZERO>(T::mul(t, T::set1(kCosFopi)));  // (CS2)
  const V q = T::mul(T::set1(2.0f), round_dir<_MM_FROUND_TO_POS_INF>(T::mul(j, T::set1(0.5f))));
  o = T::sub(q, T::mul(T::set1(8.0f), round_dir<_MM_FROUND_TO_NEG_INF>(T::mul(q, T::set1(0.125f)))));  // (CS3)
  const V z = T::sub(T::sub(T::sub(t, T::mul(q, T::set1(kCosDp[0]))), T::mul(q, T::set1(kCosDp[1]))),
                     T::mul(q, T::set1(kCosDp[2])));  // (CS4)
  const V s = T::mul(z, z);                           // (CS5)
  yc = T::add(T::mul(T::add(T::mul(T::set1(kCosC[0]), s), T::set1(kCosC[1])), s), T::set1(kCosC[2]));
  yc = T::mul(T::mul(yc, s), s);
  yc = T::add(T::sub(yc, T::mul(T::set1(0.5f), s)), T::set1(1.0f));
  ys = T::add(T::mul(T::add(T::mul(T::set1(kCosS[0]), s), T::set1(kCosS[1])), s), T::set1(kCosS[2]));
  ys = T::add(T::mul(T::mul(ys, s), z), z);
}

// o mod 4 = 2, i.e. o in {2, 6} (exact small integers)
template <class T>
inline typename T::C odd_quadrant_v(typename T::V o) {
  const typename T::V o4 =
      T::sub(o, T::mul(T::set1(4.0f), round_dir<_MM_FROUND_TO_NEG_INF>(T::mul(o, T::set1(0.25f)))));
  return T::template cmp<_CMP_EQ_OQ>(o4, T::set1(2.0f));
}

template <class T>
inline typename T::V cos_v(typename T::V x) {
  using V = typename T::V;
  const V a = abs_v<T>(x);
  V o, yc, ys;
  trig_parts_v<T>(T::min(T::set1(kCosTMax), a), o, yc, ys);  // (CS1); NaN and inf are replaced at the end
  // (CS6): o in {2, 6} takes ys; o in {2, 4} is |o − 3| = 1 and negates
  V y = T::select(odd_quadrant_v<T>(o), yc, ys);
  y = T::select(T::template cmp<_CMP_EQ_OQ>(abs_v<T>(T::sub(o, T::set1(3.0f))), T::set1(1.0f)), y,
                T::xor_(y, T::set1(-0.0f)));
  const V inf = T::set1(std::numeric_limits<float>::infinity());
  return T::select(T::template cmp<_CMP_NLT_UQ>(a, inf), y, T::set1(std::numeric_limits<float>::quiet_NaN()));
}

template <class T>
inline typename T::V sin_v(typename T::V x) {
  using V = typename T::V;
  const V sign = T::set1(-0.0f);
  const V a = abs_v<T>(x);
  V o, yc, ys;
  trig_parts_v<T>(T::min(T::set1(kCosTMax), a), o, yc, ys);  // (CS1); NaN and inf are replaced at the end
  // (SN1): o in {2, 6} takes yc; o in {4, 6} negates; then the sign bit of x
  V y = T::select(odd_quadrant_v<T>(o), ys, yc);
  y = T::select(T::template cmp<_CMP_GE_OQ>(o, T::set1(4.0f)), y, T::xor_(y, sign));
  y = T::xor_(y, T::and_(sign, x));
  const V inf = T::set1(std::numeric_limits<float>::infinity());
  return T::select(T::template cmp<_CMP_NLT_UQ>(a, inf), y, T::set1(std::numeric_limits<float>::quiet_NaN()));
}

template <class T>
inline typename T::V atan_v(typename T::V x) {
  using V = typename T::V;
  const V a = abs_v<T>(x);  // (AT1)
  const V one = T::set1(1.0f);
  const auto big = T::template cmp<_CMP_GT_OQ>(a, T::set1(kAtanT3P8));  // (AT2): both branches, one selected
  const auto mid = T::template cmp<_CMP_GT_OQ>(a, T::set1(kAtanTP8));
  V r = T::select(mid, a, T::div(T::sub(a, one), T::add(a, one)));
  r = T::select(big, r, T::div(T::set1(-1.0f), a));
  V y0 = T::select(mid, T::zero(), T::set1(kAtanPio4));
  y0 = T::select(big, y0, T::set1(kAtanPio2));
  const V z = T::mul(r, r);  // (AT3)
  V p = T::set1(kAtanP[0]);
  for (int k = 1; k < 4; ++k) p = T::add(T::mul(p, z), T::set1(kAtanP[k]));
  const V y = T::add(y0, T::add(T::mul(T::mul(p, z), r), r));
  return copysign_v<T>(y, x);  // (AT4)
}

template <class T>
inline typename T::V log_v(typename T::V x) {
  using V = typename T::V;
  V m, e;
  log_frexp(x, m, e);
  const auto lo = T::template cmp<_CMP_LT_OQ>(m, T::set1(kLogSqrtHalf));  // (LN4)
  const V one = T::set1(1.0f);
  e = T::select(lo, e, T::sub(e, one));
  const V f = T::select(lo, T::sub(m, one), T::sub(T::add(m, m), one));
  const V z = T::mul(f, f);  // (LN5)
  V p = T::set1(kLogQ[0]);
  for (int k = 1; k < 9; ++k) p = T::add(T::mul(p, f), T::set1(kLogQ[k]));
  V y = T::mul(T::mul(p, f), z);
  y = T::add(y, T::mul(e, T::set1(kC2)));  // (LN6)
  y = T::sub(y, T::mul(T::set1(0.5f), z));
  V r = T::add(T::add(f, y), T::mul(e, T::set1(kC1)));
  const V inf = T::set1(std::numeric_limits<float>::infinity());  // (LN1)
  r = T::select(T::template cmp<_CMP_EQ_OQ>(x, T::zero()), r, T::xor_(inf, T::set1(-0.0f)));
  r = T::select(T::template cmp<_CMP_EQ_OQ>(x, inf), r, inf);
  return T::select(T::template cmp<_CMP_NGE_UQ>(x, T::zero()), r, T::set1(std::numeric_limits<float>::quiet_NaN()));
}

// (F1): t = min(|x|, 3.925); NaN: the second operand.
template <class T>
inline typename T::V erf_t_v(typename T::V x) {
  return T::min(T::set1(kErfTMax), abs_v<T>(x));
}

// (F2)-(F3): erf(t) for t <= 0.921875.
template <class T>
inline typename T::V erf_small_v(typename T::V t) {
  using V = typename T::V;
  const V s = T::mul(t, t);  // (F2)
  V p = T::set1(kErfA[0]);   // (F3)
  for (int k = 1; k < 6; ++k) p = T::fmadd(p, s, T::set1(kErfA[k]));
  return T::fmadd(p, t, t);
}

// (F4): erf(t) for t > 0.921875.
template <class T>
inline typename T::V erf_big_v(typename T::V t) {
  using V = typename T::V;
  V q = T::set1(kErfB[0]);
  for (int k = 1; k < 7; ++k) q = T::fmadd(q, t, T::set1(kErfB[k]));
  q = T::fmadd(q, t, t);
  return T::sub(T::set1(1.0f), exp_fused_nonpositive_v<T>(T::xor_(q, T::set1(-0.0f))));
}

template <class T>
inline typename T::V erf_v(typename T::V x) {
  const typename T::V t = erf_t_v<T>(x);
  const typename T::V small = erf_small_v<T>(t), big = erf_big_v<T>(t);
  return copysign_v<T>(T::select(T::template cmp<_CMP_GT_OQ>(t, T::set1(kErfSplit)), small, big), x);  // (F5)
}

// (T1)-(T4) without (T3)'s exp and division when every lane has t < 0.75: activations
// often sit below the split (magika's first Tanh: 90 % of its 16-lane vectors; 371 ->
// 165 us on its 1 M elements, AVX-512, 1 thread). A vector with a lane past the split
// computes both branches and selects (skipping the polynomial where every t >= 0.75 as
// well costs magika's second Tanh, whose vectors are mixed, 12 % in mispredicted
// branches). Either way a lane gets the bits (T4) selects. Gelu (G2) takes it too.
// (T3)'s lower clamp of (E1) is skipped: t + t >= 0, and vminps(89, NaN) keeps the NaN.
template <class T>
inline typename T::V tanh_v(typename T::V x) {
  using V = typename T::V;
  const V t = abs_v<T>(x);  // (T1)
  const V s = T::mul(t, t);
  V p = T::set1(kTanhT[5]);  // (T2)
  for (int k = 4; k >= 0; --k) p = T::add(T::mul(p, s), T::set1(kTanhT[k]));
  const V small = T::add(t, T::mul(t, T::mul(s, p)));
  const auto is_small = T::template cmp<_CMP_LT_OQ>(t, T::set1(kTanhSplit));
  if (all_set(is_small)) return copysign_v<T>(small, x);
  const V one = T::set1(1.0f);
  const V e = exp_clamped_v<T>(T::min(T::set1(kExpHi), T::add(t, t)));  // (T3)
  const V big = T::sub(one, T::div(T::set1(2.0f), T::add(e, one)));
  return copysign_v<T>(T::select(is_small, big, small), x);  // (T4)
}

template <class T>
inline typename T::V sigmoid_v(typename T::V x) {
  using V = typename T::V;
  const V e = exp_fused_nonpositive_v<T>(T::or_(x, T::set1(-0.0f)));  // (Σ1): −|x|
  const V d = T::add(T::set1(1.0f), e);
  const auto non_negative = T::template cmp<_CMP_GE_OQ>(x, T::zero());
  return T::div(T::select(non_negative, e, T::set1(1.0f)), d);  // (Σ2): one division, its numerator selected
}

template <class T>
inline typename T::V silu_v(typename T::V x) {
  return T::mul(x, sigmoid_v<T>(x));
}

template <class T>
inline typename T::V expm1_v(typename T::V x) {
  using V = typename T::V;
  V q = T::set1(kExpm1Q[6]);  // (X1)
  for (int k = 5; k >= 0; --k) q = T::add(T::mul(q, x), T::set1(kExpm1Q[k]));
  const V small = T::add(x, T::mul(T::mul(x, x), q));
  const V big = T::sub(exp_v<T>(x), T::set1(1.0f));                                              // (X2)
  return T::select(T::template cmp<_CMP_LT_OQ>(abs_v<T>(x), T::set1(kExpm1Split)), big, small);  // (X3)
}

// (X1)-(X3) for the lanes where x < 0 (Elu's): there min(89, t) of (E1) is t, and
// |x| < split is x > −split. Other lanes get values nobody selects. Only the branches
// some negative lane takes are computed: activations below an Elu have big negatives in
// nearly every vector, and in 4-61 % of them (madmom's TCN and key CNN) no negative lane
// in (−split, 0), whose polynomial is then skipped.
template <class T>
inline typename T::V expm1_negative_v(typename T::V x, typename T::C neg) {
  using V = typename T::V;
  const auto is_small = T::template cmp<_CMP_GT_OQ>(x, T::set1(-kExpm1Split));
  const auto is_big = T::template cmp<_CMP_NGT_UQ>(x, T::set1(-kExpm1Split));  // x <= −split (or NaN)
  if (none_set(both_set(neg, is_small))) {
    return T::sub(exp_nonpositive_v<T>(x), T::set1(1.0f));  // (X2)
  }
  V q = T::set1(kExpm1Q[6]);  // (X1)
  for (int k = 5; k >= 0; --k) q = T::add(T::mul(q, x), T::set1(kExpm1Q[k]));
  const V small = T::add(x, T::mul(T::mul(x, x), q));
  if (none_set(both_set(neg, is_big))) return small;
  const V big = T::sub(exp_nonpositive_v<T>(x), T::set1(1.0f));  // (X2)
  return T::select(is_small, big, small);                        // (X3)
}

// (EL) over n elements: a vector without a negative lane is stored as it is; else the
// select of x and f32(alpha · expm1(x)) in registers (x < 0 is false for NaN and ±0).
template <class T>
void elu_run_v(const float* x, float* y, int64_t n, float alpha) {
  using V = typename T::V;
  const V va = T::set1(alpha);
  int64_t i = 0;
  for (; i + T::kLanes <= n; i += T::kLanes) {
    const V v = T::loadu(x + i);
    const auto neg = T::template cmp<_CMP_LT_OQ>(v, T::zero());
    T::storeu(y + i, none_set(neg) ? v : T::select(neg, v, T::mul(va, expm1_negative_v<T>(v, neg))));
  }
  if (i < n) {
    const typename T::M k = T::tail(n - i);
    const V v = T::load(k, x + i);  // +0 past n: not negative
    const auto neg = T::template cmp<_CMP_LT_OQ>(v, T::zero());
    T::store(y + i, k, T::select(neg, v, T::mul(va, expm1_negative_v<T>(v, neg))));
  }
}

template <class T>
inline typename T::V relu_v(typename T::V x) {
  // vmaxps returns its second operand on equal zeros (+0, as np.maximum) and on NaN
  // (then x is put back).
  const typename T::V y = T::max(x, T::zero());
  return T::select(T::template cmp<_CMP_UNORD_Q>(x, x), y, x);
}

// (G1) from erf(x / SQRT2) = e.
template <class T>
inline typename T::V gelu_of_erf_v(typename T::V x, typename T::V e) {
  return T::mul(T::mul(T::set1(0.5f), x), T::add(T::set1(1.0f), e));
}

template <class T>
inline typename T::V gelu_v(typename T::V x) {  // (G1)
  return gelu_of_erf_v<T>(x, erf_v<T>(T::div(x, T::set1(kGeluSqrt2))));
}

template <class T>
inline typename T::V gelu_tanh_v(typename T::V x) {  // (G2)
  using V = typename T::V;
  const V x3 = T::mul(T::mul(x, x), x);
  const V a = T::mul(T::set1(kGeluK), T::add(x, T::mul(T::set1(kGeluC), x3)));
  return T::mul(T::mul(T::set1(0.5f), x), T::add(T::set1(1.0f), tanh_v<T>(a)));
}

template <class T>
inline typename T::V gelu_tanh_mlas_v(typename T::V x) {  // (G2), MLAS's tanh
  using V = typename T::V;
  const V x3 = T::mul(T::mul(x, x), x);
  const V a = T::mul(T::set1(kGeluK), T::add(x, T::mul(T::set1(kGeluC), x3)));
  return T::mul(T::mul(T::set1(0.5f), x), T::add(T::set1(1.0f), recurrent::tanh_v<T>(a)));
}

// (FG1): ORT's FastGelu, ort::fast_gelu_one's operations
template <class T>
inline typename T::V fast_gelu_ort_v(typename T::V x) {
  using V = typename T::V;
  const V a = T::mul(x, T::add(T::mul(T::mul(T::set1(0.035677408136300125f), x), x), T::set1(0.7978845608028654f)));
  return T::mul(T::mul(T::set1(0.5f), x), T::add(recurrent::tanh_v<T>(a), T::set1(1.0f)));
}

// (SP1)-(SP3), softplus_one's operations: −|x| as the sign bit set (np.negative of
// np.abs, NaN too), u == 1 ? t : log(u) · (t / (u − 1)), x where x >= 0 or NaN else +0,
// then that plus l (first operand: a NaN x keeps its payload).
template <class T>
inline typename T::V softplus_v(typename T::V x) {
  using V = typename T::V;
  const V one = T::set1(1.0f);
  const V t = exp_v<T>(T::or_(x, T::set1(-0.0f)));  // (SP1)
  const V u = T::add(one, t);                       // (SP2)
  const V l = T::select(T::template cmp<_CMP_EQ_OQ>(u, one), T::mul(log_v<T>(u), T::div(t, T::sub(u, one))), t);
  const V m = T::select(T::template cmp<_CMP_NLT_UQ>(x, T::zero()), T::zero(), x);
  return T::add(m, l);  // (SP3)
}

// y[i] = f(x[i]) for i < n, kLanes at a time, the tail masked (full vectors take plain
// loads and stores: no mask to build per vector).
template <class T, typename T::V (*f)(typename T::V)>
void unary_run_v(const float* x, float* y, int64_t n) {
  int64_t i = 0;
  for (; i + T::kLanes <= n; i += T::kLanes) T::storeu(y + i, f(T::loadu(x + i)));
  if (i < n) {
    const typename T::M k = T::tail(n - i);
    T::store(y + i, k, f(T::load(k, x + i)));
  }
}

// (L5) over one row: y = (x − mean) · inv_std · scale (+ bias); with `divide`, `s` is the
// standard deviation and (L5') y = (x − mean) / s · scale (+ bias), as written-out exports
// compute it (quanta::LayerNormDiv).
template <class T>
inline void layer_norm_scale_v(const float* xr, float* yr, int64_t d, float mean, float s, const float* scale,
                               const float* bias, bool divide) {
  const typename T::V vmean = T::set1(mean), vs = T::set1(s);
  for (int64_t i = 0; i < d; i += T::kLanes) {
    const typename T::M k = T::tail(d - i);
    const typename T::V di = T::sub(T::load(k, xr + i), vmean);
    typename T::V v = T::mul(divide ? T::div(di, vs) : T::mul(di, vs), T::load(k, scale + i));  // (L5), (L5')
    if (bias) v = T::add(v, T::load(k, bias + i));
    T::store(yr + i, k, v);
  }
}

template <class T, BinaryOp op>
inline typename T::V binary_v(typename T::V a, typename T::V b) {
  if constexpr (op == BinaryOp::kAdd) return T::add(a, b);
  if constexpr (op == BinaryOp::kSub) return T::sub(a, b);
  if constexpr (op == BinaryOp::kMul) return T::mul(a, b);
  if constexpr (op == BinaryOp::kMax || op == BinaryOp::kMin) {
    // vmaxps(a, b) = a > b ? a : b (vminps: <), b on NaN: a NaN a is put back
    const typename T::V r = op == BinaryOp::kMax ? T::max(a, b) : T::min(a, b);
    return T::select(T::template cmp<_CMP_UNORD_Q>(a, a), r, a);
  }
  if constexpr (op == BinaryOp::kPRelu) {
    // the product where a < 0 (ordered: a NaN a stays), a elsewhere
    return T::select(T::template cmp<_CMP_LT_OQ>(a, T::zero()), a, T::mul(a, b));
  }
  return T::div(a, b);
}

// c[i] = a[i·AS] op b[i·BS] for i < n (AS, BS: 1 steps, 0 repeats element 0), one IEEE
// operation per lane; the tail masked.
template <class T, BinaryOp op, int AS, int BS>
void binary_run_t(const float* a, const float* b, float* c, int64_t n) {
  using V = typename T::V;
  const V fa = T::set1(a[0]), fb = T::set1(b[0]);
  int64_t i = 0;
  for (; i + T::kLanes <= n; i += T::kLanes) {
    const V va = AS ? T::loadu(a + i) : fa;
    const V vb = BS ? T::loadu(b + i) : fb;
    T::storeu(c + i, binary_v<T, op>(va, vb));
  }
  if (i < n) {
    const typename T::M k = T::tail(n - i);
    const V va = AS ? T::load(k, a + i) : fa;
    const V vb = BS ? T::load(k, b + i) : fb;
    T::store(c + i, k, binary_v<T, op>(va, vb));
  }
}

// float_ops.h BinaryRunFn.
template <class T, BinaryOp op>
void binary_run_v(const float* a, int64_t a_step, const float* b, int64_t b_step, float* c, int64_t n) {
  if (n <= 0) return;
  if (a_step && b_step) return binary_run_t<T, op, 1, 1>(a, b, c, n);
  if (a_step) return binary_run_t<T, op, 1, 0>(a, b, c, n);
  if (b_step) return binary_run_t<T, op, 0, 1>(a, b, c, n);
  return binary_run_t<T, op, 0, 0>(a, b, c, n);
}

// The kernel table of an ISA (float_ops.h Kernels): its own Softmax (both exps) and LayerNorm row
// kernels, everything else from the templates above.
template <class T>
constexpr Kernels simd_kernels(const char* isa, SoftmaxRowsFn softmax, SoftmaxRowsFn softmax_fused,
                               LayerNormRowsFn layer_norm, ToHalfRunFn to_half, FromHalfRunFn from_half) {
  return Kernels{
      isa,
      {binary_run_v<T, BinaryOp::kAdd>, binary_run_v<T, BinaryOp::kSub>, binary_run_v<T, BinaryOp::kMul>,
       binary_run_v<T, BinaryOp::kDiv>, binary_run_v<T, BinaryOp::kMax>, binary_run_v<T, BinaryOp::kMin>,
       binary_run_v<T, BinaryOp::kPRelu>},
      unary_run_v<T, exp_v<T>>,
      softmax,
      softmax_fused,
      layer_norm,
      {unary_run_v<T, erf_v<T>>, unary_run_v<T, tanh_v<T>>, unary_run_v<T, sigmoid_v<T>>, unary_run_v<T, relu_v<T>>,
       unary_run_v<T, gelu_v<T>>, unary_run_v<T, gelu_tanh_v<T>>, unary_run_v<T, recurrent::logistic_v<T>>,
       unary_run_v<T, recurrent::tanh_v<T>>, unary_run_v<T, silu_v<T>>, unary_run_v<T, log_v<T>>,
       unary_run_v<T, cos_v<T>>, unary_run_v<T, sin_v<T>>, unary_run_v<T, expm1_v<T>>,
       unary_run_v<T, gelu_tanh_mlas_v<T>>, unary_run_v<T, atan_v<T>>, unary_run_v<T, softplus_v<T>>,
       unary_run_v<T, fast_gelu_ort_v<T>>},  // by UnaryOp
      elu_run_v<T>,
      to_half,
      from_half};
}

}  // namespace
}  // namespace float_ops
}  // namespace quanta
