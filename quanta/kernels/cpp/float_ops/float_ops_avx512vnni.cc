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

namespace quanta {
namespace float_ops {
namespace {

inline __mmask16 tail_mask(int64_t left) {
  return left >= 16 ? static_cast<__mmask16>(0xffff) : static_cast<__mmask16>((1u << left) - 1u);
}

inline __m512i pow2_bits(__m512i k) { return _mm512_slli_epi32(_mm512_add_epi32(k, _mm512_set1_epi32(127)), 23); }

inline __m512 exp16(__m512 x) {
  __m512 t = _mm512_max_ps(_mm512_set1_ps(kExpLo), x);  // (E1)
  t = _mm512_min_ps(_mm512_set1_ps(kExpHi), t);
  const __m512 n = _mm512_roundscale_ps(_mm512_mul_ps(t, _mm512_set1_ps(kL2E)),
                                        _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);  // (E2)
  const __m512 r = _mm512_sub_ps(_mm512_sub_ps(t, _mm512_mul_ps(n, _mm512_set1_ps(kC1))),
                                 _mm512_mul_ps(n, _mm512_set1_ps(kC2)));  // (E3)
  __m512 h = _mm512_set1_ps(kP0);  // (E4)
  h = _mm512_add_ps(_mm512_mul_ps(h, r), _mm512_set1_ps(kP1));
  h = _mm512_add_ps(_mm512_mul_ps(h, r), _mm512_set1_ps(kP2));
  h = _mm512_add_ps(_mm512_mul_ps(h, r), _mm512_set1_ps(kP3));
  h = _mm512_add_ps(_mm512_mul_ps(h, r), _mm512_set1_ps(kP4));
  h = _mm512_add_ps(_mm512_mul_ps(h, r), _mm512_set1_ps(kP5));
  const __m512 p = _mm512_add_ps(_mm512_add_ps(_mm512_mul_ps(h, _mm512_mul_ps(r, r)), r),
                                 _mm512_set1_ps(1.0f));  // (E5)
  const __m512i ni = _mm512_cvtps_epi32(n);  // n is integral (NaN: p is NaN anyway)
  const __m512i n1 = _mm512_srai_epi32(ni, 1);
  const __m512i n2 = _mm512_sub_epi32(ni, n1);
  return _mm512_mul_ps(_mm512_mul_ps(p, _mm512_castsi512_ps(pow2_bits(n1))),
                       _mm512_castsi512_ps(pow2_bits(n2)));  // (E6)
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

void softmax_row(const float* x, float* y, int64_t d) {
  const __m512 neg_inf = _mm512_set1_ps(-std::numeric_limits<float>::infinity());
  __m512 vm = neg_inf;  // (S1)
  for (int64_t i = 0; i < d; i += 16) {
    vm = _mm512_max_ps(_mm512_mask_loadu_ps(neg_inf, tail_mask(d - i), x + i), vm);
  }
  const __m512 m = _mm512_set1_ps(_mm512_reduce_max_ps(vm));  // max only selects: any order
  __m512 acc = _mm512_setzero_ps();
  for (int64_t i = 0; i < d; i += 16) {
    const __mmask16 k = tail_mask(d - i);
    const __m512 e = exp16(_mm512_sub_ps(_mm512_maskz_loadu_ps(k, x + i), m));  // (S2)
    _mm512_mask_storeu_ps(y + i, k, e);
    acc = _mm512_mask_add_ps(acc, k, acc, e);  // (S3), (R1)
  }
  const __m512 s = _mm512_set1_ps(tree16(acc));
  for (int64_t i = 0; i < d; i += 16) {
    const __mmask16 k = tail_mask(d - i);
    _mm512_mask_storeu_ps(y + i, k, _mm512_div_ps(_mm512_maskz_loadu_ps(k, y + i), s));  // (S4)
  }
}

void softmax_rows(const float* x, float* y, int64_t rows, int64_t d) {
  for (int64_t r = 0; r < rows; ++r) softmax_row(x + r * d, y + r * d, d);
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
    const float var = tree16(acc) / count;                 // (L3)
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
    {binary_run<BinaryOp::kAdd>, binary_run<BinaryOp::kSub>, binary_run<BinaryOp::kMul>,
     binary_run<BinaryOp::kDiv>},
    exp_run,
    softmax_rows,
    layer_norm_rows,
};

}  // namespace float_ops
}  // namespace quanta
