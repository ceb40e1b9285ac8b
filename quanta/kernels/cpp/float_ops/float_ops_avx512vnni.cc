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
#include "float_ops/float_ops_simd.h"
#include "float_ops/ort_rows_scalar.h"
#include "recurrent/mlas_simd.h"

namespace quanta {
namespace float_ops {
namespace {

inline __mmask16 tail_mask(int64_t left) {
  return left >= 16 ? static_cast<__mmask16>(0xffff) : static_cast<__mmask16>((1u << left) - 1u);
}

// The lane functions of float_ops_simd.h on 16 lanes ((E6) is one vscalefps: simd.h).
using simd::F32x16;
inline __m512 exp16_nonpositive(__m512 x) { return exp_nonpositive_v<F32x16>(x); }
template <bool Fused>
inline __m512 exp16(__m512 x) {
  return Fused ? exp_fused_nonpositive_v<F32x16>(x) : exp16_nonpositive(x);
}

// (R2)-(R3): simd.h's F32x16::tree16
inline float tree16(__m512 acc) { return simd::F32x16::tree16(acc); }

// R rows in lockstep, three passes while they are hot in L1: the maximum, exp with the sum
// (S3) accumulated on the fly (one zmm accumulator per row: the 16 lanes of (R1)), then
// the product with r (S4)-(S5). The R rows' dependency chains (max, exp, sum, 1/s) are
// independent, which hides their latency on short rows (D = 128: 8 vectors per pass).
// Each row gets the same instructions whatever R is.
// Fused: (EN1)-(EN6) in (S2) (Kernels::softmax_fused), else (E1)-(E6).
template <int R, bool Fused>
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
      const __m512 e = exp16<Fused>(_mm512_sub_ps(_mm512_loadu_ps(x + j * d + i), m[j]));  // (S2)
      _mm512_storeu_ps(y + j * d + i, e);
      acc[j] = _mm512_add_ps(acc[j], e);  // (S3), (R1)
    }
  }
  if (i < d) {
    for (int j = 0; j < R; ++j) {
      const __m512 e = exp16<Fused>(_mm512_sub_ps(_mm512_maskz_loadu_ps(k, x + j * d + i), m[j]));
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

template <bool Fused>
void softmax_rows(const float* x, float* y, int64_t rows, int64_t d) {
  int64_t row = 0;
  if (d <= kLockstepMaxD) {
    for (; row + 4 <= rows; row += 4) softmax_rows_lockstep<4, Fused>(x + row * d, y + row * d, d);
  }
  for (; row < rows; ++row) softmax_rows_lockstep<1, Fused>(x + row * d, y + row * d, d);
}

void layer_norm_rows(const float* x, float* y, int64_t rows, int64_t d, const float* scale, const float* bias,
                     float epsilon, float* mean_out, float* inv_std_out, bool divide, bool rms) {
  const float count = static_cast<float>(d);
  for (int64_t row = 0; row < rows; ++row) {
    const float* xr = x + row * d;
    float* yr = y + row * d;
    __m512 acc = _mm512_setzero_ps();
    __m512 lo = _mm512_set1_ps(d > 0 ? xr[0] : 0.0f), hi = lo;  // (L1c): inactive lanes keep x_0
    for (int64_t i = 0; i < d && !rms; i += 16) {
      const __mmask16 k = tail_mask(d - i);
      const __m512 v = _mm512_maskz_loadu_ps(k, xr + i);
      acc = _mm512_mask_add_ps(acc, k, acc, v);
      lo = _mm512_mask_min_ps(lo, k, lo, v);
      hi = _mm512_mask_max_ps(hi, k, hi, v);
    }
    const float mean = rms ? 0.0f
                           : clamp_to(tree16(acc) / count, _mm512_reduce_min_ps(lo),
                                      _mm512_reduce_max_ps(hi));  // (L1r), (L1), (L1c)
    const __m512 vmean = _mm512_set1_ps(mean);
    acc = _mm512_setzero_ps();
    for (int64_t i = 0; i < d; i += 16) {
      const __mmask16 k = tail_mask(d - i);
      const __m512 di = _mm512_sub_ps(_mm512_maskz_loadu_ps(k, xr + i), vmean);  // (L2)
      acc = _mm512_mask_add_ps(acc, k, acc, _mm512_mul_ps(di, di));
    }
    const float var = tree16(acc) / count;                                                         // (L3)
    const float std_dev = std::sqrt(var + epsilon);                                                // (L4), (L4')
    const float inv_std = 1.0f / std_dev;                                                          // (L4)
    layer_norm_scale_v<F32x16>(xr, yr, d, mean, divide ? std_dev : inv_std, scale, bias, divide);  // (L5), (L5')
    if (mean_out) mean_out[row] = mean;
    if (inv_std_out) inv_std_out[row] = inv_std;
  }
}

// float32 -> float16 by vcvtps2ph (round to nearest even); a vector holding a NaN is
// redone lane by lane for NumPy's payload (float_ops.h "half").
void to_half_run(const float* x, uint16_t* y, int64_t n) {
  for (int64_t i = 0; i < n; i += 16) {
    const __mmask16 k = tail_mask(n - i);
    const __m512 v = _mm512_maskz_loadu_ps(k, x + i);
    const __m256i h = _mm512_cvtps_ph(v, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    _mm256_mask_storeu_epi16(y + i, k, h);
    if (_mm512_cmp_ps_mask(v, v, _CMP_UNORD_Q) != 0) {
      for (int64_t j = i; j < i + 16 && j < n; ++j) y[j] = half_from_f32(x[j]);
    }
  }
}

// float16 -> float32 by vcvtph2ps (exact); NaN lanes redone for NumPy's quiet bit.
void from_half_run(const uint16_t* x, float* y, int64_t n) {
  const __m256i exp_mask = _mm256_set1_epi16(0x7C00);
  for (int64_t i = 0; i < n; i += 16) {
    const __mmask16 k = tail_mask(n - i);
    const __m256i h = _mm256_maskz_loadu_epi16(k, x + i);
    _mm512_mask_storeu_ps(y + i, k, _mm512_cvtph_ps(h));
    // a NaN: exponent all ones and a non-zero payload, |h| > 0x7C00
    const __mmask16 nan = _mm256_cmpgt_epi16_mask(_mm256_andnot_si256(_mm256_set1_epi16(-0x8000), h), exp_mask);
    if (nan != 0) {
      for (int64_t j = i; j < i + 16 && j < n; ++j) y[j] = half_to_f32(x[j]);
    }
  }
}

// erf (F1)-(F5) and Gelu (G1) with (F4) computed only for the lanes that select it. The
// twin computes both branches of every lane and selects; a lane's bits depend on its own
// value only, so computing (F4) on the lanes past the split, packed together, gives each
// lane the same bits. Gelu inputs mix both sides in nearly every vector (all-MiniLM's:
// 27 % of the lanes past the split, 96 % of the vectors mixed), so a per-vector skip (as
// tanh_v's) saves nothing, while packing skips (F4) and its exp on 73 % of the lanes.
// Per block of 256 elements: (F1)-(F3) and the result of every lane stored, the t (and
// x) of the lanes past the split compressed into a buffer; (F4) on the buffer; its
// results expanded back over the lanes that take them.
template <bool kGelu>
void erf_split_run(const float* x, float* y, int64_t n) {
  constexpr int kBlock = 256;
  alignas(64) float bt[kBlock + 16], bx[kBlock + 16];
  __mmask16 masks[kBlock / 16];
  const __m512 split = _mm512_set1_ps(kErfSplit);
  for (int64_t b0 = 0; b0 < n; b0 += kBlock) {
    const int64_t bn = n - b0 < kBlock ? n - b0 : kBlock;
    const float* xb = x + b0;
    float* yb = y + b0;
    int nb = 0;
    for (int64_t i = 0, v = 0; i < bn; i += 16, ++v) {
      const __mmask16 k = tail_mask(bn - i);
      const __m512 xv = _mm512_maskz_loadu_ps(k, xb + i);
      const __m512 u = kGelu ? _mm512_div_ps(xv, _mm512_set1_ps(kGeluSqrt2)) : xv;
      const __m512 t = erf_t_v<F32x16>(u);
      const __mmask16 big = _mm512_mask_cmp_ps_mask(k, t, split, _CMP_GT_OQ);
      const __m512 e = copysign_v<F32x16>(erf_small_v<F32x16>(t), u);  // (F5): the lanes below the split
      _mm512_mask_storeu_ps(yb + i, k, kGelu ? gelu_of_erf_v<F32x16>(xv, e) : e);
      masks[v] = big;
      if (big) {
        _mm512_storeu_ps(bt + nb, _mm512_maskz_compress_ps(big, t));
        _mm512_storeu_ps(bx + nb, _mm512_maskz_compress_ps(big, xv));
        nb += __builtin_popcount(static_cast<unsigned>(big));
      }
    }
    if (nb == 0) continue;
    // the lanes past nb of the last packed vector: zeros, not the stack's leftovers
    _mm512_storeu_ps(bt + nb, _mm512_setzero_ps());
    _mm512_storeu_ps(bx + nb, _mm512_setzero_ps());
    for (int j = 0; j < nb; j += 16) {  // (F4) on the packed lanes (past nb: unused)
      // (F5)'s sign: x / SQRT2 has the sign of x (no NaN or zero is past the split)
      const __m512 xv = _mm512_load_ps(bx + j);
      const __m512 e = copysign_v<F32x16>(erf_big_v<F32x16>(_mm512_load_ps(bt + j)), xv);
      _mm512_store_ps(bt + j, kGelu ? gelu_of_erf_v<F32x16>(xv, e) : e);
    }
    int pos = 0;
    for (int64_t i = 0, v = 0; i < bn; i += 16, ++v) {
      const __mmask16 big = masks[v];
      if (big) {
        _mm512_mask_storeu_ps(yb + i, big, _mm512_maskz_expand_ps(big, _mm512_loadu_ps(bt + pos)));
        pos += __builtin_popcount(static_cast<unsigned>(big));
      }
    }
  }
}

// The ISA's table with the split erf and Gelu runs in place of the template's.
// (SX1): MLAS's AVX-512F exp (MlasComputeSumExpF32KernelAvx512F), 2^m by vscalefps
inline __m512 ort_sum_exp16(__m512 v) {
  const __m512 t = _mm512_max_ps(_mm512_set1_ps(ort::kExpLowerAvx512f), v);  // a NaN v stays NaN
  const __m512 b = _mm512_fmadd_ps(t, _mm512_set1_ps(ort::kExpLog2e), _mm512_set1_ps(ort::kExpBias));
  const __m512 m = _mm512_sub_ps(b, _mm512_set1_ps(ort::kExpBias));
  __m512 r = _mm512_fmadd_ps(m, _mm512_set1_ps(ort::kExpLn2Hi), t);
  r = _mm512_fmadd_ps(m, _mm512_set1_ps(ort::kExpLn2Lo), r);
  __m512 p = _mm512_fmadd_ps(_mm512_set1_ps(ort::kExpP0), r, _mm512_set1_ps(ort::kExpP1));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(ort::kExpP2));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(ort::kExpP3));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(ort::kExpP4));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.0f));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.0f));
  return _mm512_scalef_ps(p, m);
}

// ORT's Softmax rows on an AVX-512F host: (SM1), (SX1), (SX2) (one accumulator, the masked
// last vector adds to its full lanes only), (SM4), (SM5)
void mlas_softmax_rows_avx512f(const float* x, float* y, int64_t rows, int64_t d) {
  for (int64_t row = 0; row < rows; ++row) {
    const float* xr = x + row * d;
    float* yr = y + row * d;
    const __m512 lowest = _mm512_set1_ps(std::numeric_limits<float>::lowest());
    __m512 vm = lowest;
    for (int64_t i = 0; i < d; i += 16) {  // max(x, m): a NaN x leaves m (SM1)
      const __mmask16 k = tail_mask(d - i);
      vm = _mm512_max_ps(_mm512_mask_loadu_ps(lowest, k, xr + i), vm);
    }
    alignas(64) float l[16];
    _mm512_store_ps(l, vm);
    float m = std::numeric_limits<float>::lowest();
    for (int j = 0; j < 16; ++j) m = ort::max_skip_nan(m, l[j]);
    const __m512 vneg = _mm512_set1_ps(-m);
    __m512 acc = _mm512_setzero_ps();
    for (int64_t i = 0; i < d; i += 16) {
      const __mmask16 k = tail_mask(d - i);
      const __m512 e = ort_sum_exp16(_mm512_add_ps(_mm512_maskz_loadu_ps(k, xr + i), vneg));
      _mm512_mask_storeu_ps(yr + i, k, e);
      acc = _mm512_mask_add_ps(acc, k, acc, e);  // (SX2)
    }
    _mm512_store_ps(l, acc);
    const __m512 r = _mm512_set1_ps(1.0f / ort::sum16_folded(l));  // (SM4)
    for (int64_t i = 0; i < d; i += 16) {                          // (SM5)
      const __mmask16 k = tail_mask(d - i);
      _mm512_mask_storeu_ps(yr + i, k, _mm512_mul_ps(_mm512_maskz_loadu_ps(k, yr + i), r));
    }
  }
}

Kernels with_split_erf(Kernels k) {
  k.unary[static_cast<int>(UnaryOp::kErf)] = erf_split_run<false>;
  k.unary[static_cast<int>(UnaryOp::kGelu)] = erf_split_run<true>;
  return k;
}

}  // namespace

const Kernels& kernels_avx512vnni() {
  static const Kernels k = [] {
    Kernels t = with_split_erf(simd_kernels<F32x16>("avx512vnni", softmax_rows<false>, softmax_rows<true>,
                                                    layer_norm_rows, to_half_run, from_half_run));
    // ORT's AVX2 host rows in its 8-lane order (float_ops.h mlas_softmax, ort_layer_norm);
    // its AVX-512F host's Softmax rows (SX1)-(SX2) in AVX-512
    t.mlas_softmax = kernels_avx2().mlas_softmax;
    t.ort_layer_norm = kernels_avx2().ort_layer_norm;
    t.mlas_softmax_avx512f = mlas_softmax_rows_avx512f;
    return t;
  }();
  return k;
}

}  // namespace float_ops
}  // namespace quanta
