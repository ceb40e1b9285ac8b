// qgemm: the int8 GEMM core, u8 x s8 -> s32, with fused output stages.
//
// ---------------------------------------------------------------------------------------
// Contract (ruy mul_params.h style). Equation numbers cite docs/quantization-math.md.
// ---------------------------------------------------------------------------------------
//
// Operands: x [M, K] uint8 or int8 (row stride x_row_stride elements), w [K, N] int8 or
// uint8 (prepacked once into a PackedWeights), zx a run-time zero point (one scalar, or
// one per row, zx[m], as MatMulInteger allows), zw[n] a static per-column zero point
// (scalar = every column) given at pack time. For m < M,
// n < N, in int32 arithmetic that WRAPS modulo 2^32 (as ONNX MatMulInteger's int32
// accumulator; every order of summation gives the same bits):
//
//   acc[m,n] = Σ_k (x[m,k] − zx[m])·(w[k,n] − zw[n])  +  bias[n]                   eq. (4)
//
// computed in the folded form (eq. (5), with the u8 shift of eq. (8)):
//
//   acc[m,n] = Σ_k x'[m,k]·w'[k,n]  −  zw'[n]·Σ_k x'[m,k]  −  zx'[m]·cs[n]  +  bias[n]
//
//   x' = x, zx' = zx            for uint8 x
//   x' = x + 128, zx' = zx + 128 for int8 x  (vpdpbusd takes u8 x s8; the difference
//                                 x' − zx' = x − zx is unchanged, so the +128·Σw
//                                 compensation lands in the zx'·cs[n] term)
//   w' = w, zw' = zw            for int8 w
//   w' = w − 128, zw' = zw − 128 for uint8 w (again w' − zw' = w − zw)
//   cs[n] = Σ_k (w[k,n] − zw[n])  the "column sums", computed once at pack time
//                                 (PackedWeights::column_sums)
//
// Σ x'·w' is the micro-kernel's product; the zw' term is skipped when every zw' is 0;
// with a scalar zx, bias[n] − zx'·cs[n] is one per-call column constant.
//
// Output stage, by out_type (lo/hi: the optional fused clamp, default the type's range):
//
//   kS32: y = min(max(acc, lo), hi)
//   kF32: y = min(max(fl(float32(acc) · multiplier[n]) [+ float_bias[n]], lo), hi)
//         (dequantization, multiplier = sx·sw[n]; float_bias is added after the
//          multiply; two float32 roundings, never a fused multiply-add)
//   kU8/kS8, Requant::kFloat (eq. (6), ONNX / ONNX Runtime semantics, bit-exact with
//         quanta/kernels/reference/requant.py::requantize):
//         v = fl(float32(acc) · multiplier[n]);  v = min(max(v, L − zy), H − zy)  (float32)
//         y = round_half_even(v) + zy
//   kU8/kS8, Requant::kFixedPoint (eq. (7), gemmlowp / TFLite, bit-exact with
//         requant.py::requantize_fixed_point):
//         y = min(max(RDBPOT(SRDHM(acc·2^max(s,0), fixed_multiplier[n]), max(−s,0)) + zy, L), H)
//         with s = fixed_shift[n]
//   where L = max(qmin, lo), H = min(qmax, hi) (the clamp is applied in the output's
//   quantized domain: a fused Relu is lo = zy, Relu6 adds hi = zy + round(6/sy)).
//   kU8/kS8, Requant::kFloat with the second affine stage (post_k set; a QLinearAdd of a
//   constant per column fused onto the codes y above, docs/quantization-math.md (QA1)-(QA3),
//   bit-exact with quanta/kernels/reference/qlinear_matmul_add.py):
//         out = min(max(round_half_even(fma(post_u[n], post_r2, fma(float32(y), post_r1, post_k[n]))),
//                       qmin), qmax)
//         (each fma rounded once; y in [L, H], so float32(y) is exact)
//
// float32(acc) rounds to nearest even (|acc| > 2^24 loses bits, as the reference does).
// round_half_even uses an explicit RNE instruction in the SIMD paths and nearbyint (the
// current rounding mode, RNE unless the caller changed it) in the portable path.
//
// Per-tensor vs per-channel: multiplier / fixed_multiplier / fixed_shift are either one
// value (per_channel = false) or N values (per_channel = true).
//
// The transposed form (a 1x1 NCHW convolution computed as y[m,:] = W[m,:]·X, its output
// channels on the rows): row_bias[m] is added to acc[m,n] (after bias[n], wrapping), and
// with multiplier_per_row the multiplier has M values, multiplier[m] in place of
// multiplier[n] (kF32 and Requant::kFloat only).
//
// Dimensions: M, N and K may each be 0. K = 0 gives acc = bias; M = 0 or N = 0 writes
// nothing.
//
// Buffer ownership: the caller owns x, y, bias, multipliers (read during the call only),
// the PackedWeights (read-only, shareable between calls and threads) and the Workspace
// (scratch; one call at a time). qgemm() never allocates: everything it needs beyond the
// caller's buffers lives in the Workspace, which the caller sizes with
// qgemm_workspace_bytes() (Workspace::reserve() grows it once; later calls of the same or
// smaller size reuse it).
//
// Threads: num_threads >= 1 splits the N panels (or, when there are fewer panels than
// threads, the rows) into a few chunks per thread, claimed dynamically by the caller and
// up to num_threads − 1 workers of a small pool (thread_pool.h). Every output element is
// computed by the same instruction sequence whichever thread runs it, so the bytes are
// identical for any num_threads.
//
// Alignment: none required of the caller. The packed buffer and the workspace are
// 64-byte aligned by construction.
//
// Layering (docs/kernels.md): entry = bindings_qgemm.cc (checks) -> driver = qgemm.cc
// (blocking, threads, zero-point folding) -> micro-kernels qgemm_<isa>.cc (one register
// tile over one K chunk, epilogue fused).
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "dispatch.h"

namespace quanta {
namespace qgemm {

enum class OutType : int { kU8 = 0, kS8 = 1, kS32 = 2, kF32 = 3 };
enum class Requant : int { kNone = 0, kFloat = 1, kFixedPoint = 2 };

// 64-byte aligned, zero-initialised byte buffer.
class AlignedBuffer {
 public:
  AlignedBuffer() = default;
  explicit AlignedBuffer(size_t bytes) { resize(bytes); }
  void resize(size_t bytes);  // discards the contents
  uint8_t* data() { return ptr_.get(); }
  const uint8_t* data() const { return ptr_.get(); }
  size_t size() const { return size_; }

 private:
  struct Free {
    void operator()(uint8_t* p) const;
  };
  std::unique_ptr<uint8_t, Free> ptr_;
  size_t size_ = 0;
};

// Weights prepacked for one ISA's micro-kernel layout (docs/kernels.md "Packed layout"):
//   panel p (columns [p·nr, p·nr + nr)), k-group g (rows [g·kr, g·kr + kr)):
//   data[((p·Kp/kr + g)·nr + j)·kr + t] = w'[g·kr + t, p·nr + j]   (storage type: int8,
//   or int16 for the AVX2 layout), zero where k >= K or column >= N.
// Kp = K rounded up to kr. column_sums / zero_point are padded with zeros to
// n_panels·nr entries so micro-kernels may load whole vectors.
struct PackedWeights {
  Isa isa = Isa::kPortable;
  int nr = 0;             // columns per panel
  int kr = 0;             // k values per group (4: vpdpbusd, 2: vpmaddwd)
  int storage_bytes = 1;  // 1 (int8) or 2 (int16)
  int64_t K = 0, N = 0, Kp = 0, n_panels = 0;
  bool weights_unsigned = false;  // packed from uint8 weights (w' = w − 128)
  bool has_zero_point = false;    // some zw'[n] != 0: the row-sum term is needed
  // avx2 only: packed for the vpmaddubsw family (kernel.h Avx2NarrowLayout) instead of
  // the int16-product one: every pair of w' fits vpmaddubsw's int16 (kernel.h
  // weights_pairs_fit_int16; 7-bit weights always do), so it is exact there, or asked
  // for by pack_weights' `saturating`
  bool narrow = false;
  AlignedBuffer data;
  AlignedBuffer column_sums;  // int32 [n_panels·nr]: cs[n] = Σ_k (w[k,n] − zw[n])
  AlignedBuffer zero_point;   // int32 [n_panels·nr]: zw'[n] (weights' domain shifted to s8)

  int64_t padded_n() const { return n_panels * nr; }
  const int32_t* column_sums_ptr() const { return reinterpret_cast<const int32_t*>(column_sums.data()); }
  const int32_t* zero_point_ptr() const { return reinterpret_cast<const int32_t*>(zero_point.data()); }
};

// Packs w [K, N] (row stride w_row_stride elements) for `isa`. zero_point has N entries,
// or 1 when zero_point_per_channel is false. Weights int8 (w_unsigned = false, zw in
// [-128, 127]) or uint8 (zw in [0, 255]); the caller checks the ranges.
// `saturating` (int8 weights, isa avx2 only): the vpmaddubsw family whatever the weights'
// range, so the pair sums x'[2j]·w[2j] + x'[2j+1]·w[2j+1] of raw uint8 x and int8 w
// saturate to int16 as ONNX Runtime's u8·s8 kernels without VNNI compute them
// (MlasGemmU8S8KernelAvx2; docs/float-ops.md (QC2), (QM1)); the zero-point terms stay exact.
std::shared_ptr<PackedWeights> pack_weights(const void* w, bool w_unsigned, int64_t K, int64_t N, int64_t w_row_stride,
                                            const int32_t* zero_point, bool zero_point_per_channel, Isa isa,
                                            bool saturating = false);

// Scratch owned by the caller (one call at a time).
class Workspace {
 public:
  uint8_t* reserve(size_t bytes);  // grows (never shrinks); returns a 64-byte aligned base
  size_t size() const { return buf_.size(); }

 private:
  AlignedBuffer buf_;
};

// Cache blocking of one call (docs/kernels.md "Blocking"): run-time parameters, every
// value of which gives the same bytes (int32 sums wrap, so the order of the K chunks and
// the grouping of rows into tiles do not change them; the output stage is per element).
// 0 / -1 fields take the built-in heuristic (qgemm.cc make_plan). Values are clamped to
// what the workspace of the call was sized for (qgemm_workspace_bytes does not depend on
// the blocking, so a tuner may change it after the caller reserved its workspace).
struct Blocking {
  int64_t mc = 0;       // rows per A block (rounded to MR; MR = the row tiles outer)
  int64_t nc = 0;       // N panels per B block (the B block stays in L2 across A blocks)
  int64_t kc = 0;       // K chunk (rounded to KR; >= kMinTunedKc when set)
  int prefetch = -1;    // B prefetch distance in bytes of the avx512vnni 12-row tile (0: none)
  int prefetch_a = -1;  // 1: prefetch the next A block into L2 as a block starts; 0: not
  bool is_default() const { return mc == 0 && nc == 0 && kc == 0 && prefetch < 0 && prefetch_a < 0; }
  bool operator==(const Blocking& o) const {
    return mc == o.mc && nc == o.nc && kc == o.kc && prefetch == o.prefetch && prefetch_a == o.prefetch_a;
  }
};
constexpr int64_t kMaxTunedMc = 256;  // rows: bounds the workspace's partial-sum buffer
constexpr int64_t kMinTunedKc = 256;  // K chunks shorter than this are never chosen

// The key of a tuned choice: what the blocking of a call depends on.
struct ShapeKey {
  Isa isa = Isa::kPortable;
  int64_t M = 0, N = 0, K = 0;
  int threads = 1;
  bool operator<(const ShapeKey& o) const;
  bool operator==(const ShapeKey& o) const;
};

// The process-wide table of tuned blockings (the autotuner, quanta/runtime/tuner.py, fills
// it from its measurements or its cache). A call with a default Blocking looks its shape
// up here; without an entry the heuristics apply. Thread-safe (a mutex around the table,
// taken once per call).
void set_tuned_blocking(const ShapeKey& key, const Blocking& b);
void clear_tuned_blockings();
// Shapes of the qgemm calls made since record_shapes(true), with the call count each
// (the tuner runs a model once with it on, to learn the GEMM shapes its kernels use).
void record_shapes(bool on);
std::vector<std::pair<ShapeKey, int64_t>> recorded_shapes();

// The blocking make_plan resolves for a call (heuristic, table or explicit), e.g. to show
// what the tuner changed.
struct ResolvedBlocking {
  int64_t mc, nc, kc, n_chunks;
  int prefetch, prefetch_a;
  bool tuned;  // from the table (or explicit), not the heuristics
};

struct QGemmParams {
  int64_t M = 0;
  const void* x = nullptr;   // [M, K] uint8 or int8
  int64_t x_row_stride = 0;  // elements, >= K
  bool x_signed = false;
  int32_t zx = 0;                       // in x's dtype range (when zx_per_row is null)
  const int32_t* zx_per_row = nullptr;  // [M] per-row zero points (MatMulInteger), or null
  const PackedWeights* w = nullptr;
  const int32_t* bias = nullptr;  // [N] int32, or null
  OutType out_type = OutType::kS32;
  Requant requant = Requant::kNone;   // kFloat or kFixedPoint for kU8/kS8, kNone otherwise
  const float* multiplier = nullptr;  // kF32 and Requant::kFloat; finite and > 0
  bool multiplier_per_channel = false;
  bool multiplier_per_row = false;            // M multipliers (the transposed form above)
  const int32_t* row_bias = nullptr;          // [M] int32 added per row, or null
  const float* float_bias = nullptr;          // [N], kF32 only, or null
  const int32_t* fixed_multiplier = nullptr;  // Requant::kFixedPoint: in [0, 2^31)
  const int32_t* fixed_shift = nullptr;       // Requant::kFixedPoint: in [-31, 30]
  bool fixed_per_channel = false;
  int32_t zy = 0;  // kU8/kS8, in the output's range
  bool has_clamp = false;
  double clamp_lo = 0.0, clamp_hi = 0.0;  // in the output's domain; lo <= hi
  // The second affine stage (kU8/kS8 with Requant::kFloat only): [N] float32 each, finite,
  // with finite post_r1, post_r2; post_k null: none.
  const float* post_k = nullptr;
  const float* post_u = nullptr;
  float post_r1 = 0.f, post_r2 = 0.f;
  void* y = nullptr;         // [M, N] of out_type
  int64_t y_row_stride = 0;  // elements, >= N
  int num_threads = 1;
  Blocking blocking;  // default: the tuned table, else the heuristics
};

// Bytes of workspace qgemm(p) needs (depends on M, K, N, the packed layout, out_type,
// x_signed and num_threads).
size_t qgemm_workspace_bytes(const QGemmParams& p);
ResolvedBlocking qgemm_resolved_blocking(const QGemmParams& p);

// Runs the GEMM with the micro-kernel family p.w was packed for (p.w->isa).
// Precondition: workspace.size() >= qgemm_workspace_bytes(p) (checked; throws
// std::invalid_argument otherwise, so the hot path never allocates).
void qgemm(const QGemmParams& p, Workspace& workspace);

// Name of the micro-kernel family for an ISA in the docs/kernels.md grammar, e.g.
// "qgemm_u8s8_s32_12x32c4__avx512vnni".
std::string qgemm_kernel_name(Isa isa);
std::string qgemm_kernel_name(const PackedWeights& w);  // the family w was packed for

// Measured vpdpbusd throughput in GOPS (2 ops per multiply-add), one thread, register
// operands only: the machine's int8 peak for benchmarks/kernels.py. Requires avx512vnni.
double vnni_peak_probe(double seconds);

}  // namespace qgemm
}  // namespace quanta
