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
#include "float_ops/ort_rows_scalar.h"
#include "float_ops/float_ops_scalar.h"
#include "float_ops/float_ops_simd.h"
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

// The lane functions of float_ops_simd.h on 8 lanes.
using simd::F32x8;

// F32x8 whose (E6) never computes with a subnormal: a result below FLT_MIN through the
// second product of (E6) costs a microcode assist (~100 cycles a vector on Zen 3), and a
// Softmax row whose padding the mask set to −FLT_MAX or −1e4 has x − m clamped to −104 in
// every masked lane (n = −150, the result 0). The bytes are scale_pow2's, rne(p · 2^n):
// - n ≥ −125: p ∈ [0.7, 1.42] (E5), so p · 2^n is normal and both products are F32x8's;
// - n ≤ −126: q = p · 2^(n+149) is exact (a power of two, q < 1.42 · 2^23), rne(q) is the
//   result in units of 2^−149 (the least subnormal), and that integer is its bit pattern
//   (also when it reaches 2^23: exponent field 1, FLT_MIN and above);
// - NaN n: the comparison is false, the first branch returns NaN as before.
// A vector without a lane at n ≤ −126 takes scale_pow2 unchanged (one compare and a
// movemask more).
struct F32x8NoSubnormal : F32x8 {
  static V scale_pow2(V p, V n) {
    const V cut = _mm256_set1_ps(-126.0f);
    const V sub = _mm256_cmp_ps(n, cut, _CMP_LE_OQ);
    if (_mm256_movemask_ps(sub) == 0) return F32x8::scale_pow2(p, n);
    const V y = F32x8::scale_pow2(p, _mm256_max_ps(_mm256_set1_ps(-125.0f), n));  // NaN n: second operand
    const __m256i e = _mm256_add_epi32(_mm256_cvttps_epi32(_mm256_min_ps(cut, n)), _mm256_set1_epi32(149));
    const V q = _mm256_mul_ps(p, _mm256_castsi256_ps(pow2_bits(e)));
    const __m256i units = _mm256_cvttps_epi32(_mm256_round_ps(q, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC));
    return _mm256_blendv_ps(y, _mm256_castsi256_ps(units), sub);
  }
};

// Fused: (EN1)-(EN6) (Kernels::softmax_fused), else (E1)-(E6).
template <bool Fused>
inline __m256 exp8_nonpositive(__m256 x) {
  return Fused ? exp_fused_nonpositive_v<F32x8NoSubnormal>(x) : exp_nonpositive_v<F32x8NoSubnormal>(x);
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

// One row, three passes while it is hot in L1: the maximum, exp with the sum (S3)
// accumulated on the fly (lo / hi: lanes 0–7 / 8–15 of each 16-block), then the product
// with r (S4)-(S5).
template <bool Fused>
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
    const __m256 e0 = exp8_nonpositive<Fused>(_mm256_sub_ps(_mm256_loadu_ps(x + i), m));  // (S2)
    const __m256 e1 = exp8_nonpositive<Fused>(_mm256_sub_ps(_mm256_loadu_ps(x + i + 8), m));
    _mm256_storeu_ps(y + i, e0);
    _mm256_storeu_ps(y + i + 8, e1);
    lo = _mm256_add_ps(lo, e0);  // (S3), (R1): lanes 0–7 of the block
    hi = _mm256_add_ps(hi, e1);  // lanes 8–15
  }
  if (i < d) {  // the last, partial 16-block: masked lanes add +0
    const __m256i k0 = tail_mask8(d - i), k1 = tail_mask8(d - i - 8);
    const __m256 e0 = _mm256_and_ps(exp8_nonpositive<Fused>(_mm256_sub_ps(_mm256_maskload_ps(x + i, k0), m)),
                                    _mm256_castsi256_ps(k0));
    const __m256 e1 = _mm256_and_ps(exp8_nonpositive<Fused>(_mm256_sub_ps(_mm256_maskload_ps(x + i + 8, k1), m)),
                                    _mm256_castsi256_ps(k1));
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

template <bool Fused>
void softmax_rows(const float* x, float* y, int64_t rows, int64_t d) {
  for (int64_t r = 0; r < rows; ++r) softmax_row<Fused>(x + r * d, y + r * d, d);
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

// (L1c) with the row's range from 8-wide min / max over the whole blocks and a scalar tail.
inline float clamp_range(const float* xr, int64_t d, float mean) {
  if (d <= 0) return mean;
  __m256 vlo = _mm256_set1_ps(xr[0]), vhi = vlo;
  int64_t i = 0;
  for (; i + 8 <= d; i += 8) {
    const __m256 v = _mm256_loadu_ps(xr + i);
    vlo = _mm256_min_ps(vlo, v);
    vhi = _mm256_max_ps(vhi, v);
  }
  alignas(32) float l[8], h[8];
  _mm256_store_ps(l, vlo);
  _mm256_store_ps(h, vhi);
  float lo = l[0], hi = h[0];
  for (int j = 1; j < 8; ++j) {
    lo = l[j] < lo ? l[j] : lo;
    hi = h[j] > hi ? h[j] : hi;
  }
  for (; i < d; ++i) {
    lo = xr[i] < lo ? xr[i] : lo;
    hi = xr[i] > hi ? xr[i] : hi;
  }
  return clamp_to(mean, lo, hi);
}

void layer_norm_rows(const float* x, float* y, int64_t rows, int64_t d, const float* scale, const float* bias,
                     float epsilon, float* mean_out, float* inv_std_out, bool divide, bool rms) {
  const float count = static_cast<float>(d);
  for (int64_t row = 0; row < rows; ++row) {
    const float* xr = x + row * d;
    float* yr = y + row * d;
    const float mean = rms ? 0.0f : clamp_range(xr, d, sum16(d, [&](int64_t i, __m256i k) {
                                                         return _mm256_maskload_ps(xr + i, k);
                                                       }) / count);  // (L1r), (L1), (L1c)
    const __m256 vmean = _mm256_set1_ps(mean);
    const float var = sum16(d,
                            [&](int64_t i, __m256i k) {
                              const __m256 di = _mm256_sub_ps(_mm256_maskload_ps(xr + i, k), vmean);  // (L2)
                              return _mm256_mul_ps(di, di);
                            }) /
                      count;                                                                      // (L3)
    const float std_dev = std::sqrt(var + epsilon);                                               // (L4), (L4')
    const float inv_std = 1.0f / std_dev;                                                         // (L4)
    layer_norm_scale_v<F32x8>(xr, yr, d, mean, divide ? std_dev : inv_std, scale, bias, divide);  // (L5), (L5')
    if (mean_out) mean_out[row] = mean;
    if (inv_std_out) inv_std_out[row] = inv_std;
  }
}

// float32 -> float16 by F16C's vcvtps2ph (round to nearest even); the tail and a vector
// holding a NaN go lane by lane (NumPy's payload, float_ops.h "half").
void to_half_run(const float* x, uint16_t* y, int64_t n) {
  int64_t i = 0;
  for (; i + 8 <= n; i += 8) {
    const __m256 v = _mm256_loadu_ps(x + i);
    _mm_storeu_si128(reinterpret_cast<__m128i*>(y + i), _mm256_cvtps_ph(v, _MM_FROUND_TO_NEAREST_INT));
    if (_mm256_movemask_ps(_mm256_cmp_ps(v, v, _CMP_UNORD_Q)) != 0) {
      for (int64_t j = i; j < i + 8; ++j) y[j] = half_from_f32(x[j]);
    }
  }
  for (; i < n; ++i) y[i] = half_from_f32(x[i]);
}

// float16 -> float32 by F16C's vcvtph2ps (exact); NaN lanes redone for NumPy's quiet bit.
void from_half_run(const uint16_t* x, float* y, int64_t n) {
  int64_t i = 0;
  for (; i + 8 <= n; i += 8) {
    const __m128i h = _mm_loadu_si128(reinterpret_cast<const __m128i*>(x + i));
    _mm256_storeu_ps(y + i, _mm256_cvtph_ps(h));
    const __m128i nan = _mm_cmpgt_epi16(_mm_andnot_si128(_mm_set1_epi16(-0x8000), h), _mm_set1_epi16(0x7C00));
    if (_mm_movemask_epi8(nan) != 0) {
      for (int64_t j = i; j < i + 8; ++j) y[j] = half_to_f32(x[j]);
    }
  }
  for (; i < n; ++i) y[i] = half_to_f32(x[i]);
}

// ---- ONNX Runtime's rows (float_ops.h mlas_softmax, ort_layer_norm): ort::'s scalar
// operations lane by lane, in ORT's AVX2 host's lane layout ------------------------------

// (SM2) on 8 lanes: ort::sum_exp_one's operations
__m256 ort_sum_exp8(__m256 v) {
  const __m256 t = _mm256_max_ps(_mm256_set1_ps(ort::kExpLower), v);  // v when NaN
  const __m256 b = _mm256_fmadd_ps(t, _mm256_set1_ps(ort::kExpLog2e), _mm256_set1_ps(ort::kExpBias));
  const __m256 m = _mm256_sub_ps(b, _mm256_set1_ps(ort::kExpBias));
  __m256 r = _mm256_fmadd_ps(m, _mm256_set1_ps(ort::kExpLn2Hi), t);
  r = _mm256_fmadd_ps(m, _mm256_set1_ps(ort::kExpLn2Lo), r);
  __m256 p = _mm256_fmadd_ps(_mm256_set1_ps(ort::kExpP0), r, _mm256_set1_ps(ort::kExpP1));
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(ort::kExpP2));
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(ort::kExpP3));
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(ort::kExpP4));
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.0f));
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.0f));
  const __m256i e = _mm256_add_epi32(_mm256_slli_epi32(_mm256_castps_si256(b), 23),
                                     _mm256_set1_epi32(static_cast<int>(ort::kExpOne)));
  return _mm256_mul_ps(p, _mm256_castsi256_ps(e));
}

void mlas_softmax_rows(const float* x, float* y, int64_t rows, int64_t d) {
  for (int64_t row = 0; row < rows; ++row) {
    const float* xr = x + row * d;
    float* yr = y + row * d;
    __m256 vm = _mm256_set1_ps(std::numeric_limits<float>::lowest());
    int64_t i = 0;
    for (; i + 8 <= d; i += 8) vm = _mm256_max_ps(_mm256_loadu_ps(xr + i), vm);  // a NaN x keeps vm
    alignas(32) float l[8];
    _mm256_store_ps(l, vm);
    float m = std::numeric_limits<float>::lowest();  // (SM1)
    for (int j = 0; j < 8; ++j) m = ort::max_skip_nan(m, l[j]);
    for (; i < d; ++i) m = ort::max_skip_nan(m, xr[i]);
    const float neg = -m;
    const __m256 vneg = _mm256_set1_ps(neg);
    __m256 acc = _mm256_setzero_ps();
    for (i = 0; i + 8 <= d; i += 8) {
      const __m256 e = ort_sum_exp8(_mm256_add_ps(_mm256_loadu_ps(xr + i), vneg));  // (SM2)
      _mm256_storeu_ps(yr + i, e);
      acc = _mm256_add_ps(acc, e);  // (SM3)
    }
    _mm256_store_ps(l, acc);
    for (int j = 0; i < d; ++i, ++j) {  // the masked last vector
      yr[i] = ort::sum_exp_one(xr[i] + neg);
      l[j] = l[j] + yr[i];
    }
    const __m256 r = _mm256_set1_ps(1.0f / ort::sum8_pairs(l));                                           // (SM4)
    for (i = 0; i + 8 <= d; i += 8) _mm256_storeu_ps(yr + i, _mm256_mul_ps(_mm256_loadu_ps(yr + i), r));  // (SM5)
    const float rs = _mm256_cvtss_f32(r);
    for (; i < d; ++i) yr[i] *= rs;
  }
}

// (OL3) of v(i) = x_i − c (c = +0 not subtracted: the simplified kernel squares x_i)
template <bool Centred>
float ort_square_sum8(const float* xr, int64_t d, float c) {
  const __m256 vc = _mm256_set1_ps(c);
  __m256 q = _mm256_setzero_ps();
  int64_t i = 0;
  for (; i + 8 <= d; i += 8) {
    const __m256 v = Centred ? _mm256_sub_ps(_mm256_loadu_ps(xr + i), vc) : _mm256_loadu_ps(xr + i);
    q = _mm256_fmadd_ps(v, v, q);
  }
  alignas(32) float ql[8];
  _mm256_store_ps(ql, q);
  float s = ort::sum8_halves(ql);
  if (d - i >= 4) {
    for (const int64_t end = i + 4; i < end; ++i) {
      const float v = Centred ? xr[i] - c : xr[i];
      s = s + v * v;
    }
  }
  for (; i < d; ++i) {
    const float v = Centred ? xr[i] - c : xr[i];
    s = std::fma(v, v, s);
  }
  return s;
}

// (OL1) on 4 float64 lanes
float ort_mean_f64(const float* xr, int64_t d) {
  __m256d acc = _mm256_setzero_pd();
  int64_t i = 0;
  for (; i + 4 <= d; i += 4) acc = _mm256_add_pd(acc, _mm256_cvtps_pd(_mm_loadu_ps(xr + i)));
  alignas(32) double l[4];
  _mm256_store_pd(l, acc);
  double s = (l[0] + l[2]) + (l[1] + l[3]);
  for (; i < d; ++i) s = s + static_cast<double>(xr[i]);
  return static_cast<float>(s / static_cast<double>(d));
}

void ort_layer_norm_rows(const float* x, float* y, int64_t rows, int64_t d, const float* scale, const float* bias,
                         float eps, OrtNormKernel kernel) {
  const float count = static_cast<float>(d);
  for (int64_t row = 0; row < rows; ++row) {
    const float* xr = x + row * d;
    float* yr = y + row * d;
    if (kernel == OrtNormKernel::kSimplified) {
      if (d < ort::kSimplifiedAvx2From) {
        ort::simplified_short_row(xr, yr, d, scale, eps);  // (OL7)
        continue;
      }
      const float inv = 1.0f / std::sqrt(ort_square_sum8<false>(xr, d, 0.0f) / count + eps);  // (OL6)
      const __m256 vinv = _mm256_set1_ps(inv);
      int64_t i = 0;
      for (; i + 8 <= d; i += 8) {
        const __m256 t = _mm256_mul_ps(vinv, _mm256_loadu_ps(xr + i));
        _mm256_storeu_ps(yr + i, _mm256_mul_ps(t, _mm256_loadu_ps(scale + i)));
      }
      for (; i < d; ++i) yr[i] = (inv * xr[i]) * scale[i];
      continue;
    }
    if (kernel == OrtNormKernel::kSkip || d < ort::kLayerNormAvx2From) {
      ort::welford_row(xr, yr, d, scale, bias, eps);  // (OL8), (OL9)
      continue;
    }
    const float mean = ort_mean_f64(xr, d);                                                // (OL1)
    const float inv = 1.0f / std::sqrt(ort_square_sum8<true>(xr, d, mean) / count + eps);  // (OL2)-(OL4)
    const __m256 vmean = _mm256_set1_ps(mean), vinv = _mm256_set1_ps(inv);
    int64_t i = 0;
    for (; i + 8 <= d; i += 8) {
      const __m256 t = _mm256_mul_ps(_mm256_sub_ps(_mm256_loadu_ps(xr + i), vmean), vinv);
      const __m256 sc = _mm256_loadu_ps(scale + i);
      _mm256_storeu_ps(yr + i,
                       bias ? _mm256_fmadd_ps(t, sc, _mm256_loadu_ps(bias + i)) : _mm256_mul_ps(t, sc));  // (OL5)
    }
    for (; i < d; ++i) {
      const float t = (xr[i] - mean) * inv;
      yr[i] = bias ? std::fma(t, scale[i], bias[i]) : t * scale[i];
    }
  }
}

}  // namespace

const Kernels& kernels_avx2() {
  static const Kernels k = [] {
    Kernels t = simd_kernels<F32x8>("avx2", softmax_rows<false>, softmax_rows<true>, layer_norm_rows, to_half_run,
                                    from_half_run);
    t.mlas_softmax = mlas_softmax_rows;
    t.ort_layer_norm = ort_layer_norm_rows;
    t.mlas_softmax_avx512f = ort::softmax_rows_avx512f;  // the 16-lane order, one element at a time
    return t;
  }();
  return k;
}

}  // namespace float_ops
}  // namespace quanta
