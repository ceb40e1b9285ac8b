// Tensor kernels for the float and shape-math steps of quantized models that are not
// quantized operators: Clip, Cast, the unary IEEE functions, integer binary arithmetic,
// comparisons and logic with numpy broadcasting, float32 row reductions, one axis of a
// separable Resize, and gathers along an axis (Gather, nearest Resize, any Transpose).
//
// ---------------------------------------------------------------------------------------
// Contract (docs/float-ops.md "Tensor ops"; NumPy twins: kernels/reference/math_ops.py,
// nn.py, reduce_ops.py, nn_resize.py, nn_norm.py). One IEEE operation per step, in the
// order written, no fused multiply-add (-ffp-contract=off), true divisions and square
// roots; the loops are plain C++ that each ISA file compiles with its own -m flags (the
// compiler vectorizes lanes that are independent, which never reorders an operation).
// ---------------------------------------------------------------------------------------
//
//   max(a, b)   numpy's np.maximum: a if a is NaN, else (a > b ? a : b) — on a tie
//               (±0) the SECOND operand; min alike with <
//   clip        y = min(max(x, lo), hi), each bound only when given (nn.clip)
//   sqrt, neg, abs, reciprocal (f32(1 / x)), square f32(x · x), cube f32(f32(x · x) · x)
//   hard_sigmoid  y = clip01(f32(f32(alpha · x) + beta))   alpha, beta float32, clip01 as
//               np.clip(t, 0, 1): t itself on NaN and on ties (clip01(−0) = −0)
//   hard_swish  y = f32(x · clip01(f32(f32(x · f32(1/6)) + 0.5)))
//   leaky_relu  y = x < 0 ? f32(x · alpha) : x   (NaN and ±0 pass through; nn.leaky_relu)
//   cast        C conversions as numpy's astype: float -> integer truncates toward zero
//               (out of range: undefined in ONNX, not pinned), integer -> narrower
//               integer keeps the low bits, -> bool is x != 0 (NaN -> true)
//   binary int  c = a op b in the type, numpy broadcasting: add / sub / mul wrap (two's
//               complement); div truncates toward zero with x / 0 = 0 and MIN / −1 = MIN
//               (math_ops.int_div_trunc); max / min
//   compare     c = a op b as bool (uint8 0/1); logic and / or / xor on bool
//   reduce      rows [R, D] float32: sum16 (R1)–(R3), of x (sum) or f32(x · x) (sumsq);
//               max / min in 16 lanes from −inf / +inf, acc_j = max(acc_j, x_i) for
//               i ≡ j (mod 16) in increasing i, then acc_j = max(acc_j, acc_{j+h}),
//               h = 8, 4, 2, 1 (docs/float-ops.md (M1)–(M3)); prod: the lanes of (R1) from
//               +1 with f32(acc_j · x_i), the tree of (R2) with products (P16)
//   reduce middle  x [outer, D, inner] float32 -> y [outer, inner]: y[o, c] is `reduce` of
//               the row x[o, 0 … D−1, c] (the same lanes, order and tree), computed in
//               place across the columns c instead of on a transposed copy
//   reduce int  rows [R, D] int32 / int64: sum, sum of squares, sum of |x|, product (all
//               wrapping, two's complement, so any order gives the same bits; |MIN| = MIN),
//               max, min (numpy's np.sum / np.prod / np.maximum.reduce in the type)
//   resize_axis in double, y[a, q, c] = Σ_t x[a, taps[q, t], c] · w[q, t], t = 0 … T−1 in
//               order, the first product being the start of the sum (nn_resize (3))
//   batch_norm  y = f32(f32(f32(f32(x − m_c) / d_c) · g_c) + b_c) for the channel c of
//               each row of `inner` elements (d_c = f32(sqrt(f32(var_c + eps))), given)
//   acc_to_float  y = f32(f32(int32(acc + bias_c)) · scale_c) (+ fbias_c): the float output
//               stage of an integer convolution (quanta::AccumulatorToFloat); the int32 sum
//               wraps, the conversion rounds to nearest even, each float op rounds once
//   acc_to_quant  y = QuantizeLinear(post(acc_to_float(acc)), y_scale, zy), uint8 or int8:
//               quanta::AccumulatorToQuant, the composition of acc_to_float, the float
//               convolutions' post-op (sgemm::apply_post, the activation's nodes in order)
//               and QuantizeLinear's per-tensor run (true float32 division, round half to
//               even, saturation), piece by piece of each row (acc_to_quant.cc)
//   take_axis   y[a, q, :] = x[a, idx[q], :], rows of `inner` bytes (memcpy)
//   repeat_2d   y[p, oy, ox] = x[p, oy / sh, ox / sw] (integer division): nearest upsampling
//               by integer factors of the last two axes, bytes moved
//
// Threads: outputs are split into chunks of whole runs; a chunk is computed by the same
// instructions whichever thread runs it, so the bytes are identical for any num_threads.
#pragma once

#include <cstdint>

#include "broadcast.h"
#include "dispatch.h"

namespace quanta {
namespace sgemm {
struct PostOp;
}  // namespace sgemm
}  // namespace quanta

namespace quanta {
namespace tensor_ops {

// Element types (the binding maps numpy dtypes to these).
enum class DType : int { kF32 = 0, kF64 = 1, kI8 = 2, kU8 = 3, kI32 = 4, kI64 = 5, kBool = 6 };
constexpr int kNumDTypes = 7;

enum class UnaryF32 : int {
  kClip = 0,
  kSqrt = 1,
  kNeg = 2,
  kAbs = 3,
  kReciprocal = 4,
  kSquare = 5,
  kCube = 6,
  kHardSigmoid = 7,
  kHardSwish = 8,
  kLeakyRelu = 9
};
constexpr int kNumUnaryF32 = 10;

struct UnaryParams {
  float lo = 0, hi = 0;  // clip bounds
  bool has_lo = false, has_hi = false;
  float alpha = 0, beta = 0;  // hard_sigmoid; leaky_relu's alpha
};

// kMod / kFmod: int32 / int64 only (ONNX Mod, fmod 0 / 1)
enum class BinaryInt : int { kAdd = 0, kSub = 1, kMul = 2, kDiv = 3, kMax = 4, kMin = 5, kMod = 6, kFmod = 7 };
constexpr int kNumBinaryInt = 8;
enum class Compare : int { kEqual = 0, kLess = 1, kLessOrEqual = 2, kGreater = 3, kGreaterOrEqual = 4 };
enum class Logic : int { kAnd = 0, kOr = 1, kXor = 2 };
enum class Reduce : int { kSum = 0, kSumSquare = 1, kMax = 2, kMin = 3, kProd = 4 };
constexpr int kNumReduce = 5;
enum class ReduceInt : int { kSum = 0, kSumSquare = 1, kSumAbs = 2, kProd = 3, kMax = 4, kMin = 5 };
constexpr int kNumReduceInt = 6;

using UnaryF32Fn = void (*)(const float* x, float* y, int64_t n, const UnaryParams& p);
// integer clip: bounds already in the type's range
using ClipIntFn = void (*)(const void* x, void* y, int64_t n, int64_t lo, int64_t hi, bool has_lo, bool has_hi);
using CastFn = void (*)(const void* x, void* y, int64_t n);
// broadcast runs (broadcast.h): a_step / b_step are 1 or 0; pointers in elements of the type
using RunFn = void (*)(const void* a, int64_t a_step, const void* b, int64_t b_step, void* c, int64_t n);
using ReduceFn = void (*)(const float* x, int64_t rows, int64_t d, float* y);
// columns [c0, c1) of one slab x [d, inner] -> y[c0 … c1−1]; c1 − c0 <= kMiddleTile
using ReduceMiddleFn = void (*)(const float* x, int64_t d, int64_t inner, int64_t c0, int64_t c1, float* y);
// Columns per reduce_middle call: its 16 lanes of every column (16 KB) stay in L1.
constexpr int64_t kMiddleTile = 256;
// rows [rows, d] of the type -> y [rows] of the type; pointers in elements of the type
using ReduceIntFn = void (*)(const void* x, int64_t rows, int64_t d, void* y);
// rows of `inner` elements; row r has channel r mod channels; p = {m, d, g, b}, [channels] each
using BatchNormFn = void (*)(const float* x, float* y, int64_t rows, int64_t inner, int64_t channels, const float* m,
                             const float* d, const float* g, const float* b, int64_t row0);
// rows of `inner` int32 accumulators, channel r mod channels; bias / fbias may be null
using AccToFloatFn = void (*)(const int32_t* acc, float* y, int64_t rows, int64_t inner, int64_t channels,
                              const int32_t* bias, const float* scale, const float* fbias, int64_t row0);
using ResizeAxisFn = void (*)(const double* x, int64_t outer, int64_t n, int64_t inner, const int64_t* taps,
                              const double* w, int64_t o, int64_t t, double* y);

// One table per ISA (tensor_ops_<isa>.cc); a null entry is a combination without a kernel.
// Paddle's written-out hardswish on y in place, p = {b, lo, hi, d}, the four steps of the
// graph in their order: t = f32(y + b); t = min(max(t, lo), hi) (clip; a NaN or infinite
// bound is none); t = f32(y · t); y = f32(t / d) (sgemm.h PostKind::kClipGateDiv).
using ClipGateDivFn = void (*)(float* y, int64_t n, const float* p);

struct Kernels {
  const char* isa;
  UnaryF32Fn unary_f32[kNumUnaryF32];
  ClipIntFn clip_int[kNumDTypes];               // kI8, kU8, kI32, kI64
  CastFn cast[kNumDTypes][kNumDTypes];          // [from][to]
  RunFn binary_int[kNumDTypes][kNumBinaryInt];  // kF64, kI32, kI64
  RunFn compare[kNumDTypes][5];                 // every type
  RunFn logic[3];                               // bool
  ReduceFn reduce[kNumReduce];
  ReduceMiddleFn reduce_middle[kNumReduce];
  ReduceIntFn reduce_int[kNumDTypes][kNumReduceInt];  // kI32, kI64
  ResizeAxisFn resize_axis;
  BatchNormFn batch_norm;
  AccToFloatFn acc_to_float;
  ClipGateDivFn clip_gate_div;
};

// Each ISA's table is built on first use, inside its own file's function: a namespace-scope
// table would be filled by a static initializer compiled with that file's -m flags, which
// runs when the library loads and faults on a CPU without the ISA (seen with AVX-512 code
// on an AVX2-only core).
const Kernels& kernels_portable();
const Kernels& kernels_avx2();
const Kernels& kernels_avx512vnni();
const Kernels& kernels_for(Isa isa);

int64_t dtype_size(DType t);

// ---- drivers (tensor_ops.cc) ----------------------------------------------------------------

void unary_f32(UnaryF32 op, const float* x, float* y, int64_t n, const UnaryParams& p, int num_threads, Isa isa);
void clip_int(DType t, const void* x, void* y, int64_t n, int64_t lo, int64_t hi, bool has_lo, bool has_hi,
              int num_threads, Isa isa);
void cast(DType from, DType to, const void* x, void* y, int64_t n, int num_threads, Isa isa);
// kind 0: binary_int (op BinaryInt), 1: compare (op Compare), 2: logic (op Logic)
void broadcast_op(int kind, int op, DType t, const void* a, const void* b, void* c, const broadcast::Shape& s,
                  int num_threads, Isa isa);
void reduce_rows(Reduce op, const float* x, int64_t rows, int64_t d, float* y, int num_threads, Isa isa);
void reduce_middle(Reduce op, const float* x, int64_t outer, int64_t d, int64_t inner, float* y, int num_threads,
                   Isa isa);
// t: kI32 or kI64
void reduce_rows_int(ReduceInt op, DType t, const void* x, int64_t rows, int64_t d, void* y, int num_threads, Isa isa);
void resize_axis(const double* x, int64_t outer, int64_t n, int64_t inner, const int64_t* taps, const double* w,
                 int64_t o, int64_t t, double* y, int num_threads, Isa isa);
// Two resize_axis steps over the last two axes of float32 planes x [planes, h, w] (rows
// first: the h axis with taps_a / w_a, then the w axis with taps_b / w_b; else the other
// way round), one plane at a time in double buffers of its own, and the result rounded
// to float32 once: the bytes of cast -> resize_axis -> resize_axis -> cast, without the
// tensor-sized double intermediates. With lanes > 1 each plane is [h, w, lanes] (an
// NCHW16c block: lanes 16) and each lane runs the chain of a plane of its own.
void resize_2d_f32(const float* x, int64_t planes, int64_t h, int64_t w, int64_t lanes, bool rows_first,
                   const int64_t* taps_a, const double* w_a, int64_t o_a, int64_t t_a, const int64_t* taps_b,
                   const double* w_b, int64_t o_b, int64_t t_b, float* y, int num_threads, Isa isa);
void batch_norm(const float* x, float* y, int64_t rows, int64_t inner, int64_t channels, const float* m, const float* d,
                const float* g, const float* b, int num_threads, Isa isa);
void acc_to_float(const int32_t* acc, float* y, int64_t rows, int64_t inner, int64_t channels, const int32_t* bias,
                  const float* scale, const float* fbias, int num_threads, Isa isa);
template <typename T>  // uint8_t or int8_t
void acc_to_quant(const int32_t* acc, T* y, int64_t rows, int64_t inner, int64_t channels, const int32_t* bias,
                  const float* scale, const float* fbias, const sgemm::PostOp* post, float y_scale, int32_t zy,
                  int num_threads, Isa isa);
// quanta::SoftmaxQuant: y[r, :] = QuantizeLinear(Softmax(Add?(Mul?(x[r, :], scale), mask[mask_rows[r], :])),
// y_scale, zy) over `rows` rows of d <= kSoftmaxQuantMaxD elements (softmax_quant.cc); scale (one
// value) and mask (with mask_rows: the mask row of each x row) may be null.
constexpr int64_t kSoftmaxQuantMaxD = 4096;
template <typename T>  // uint8_t or int8_t
void softmax_quant(const float* x, T* y, int64_t rows, int64_t d, const float* scale, const float* mask,
                   const int64_t* mask_rows, float y_scale, int32_t zy, int num_threads, Isa isa);
// softmax_quant's rows on AVX-512, one thread: the same bytes in three passes over the
// rows instead of six (softmax_quant_avx512vnni.cc)
template <typename T>
void softmax_quant_rows_avx512vnni(const float* x, T* y, int64_t rows, int64_t d, const float* scale, const float* mask,
                                   const int64_t* mask_rows, float y_scale, int32_t zy);
// quanta::MulQuant: y[r, i] = QuantizeLinear(f32(a(x[r, i]) · c[i · c_step]), y_scale, zy) over `rows`
// rows of d elements (mul_quant.cc); c_step 1 (one factor per column) or 0 (one factor); a the
// identity, or with `gelu` float_ops' Gelu (G1) (MulQuant's activation "gelu").
template <typename T>  // uint8_t or int8_t
void mul_quant(const float* x, T* y, int64_t rows, int64_t d, const float* c, int64_t c_step, float y_scale, int32_t zy,
               int num_threads, Isa isa, bool gelu = false);
// mul_quant's rows on AVX-512, one thread (mul_quant_avx512vnni.cc)
template <typename T>
void mul_quant_rows_avx512vnni(const float* x, T* y, int64_t rows, int64_t d, const float* c, int64_t c_step,
                               float y_scale, int32_t zy);
// y[a, q, :] = x[a, idx[q], :]; idx already in [0, n)
void take_axis(const uint8_t* x, int64_t outer, int64_t n, int64_t inner_bytes, const int64_t* idx, int64_t m,
               uint8_t* y, int num_threads);
// y [planes, h·sh, w·sw] = x [planes, h, w] with each element repeated sw times along a
// row and each widened row sh times; elements of `elem` bytes (1, 2, 4 or 8). Threads take
// chunks of input rows.
void repeat_2d(const uint8_t* x, int64_t planes, int64_t h, int64_t w, int64_t elem, int64_t sh, int64_t sw, uint8_t* y,
               int num_threads);
// y (contiguous, shape[rank]) = the strided view x (byte strides, may be 0 or negative)
void copy_strided(const uint8_t* x, int rank, const int64_t* shape, const int64_t* strides, int64_t elem, uint8_t* y,
                  int num_threads);

// dst[o·n] = src[o] for o < count, elements of type T (bytes moved, never computed): one
// row of an interleave (copy_strided's short strided runs, concat_into's inputs of one
// element a row).
template <typename T>
inline void interleave_column(const uint8_t* src, int64_t count, int64_t n, uint8_t* dst) {
  const T* s = reinterpret_cast<const T*>(src);
  T* d = reinterpret_cast<T*>(dst);
  for (int64_t o = 0; o < count; ++o) d[o * n] = s[o];
}

}  // namespace tensor_ops
}  // namespace quanta
