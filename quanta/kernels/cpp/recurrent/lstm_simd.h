// One vector of lanes of the LSTM row step (recurrent.h Kernels::lstm_row, and
// onnx_lstm_row with ONNX's functions) over the vector traits of simd.h, shared by
// recurrent_avx2.cc (whole vectors, the tail lanes by recurrent_scalar.h's lstm_lane) and
// recurrent_avx512vnni.cc (masked tails). Each lane computes lstm_lane's operations in
// their order.
#pragma once

#include <cstdint>

#include "float_ops/float_ops_simd.h"
#include "recurrent/mlas_simd.h"
#include "simd.h"

namespace quanta {
namespace recurrent {
namespace {

// MLAS's logistic and tanh (mlas_simd.h): DynamicQuantizeLSTM's and OrtLSTM's gates.
template <class T>
struct MlasActs {
  static typename T::V sigmoid(typename T::V x) { return logistic_v<T>(x); }
  static typename T::V tanh(typename T::V x) { return tanh_v<T>(x); }
};

// ONNX's sigmoid and tanh (float_ops_simd.h): the float LSTM's and GRU's gates.
template <class T>
struct OnnxActs {
  static typename T::V sigmoid(typename T::V x) { return float_ops::sigmoid_v<T>(x); }
  static typename T::V tanh(typename T::V x) { return float_ops::tanh_v<T>(x); }
};

// Lanes [j, j + kLanes) of row (c, h): `ld(ptr)` reads the lanes at ptr (masked or
// whole); *cn receives the new cell state, *hn the new hidden state. Acts: the gate
// functions (sigmoid, tanh).
template <class T, class Acts = MlasActs<T>, class Ld>
inline void lstm_lanes(Ld ld, const float* p, const float* xg, const float* bias, const float* peephole, float clip,
                       bool input_forget, int64_t H, int64_t j, const float* c, typename T::V* cn, typename T::V* hn) {
  using V = typename T::V;
  const V cp = ld(c + j);
  V gi = T::add(ld(p + j), ld(xg + j));
  if (peephole) gi = T::add(gi, T::mul(cp, ld(peephole + j)));
  if (bias) gi = T::add(gi, ld(bias + j));
  const V i = Acts::sigmoid(clamp_v<T>(gi, -clip, clip));
  V f;
  if (input_forget) {
    f = T::sub(T::set1(1.0f), i);
  } else {
    V gf = T::add(ld(p + 2 * H + j), ld(xg + 2 * H + j));
    if (peephole) gf = T::add(gf, T::mul(cp, ld(peephole + 2 * H + j)));
    if (bias) gf = T::add(gf, ld(bias + 2 * H + j));
    f = Acts::sigmoid(clamp_v<T>(gf, -clip, clip));
  }
  V gc = T::add(ld(p + 3 * H + j), ld(xg + 3 * H + j));
  if (bias) gc = T::add(gc, ld(bias + 3 * H + j));
  const V g = Acts::tanh(clamp_v<T>(gc, -clip, clip));
  *cn = T::add(T::mul(cp, f), T::mul(i, g));
  V go = T::add(ld(p + H + j), ld(xg + H + j));
  if (peephole) go = T::add(go, T::mul(*cn, ld(peephole + H + j)));
  if (bias) go = T::add(go, ld(bias + H + j));
  const V o = Acts::sigmoid(clamp_v<T>(go, -clip, clip));
  *hn = T::mul(Acts::tanh(*cn), o);
}

}  // namespace
}  // namespace recurrent
}  // namespace quanta
