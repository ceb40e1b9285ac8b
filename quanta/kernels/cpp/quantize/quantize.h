// QuantizeLinear, per-tensor and per-axis, float32 -> int8 / uint8 / int16 / uint16.
//
// Contract (ONNX QuantizeLinear, docs/quantization-math.md eq. (1)):
//   y[i] = saturate(round_half_even(x[i] / scale[c]) + zero_point[c]),  c = channel of i
// The quotient is the true float32 division's: the SIMD runs multiply by 1/scale and
// divide for the vectors where that could round differently (the argument is written in
// quantize_avx512vnni.cc), so results are bit-identical to the ONNX reference and to
// kernels/reference/quantize.py.
// Rounding: half to even (the current MXCSR / fenv mode, which is round-to-nearest-even
// unless the caller changed it; the bindings do not).
//
// Layout: x viewed as [outer, channels, inner]; per-tensor is channels == 1.
// Buffers are owned by the caller; no allocation. Threads: the flat element range is cut
// into chunks (each element is computed by the same instructions on any thread, so the
// bytes do not depend on num_threads).
#pragma once

#include <cstdint>

#include "dispatch.h"

namespace quanta {

struct QuantizeParams {
  const float* scale;         // [channels]
  const int32_t* zero_point;  // [channels]
  int64_t outer;
  int64_t channels;
  int64_t inner;
};

template <typename T>
void quantize_linear(const float* x, T* y, const QuantizeParams& p, Isa isa, int num_threads = 1);

// ISA variants (one file each); signature: contiguous run of n values with one scale/zp.
void quantize_run_u8_portable(const float* x, uint8_t* y, int64_t n, float scale, int32_t zp);
void quantize_run_s8_portable(const float* x, int8_t* y, int64_t n, float scale, int32_t zp);
// 16-bit storage (ORT's QUInt16 / QInt16 activations).
void quantize_run_u16_portable(const float* x, uint16_t* y, int64_t n, float scale, int32_t zp);
void quantize_run_s16_portable(const float* x, int16_t* y, int64_t n, float scale, int32_t zp);
void quantize_run_u8_avx2(const float* x, uint8_t* y, int64_t n, float scale, int32_t zp);
void quantize_run_s8_avx2(const float* x, int8_t* y, int64_t n, float scale, int32_t zp);
void quantize_run_u16_avx2(const float* x, uint16_t* y, int64_t n, float scale, int32_t zp);
void quantize_run_s16_avx2(const float* x, int16_t* y, int64_t n, float scale, int32_t zp);
void quantize_run_u8_avx512vnni(const float* x, uint8_t* y, int64_t n, float scale, int32_t zp);
void quantize_run_s8_avx512vnni(const float* x, int8_t* y, int64_t n, float scale, int32_t zp);
void quantize_run_u16_avx512vnni(const float* x, uint16_t* y, int64_t n, float scale, int32_t zp);
void quantize_run_s16_avx512vnni(const float* x, int16_t* y, int64_t n, float scale, int32_t zp);

}  // namespace quanta
