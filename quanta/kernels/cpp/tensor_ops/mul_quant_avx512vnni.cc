// mul_quant on AVX-512: per 16 lanes, f32(x · c) (float_ops' Mul run) and QuantizeLinear's
// step (quantize_avx512.h, the run's own code) in registers; the bytes of mul_quant.cc's
// composition, checked against the twin (tests/passes/lower/test_mul_quant.py).
#include <immintrin.h>

#include <cstdint>

#include "quantize/quantize_avx512.h"
#include "tensor_ops/tensor_ops.h"

namespace quanta {
namespace tensor_ops {

template <typename T>
void mul_quant_rows_avx512vnni(const float* x, T* y, int64_t rows, int64_t d, const float* c, int64_t c_step,
                               float y_scale, int32_t zy) {
  const Quantize16<T> quant(y_scale, zy);
  const __m512 c0 = _mm512_set1_ps(*c);
  for (int64_t r = 0; r < rows; ++r) {
    const float* xr = x + r * d;
    T* yr = y + r * d;
    for (int64_t i = 0; i < d; i += 16) {
      const int64_t left = d - i;
      const __mmask16 k = left >= 16 ? static_cast<__mmask16>(0xffff) : static_cast<__mmask16>((1u << left) - 1u);
      const __m512 cv = c_step != 0 ? _mm512_maskz_loadu_ps(k, c + i) : c0;
      Quantize16<T>::store16(yr + i, quant(_mm512_mul_ps(_mm512_maskz_loadu_ps(k, xr + i), cv)), left, k);
    }
  }
}

template void mul_quant_rows_avx512vnni<uint8_t>(const float*, uint8_t*, int64_t, int64_t, const float*, int64_t, float,
                                                 int32_t);
template void mul_quant_rows_avx512vnni<int8_t>(const float*, int8_t*, int64_t, int64_t, const float*, int64_t, float,
                                                int32_t);

}  // namespace tensor_ops
}  // namespace quanta
