// Float32 kernels for the float islands of quantized models: Softmax, LayerNormalization,
// the binary Add / Sub / Mul / Div with numpy broadcasting, the elementwise erf, tanh,
// sigmoid, relu and Gelu; exp as a building block.
//
// ---------------------------------------------------------------------------------------
// Contract (docs/float-ops.md; NumPy twin: kernels/reference/float_ops.py). Every float
// operation below is one float32 IEEE operation in the order written: no fused multiply-
// add (-ffp-contract=off) except where an equation writes fma (one rounding: std::fma,
// vfmadd), true divisions and square roots (correctly rounded), rne = round half to even. Every ISA variant therefore gives the bytes of the twin (NaN
// payloads aside: a NaN result is NaN everywhere, its sign/payload bits are not pinned).
// ---------------------------------------------------------------------------------------
//
//   exp       (E1) t = min(max(x, −104), 89)            (E2) n = rne(f32(t · L2E))
//             (E3) r = f32(f32(t − f32(n · C1)) − f32(n · C2))
//             (E4) h = P0; h = f32(f32(h · r) + Pk), k = 1..5
//             (E5) p = f32(f32(f32(h · f32(r · r)) + r) + 1)
//             (E6) y = f32(f32(p · 2^n1) · 2^n2), n1 = floor(n / 2), n2 = n − n1
//             (constants: float_ops_scalar.h, bit patterns in the comments)
//   sum16     (R1) lane j = i mod 16 accumulates x_i from +0 in increasing i
//             (R2) acc_j = f32(acc_j + acc_{j+h}) for h = 8, 4, 2, 1, j < h   (R3) acc_0
//             AVX-512: one zmm accumulator; AVX2: two ymm (lanes 0–7 and 8–15 of each
//             16-block), first tree step = ymm0 + ymm1; portable: float acc[16].
//   softmax   (S1) m = max of the non-NaN x_i (−inf if none)
//             (S2) e_i = exp(f32(x_i − m))  (S3) s = sum16(e)  (S4) r = f32(1 / s)
//             (S5) y_i = f32(e_i · r)
//   layer_norm (L1) mean = f32(sum16(x) / D), then clamped to [min x_i, max x_i] (L1c)
//             (L2) d_i = f32(x_i − mean)
//             (L3) var = f32(sum16(f32(d_i · d_i)) / D)
//             (L4) inv_std = f32(1 / f32(sqrt(f32(var + eps))))
//             (L5) y_i = f32(f32(f32(d_i · inv_std) · scale_i) + bias_i)   (no bias: no add)
//             divide (quanta::LayerNormDiv, the written-out form of exports):
//             (L4') s = f32(sqrt(f32(var + eps)))  (L5') y_i = f32(f32(f32(d_i / s) · scale_i) + bias_i)
//             rms (quanta::RMSNormDiv, T5's written-out RMS norm): no mean, d_i = x_i
//             (L1r) mean = +0  (x_i − +0 is x_i for every float32, −0 and NaN included),
//             then (L3), (L4), (L5) (reciprocal) or (L4'), (L5') (divide): eqs. (RMS1)-(RMS4)
//   binary    c = f32(a op b), op in + − · /, numpy broadcasting; max / min as np.maximum /
//             np.minimum: a if a is NaN, else (a > b ? a : b) (min: <), so a NaN b propagates
//             and a tie of ±0 gives b
//   erf       (F1) t = min(|x|, 3.925)  (F2) s = f32(t · t)
//             (F3) p = A0; p = f32(f32(p · s) + Ak), k = 1..5;  ys = f32(f32(p · t) + t)
//             (F4) q = B0; q = f32(f32(q · t) + Bk), k = 1..6;  q = f32(f32(q · t) + t)
//                  yb = f32(1 − exp(−q))
//             (F5) y = copysign(t > 0.921875 ? yb : ys, x)
//   tanh      (T1) t = |x|, s = f32(t · t)
//             (T2) p = T5; p = f32(f32(p · s) + Tk), k = 4..0;  ys = f32(t + f32(t · f32(s · p)))
//             (T3) e = exp(f32(t + t));  yb = f32(1 − f32(2 / f32(e + 1)))
//             (T4) y = copysign(t < 0.75 ? ys : yb, x)
//   sigmoid   (Σ1) e = exp(−|x|) by (EN1)-(EN6)
//             (Σ2) y = x >= 0 ? f32(1 / f32(1 + e)) : f32(e / f32(1 + e))
//             (one division of the selected numerator)
//   fused exp (EN1) t = max(x, −104) for x <= 0 or NaN  (EN2) n = rne(f32(t · L2E))
//             (EN3) r = fma(−n, C2, f32(t − f32(n · C1)))  (EN4) h = P0; h = fma(h, r, Pk), k = 1..5
//             (EN5) p = f32(fma(h, f32(r · r), r) + 1)  (EN6) y = (E6)
//   silu      y = f32(x · sigmoid(x)): the Sigmoid and Mul of a SiLU gate in one pass
//   expm1     (X1) q = Q6; q = f32(f32(q · x) + Qk), k = 5..0;  ys = f32(x + f32(f32(x · x) · q))
//             (X2) yb = f32(exp(x) − 1)   (E1)-(E6)
//             (X3) y = |x| < f32(ln 2 / 2) ? ys : yb   (NaN: yb)   (Qk = f32(1 / (k + 2)!))
//   elu       (EL) y = x < 0 ? f32(f32(alpha) · expm1(x)) : x   (NaN and ±0 pass through): one
//             pass; a vector with no negative lane is copied without computing expm1
//   half      f32 -> f16 bits: round to nearest even, overflow to ±inf, subnormal halves
//             (vcvtps2ph); f16 -> f32 exact (vcvtph2ps). A NaN keeps its payload as NumPy's
//             npy_floatbits_to_halfbits / npy_halfbits_to_floatbits do (the top payload
//             bits, a signalling NaN stays signalling, an all-zero half payload becomes 1),
//             where the hardware would set the quiet bit: NaN lanes are redone one by one.
//   relu      y = np.maximum(x, 0): +0 for ±0, NaN stays NaN
//   log       (LN1) ±0 -> −inf, +inf -> +inf, x < 0 or NaN -> NaN; else
//             (LN2) x < FLT_MIN: x' = f32(x · 2^23), e0 = −23 (else x' = x, e0 = 0)
//             (LN3) x' = m · 2^e (frexp, m in [0.5, 1)), e = e + e0
//             (LN4) m < f32(√½): e = e − 1, f = f32(f32(m + m) − 1); else f = f32(m − 1)
//             (LN5) z = f32(f · f); p = Q0; p = f32(f32(p · f) + Qk), k = 1..8;
//                   y = f32(f32(p · f) · z)
//             (LN6) y = f32(y + f32(e · C2)); y = f32(y − f32(0.5 · z));
//                   y = f32(f32(f + y) + f32(e · C1))            (C1, C2 of (E3); Cephes logf)
//   cos       (CS1) NaN, ±inf -> NaN; t = min(|x|, 2^24)
//             (CS2) j = trunc(f32(t · f32(4/π))); q = 2 · ceil(f32(j · 0.5))   (exact)
//             (CS3) o = q − 8 · floor(f32(q · 0.125))   (q mod 8, exact)
//             (CS4) z = f32(f32(f32(t − f32(q · DP1)) − f32(q · DP2)) − f32(q · DP3))
//             (CS5) s = f32(z · z);
//                   yc = f32(f32(f32(f32(f32(f32(f32(C0 · s) + C1) · s) + C2) · s) · s) − f32(0.5 · s)) + 1)
//                   ys = f32(f32(f32(f32(f32(f32(f32(S0 · s) + S1) · s) + S2) · s) · z) + z)
//             (CS6) y = o in {2, 6} ? ys : yc, negated for o in {2, 4}        (Cephes cosf)
//   sin       (CS1)-(CS5) of |x|, then
//             (SN1) y = o in {2, 6} ? yc : ys, negated for o in {4, 6}, negated again for a
//                   negative sign bit of x                                 (Cephes sinf)
//   atan      (AT1) a = |x|
//             (AT2) a > T3P8: y0 = π/2, r = f32(−1 / a); a > TP8: y0 = π/4,
//                   r = f32(f32(a − 1) / f32(a + 1)); else y0 = 0, r = a
//             (AT3) z = f32(r · r); p = P0; p = f32(f32(p · z) + Pk), k = 1..3;
//                   y = f32(y0 + f32(f32(f32(p · z) · r) + r))
//             (AT4) y with the sign bit of x                           (Cephes atanf)
//   gelu      (G1) y = f32(f32(0.5 · x) · f32(1 + erf(f32(x / f32(√2)))))
//             (G2) a = f32(K · f32(x + f32(C · f32(f32(x · x) · x))));
//                  y = f32(f32(0.5 · x) · f32(1 + tanh(a)))        (approximate = "tanh")
//             Both branches of a split are computed for every element and one is selected.
//   mlas_logistic, mlas_tanh   ONNX Runtime's MlasComputeLogistic / MlasComputeTanh (its
//             Sigmoid and Tanh), rational approximations with FMA Horner steps:
//             recurrent/recurrent_scalar.h (logistic_one, tanh_one) and recurrent/mlas_simd.h;
//             the twin is kernels/reference/ms_lstm.py (mlas_logistic, mlas_tanh).
//   gelu_tanh_mlas  (G2) with tanh = mlas_tanh (quanta::MlasGeluTanh: the written-out
//             tanh GELU of a file ORT's quantizer wrote, whose Tanh is MLAS's)
//   fast_gelu_ort  (FG1) ORT's FastGelu kernel: a = f32(x · f32(f32(f32(C' · x) · x) + B)),
//             y = f32(f32(0.5 · x) · f32(mlas_tanh(a) + 1))   (quanta::OrtFastGelu)
//   mlas_softmax  ORT's MlasComputeSoftmax on an AVX2 host (quanta::MlasSoftmax):
//             (SM1) m = max(lowest, the non-NaN x_i)   (SM2) e_i = MLAS's exp of f32(x_i − m)
//             (fma steps, kernels/reference/ort_float.py mlas_sum_exp)
//             (SM3) 8 lanes: lane j adds e_{8g+j} from +0 in increasing g (the last vector
//             masked: its empty lanes add +0)  s = ((l0+l1)+(l2+l3)) + ((l4+l5)+(l6+l7))
//             (SM4) r = f32(1 / s)  (SM5) y_i = f32(e_i · r)
//             On an AVX-512F host ORT's order is (SX1) (the exp's 2^m by vscalefps: one
//             rounding, subnormals too) and (SX2) (16 lanes, the high half folded onto
//             the low, then (SM3)'s tree); mlas_softmax takes it when avx512f_order.
//   ort_layer_norm  ORT 1.32's LayerNormalization family on an AVX2 host (quanta::OrtLayerNorm),
//             kernel 0 (LayerNormalization), 1 (SimplifiedLayerNormalization), 2 (Skip):
//             (OL1)-(OL5) kernel 0, d >= 8: mean = f32(S / d), S the float64 sum over 4 lanes
//             ((l0+l2)+(l1+l3), then the tail in order); d_i = f32(x_i − mean);
//             Q = Σ d_i² by (OL3): 8 lanes of fma, ((q0+q4)+(q2+q6))+((q1+q5)+(q3+q7)), then
//             four f32(d·d) added in order when 4 remain, then one fma per element;
//             inv = f32(1 / sqrt(f32(f32(Q / d) + eps)));
//             y_i = fma(f32(d_i · inv), scale_i, bias_i)   (no bias: f32(f32(d_i · inv) · scale_i))
//             (OL6) kernel 1, d >= 16: Q of x_i by (OL3), inv as above, y_i = f32(f32(inv · x_i) · scale_i)
//             (OL7) kernel 1, d < 16: s = Σ f32(x_i · x_i) in order (no fma);
//             r = sqrt(f32(f32(s / d) + eps)); y_i = f32(f32(x_i / r) · scale_i)
//             (OL8) kernel 2, or kernel 0 with d < 8: Welford, mean = M2 = +0, for k = 1..d:
//             δ = f32(x_k − mean), mean = f32(mean + f32(δ / k)), M2 = f32(M2 + f32(f32(x_k − mean) · δ))
//             (OL9) std = sqrt(f32(f32(M2 / d) + eps)); y_i = f32(f32(f32(x_i − mean) / std) · scale_i) + bias_i
//
// Broadcasting (binary): the driver drops size-1 dimensions and merges adjacent dimensions
// that are contiguous (or broadcast) in both inputs, so any broadcast is an odometer over
// outer dimensions around an inner run in which each input steps by 1 or repeats one
// element (step 0): same shape, scalar, [1,128,384] + [384] and [1,6,128,128] +
// [1,1,1,128] all reach the vector loop.
//
// Threads: rows (softmax, layer_norm) or output positions (binary, exp, unary) are split into
// chunks; a row or an element is computed by the same instructions whichever thread runs
// it, so the bytes are identical for any num_threads. Buffers are owned by the caller.
#pragma once

#include <cstdint>

#include "broadcast.h"
#include "dispatch.h"

namespace quanta {
namespace float_ops {

// (L1c) the rounded mean of a row clamped to the row's range [lo, hi]: the exact mean lies
// there, and a row of one repeated value (a silent audio frame at its dB floor) gets that
// value exactly, so its d_i are 0 instead of the mean's rounding error scaled by
// 1/sqrt(eps). A NaN mean (a row with NaN, or +inf and -inf) fails both comparisons and
// stays NaN, so how lo / hi treat NaN does not matter.
inline float clamp_to(float mean, float lo, float hi) {
  if (mean < lo) mean = lo;
  if (mean > hi) mean = hi;
  return mean;
}

// (L1c) with the row's range found by a scalar pass (the portable kernel).
inline float clamp_mean(const float* xr, int64_t d, float mean) {
  if (d <= 0) return mean;
  float lo = xr[0], hi = xr[0];
  for (int64_t i = 1; i < d; ++i) {
    lo = xr[i] < lo ? xr[i] : lo;
    hi = xr[i] > hi ? xr[i] : hi;
  }
  return clamp_to(mean, lo, hi);
}

// kPRelu: a < 0 ? a * b : a (ONNX PRelu, b the slope), NaN a stays NaN
enum class BinaryOp : int { kAdd = 0, kSub = 1, kMul = 2, kDiv = 3, kMax = 4, kMin = 5, kPRelu = 6 };
enum class UnaryOp : int {
  kErf = 0,
  kTanh = 1,
  kSigmoid = 2,
  kRelu = 3,
  kGelu = 4,
  kGeluTanh = 5,
  kMlasLogistic = 6,
  kMlasTanh = 7,
  kSilu = 8,
  kLog = 9,
  kCos = 10,
  kSin = 11,
  kExpm1 = 12,
  kGeluTanhMlas = 13,
  kAtan = 14,
  kSoftplus = 15,
  kFastGeluOrt = 16
};
constexpr int kNumUnaryOps = 17;

// OrtLayerNorm's kernel (ort_layer_norm above)
enum class OrtNormKernel : int { kLayerNorm = 0, kSimplified = 1, kSkip = 2 };

// Inner runs of n elements; a_step / b_step are 1 (contiguous) or 0 (one repeated element).
using BinaryRunFn = void (*)(const float* a, int64_t a_step, const float* b, int64_t b_step, float* c, int64_t n);
// y[i] = exp(x[i]) over n elements.
using ExpRunFn = void (*)(const float* x, float* y, int64_t n);
// y[i] = f(x[i]) over n elements, f one of UnaryOp.
using UnaryRunFn = void (*)(const float* x, float* y, int64_t n);
// y[i] = elu(x[i]) with float32 alpha, (EL).
using EluRunFn = void (*)(const float* x, float* y, int64_t n, float alpha);
// float32 -> float16 bits and back (the "half" conversions above).
using ToHalfRunFn = void (*)(const float* x, uint16_t* y, int64_t n);
using FromHalfRunFn = void (*)(const uint16_t* x, float* y, int64_t n);
// `rows` contiguous rows of length d (d >= 1).
using SoftmaxRowsFn = void (*)(const float* x, float* y, int64_t rows, int64_t d);
// bias may be null (no add); mean / inv_std may be null (not written), else [rows];
// divide: (L4'), (L5') instead of (L5) (inv_std is still written as (L4)); rms: (L1r)
// instead of (L1).
using LayerNormRowsFn = void (*)(const float* x, float* y, int64_t rows, int64_t d, const float* scale,
                                 const float* bias, float epsilon, float* mean, float* inv_std, bool divide, bool rms);
// ort_layer_norm's rows (bias may be null; the simplified kernel takes none)
using OrtLayerNormRowsFn = void (*)(const float* x, float* y, int64_t rows, int64_t d, const float* scale,
                                    const float* bias, float epsilon, OrtNormKernel kernel);

// One table per ISA (filled by float_ops_<isa>.cc).
struct Kernels {
  const char* isa;
  BinaryRunFn binary[7];  // indexed by BinaryOp
  ExpRunFn exp;
  SoftmaxRowsFn softmax;
  // (S1)-(S5) with the fused exp (EN1)-(EN6) in (S2): quanta::SoftmaxQuant's rows
  // (docs/float-ops.md "SoftmaxQuant"); the float Softmax keeps (E1)-(E6)
  SoftmaxRowsFn softmax_fused;
  LayerNormRowsFn layer_norm;
  UnaryRunFn unary[kNumUnaryOps];  // indexed by UnaryOp
  EluRunFn elu;
  ToHalfRunFn to_half;
  FromHalfRunFn from_half;
  // ONNX Runtime's Softmax and LayerNorm rows (mlas_softmax, ort_layer_norm above): set by
  // each ISA's file after the table is built (AVX-512: the AVX2 rows, ORT's AVX2 host order)
  SoftmaxRowsFn mlas_softmax = nullptr;
  OrtLayerNormRowsFn ort_layer_norm = nullptr;
  // ORT's Softmax rows on an AVX-512F host, (SX1) and (SX2) (AVX-512 on avx512vnni, the
  // scalar rows of ort_rows_scalar.h elsewhere)
  SoftmaxRowsFn mlas_softmax_avx512f = nullptr;
};

// Each instruction set's table is built on its first use, inside its own file: a table
// built while the library loads would run that file's instructions on any CPU (an
// AVX-512 build of the table stopped the library from loading on an AVX2-only CPU).
const Kernels& kernels_portable();
const Kernels& kernels_avx2();
const Kernels& kernels_avx512vnni();
const Kernels& kernels_for(Isa isa);

// ---- drivers (float_ops.cc) ---------------------------------------------------------------

void exp_f32(const float* x, float* y, int64_t n, int num_threads, Isa isa);

void unary(UnaryOp op, const float* x, float* y, int64_t n, int num_threads, Isa isa);

void elu(const float* x, float* y, int64_t n, float alpha, int num_threads, Isa isa);

void to_half(const float* x, uint16_t* y, int64_t n, int num_threads, Isa isa);

void from_half(const uint16_t* x, float* y, int64_t n, int num_threads, Isa isa);

void softmax(const float* x, float* y, int64_t rows, int64_t d, int num_threads, Isa isa);

void layer_norm(const float* x, float* y, int64_t rows, int64_t d, const float* scale, const float* bias, float epsilon,
                float* mean, float* inv_std, int num_threads, Isa isa, bool divide = false, bool rms = false);

// avx512f_order: ORT's AVX-512F host order (SX1), (SX2), else its AVX2 host's
void mlas_softmax(const float* x, float* y, int64_t rows, int64_t d, int num_threads, Isa isa, bool avx512f_order);

// Whether this CPU runs ORT's AVX-512F softmax kernels: x86 with AVX2, FMA and AVX-512F
// usable (MLAS's platform table; quanta.kernels.reference.ort_host.onnxruntime_softmax_avx512f)
bool host_runs_ort_avx512f();

void ort_layer_norm(const float* x, float* y, int64_t rows, int64_t d, const float* scale, const float* bias,
                    float epsilon, OrtNormKernel kernel, int num_threads, Isa isa);

// A broadcast binary operation, dimensions already aligned to the output's rank
// (broadcast.h, shared with the other binary family).
using BroadcastShape = broadcast::Shape;

using broadcast::kMaxRank;

void binary(BinaryOp op, const float* a, const float* b, float* c, const BroadcastShape& s, int num_threads, Isa isa);

}  // namespace float_ops
}  // namespace quanta
