// softmax_quant on AVX-512: the float32 operations of softmax_quant.cc's composition
// (float_ops' Mul and Add runs, the Softmax row (S1)-(S5) with the fused exp (EN1)-(EN6),
// QuantizeLinear's run) on each element in the same order, fused into three passes over a
// block of rows instead of six:
//   1. v = f32(f32(x · c) + mask) into an L1 buffer, and the row maximum (S1);
//   2. e = exp(f32(v − m)) (S2), (EN1)-(EN6), over the buffer in place, with the sum (S3)
//      on the fly;
//   3. y = f32(e · r) (S4)-(S5) and its QuantizeLinear (Quantize16), the bytes stored.
// Every lane gets the instructions of the composed kernels (float_ops_avx512vnni.cc's
// softmax_rows_lockstep<R, true>, quantize_avx512.h): the bytes are identical, which the
// differential tests against the twin check (tests/kernels/test_softmax_quant.py).
#include <immintrin.h>

#include <algorithm>
#include <cstdint>
#include <limits>

#include "float_ops/float_ops_simd.h"
#include "quantize/quantize_avx512.h"
#include "tensor_ops/tensor_ops.h"

namespace quanta {
namespace tensor_ops {
namespace {

inline __mmask16 tail_mask(int64_t left) {
  return left >= 16 ? static_cast<__mmask16>(0xffff) : static_cast<__mmask16>((1u << left) - 1u);
}

// (R2)-(R3): simd.h's F32x16::tree16
inline float tree16(__m512 acc) { return simd::F32x16::tree16(acc); }

// R rows in lockstep (their max, exp, sum and 1/s chains overlap on short rows, as in the
// float Softmax); v: R·d floats of scratch.
template <typename T, int R>
void rows_lockstep(const float* x, T* y, int64_t d, const float* scale, const float* const* mask, float* v,
                   const Quantize16<T>& quant) {
  const __m512 neg_inf = _mm512_set1_ps(-std::numeric_limits<float>::infinity());
  const __m512 c = scale != nullptr ? _mm512_set1_ps(*scale) : _mm512_setzero_ps();
  __m512 vm[R];  // (S1); never NaN: max(v, m) keeps m for a NaN v
  for (int j = 0; j < R; ++j) vm[j] = neg_inf;
  int64_t i = 0;
  for (; i < d; i += 16) {
    const int64_t left = d - i;
    const __mmask16 k = tail_mask(left);
    for (int j = 0; j < R; ++j) {
      __m512 a = _mm512_maskz_loadu_ps(k, x + j * d + i);
      if (scale != nullptr) a = _mm512_mul_ps(a, c);                                     // the Mul run
      if (mask != nullptr) a = _mm512_add_ps(a, _mm512_maskz_loadu_ps(k, mask[j] + i));  // the Add run
      _mm512_mask_storeu_ps(v + j * d + i, k, a);
      vm[j] = _mm512_mask_max_ps(vm[j], k, a, vm[j]);  // lanes past d keep m
    }
  }
  __m512 m[R], acc[R];
  for (int j = 0; j < R; ++j) {
    m[j] = _mm512_set1_ps(_mm512_reduce_max_ps(vm[j]));  // max only selects: any order
    acc[j] = _mm512_setzero_ps();
  }
  for (i = 0; i < d; i += 16) {
    const __mmask16 k = tail_mask(d - i);
    for (int j = 0; j < R; ++j) {
      float* vj = v + j * d + i;
      const __m512 e =
          float_ops::exp_fused_nonpositive_v<simd::F32x16>(_mm512_sub_ps(_mm512_maskz_loadu_ps(k, vj), m[j]));
      _mm512_mask_storeu_ps(vj, k, e);
      acc[j] = _mm512_mask_add_ps(acc[j], k, acc[j], e);  // (S3), (R1); lanes past d add nothing
    }
  }
  __m512 r[R];
  for (int j = 0; j < R; ++j) r[j] = _mm512_set1_ps(1.0f / tree16(acc[j]));  // (S4)
  for (i = 0; i < d; i += 16) {
    const int64_t left = d - i;
    const __mmask16 k = tail_mask(left);
    for (int j = 0; j < R; ++j) {
      const __m512 s = _mm512_mul_ps(_mm512_maskz_loadu_ps(k, v + j * d + i), r[j]);  // (S5)
      Quantize16<T>::store16(y + j * d + i, quant(s), left, k);
    }
  }
}

}  // namespace

template <typename T>
void softmax_quant_rows_avx512vnni(const float* x, T* y, int64_t rows, int64_t d, const float* scale, const float* mask,
                                   const int64_t* mask_rows, float y_scale, int32_t zy) {
  const Quantize16<T> quant(y_scale, zy);
  alignas(64) float v[kSoftmaxQuantMaxD];
  const float* mk[4] = {nullptr, nullptr, nullptr, nullptr};
  int64_t row = 0;
  // four rows in lockstep while their buffers fit (float_ops' lockstep rows go to 2048)
  if (4 * d <= kSoftmaxQuantMaxD) {
    for (; row + 4 <= rows; row += 4) {
      for (int j = 0; j < 4; ++j) mk[j] = mask != nullptr ? mask + mask_rows[row + j] * d : nullptr;
      rows_lockstep<T, 4>(x + row * d, y + row * d, d, scale, mask != nullptr ? mk : nullptr, v, quant);
    }
  }
  for (; row < rows; ++row) {
    mk[0] = mask != nullptr ? mask + mask_rows[row] * d : nullptr;
    rows_lockstep<T, 1>(x + row * d, y + row * d, d, scale, mask != nullptr ? mk : nullptr, v, quant);
  }
}

template void softmax_quant_rows_avx512vnni<uint8_t>(const float*, uint8_t*, int64_t, int64_t, const float*,
                                                     const float*, const int64_t*, float, int32_t);
template void softmax_quant_rows_avx512vnni<int8_t>(const float*, int8_t*, int64_t, int64_t, const float*, const float*,
                                                    const int64_t*, float, int32_t);

}  // namespace tensor_ops
}  // namespace quanta
