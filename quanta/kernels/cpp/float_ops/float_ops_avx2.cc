// AVX2 float_ops, 8 lanes per ymm. The 16 lanes of sum16 (R1) are TWO ymm accumulators:
// lo holds lanes 0–7 and hi lanes 8–15 of each 16-element block, so the first tree step
// (R2, h = 8) is lo + hi and the result is the bytes of the AVX-512 and portable variants.
// Tails use vmaskmovps loads/stores; a tail lane adds +0 to its accumulator, which leaves
// it unchanged (an accumulator is never −0: it starts at +0 and x + y = −0 only when both
// are −0).
//
// Operand order matters for NaN: vmaxps / vminps return their SECOND operand when either
// is NaN, so (E1) is max(lo, t) then min(hi, t) and the row maximum is max(x, m).
#include <immintrin.h>

#include <cmath>
#include <cstdint>
#include <limits>

#include "float_ops/float_ops.h"
#include "float_ops/float_ops_scalar.h"
#include "recurrent/mlas_simd.h"

namespace quanta {
namespace float_ops {
namespace {

// Lane mask for `left` remaining elements of an 8-lane step (all ones when left >= 8).
inline __m256i tail_mask8(int64_t left) {
  const __m256i idx = _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7);
  const int32_t n = left >= 8 ? 8 : (left <= 0 ? 0 : static_cast<int32_t>(left));
  return _mm256_cmpgt_epi32(_mm256_set1_epi32(n), idx);
}

inline __m256i pow2_bits(__m256i k) { return _mm256_slli_epi32(_mm256_add_epi32(k, _mm256_set1_epi32(127)), 23); }

// (E2)-(E6) from the clamped argument t of (E1).
inline __m256 exp8_clamped(__m256 t) {
  const __m256 n = _mm256_round_ps(_mm256_mul_ps(t, _mm256_set1_ps(kL2E)),
                                   _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);  // (E2)
  const __m256 r = _mm256_sub_ps(_mm256_sub_ps(t, _mm256_mul_ps(n, _mm256_set1_ps(kC1))),
                                 _mm256_mul_ps(n, _mm256_set1_ps(kC2)));  // (E3)
  __m256 h = _mm256_set1_ps(kP0);                                         // (E4)
  h = _mm256_add_ps(_mm256_mul_ps(h, r), _mm256_set1_ps(kP1));
  h = _mm256_add_ps(_mm256_mul_ps(h, r), _mm256_set1_ps(kP2));
  h = _mm256_add_ps(_mm256_mul_ps(h, r), _mm256_set1_ps(kP3));
  h = _mm256_add_ps(_mm256_mul_ps(h, r), _mm256_set1_ps(kP4));
  h = _mm256_add_ps(_mm256_mul_ps(h, r), _mm256_set1_ps(kP5));
  const __m256 p = _mm256_add_ps(_mm256_add_ps(_mm256_mul_ps(h, _mm256_mul_ps(r, r)), r),
                                 _mm256_set1_ps(1.0f));  // (E5)
  const __m256i ni = _mm256_cvtps_epi32(n);              // n is integral (NaN: p is NaN anyway)
  const __m256i n1 = _mm256_srai_epi32(ni, 1);
  const __m256i n2 = _mm256_sub_epi32(ni, n1);
  return _mm256_mul_ps(_mm256_mul_ps(p, _mm256_castsi256_ps(pow2_bits(n1))),
                       _mm256_castsi256_ps(pow2_bits(n2)));  // (E6)
}

inline __m256 exp8(__m256 x) {
  const __m256 t = _mm256_max_ps(_mm256_set1_ps(kExpLo), x);  // (E1)
  return exp8_clamped(_mm256_min_ps(_mm256_set1_ps(kExpHi), t));
}

// exp of an argument that is <= 0 or NaN (Softmax's x_i − m): the upper clamp of (E1)
// is then the identity (vminps(89, t) returns t for t <= 89 and for NaN t) and is skipped.
inline __m256 exp8_nonpositive(__m256 x) { return exp8_clamped(_mm256_max_ps(_mm256_set1_ps(kExpLo), x)); }

inline __m256 abs8(__m256 x) { return _mm256_andnot_ps(_mm256_set1_ps(-0.0f), x); }

// |r| with the sign bit of x (std::copysign; r is never negative here).
inline __m256 copysign8(__m256 r, __m256 x) {
  const __m256 sign = _mm256_set1_ps(-0.0f);
  return _mm256_or_ps(_mm256_andnot_ps(sign, r), _mm256_and_ps(sign, x));
}

inline __m256 erf8(__m256 x) {
  const __m256 t = _mm256_min_ps(_mm256_set1_ps(kErfTMax), abs8(x));  // (F1); NaN: the second operand
  const __m256 s = _mm256_mul_ps(t, t);                               // (F2)
  __m256 p = _mm256_set1_ps(kErfA[0]);                                // (F3)
  for (int k = 1; k < 6; ++k) p = _mm256_add_ps(_mm256_mul_ps(p, s), _mm256_set1_ps(kErfA[k]));
  const __m256 small = _mm256_add_ps(_mm256_mul_ps(p, t), t);
  __m256 q = _mm256_set1_ps(kErfB[0]);  // (F4)
  for (int k = 1; k < 7; ++k) q = _mm256_add_ps(_mm256_mul_ps(q, t), _mm256_set1_ps(kErfB[k]));
  q = _mm256_add_ps(_mm256_mul_ps(q, t), t);
  const __m256 big = _mm256_sub_ps(_mm256_set1_ps(1.0f), exp8(_mm256_xor_ps(q, _mm256_set1_ps(-0.0f))));
  const __m256 is_big = _mm256_cmp_ps(t, _mm256_set1_ps(kErfSplit), _CMP_GT_OQ);
  return copysign8(_mm256_blendv_ps(small, big, is_big), x);  // (F5)
}

inline __m256 tanh8(__m256 x) {
  const __m256 t = abs8(x);  // (T1)
  const __m256 s = _mm256_mul_ps(t, t);
  __m256 p = _mm256_set1_ps(kTanhT[5]);  // (T2)
  for (int k = 4; k >= 0; --k) p = _mm256_add_ps(_mm256_mul_ps(p, s), _mm256_set1_ps(kTanhT[k]));
  const __m256 small = _mm256_add_ps(t, _mm256_mul_ps(t, _mm256_mul_ps(s, p)));
  const __m256 one = _mm256_set1_ps(1.0f);
  const __m256 e = exp8(_mm256_add_ps(t, t));  // (T3)
  const __m256 big = _mm256_sub_ps(one, _mm256_div_ps(_mm256_set1_ps(2.0f), _mm256_add_ps(e, one)));
  const __m256 is_small = _mm256_cmp_ps(t, _mm256_set1_ps(kTanhSplit), _CMP_LT_OQ);
  return copysign8(_mm256_blendv_ps(big, small, is_small), x);  // (T4)
}

inline __m256 sigmoid8(__m256 x) {
  const __m256 e = exp8(_mm256_or_ps(abs8(x), _mm256_set1_ps(-0.0f)));  // (Σ1)
  const __m256 d = _mm256_add_ps(_mm256_set1_ps(1.0f), e);
  const __m256 non_negative = _mm256_cmp_ps(x, _mm256_setzero_ps(), _CMP_GE_OQ);
  return _mm256_blendv_ps(_mm256_div_ps(e, d), _mm256_div_ps(_mm256_set1_ps(1.0f), d), non_negative);  // (Σ2)
}

inline __m256 relu8(__m256 x) {
  // vmaxps returns its second operand on equal zeros (+0, as np.maximum) and on NaN
  // (then x is put back).
  const __m256 y = _mm256_max_ps(x, _mm256_setzero_ps());
  return _mm256_blendv_ps(y, x, _mm256_cmp_ps(x, x, _CMP_UNORD_Q));
}

inline __m256 gelu8(__m256 x) {  // (G1)
  const __m256 e = erf8(_mm256_div_ps(x, _mm256_set1_ps(kGeluSqrt2)));
  return _mm256_mul_ps(_mm256_mul_ps(_mm256_set1_ps(0.5f), x), _mm256_add_ps(_mm256_set1_ps(1.0f), e));
}

inline __m256 gelu_tanh8(__m256 x) {  // (G2)
  const __m256 x3 = _mm256_mul_ps(_mm256_mul_ps(x, x), x);
  const __m256 a = _mm256_mul_ps(_mm256_set1_ps(kGeluK), _mm256_add_ps(x, _mm256_mul_ps(_mm256_set1_ps(kGeluC), x3)));
  return _mm256_mul_ps(_mm256_mul_ps(_mm256_set1_ps(0.5f), x), _mm256_add_ps(_mm256_set1_ps(1.0f), tanh8(a)));
}

template <__m256 (*f)(__m256)>
void unary_run(const float* x, float* y, int64_t n) {
  for (int64_t i = 0; i < n; i += 8) {
    const __m256i k = tail_mask8(n - i);
    _mm256_maskstore_ps(y + i, k, f(_mm256_maskload_ps(x + i, k)));
  }
}

// (R2)-(R3) from the two halves: lo + hi is the h = 8 step.
inline float tree16(__m256 lo, __m256 hi) {
  const __m256 a8 = _mm256_add_ps(lo, hi);
  const __m128 a4 = _mm_add_ps(_mm256_castps256_ps128(a8), _mm256_extractf128_ps(a8, 1));
  const __m128 a2 = _mm_add_ps(a4, _mm_movehl_ps(a4, a4));
  const __m128 a1 = _mm_add_ss(a2, _mm_movehdup_ps(a2));
  return _mm_cvtss_f32(a1);
}

inline float hmax(__m256 v) {  // max only selects (no NaN here): any order
  __m128 a = _mm_max_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
  a = _mm_max_ps(a, _mm_movehl_ps(a, a));
  a = _mm_max_ss(a, _mm_movehdup_ps(a));
  return _mm_cvtss_f32(a);
}

template <BinaryOp op>
inline __m256 binary8(__m256 a, __m256 b) {
  if constexpr (op == BinaryOp::kAdd) return _mm256_add_ps(a, b);
  if constexpr (op == BinaryOp::kSub) return _mm256_sub_ps(a, b);
  if constexpr (op == BinaryOp::kMul) return _mm256_mul_ps(a, b);
  return _mm256_div_ps(a, b);
}

template <BinaryOp op, int AS, int BS>
void binary_run_t(const float* a, const float* b, float* c, int64_t n) {
  const __m256 fa = _mm256_set1_ps(a[0]), fb = _mm256_set1_ps(b[0]);
  int64_t i = 0;
  for (; i + 8 <= n; i += 8) {
    const __m256 va = AS ? _mm256_loadu_ps(a + i) : fa;
    const __m256 vb = BS ? _mm256_loadu_ps(b + i) : fb;
    _mm256_storeu_ps(c + i, binary8<op>(va, vb));
  }
  for (; i < n; ++i) c[i] = binary_one<op>(AS ? a[i] : a[0], BS ? b[i] : b[0]);  // one IEEE op, as a lane
}

template <BinaryOp op>
void binary_run(const float* a, int64_t a_step, const float* b, int64_t b_step, float* c, int64_t n) {
  if (n <= 0) return;
  if (a_step && b_step) return binary_run_t<op, 1, 1>(a, b, c, n);
  if (a_step) return binary_run_t<op, 1, 0>(a, b, c, n);
  if (b_step) return binary_run_t<op, 0, 1>(a, b, c, n);
  return binary_run_t<op, 0, 0>(a, b, c, n);
}

void exp_run(const float* x, float* y, int64_t n) {
  for (int64_t i = 0; i < n; i += 8) {
    const __m256i k = tail_mask8(n - i);
    _mm256_maskstore_ps(y + i, k, exp8(_mm256_maskload_ps(x + i, k)));
  }
}

// One row, three passes while it is hot in L1: the maximum, exp with the sum (S3)
// accumulated on the fly (lo / hi: lanes 0–7 / 8–15 of each 16-block), then the product
// with r (S4)-(S5).
void softmax_row(const float* x, float* y, int64_t d) {
  const __m256 neg_inf = _mm256_set1_ps(-std::numeric_limits<float>::infinity());
  __m256 vm0 = neg_inf, vm1 = neg_inf;  // (S1); never NaN: max(x, m) keeps m for a NaN x
  int64_t i = 0;
  for (; i + 16 <= d; i += 16) {
    vm0 = _mm256_max_ps(_mm256_loadu_ps(x + i), vm0);
    vm1 = _mm256_max_ps(_mm256_loadu_ps(x + i + 8), vm1);
  }
  for (; i < d; i += 8) {
    const __m256i k = tail_mask8(d - i);
    const __m256 v = _mm256_blendv_ps(neg_inf, _mm256_maskload_ps(x + i, k), _mm256_castsi256_ps(k));
    vm0 = _mm256_max_ps(v, vm0);
  }
  const __m256 m = _mm256_set1_ps(hmax(_mm256_max_ps(vm1, vm0)));
  __m256 lo = _mm256_setzero_ps(), hi = _mm256_setzero_ps();
  for (i = 0; i + 16 <= d; i += 16) {
    const __m256 e0 = exp8_nonpositive(_mm256_sub_ps(_mm256_loadu_ps(x + i), m));  // (S2)
    const __m256 e1 = exp8_nonpositive(_mm256_sub_ps(_mm256_loadu_ps(x + i + 8), m));
    _mm256_storeu_ps(y + i, e0);
    _mm256_storeu_ps(y + i + 8, e1);
    lo = _mm256_add_ps(lo, e0);  // (S3), (R1): lanes 0–7 of the block
    hi = _mm256_add_ps(hi, e1);  // lanes 8–15
  }
  if (i < d) {  // the last, partial 16-block: masked lanes add +0
    const __m256i k0 = tail_mask8(d - i), k1 = tail_mask8(d - i - 8);
    const __m256 e0 =
        _mm256_and_ps(exp8_nonpositive(_mm256_sub_ps(_mm256_maskload_ps(x + i, k0), m)), _mm256_castsi256_ps(k0));
    const __m256 e1 =
        _mm256_and_ps(exp8_nonpositive(_mm256_sub_ps(_mm256_maskload_ps(x + i + 8, k1), m)), _mm256_castsi256_ps(k1));
    _mm256_maskstore_ps(y + i, k0, e0);
    _mm256_maskstore_ps(y + i + 8, k1, e1);
    lo = _mm256_add_ps(lo, e0);
    hi = _mm256_add_ps(hi, e1);
  }
  const __m256 r = _mm256_set1_ps(1.0f / tree16(lo, hi));                                             // (S4)
  for (i = 0; i + 8 <= d; i += 8) _mm256_storeu_ps(y + i, _mm256_mul_ps(_mm256_loadu_ps(y + i), r));  // (S5)
  if (i < d) {
    const __m256i k = tail_mask8(d - i);
    _mm256_maskstore_ps(y + i, k, _mm256_mul_ps(_mm256_maskload_ps(y + i, k), r));
  }
}

void softmax_rows(const float* x, float* y, int64_t rows, int64_t d) {
  for (int64_t r = 0; r < rows; ++r) softmax_row(x + r * d, y + r * d, d);
}

// (R1) over f(i) for the 16-blocks of one row: lo takes lanes 0–7, hi lanes 8–15; the
// values of lanes past d are masked to +0.
template <typename F>
inline float sum16(int64_t d, F&& f) {
  __m256 lo = _mm256_setzero_ps(), hi = _mm256_setzero_ps();
  for (int64_t i = 0; i < d; i += 16) {
    const __m256i k0 = tail_mask8(d - i), k1 = tail_mask8(d - i - 8);
    lo = _mm256_add_ps(lo, _mm256_and_ps(f(i, k0), _mm256_castsi256_ps(k0)));
    hi = _mm256_add_ps(hi, _mm256_and_ps(f(i + 8, k1), _mm256_castsi256_ps(k1)));
  }
  return tree16(lo, hi);
}

void layer_norm_rows(const float* x, float* y, int64_t rows, int64_t d, const float* scale, const float* bias,
                     float epsilon, float* mean_out, float* inv_std_out) {
  const float count = static_cast<float>(d);
  for (int64_t row = 0; row < rows; ++row) {
    const float* xr = x + row * d;
    float* yr = y + row * d;
    const float mean = sum16(d, [&](int64_t i, __m256i k) { return _mm256_maskload_ps(xr + i, k); }) / count;  // (L1)
    const __m256 vmean = _mm256_set1_ps(mean);
    const float var = sum16(d,
                            [&](int64_t i, __m256i k) {
                              const __m256 di = _mm256_sub_ps(_mm256_maskload_ps(xr + i, k), vmean);  // (L2)
                              return _mm256_mul_ps(di, di);
                            }) /
                      count;                                // (L3)
    const float inv_std = 1.0f / std::sqrt(var + epsilon);  // (L4)
    const __m256 vinv = _mm256_set1_ps(inv_std);
    for (int64_t i = 0; i < d; i += 8) {
      const __m256i k = tail_mask8(d - i);
      const __m256 di = _mm256_sub_ps(_mm256_maskload_ps(xr + i, k), vmean);
      __m256 v = _mm256_mul_ps(_mm256_mul_ps(di, vinv), _mm256_maskload_ps(scale + i, k));  // (L5)
      if (bias) v = _mm256_add_ps(v, _mm256_maskload_ps(bias + i, k));
      _mm256_maskstore_ps(yr + i, k, v);
    }
    if (mean_out) mean_out[row] = mean;
    if (inv_std_out) inv_std_out[row] = inv_std;
  }
}

}  // namespace

const Kernels kKernelsAvx2 = {
    "avx2",
    {binary_run<BinaryOp::kAdd>, binary_run<BinaryOp::kSub>, binary_run<BinaryOp::kMul>, binary_run<BinaryOp::kDiv>},
    exp_run,
    softmax_rows,
    layer_norm_rows,
    {unary_run<erf8>, unary_run<tanh8>, unary_run<sigmoid8>, unary_run<relu8>, unary_run<gelu8>, unary_run<gelu_tanh8>,
     unary_run<recurrent::logistic8>, unary_run<recurrent::tanh8>},  // by UnaryOp
};

}  // namespace float_ops
}  // namespace quanta
