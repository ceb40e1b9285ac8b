// Elementwise ops on 16-bit codes (docs/quantization-math.md "A16 elementwise", eqs.
// (E1)-(E3); the twin is quanta/kernels/reference/requant16.py): one rounding per product,
// sum and quotient in the written order (the build passes -ffp-contract=off), rounded half
// to even, so the codes equal the twin's. affine16 computes in float64; the binary ops are
// the float group's float32 steps (DequantizeLinear, the op, QuantizeLinear's division).
//
//   affine16   y = sat(rne(clamp(f64(x − zx)·m[c] + b[c], lo, hi)))   x [outer, C, inner]
//   mul16      y = sat(rne(f32(f32(f32(a − za)·sa)·f32(f32(b − zb)·sb)) / sy) + zy)
//   add16      y = sat(rne(f32(f32(f32(a − za)·sa)+f32(f32(b − zb)·sb)) / sy) + zy)
//              (numpy broadcasting)
//   lut16      y = table[bits(x)]                                     a 65536-entry table
#pragma once

#include <cstdint>

#include "broadcast.h"
#include "dispatch.h"

namespace quanta {
namespace a16w8 {

struct Affine16 {
  int64_t outer = 1, channels = 1, inner = 1;
  const double* m = nullptr;  // [channels]
  const double* b = nullptr;
  int32_t zx = 0;
  double lo = 0, hi = 0;  // integer code bounds
};

struct Binary16 {
  bool mul = true;
  int32_t za = 0, zb = 0;
  float sa = 0, sb = 0, sy = 1;  // the float32 scales: the group's steps, eqs. (E2) / (E3)
  double zy = 0, lo = 0, hi = 0;
};

// TI, TO: uint16_t or int16_t.
template <typename TI, typename TO>
void affine16(const TI* x, TO* y, const Affine16& p, Isa isa);
template <typename T>
void binary16(const T* a, const T* b, T* y, const broadcast::Shape& s, const Binary16& p, Isa isa);

// y[i] = table[x[i]] over n codes; x holds the 16 bits of the input's codes (an int16 x
// viewed as uint16), the table 65536 codes of the output's 16-bit type (T: 2 bytes).
template <typename T>
void lut16(const uint16_t* x, T* y, int64_t n, const T* table);

}  // namespace a16w8
}  // namespace quanta
