// Elementwise int8 kernels: DequantizeLinear, DynamicQuantizeLinear, com.microsoft
// QLinearAdd / QLinearMul (numpy broadcasting), 256-entry lookup tables (QLinearSigmoid,
// QLinearLeakyRelu, requantizing QLinearConcat inputs), QLinearSoftmax rows.
//
// ---------------------------------------------------------------------------------------
// Contract. T is uint8_t or int8_t; every float operation below is one float32 IEEE
// operation in the order written (no fused multiply-add: -ffp-contract=off; divisions are
// true divisions), so every ISA variant gives the bytes of the NumPy twins
// (kernels/reference/quantize.py, ms_qlinear.py, ms_qops.py). rne = round half to even
// (RNE instructions in the SIMD paths, nearbyint in the portable one); sat = clamp to
// [qmin, qmax] of T; a NaN before sat becomes qmin.
// ---------------------------------------------------------------------------------------
//
//   dequantize       y[i] = f32(float32(x[i] − zp[c]) · scale[c])       eq. (1), c = channel
//   dynamic quantize lo/hi: min/max of x widened to 0 (any NaN in x: lo = hi = 0)
//                    scale = f32((hi == lo ? 1 : hi − lo) / 255)
//                    zp    = rne(min(255, max(0, f32(0 − f32(lo / scale)))))  (Python's
//                            builtin max/min: a NaN argument loses to the first)
//                    y     = QuantizeLinear(x, scale, zp) (quantize/quantize.h)  eq. (10)
//   qadd             c = sat(rne(f32(f32(f32(dq_a + dq_b) / sc) + zc)))
//                    dq_a = f32(sa · float32(a − za)), dq_b likewise
//   qmul             c = sat(rne(f32(f32(float32((a − za)·(b − zb)) · r) + zc)))
//                    r = f32(f32(sa · sb) / sc), computed by the caller
//   lut              y[i] = table[uint8 bits of x[i]]   (the table is the twin evaluated
//                    on all 256 codes at bind time: bit-exact by construction)
//   softmax rows     see ms_qops.py (1)-(5): d = max(row) − x, t = T[255 − d],
//                    sum = Σ t in index order (sequential float32),
//                    y = sat(rne(f64(t) · Ys / f64(sum)) + zy)   (float64, ONNX Runtime's)
//
// Broadcasting (qadd / qmul): numpy rules. The driver drops size-1 dimensions and merges
// adjacent dimensions that are contiguous (or broadcast) in both inputs, so any
// broadcast becomes an odometer over outer dimensions around an inner run in which each
// input steps by 1 or is one repeated element (step 0): same shape, scalar, per-channel
// (C,1,1) against NCHW and trailing (D,) against (..., D) all reach the vector loop.
//
// ISA variants: elementwise_<isa>.cc each fill one Kernels table. Portable: loops over the
// scalar functions of elementwise_scalar.h. AVX2 / AVX-512: 8 / 16 lanes per step (tails:
// the scalar functions / masks), lookup tables as 16 vpshufb rows of 16 entries picked by
// the index's high nibble (32 / 64 bytes per step; with AVX-512 VBMI: lut_avx512vbmi, two
// vpermi2b over the table's four 64-byte quarters and a blend on the index's top bit),
// softmax rows from the shared template (vectorised by the compiler).
//
// Threads: the output is split into chunks by position; each element is computed by the
// same instruction sequence whichever thread and chunk run it, so the bytes are identical
// for any num_threads. Buffers are owned by the caller; no allocation.
#pragma once

#include <cmath>
#include <cstdint>

#include "broadcast.h"
#include "dispatch.h"

namespace quanta {
namespace elementwise {

// QLinearAdd in ONNX Runtime's x86 form: c = sat(rne(fma(a, ra, fma(b, rb, k)))) on the raw
// codes, ra = f32(sa / sc), rb = f32(sb / sc), k = f32(zc - fma(za, ra, f32(rb * zb)))
// (make_add_params; the twin is reference/ms_qlinear.py qlinear_add).
struct AddParams {
  float ra, rb, k;
};

inline AddParams make_add_params(float sa, int32_t za, float sb, int32_t zb, float sc, int32_t zc) {
  const float ra = sa / sc, rb = sb / sc;
  const float t = rb * static_cast<float>(zb);
  return AddParams{ra, rb, static_cast<float>(zc) - std::fmaf(static_cast<float>(za), ra, t)};
}

struct MulParams {
  float ratio;  // r = f32(f32(sa · sb) / sc)
  int32_t za, zb, zc;
};

// Inner runs of n elements; a_step / b_step are 1 (contiguous) or 0 (one repeated element).
template <typename T>
using AddRunFn = void (*)(const T* a, int64_t a_step, const T* b, int64_t b_step, T* c, int64_t n, const AddParams& p);
template <typename T>
using MulRunFn = void (*)(const T* a, int64_t a_step, const T* b, int64_t b_step, T* c, int64_t n, const MulParams& p);
template <typename T>
using DequantizeRunFn = void (*)(const T* x, float* y, int64_t n, float scale, int32_t zp);

// min / max of x[0, n) (n >= 1) and whether some element is NaN (min/max then unspecified).
using MinMaxFn = void (*)(const float* x, int64_t n, float* lo, float* hi, bool* has_nan);

// y[i] = table[x[i]] over n bytes.
using LutFn = void (*)(const uint8_t* x, uint8_t* y, int64_t n, const uint8_t* table);
template <typename T>
using SoftmaxRowsFn = void (*)(const T* x, T* y, int64_t rows, int64_t d, const float* table, float ys, int32_t zy);

// One table per ISA (filled by elementwise_<isa>.cc).
struct Kernels {
  AddRunFn<uint8_t> add_u8;
  AddRunFn<int8_t> add_s8;
  MulRunFn<uint8_t> mul_u8;
  MulRunFn<int8_t> mul_s8;
  DequantizeRunFn<uint8_t> dequantize_u8;
  DequantizeRunFn<int8_t> dequantize_s8;
  MinMaxFn minmax_f32;
  LutFn lut;
  SoftmaxRowsFn<uint8_t> softmax_u8;
  SoftmaxRowsFn<int8_t> softmax_s8;
};

// y = table[x] with vpermi2b (elementwise_avx512vnni.cc, compiled for VBMI on its own):
// run only when avx512vbmi_active().
void lut_avx512vbmi(const uint8_t* x, uint8_t* y, int64_t n, const uint8_t* table);

// y[i] = tables[(j0 + i) mod C][x[i]], channels innermost (elementwise_avx512vnni.cc;
// lut_u8_channels prepares `offsets` and `padded`).
void lut_channels_last_avx512(const uint8_t* x, uint8_t* y, int64_t n, int64_t j0, const int32_t* offsets,
                              int64_t period, const uint8_t* padded);
// the same with AVX2's vpgatherdd, 16 elements a step (elementwise_avx2.cc)
void lut_channels_last_avx2(const uint8_t* x, uint8_t* y, int64_t n, int64_t j0, const int32_t* offsets, int64_t period,
                            const uint8_t* padded);

extern const Kernels kKernelsPortable;
extern const Kernels kKernelsAvx2;
extern const Kernels kKernelsAvx512Vnni;
const Kernels& kernels_for(Isa isa);

// ---- drivers (elementwise.cc) -----------------------------------------------------------

// x viewed as [outer, channels, inner]; per-tensor is channels == 1.
template <typename T>
void dequantize_linear(const T* x, float* y, const float* scale, const int32_t* zero_point, int64_t outer,
                       int64_t channels, int64_t inner, int num_threads, Isa isa);

// Returns scale and zero point; writes y (n elements).
void dynamic_quantize_linear(const float* x, uint8_t* y, int64_t n, float* scale, uint8_t* zero_point, int num_threads,
                             Isa isa);

// A broadcast binary operation, dimensions already aligned to the output's rank
// (broadcast.h, shared with the other binary family).
using BroadcastShape = broadcast::Shape;

template <typename T>
void qlinear_add(const T* a, const T* b, T* c, const BroadcastShape& s, const AddParams& p, int num_threads, Isa isa);
template <typename T>
void qlinear_mul(const T* a, const T* b, T* c, const BroadcastShape& s, const MulParams& p, int num_threads, Isa isa);

// y[i] = table[x[i]] over n bytes (int8 data is passed as its uint8 bits).
void lut_u8(const uint8_t* x, uint8_t* y, int64_t n, const uint8_t* table, int num_threads, Isa isa);

// y[o, c, i] = tables[c][bits of x[o, c, i]]: a table per channel, x read as [outer, channels,
// inner] (a QLinearLookup whose group varies along one axis: a BatchNormalization between
// a DequantizeLinear and a QuantizeLinear).
void lut_u8_channels(const uint8_t* x, uint8_t* y, int64_t outer, int64_t channels, int64_t inner,
                     const uint8_t* tables, int num_threads, Isa isa);

// QLinearSoftmax over `rows` contiguous rows of length d; table: 256 float32 (ms_qops.py
// (2)); ys = f32(floor(f32(1 / sy))).
template <typename T>
void qlinear_softmax_rows(const T* x, T* y, int64_t rows, int64_t d, const float* table, float ys, int32_t zy,
                          int num_threads, Isa isa);

}  // namespace elementwise
}  // namespace quanta
