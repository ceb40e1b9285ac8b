// Portable float_ops: the contract of float_ops.h one element at a time
// (float_ops_scalar.h). The SIMD variants perform the same float32 operations in the same
// order, lane by lane.
#include <cstdint>
#include <limits>

#include "float_ops/float_ops.h"
#include "float_ops/float_ops_scalar.h"
#include "float_ops/ort_rows_scalar.h"
#include "recurrent/recurrent_scalar.h"

namespace quanta {
namespace float_ops {
namespace {

template <BinaryOp op>
void binary_run(const float* a, int64_t a_step, const float* b, int64_t b_step, float* c, int64_t n) {
  for (int64_t i = 0; i < n; ++i) c[i] = binary_one<op>(a[i * a_step], b[i * b_step]);
}

void exp_run(const float* x, float* y, int64_t n) {
  for (int64_t i = 0; i < n; ++i) y[i] = exp_one(x[i]);
}

template <float (*f)(float)>
void unary_run(const float* x, float* y, int64_t n) {
  for (int64_t i = 0; i < n; ++i) y[i] = f(x[i]);
}

void elu_run(const float* x, float* y, int64_t n, float alpha) {
  for (int64_t i = 0; i < n; ++i) y[i] = elu_one(x[i], alpha);
}

void to_half_run(const float* x, uint16_t* y, int64_t n) {
  for (int64_t i = 0; i < n; ++i) y[i] = half_from_f32(x[i]);
}

void from_half_run(const uint16_t* x, float* y, int64_t n) {
  for (int64_t i = 0; i < n; ++i) y[i] = half_to_f32(x[i]);
}

// (R1): lane i mod 16 takes x[i], in increasing i.
float sum16(const float* x, int64_t d) {
  float acc[kLanes] = {};
  for (int64_t i = 0; i < d; ++i) acc[i % kLanes] = acc[i % kLanes] + x[i];
  return tree16(acc);
}

// Fused: (EN1)-(EN6) in (S2) instead of (E1)-(E6) (Kernels::softmax_fused).
template <bool Fused>
void softmax_rows_t(const float* x, float* y, int64_t rows, int64_t d) {
  for (int64_t row = 0; row < rows; ++row) {
    const float* xr = x + row * d;
    float* yr = y + row * d;
    float m = -std::numeric_limits<float>::infinity();  // (S1), NaN elements skipped
    for (int64_t i = 0; i < d; ++i) m = xr[i] > m ? xr[i] : m;
    for (int64_t i = 0; i < d; ++i) yr[i] = Fused ? exp_fused_nonpositive_one(xr[i] - m) : exp_one(xr[i] - m);  // (S2)
    const float r = 1.0f / sum16(yr, d);                // (S3), (S4)
    for (int64_t i = 0; i < d; ++i) yr[i] = yr[i] * r;  // (S5)
  }
}

inline float gelu_tanh_mlas_one(float x) {
  const float a = kGeluK * (x + kGeluC * ((x * x) * x));  // (G2), MLAS's tanh
  return (0.5f * x) * (1.0f + recurrent::tanh_one(a));
}

// (SP1)-(SP3), float_ops.softplus_f32's operations: exp (E1)-(E6) of −|x|, Goldberg's
// log1p on log (LN1)-(LN6), plus np.maximum(x, 0) (a NaN x stays, first operand).
inline float softplus_one(float x) {
  const float t = exp_one(-std::fabs(x));  // (SP1)
  const float u = 1.0f + t;                // (SP2)
  const float l = u == 1.0f ? t : log_one(u) * (t / (u - 1.0f));
  const float m = (x >= 0.0f || x != x) ? x : 0.0f;
  return m + l;  // (SP3)
}

void layer_norm_rows(const float* x, float* y, int64_t rows, int64_t d, const float* scale, const float* bias,
                     float epsilon, float* mean_out, float* inv_std_out, bool divide, bool rms) {
  const float count = static_cast<float>(d);
  for (int64_t row = 0; row < rows; ++row) {
    const float* xr = x + row * d;
    float* yr = y + row * d;
    const float mean = rms ? 0.0f : clamp_mean(xr, d, sum16(xr, d) / count);  // (L1r), (L1), (L1c)
    float acc[kLanes] = {};
    for (int64_t i = 0; i < d; ++i) {
      const float di = xr[i] - mean;  // (L2)
      acc[i % kLanes] = acc[i % kLanes] + di * di;
    }
    const float var = tree16(acc) / count;           // (L3)
    const float std_dev = std::sqrt(var + epsilon);  // (L4), (L4')
    const float inv_std = 1.0f / std_dev;            // (L4)
    for (int64_t i = 0; i < d; ++i) {
      const float di = xr[i] - mean;
      const float v = (divide ? di / std_dev : di * inv_std) * scale[i];  // (L5), (L5')
      yr[i] = bias ? v + bias[i] : v;
    }
    if (mean_out) mean_out[row] = mean;
    if (inv_std_out) inv_std_out[row] = inv_std;
  }
}

}  // namespace

const Kernels& kernels_portable() {
  static const Kernels k = {
      "portable",
      {binary_run<BinaryOp::kAdd>, binary_run<BinaryOp::kSub>, binary_run<BinaryOp::kMul>, binary_run<BinaryOp::kDiv>,
       binary_run<BinaryOp::kMax>, binary_run<BinaryOp::kMin>, binary_run<BinaryOp::kPRelu>},
      exp_run,
      softmax_rows_t<false>,
      softmax_rows_t<true>,
      layer_norm_rows,
      {unary_run<erf_one>, unary_run<tanh_one>, unary_run<sigmoid_one>, unary_run<relu_one>, unary_run<gelu_one>,
       unary_run<gelu_tanh_one>, unary_run<recurrent::logistic_one>, unary_run<recurrent::tanh_one>,
       unary_run<silu_one>, unary_run<log_one>, unary_run<cos_one>, unary_run<sin_one>, unary_run<expm1_one>,
       unary_run<gelu_tanh_mlas_one>, unary_run<atan_one>, unary_run<softplus_one>,
       unary_run<ort::fast_gelu_one>},  // by UnaryOp
      elu_run,
      to_half_run,
      from_half_run,
      ort::softmax_rows,
      ort::layer_norm_rows,
      ort::softmax_rows_avx512f,
  };
  return k;
}

}  // namespace float_ops
}  // namespace quanta
