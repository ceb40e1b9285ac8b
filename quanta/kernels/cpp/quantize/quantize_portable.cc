// Portable QuantizeLinear run: y = saturate(round_half_even(x / scale) + zp).
// The rounded quotient is clamped to [qmin - zp, qmax - zp] *before* the zero point is
// added, so the float -> int conversion never overflows (a hazard for |x/scale| > 2^31).
// NaN maps to qmin, as ONNX Runtime does (kernels/reference/quantize.py follows it).
#include <cmath>
#include <cstdint>
#include <limits>

#include "quantize.h"

namespace quanta {
namespace {
template <typename T>
void run(const float* x, T* y, int64_t n, float scale, int32_t zp) {
  const float lo = static_cast<float>(std::numeric_limits<T>::min() - zp);
  const float hi = static_cast<float>(std::numeric_limits<T>::max() - zp);
  for (int64_t i = 0; i < n; ++i) {
    float r = std::nearbyint(x[i] / scale);
    r = r < lo ? lo : r;
    r = r > hi ? hi : r;
    if (r != r) r = lo;
    y[i] = static_cast<T>(static_cast<int32_t>(r) + zp);
  }
}
}  // namespace

void quantize_run_u8_portable(const float* x, uint8_t* y, int64_t n, float scale, int32_t zp) {
  run<uint8_t>(x, y, n, scale, zp);
}
void quantize_run_s8_portable(const float* x, int8_t* y, int64_t n, float scale, int32_t zp) {
  run<int8_t>(x, y, n, scale, zp);
}
void quantize_run_u16_portable(const float* x, uint16_t* y, int64_t n, float scale, int32_t zp) {
  run<uint16_t>(x, y, n, scale, zp);
}
void quantize_run_s16_portable(const float* x, int16_t* y, int64_t n, float scale, int32_t zp) {
  run<int16_t>(x, y, n, scale, zp);
}

}  // namespace quanta
