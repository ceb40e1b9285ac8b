// AVX-512 float_ops, 16 lanes per step with masked tails (no scalar epilogue). Each lane
// performs the float32 operations of float_ops_scalar.h in the same order; the 16 lanes
// of one zmm accumulator are the 16 lanes of sum16 (R1), and tree16 below is (R2).
//
// Operand order matters for NaN: vmaxps / vminps return their SECOND operand when either
// is NaN, so (E1) is max(lo, t) then min(hi, t) (a NaN t stays NaN) and the row maximum is
// max(x, m) (a NaN x leaves m unchanged: (S1) skips NaN).
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

inline __mmask16 tail_mask(int64_t left) {
  return left >= 16 ? static_cast<__mmask16>(0xffff) : static_cast<__mmask16>((1u << left) - 1u);
}

// (E2)-(E6) from the clamped argument t of (E1).
//
// (E6) is one vscalefps: p · 2^n rounded once (n is integral), which is the bytes of the
// two products of (E6): with n in [−150, 128] both halves 2^n1, 2^n2 are normal, the
// first product is exact and the second rounds once, so both give rne(p · 2^n), for
// subnormal and overflowing results too (FTZ/DAZ off, as everywhere here). NaN n or p:
// NaN. (Checked exhaustively over every float32 against the portable exp_one.)
inline __m512 exp16_clamped(__m512 t) {
  const __m512 n = _mm512_roundscale_ps(_mm512_mul_ps(t, _mm512_set1_ps(kL2E)),
                                        _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);  // (E2)
  const __m512 r = _mm512_sub_ps(_mm512_sub_ps(t, _mm512_mul_ps(n, _mm512_set1_ps(kC1))),
                                 _mm512_mul_ps(n, _mm512_set1_ps(kC2)));  // (E3)
  __m512 h = _mm512_set1_ps(kP0);                                         // (E4)
  h = _mm512_add_ps(_mm512_mul_ps(h, r), _mm512_set1_ps(kP1));
  h = _mm512_add_ps(_mm512_mul_ps(h, r), _mm512_set1_ps(kP2));
  h = _mm512_add_ps(_mm512_mul_ps(h, r), _mm512_set1_ps(kP3));
  h = _mm512_add_ps(_mm512_mul_ps(h, r), _mm512_set1_ps(kP4));
  h = _mm512_add_ps(_mm512_mul_ps(h, r), _mm512_set1_ps(kP5));
  const __m512 p = _mm512_add_ps(_mm512_add_ps(_mm512_mul_ps(h, _mm512_mul_ps(r, r)), r),
                                 _mm512_set1_ps(1.0f));  // (E5)
  return _mm512_scalef_ps(p, n);                         // (E6)
}

inline __m512 exp16(__m512 x) {
  const __m512 t = _mm512_max_ps(_mm512_set1_ps(kExpLo), x);  // (E1)
  return exp16_clamped(_mm512_min_ps(_mm512_set1_ps(kExpHi), t));
}

// exp of an argument that is <= 0 or NaN (Softmax's x_i − m): the upper clamp of (E1)
// is then the identity (vminps(89, t) returns t for t <= 89 and for NaN t) and is skipped.
inline __m512 exp16_nonpositive(__m512 x) { return exp16_clamped(_mm512_max_ps(_mm512_set1_ps(kExpLo), x)); }

inline __m512 abs16(__m512 x) { return _mm512_andnot_ps(_mm512_set1_ps(-0.0f), x); }

// |r| with the sign bit of x (std::copysign; r is never negative here).
inline __m512 copysign16(__m512 r, __m512 x) {
  const __m512 sign = _mm512_set1_ps(-0.0f);
  return _mm512_or_ps(_mm512_andnot_ps(sign, r), _mm512_and_ps(sign, x));
}

inline __m512 erf16(__m512 x) {
  const __m512 t = _mm512_min_ps(_mm512_set1_ps(kErfTMax), abs16(x));  // (F1); NaN: the second operand
  const __m512 s = _mm512_mul_ps(t, t);                                // (F2)
  __m512 p = _mm512_set1_ps(kErfA[0]);                                 // (F3)
  for (int k = 1; k < 6; ++k) p = _mm512_add_ps(_mm512_mul_ps(p, s), _mm512_set1_ps(kErfA[k]));
  const __m512 small = _mm512_add_ps(_mm512_mul_ps(p, t), t);
  __m512 q = _mm512_set1_ps(kErfB[0]);  // (F4)
  for (int k = 1; k < 7; ++k) q = _mm512_add_ps(_mm512_mul_ps(q, t), _mm512_set1_ps(kErfB[k]));
  q = _mm512_add_ps(_mm512_mul_ps(q, t), t);
  const __m512 big = _mm512_sub_ps(_mm512_set1_ps(1.0f), exp16(_mm512_xor_ps(q, _mm512_set1_ps(-0.0f))));
  const __mmask16 is_big = _mm512_cmp_ps_mask(t, _mm512_set1_ps(kErfSplit), _CMP_GT_OQ);
  return copysign16(_mm512_mask_blend_ps(is_big, small, big), x);  // (F5)
}

inline __m512 tanh16(__m512 x) {
  const __m512 t = abs16(x);  // (T1)
  const __m512 s = _mm512_mul_ps(t, t);
  __m512 p = _mm512_set1_ps(kTanhT[5]);  // (T2)
  for (int k = 4; k >= 0; --k) p = _mm512_add_ps(_mm512_mul_ps(p, s), _mm512_set1_ps(kTanhT[k]));
  const __m512 small = _mm512_add_ps(t, _mm512_mul_ps(t, _mm512_mul_ps(s, p)));
  const __m512 one = _mm512_set1_ps(1.0f);
  const __m512 e = exp16(_mm512_add_ps(t, t));  // (T3)
  const __m512 big = _mm512_sub_ps(one, _mm512_div_ps(_mm512_set1_ps(2.0f), _mm512_add_ps(e, one)));
  const __mmask16 is_small = _mm512_cmp_ps_mask(t, _mm512_set1_ps(kTanhSplit), _CMP_LT_OQ);
  return copysign16(_mm512_mask_blend_ps(is_small, big, small), x);  // (T4)
}

inline __m512 sigmoid16(__m512 x) {
  const __m512 e = exp16(_mm512_or_ps(abs16(x), _mm512_set1_ps(-0.0f)));  // (Σ1)
  const __m512 d = _mm512_add_ps(_mm512_set1_ps(1.0f), e);
  const __mmask16 non_negative = _mm512_cmp_ps_mask(x, _mm512_setzero_ps(), _CMP_GE_OQ);
  return _mm512_mask_blend_ps(non_negative, _mm512_div_ps(e, d), _mm512_div_ps(_mm512_set1_ps(1.0f), d));  // (Σ2)
}

inline __m512 relu16(__m512 x) {
  // vmaxps returns its second operand on equal zeros (+0, as np.maximum) and on NaN
  // (then x is put back).
  const __m512 y = _mm512_max_ps(x, _mm512_setzero_ps());
  return _mm512_mask_mov_ps(y, _mm512_cmp_ps_mask(x, x, _CMP_UNORD_Q), x);
}

inline __m512 gelu16(__m512 x) {  // (G1)
  const __m512 e = erf16(_mm512_div_ps(x, _mm512_set1_ps(kGeluSqrt2)));
  return _mm512_mul_ps(_mm512_mul_ps(_mm512_set1_ps(0.5f), x), _mm512_add_ps(_mm512_set1_ps(1.0f), e));
}

inline __m512 gelu_tanh16(__m512 x) {  // (G2)
  const __m512 x3 = _mm512_mul_ps(_mm512_mul_ps(x, x), x);
  const __m512 a = _mm512_mul_ps(_mm512_set1_ps(kGeluK), _mm512_add_ps(x, _mm512_mul_ps(_mm512_set1_ps(kGeluC), x3)));
  return _mm512_mul_ps(_mm512_mul_ps(_mm512_set1_ps(0.5f), x), _mm512_add_ps(_mm512_set1_ps(1.0f), tanh16(a)));
}

template <__m512 (*f)(__m512)>
void unary_run(const float* x, float* y, int64_t n) {
  for (int64_t i = 0; i < n; i += 16) {
    const __mmask16 k = tail_mask(n - i);
    _mm512_mask_storeu_ps(y + i, k, f(_mm512_maskz_loadu_ps(k, x + i)));
  }
}

// (R2)-(R3): lanes j and j + 8, then j and j + 4, j + 2, j + 1 (not _mm512_reduce_add_ps,
// whose order is unspecified).
inline float tree16(__m512 acc) {
  const __m256 a8 = _mm256_add_ps(_mm512_castps512_ps256(acc), _mm512_extractf32x8_ps(acc, 1));
  const __m128 a4 = _mm_add_ps(_mm256_castps256_ps128(a8), _mm256_extractf128_ps(a8, 1));
  const __m128 a2 = _mm_add_ps(a4, _mm_movehl_ps(a4, a4));
  const __m128 a1 = _mm_add_ss(a2, _mm_movehdup_ps(a2));
  return _mm_cvtss_f32(a1);
}

template <BinaryOp op>
inline __m512 binary16(__m512 a, __m512 b) {
  if constexpr (op == BinaryOp::kAdd) return _mm512_add_ps(a, b);
  if constexpr (op == BinaryOp::kSub) return _mm512_sub_ps(a, b);
  if constexpr (op == BinaryOp::kMul) return _mm512_mul_ps(a, b);
  return _mm512_div_ps(a, b);
}

template <BinaryOp op, int AS, int BS>
void binary_run_t(const float* a, const float* b, float* c, int64_t n) {
  const __m512 fa = _mm512_set1_ps(a[0]), fb = _mm512_set1_ps(b[0]);
  int64_t i = 0;
  for (; i + 16 <= n; i += 16) {
    const __m512 va = AS ? _mm512_loadu_ps(a + i) : fa;
    const __m512 vb = BS ? _mm512_loadu_ps(b + i) : fb;
    _mm512_storeu_ps(c + i, binary16<op>(va, vb));
  }
  if (i < n) {
    const __mmask16 k = tail_mask(n - i);
    const __m512 va = AS ? _mm512_maskz_loadu_ps(k, a + i) : fa;
    const __m512 vb = BS ? _mm512_maskz_loadu_ps(k, b + i) : fb;
    _mm512_mask_storeu_ps(c + i, k, binary16<op>(va, vb));
  }
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
  for (int64_t i = 0; i < n; i += 16) {
    const __mmask16 k = tail_mask(n - i);
    _mm512_mask_storeu_ps(y + i, k, exp16(_mm512_maskz_loadu_ps(k, x + i)));
  }
}

// R rows in lockstep, three passes while they are hot in L1: the maximum, exp with the sum
// (S3) accumulated on the fly (one zmm accumulator per row: the 16 lanes of (R1)), then
// the product with r (S4)-(S5). The R rows' dependency chains (max, exp, sum, 1/s) are
// independent, which hides their latency on short rows (D = 128: 8 vectors per pass).
// Each row gets the same instructions whatever R is.
template <int R>
void softmax_rows_lockstep(const float* x, float* y, int64_t d) {
  const __m512 neg_inf = _mm512_set1_ps(-std::numeric_limits<float>::infinity());
  __m512 vm[R];  // (S1); never NaN: max(x, m) keeps m for a NaN x
  for (int j = 0; j < R; ++j) vm[j] = neg_inf;
  int64_t i = 0;
  for (; i + 16 <= d; i += 16) {
    for (int j = 0; j < R; ++j) vm[j] = _mm512_max_ps(_mm512_loadu_ps(x + j * d + i), vm[j]);
  }
  const __mmask16 k = tail_mask(d - i);  // the last, partial block (none when i == d)
  if (i < d) {
    for (int j = 0; j < R; ++j) vm[j] = _mm512_max_ps(_mm512_mask_loadu_ps(neg_inf, k, x + j * d + i), vm[j]);
  }
  __m512 m[R], acc[R];
  for (int j = 0; j < R; ++j) {
    m[j] = _mm512_set1_ps(_mm512_reduce_max_ps(vm[j]));  // max only selects: any order
    acc[j] = _mm512_setzero_ps();
  }
  for (i = 0; i + 16 <= d; i += 16) {
    for (int j = 0; j < R; ++j) {
      const __m512 e = exp16_nonpositive(_mm512_sub_ps(_mm512_loadu_ps(x + j * d + i), m[j]));  // (S2)
      _mm512_storeu_ps(y + j * d + i, e);
      acc[j] = _mm512_add_ps(acc[j], e);  // (S3), (R1)
    }
  }
  if (i < d) {
    for (int j = 0; j < R; ++j) {
      const __m512 e = exp16_nonpositive(_mm512_sub_ps(_mm512_maskz_loadu_ps(k, x + j * d + i), m[j]));
      _mm512_mask_storeu_ps(y + j * d + i, k, e);
      acc[j] = _mm512_mask_add_ps(acc[j], k, acc[j], e);  // lanes past d add nothing
    }
  }
  __m512 r[R];
  for (int j = 0; j < R; ++j) r[j] = _mm512_set1_ps(1.0f / tree16(acc[j]));  // (S4)
  for (i = 0; i + 16 <= d; i += 16) {
    for (int j = 0; j < R; ++j) {
      float* yj = y + j * d + i;
      _mm512_storeu_ps(yj, _mm512_mul_ps(_mm512_loadu_ps(yj), r[j]));  // (S5)
    }
  }
  if (i < d) {
    for (int j = 0; j < R; ++j) {
      float* yj = y + j * d + i;
      _mm512_mask_storeu_ps(yj, k, _mm512_mul_ps(_mm512_maskz_loadu_ps(k, yj), r[j]));
    }
  }
}

// Rows of up to kLockstepMaxD elements go four at a time (their chains interleave); longer
// rows have enough independent work within the row.
constexpr int64_t kLockstepMaxD = 2048;

void softmax_rows(const float* x, float* y, int64_t rows, int64_t d) {
  int64_t row = 0;
  if (d <= kLockstepMaxD) {
    for (; row + 4 <= rows; row += 4) softmax_rows_lockstep<4>(x + row * d, y + row * d, d);
  }
  for (; row < rows; ++row) softmax_rows_lockstep<1>(x + row * d, y + row * d, d);
}

void layer_norm_rows(const float* x, float* y, int64_t rows, int64_t d, const float* scale, const float* bias,
                     float epsilon, float* mean_out, float* inv_std_out) {
  const float count = static_cast<float>(d);
  for (int64_t row = 0; row < rows; ++row) {
    const float* xr = x + row * d;
    float* yr = y + row * d;
    __m512 acc = _mm512_setzero_ps();
    for (int64_t i = 0; i < d; i += 16) {
      const __mmask16 k = tail_mask(d - i);
      acc = _mm512_mask_add_ps(acc, k, acc, _mm512_maskz_loadu_ps(k, xr + i));
    }
    const float mean = tree16(acc) / count;  // (L1)
    const __m512 vmean = _mm512_set1_ps(mean);
    acc = _mm512_setzero_ps();
    for (int64_t i = 0; i < d; i += 16) {
      const __mmask16 k = tail_mask(d - i);
      const __m512 di = _mm512_sub_ps(_mm512_maskz_loadu_ps(k, xr + i), vmean);  // (L2)
      acc = _mm512_mask_add_ps(acc, k, acc, _mm512_mul_ps(di, di));
    }
    const float var = tree16(acc) / count;                  // (L3)
    const float inv_std = 1.0f / std::sqrt(var + epsilon);  // (L4)
    const __m512 vinv = _mm512_set1_ps(inv_std);
    for (int64_t i = 0; i < d; i += 16) {
      const __mmask16 k = tail_mask(d - i);
      const __m512 di = _mm512_sub_ps(_mm512_maskz_loadu_ps(k, xr + i), vmean);
      __m512 v = _mm512_mul_ps(_mm512_mul_ps(di, vinv), _mm512_maskz_loadu_ps(k, scale + i));  // (L5)
      if (bias) v = _mm512_add_ps(v, _mm512_maskz_loadu_ps(k, bias + i));
      _mm512_mask_storeu_ps(yr + i, k, v);
    }
    if (mean_out) mean_out[row] = mean;
    if (inv_std_out) inv_std_out[row] = inv_std;
  }
}

}  // namespace

const Kernels kKernelsAvx512Vnni = {
    "avx512vnni",
    {binary_run<BinaryOp::kAdd>, binary_run<BinaryOp::kSub>, binary_run<BinaryOp::kMul>, binary_run<BinaryOp::kDiv>},
    exp_run,
    softmax_rows,
    layer_norm_rows,
    {unary_run<erf16>, unary_run<tanh16>, unary_run<sigmoid16>, unary_run<relu16>, unary_run<gelu16>,
     unary_run<gelu_tanh16>, unary_run<recurrent::logistic16>, unary_run<recurrent::tanh16>},  // by UnaryOp
};

}  // namespace float_ops
}  // namespace quanta
