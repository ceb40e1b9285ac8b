// Integer-only kernels of the npu-sim device (quanta.int operators), bit-exact with the
// NumPy golden quanta/kernels/reference/intonly.py. Portable scalar C++: every value is
// an integer, accumulators are exact in int64 and wrap to int32 where the golden wraps.
// The requantization multiplier/shift arrive precomputed (passes/lower/integer_only.py):
// nothing here derives a real number.
#pragma once

#include <cstdint>

namespace quanta {
namespace intonly {

enum class Rounding { kDouble = 0, kSingle = 1, kTosa = 2 };

// acc · multiplier · 2^(shift - 31), rounded in `r` mode (golden apply_scale).
int64_t apply_scale(int64_t acc, int32_t multiplier, int32_t shift, Rounding r);

inline int32_t wrap32(int64_t v) { return static_cast<int32_t>(static_cast<uint32_t>(static_cast<uint64_t>(v))); }

inline int32_t clamp(int64_t v, int32_t lo, int32_t hi) {
  return static_cast<int32_t>(v < lo ? lo : (v > hi ? hi : v));
}

// y[o, c, i] = clamp(apply_scale(acc[o, c, i], m[c], s[c]) + zy): `channels` = 1 for one
// multiplier. acc int32.
void requantize(const int32_t* acc, int64_t outer, int64_t channels, int64_t inner, const int32_t* mult,
                const int32_t* shift, int64_t n_params, int32_t zy, int32_t lo, int32_t hi, Rounding r, int32_t* y);

// a [batch, M, K], b [batch_b, K, N] (batch_b = 1: shared), c [N] or null:
// acc = Σ a·b − zb·Σ_k a + c  (c given), else Σ (a − za)(b − zb); per column or tensor.
void matmul(const int32_t* a, const int32_t* b, const int32_t* c, int64_t batch, int64_t batch_b, int64_t m, int64_t k,
            int64_t n, int32_t za, int32_t zb, int32_t zy, const int32_t* mult, const int32_t* shift, int64_t n_params,
            int32_t lo, int32_t hi, Rounding r, int32_t* y);

// x [N, C, H, W], w [M, C/group, KH, KW], c [M]; padding holds zx.
struct Conv2d {
  int64_t n, ci, h, w, co, kh, kw, oh, ow, group;
  int64_t stride[2], dilation[2], pad[2];  // pad: begin of H and W
};
void conv2d(const int32_t* x, const int32_t* w, const int32_t* c, const Conv2d& g, int32_t zx, int32_t zy,
            const int32_t* mult, const int32_t* shift, int64_t n_params, int32_t lo, int32_t hi, Rounding r,
            int32_t* y);

// TFLite's integer Add over equal-size a, b.
struct AddParams {
  int32_t za, zb, zy, am, as, bm, bs, m, s, left, lo, hi;
};
void add(const int32_t* a, const int32_t* b, int64_t size, const AddParams& p, Rounding r, int32_t* y);
void mul(const int32_t* a, const int32_t* b, int64_t size, int32_t za, int32_t zb, int32_t zy, int32_t m, int32_t s,
         int32_t lo, int32_t hi, Rounding r, int32_t* y);

// rows [R, n] along the last axis.
void softmax(const int32_t* x, int64_t rows, int64_t n, const int32_t* exp_table, int32_t y_shift, int32_t zy,
             int32_t lo, int32_t hi, int32_t* y);
void layer_norm(const int32_t* x, int64_t rows, int64_t n, const int32_t* g, const int32_t* b, int32_t zx, int32_t zy,
                int64_t eps, int32_t gamma_shift, int32_t lo, int32_t hi, int32_t* y);

// floor(sqrt(v)), v >= 0, by Newton's iteration from 2^ceil(bits(v)/2) (I-BERT).
int64_t isqrt(int64_t v);

// I-BERT's i-exp (golden int_exp, eq. (IO12)) of -d, d >= 0: floor(p · 2^(exp_shift - z)),
// z = d / -x0, r = -(d mod -x0), p = (r + b)² + c.
int64_t int_exp(int64_t d, int64_t x0, int64_t b, int64_t c, int32_t exp_shift);

// Softmax with the polynomial exp (wide inputs: no table), rows [R, n] along the last axis.
struct ExpPoly {
  int64_t x0, b, c;
  int32_t shift;
};
void softmax_poly(const int32_t* x, int64_t rows, int64_t n, const ExpPoly& e, int32_t y_shift, int32_t zy, int32_t lo,
                  int32_t hi, int32_t* y);

// I-BERT's i-GELU (golden int_gelu, eq. (IO13)). Returns -1, or the index of the first
// element whose pre-shifted value leaves int32 (y is then incomplete: the caller raises).
struct GeluPoly {
  int64_t b, c;
  int32_t zx, pre_shift, multiplier, shift, zy;
};
int64_t gelu(const int32_t* x, int64_t size, const GeluPoly& g, int32_t lo, int32_t hi, Rounding r, int32_t* y);

// TFLite's int16 table lookup with linear interpolation (golden int_lookup, eq. (IO14)):
// x int16 codes, table [513] int16 (512 steps of 128 codes and the end point); y int16.
// j = (x + 32768) >> 7, o = (x + 32768) & 127, y = T[j] + ((T[j + 1] - T[j])·o + 64) >> 7.
void lookup16(const int32_t* x, int64_t size, const int32_t* table, int32_t* y);

}  // namespace intonly
}  // namespace quanta
