// One lane of the recurrent kernels' elementwise steps (recurrent.h), in the twin's
// float32 order: the portable variant runs it for every lane, the AVX2 variant for its
// tails. The vector variants compute the same operations lane by lane.
//
// The MLAS rational approximations (reference/ms_lstm.py mlas_logistic, mlas_tanh):
//   logistic  v = min(max(x, −18), 18), s = f32(v·v),
//             p = v·P(s), q = Q(s) by Horner steps, each one FMA (one rounding),
//             y = max(f32(f32(p / q) + 0.5), 0)
//   tanh      v = min(max(x, −9), 9), then p / q likewise
// Constants: the float32 roundings of MLAS's decimal literals (MlasLogisticConstants,
// MlasTanhConstants), as the twin rounds them (decimal -> double -> float).
#pragma once

#include <cmath>
#include <cstdint>

namespace quanta {
namespace recurrent {

constexpr float kLogisticP[5] = {static_cast<float>(4.37031012579801e-11), static_cast<float>(1.15627324459942e-07),
                                 static_cast<float>(6.08574864600143e-05), static_cast<float>(8.51377133304701e-03),
                                 static_cast<float>(2.48287947061529e-01)};
constexpr float kLogisticQ[6] = {static_cast<float>(6.10247389755681e-13), static_cast<float>(5.76102136993427e-09),
                                 static_cast<float>(6.29106785017040e-06), static_cast<float>(1.70198817374094e-03),
                                 static_cast<float>(1.16817656904453e-01), static_cast<float>(9.93151921023180e-01)};
constexpr float kTanhP[7] = {static_cast<float>(-2.76076847742355e-16), static_cast<float>(2.00018790482477e-13),
                             static_cast<float>(-8.60467152213735e-11), static_cast<float>(5.12229709037114e-08),
                             static_cast<float>(1.48572235717979e-05),  static_cast<float>(6.37261928875436e-04),
                             static_cast<float>(4.89352455891786e-03)};
constexpr float kTanhQ[4] = {static_cast<float>(1.19825839466702e-06), static_cast<float>(1.18534705686654e-04),
                             static_cast<float>(2.26843463243900e-03), static_cast<float>(4.89352518554385e-03)};
constexpr float kLogisticClamp = 18.0f;
constexpr float kTanhClamp = 9.0f;

// min(max(x, lo), hi) as np.minimum(np.maximum(x, lo), hi): a NaN x stays NaN.
inline float clamp_nan(float x, float lo, float hi) {
  const float t = x < lo ? lo : x;
  return t > hi ? hi : t;
}

template <int NP, int NQ>
inline float rational_one(float v, const float (&P)[NP], const float (&Q)[NQ]) {
  const float s = v * v;
  float p = std::fma(s, P[0], P[1]);
  for (int k = 2; k < NP; ++k) p = std::fma(p, s, P[k]);
  p = v * p;
  float q = std::fma(s, Q[0], Q[1]);
  for (int k = 2; k < NQ; ++k) q = std::fma(q, s, Q[k]);
  return p / q;
}

inline float logistic_one(float x) {
  const float r = rational_one(clamp_nan(x, -kLogisticClamp, kLogisticClamp), kLogisticP, kLogisticQ) + 0.5f;
  return r < 0.0f ? 0.0f : r;
}

inline float tanh_one(float x) { return rational_one(clamp_nan(x, -kTanhClamp, kTanhClamp), kTanhP, kTanhQ); }

// One lane j of recurrent.h's lstm_row (Sigmoid, Tanh: MLAS's logistic_one, tanh_one) or
// onnx_lstm_row (float_ops' sigmoid_one, tanh_one).
template <float (*Sigmoid)(float) = logistic_one, float (*Tanh)(float) = tanh_one>
inline void lstm_lane(const float* p, const float* xg, const float* bias, const float* peephole, float clip,
                      bool input_forget, int64_t H, int64_t j, float* c, float* h) {
  const float cp = c[j];
  float gi = p[j] + xg[j];
  if (peephole) gi = gi + cp * peephole[j];
  if (bias) gi = gi + bias[j];
  const float i = Sigmoid(clamp_nan(gi, -clip, clip));
  float f;
  if (input_forget) {
    f = 1.0f - i;
  } else {
    float gf = p[2 * H + j] + xg[2 * H + j];
    if (peephole) gf = gf + cp * peephole[2 * H + j];
    if (bias) gf = gf + bias[2 * H + j];
    f = Sigmoid(clamp_nan(gf, -clip, clip));
  }
  float gc = p[3 * H + j] + xg[3 * H + j];
  if (bias) gc = gc + bias[3 * H + j];
  const float g = Tanh(clamp_nan(gc, -clip, clip));
  const float cn = cp * f + i * g;
  float go = p[H + j] + xg[H + j];
  if (peephole) go = go + cn * peephole[H + j];
  if (bias) go = go + bias[H + j];
  const float o = Sigmoid(clamp_nan(go, -clip, clip));
  h[j] = Tanh(cn) * o;
  c[j] = cn;
}

// ONNX Runtime's GRU gate functions (rnn_helpers.cc, deepcpu; quanta::OrtGRU,
// docs/float-ops.md (RNN-ORT-GRU)): x·P(x²) / Q(x²), each Horner step a float32 product
// then a float32 sum (no FMA: ORT builds that file for baseline x86-64).
constexpr float kDeepP[7] = {-2.76076847742355e-16f, 2.00018790482477e-13f, -8.60467152213735e-11f,
                             5.12229709037114e-08f,  1.48572235717979e-05f, 6.37261928875436e-04f,
                             4.89352455891786e-03f};
constexpr float kDeepQ[4] = {1.19825839466702e-06f, 1.18534705686654e-04f, 2.26843463243900e-03f,
                             4.89352518554385e-03f};

inline float deepcpu_rational(float x) {
  const float x2 = x * x;
  float p = x2 * kDeepP[0] + kDeepP[1];
  for (int i = 2; i < 7; ++i) p = x2 * p + kDeepP[i];
  p = x * p;
  float q = x2 * kDeepQ[0] + kDeepQ[1];
  for (int i = 2; i < 4; ++i) q = x2 * q + kDeepQ[i];
  return p / q;
}

// (RNN-ORT-GRU2) Rσ and (RNN-ORT-GRU5) Rt; clamp_nan keeps a NaN.
inline float deepcpu_sigmoid(float v) { return 0.5f * (1.0f + deepcpu_rational(0.5f * clamp_nan(v, -20.0f, 20.0f))); }
inline float deepcpu_tanh(float v) { return deepcpu_rational(clamp_nan(v, -10.0f, 10.0f)); }

// ORT's clip_add_bias (x + b, then std::min(clip, ·), std::max(−clip, ·): a NaN becomes
// clip) or, without a bias, clip_ignore_bias (a NaN stays).
inline float ort_clip(float v, const float* bias, int64_t j, float clip) {
  if (!bias) return clamp_nan(v, -clip, clip);
  float x = v + bias[j];
  x = x < clip ? x : clip;
  return -clip < x ? x : -clip;
}

// Lane j of Kernels::ort_gru_reset and Kernels::ort_gru_update (recurrent.h).
inline void ort_gru_reset_lane(const float* zr_r, const float* br, float clip, const float* src, int64_t j,
                               float* out) {
  out[j] = src[j] * deepcpu_sigmoid(ort_clip(zr_r[j], br, j, clip));
}
inline void ort_gru_update_lane(const float* zr_z, const float* bz, const float* a0, const float* a1, const float* bh,
                                float clip, int64_t j, float* h) {
  const float a = a1 ? a0[j] + a1[j] : a0[j];
  const float z = logistic_one(ort_clip(zr_z[j], bz, j, clip));
  const float hh = deepcpu_tanh(ort_clip(a, bh, j, clip));
  h[j] = (1.0f - z) * hh + z * h[j];
}

// Lanes of Kernels::onnx_gru_zr and onnx_gru_h (recurrent.h) with ONNX's functions
// (Sigmoid, Tanh: float_ops' sigmoid_one, tanh_one).
template <float (*Sigmoid)(float)>
inline void gru_zr_lane(const float* xg, const float* hg, const float* bias, float clip, int64_t n, float* zr) {
  float v = xg[n] + hg[n];
  if (bias) v = v + bias[n];
  zr[n] = Sigmoid(clamp_nan(v, -clip, clip));
}
template <float (*Tanh)(float)>
inline void gru_h_lane(const float* xg_h, const float* hr_h, const float* rb_h, const float* r, const float* z,
                       const float* bias_h, float clip, bool lbr, int64_t j, float* h) {
  float v;
  if (lbr) {
    float u = hr_h[j];
    if (rb_h) u = u + rb_h[j];
    v = xg_h[j] + r[j] * u;
  } else {
    v = xg_h[j] + hr_h[j];
  }
  if (bias_h) v = v + bias_h[j];
  const float hh = Tanh(clamp_nan(v, -clip, clip));
  h[j] = (1.0f - z[j]) * hh + z[j] * h[j];
}

inline void min_max_scalar(const float* x, int64_t n, float* lo, float* hi) {
  float mn = x[0], mx = x[0];
  for (int64_t i = 1; i < n; ++i) {
    mn = x[i] < mn ? x[i] : mn;
    mx = x[i] > mx ? x[i] : mx;
  }
  *lo = mn < 0.0f ? mn : 0.0f;
  *hi = mx > 0.0f ? mx : 0.0f;
}

inline uint8_t quantize_one(float x, float scale, float zp) {
  const float v = std::nearbyint(x / scale) + zp;
  return static_cast<uint8_t>(v < 0.0f ? 0.0f : (v > 255.0f ? 255.0f : v));
}

}  // namespace recurrent
}  // namespace quanta
