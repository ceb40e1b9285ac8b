// Portable elementwise runs: the contract of elementwise.h one element at a time
// (elementwise_scalar.h). The SIMD variants perform the same float32 operations in the
// same order, lane by lane.
#include <cstdint>

#include "elementwise/elementwise.h"
#include "elementwise/elementwise_scalar.h"

namespace quanta {
namespace elementwise {
namespace {

template <typename T>
void add_run(const T* a, int64_t a_step, const T* b, int64_t b_step, T* c, int64_t n, const AddParams& p) {
  for (int64_t i = 0; i < n; ++i) c[i] = add_one(a[i * a_step], b[i * b_step], p);
}

template <typename T>
void mul_run(const T* a, int64_t a_step, const T* b, int64_t b_step, T* c, int64_t n, const MulParams& p) {
  for (int64_t i = 0; i < n; ++i) c[i] = mul_one(a[i * a_step], b[i * b_step], p);
}

template <typename T>
void dequantize_run(const T* x, float* y, int64_t n, float scale, int32_t zp) {
  for (int64_t i = 0; i < n; ++i) y[i] = dequantize_one(x[i], scale, zp);
}

void minmax(const float* x, int64_t n, float* lo, float* hi, bool* has_nan) {
  float mn = x[0], mx = x[0];
  bool nan = false;
  for (int64_t i = 0; i < n; ++i) {
    const float v = x[i];
    nan |= v != v;
    mn = v < mn ? v : mn;
    mx = v > mx ? v : mx;
  }
  *lo = mn;
  *hi = mx;
  *has_nan = nan;
}

}  // namespace

const Kernels kKernelsPortable = {
    add_run<uint8_t>,       add_run<int8_t>, mul_run<uint8_t>, mul_run<int8_t>,       dequantize_run<uint8_t>,
    dequantize_run<int8_t>, minmax,          lut_scalar,       softmax_rows<uint8_t>, softmax_rows<int8_t>,
};

}  // namespace elementwise
}  // namespace quanta
