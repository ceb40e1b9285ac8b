// AVX-512 QuantizeLinear run, 16 floats per step: Quantize16 of quantize_avx512.h (the
// argument for the division-free quotient is written there).
#include <immintrin.h>

#include <cstdint>

#include "quantize.h"
#include "quantize/quantize_avx512.h"

namespace quanta {
namespace {

template <typename T>
void run(const float* x, T* y, int64_t n, float scale, int32_t zp) {
  const Quantize16<T> quant(scale, zp);
  for (int64_t i = 0; i < n; i += 16) {
    const int64_t left = n - i;
    const __mmask16 k = left >= 16 ? static_cast<__mmask16>(0xffff) : static_cast<__mmask16>((1u << left) - 1u);
    Quantize16<T>::store16(y + i, quant(_mm512_maskz_loadu_ps(k, x + i)), left, k);
  }
}
}  // namespace

void quantize_run_u8_avx512vnni(const float* x, uint8_t* y, int64_t n, float scale, int32_t zp) {
  run<uint8_t>(x, y, n, scale, zp);
}
void quantize_run_s8_avx512vnni(const float* x, int8_t* y, int64_t n, float scale, int32_t zp) {
  run<int8_t>(x, y, n, scale, zp);
}
void quantize_run_u16_avx512vnni(const float* x, uint16_t* y, int64_t n, float scale, int32_t zp) {
  run<uint16_t>(x, y, n, scale, zp);
}
void quantize_run_s16_avx512vnni(const float* x, int16_t* y, int64_t n, float scale, int32_t zp) {
  run<int16_t>(x, y, n, scale, zp);
}

}  // namespace quanta
