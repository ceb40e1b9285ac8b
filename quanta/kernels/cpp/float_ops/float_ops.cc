// Drivers of the float_ops kernels (contract: float_ops.h): broadcast iteration, thread
// chunks, ISA selection. The per-ISA runs live in float_ops_<isa>.cc.
//
// The broadcast planner is the one of elementwise/elementwise.cc (same rule, float32
// operands); it is private there, hence this copy.
#include "float_ops/float_ops.h"

#include <algorithm>
#include <cstdint>

#include "float_ops/binary_tile.h"
#include "qgemm/thread_pool.h"

namespace quanta {
namespace float_ops {

const Kernels& kernels_for(Isa isa) {
  switch (isa) {
    case Isa::kAvx512Vnni: return kernels_avx512vnni();
    case Isa::kAvx2: return kernels_avx2();
    default: return kernels_portable();
  }
}

namespace {

// Elements per thread chunk: large enough that a chunk costs far more than claiming it.
constexpr int64_t kGrain = int64_t{1} << 14;
// Memory-bound passes (binary ops, LayerNorm).
// 2^14 elements (2^16 before): inside a model run the pool's worker is awake (it spins
// between kernels), and the caller never waits for a worker that has not claimed a
// chunk, so 16K-element halves pay; 2 threads, whole runs: EfficientNet-Lite0 3.19 ->
// 2.83 ms, all-MiniLM-L6-v2 10.4 -> 9.4 ms, the MobileNet-style CNN 1.04 -> 0.98 ms.
constexpr int64_t kStreamGrain = int64_t{1} << 14;
constexpr int64_t kSoftmaxGrain = int64_t{1} << 12;

// Runs f(begin, end) over [0, n) in chunks of `grain` on up to num_threads threads.
template <typename F>
void for_ranges(int num_threads, int64_t n, int64_t grain, F&& f) {
  qgemm::parallel_ranges(num_threads, n, grain, f);
}

// Rows per chunk: about kGrain elements, at least one row.
int64_t row_grain(int64_t d) { return std::max<int64_t>(1, kStreamGrain / std::max<int64_t>(d, 1)); }

}  // namespace

void exp_f32(const float* x, float* y, int64_t n, int num_threads, Isa isa) {
  const ExpRunFn run = kernels_for(isa).exp;
  for_ranges(num_threads, n, kGrain, [&](int64_t begin, int64_t end) { run(x + begin, y + begin, end - begin); });
}

void unary(UnaryOp op, const float* x, float* y, int64_t n, int num_threads, Isa isa) {
  const UnaryRunFn run = kernels_for(isa).unary[static_cast<int>(op)];
  for_ranges(num_threads, n, kGrain, [&](int64_t begin, int64_t end) { run(x + begin, y + begin, end - begin); });
}

void elu(const float* x, float* y, int64_t n, float alpha, int num_threads, Isa isa) {
  const EluRunFn run = kernels_for(isa).elu;
  for_ranges(num_threads, n, kGrain,
             [&](int64_t begin, int64_t end) { run(x + begin, y + begin, end - begin, alpha); });
}

void to_half(const float* x, uint16_t* y, int64_t n, int num_threads, Isa isa) {
  const ToHalfRunFn run = kernels_for(isa).to_half;
  for_ranges(num_threads, n, kStreamGrain, [&](int64_t begin, int64_t end) { run(x + begin, y + begin, end - begin); });
}

void from_half(const uint16_t* x, float* y, int64_t n, int num_threads, Isa isa) {
  const FromHalfRunFn run = kernels_for(isa).from_half;
  for_ranges(num_threads, n, kStreamGrain, [&](int64_t begin, int64_t end) { run(x + begin, y + begin, end - begin); });
}

void softmax(const float* x, float* y, int64_t rows, int64_t d, int num_threads, Isa isa) {
  if (d <= 0) return;
  const SoftmaxRowsFn fn = kernels_for(isa).softmax;
  // Softmax costs ~0.4 ns per element: chunks of ~4 K elements (a multiple of 4 rows, the
  // AVX-512 lockstep group) keep both threads busy when one wakes up late.
  const int64_t grain = std::max<int64_t>(4, (kSoftmaxGrain / std::max<int64_t>(d, 1)) & ~int64_t{3});
  for_ranges(num_threads, rows, grain,
             [&](int64_t begin, int64_t end) { fn(x + begin * d, y + begin * d, end - begin, d); });
}

void layer_norm(const float* x, float* y, int64_t rows, int64_t d, const float* scale, const float* bias, float epsilon,
                float* mean, float* inv_std, int num_threads, Isa isa, bool divide, bool rms) {
  if (d <= 0) return;
  const LayerNormRowsFn fn = kernels_for(isa).layer_norm;
  for_ranges(num_threads, rows, row_grain(d), [&](int64_t begin, int64_t end) {
    fn(x + begin * d, y + begin * d, end - begin, d, scale, bias, epsilon, mean ? mean + begin : nullptr,
       inv_std ? inv_std + begin : nullptr, divide, rms);
  });
}

void mlas_softmax(const float* x, float* y, int64_t rows, int64_t d, int num_threads, Isa isa, bool avx512f_order) {
  if (d <= 0) return;
  const SoftmaxRowsFn fn = avx512f_order ? kernels_for(isa).mlas_softmax_avx512f : kernels_for(isa).mlas_softmax;
  const int64_t grain = std::max<int64_t>(1, kSoftmaxGrain / std::max<int64_t>(d, 1));
  for_ranges(num_threads, rows, grain,
             [&](int64_t begin, int64_t end) { fn(x + begin * d, y + begin * d, end - begin, d); });
}

bool host_runs_ort_avx512f() {
#if defined(__GNUC__) && (defined(__x86_64__) || defined(__i386__))
  // libgcc's probe counts AVX-512F only where the OS saves its state (XCR0), as MLAS does
  static const bool yes =
      __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma") && __builtin_cpu_supports("avx512f");
  return yes;
#else
  return false;
#endif
}

void ort_layer_norm(const float* x, float* y, int64_t rows, int64_t d, const float* scale, const float* bias,
                    float epsilon, OrtNormKernel kernel, int num_threads, Isa isa) {
  if (d <= 0) return;
  const OrtLayerNormRowsFn fn = kernels_for(isa).ort_layer_norm;
  for_ranges(num_threads, rows, row_grain(d), [&](int64_t begin, int64_t end) {
    fn(x + begin * d, y + begin * d, end - begin, d, scale, bias, epsilon, kernel);
  });
}

// ---- binary ops: NumPy broadcasting (broadcast.h) --------------------------------------------

namespace {

// Longest inner run taken as tile rows (binary_tile.h): past it a run costs far more than
// its odometer step.
constexpr int64_t kTileInnerMax = 256;

// Whether the plan is tile rows: the inner run steps in both operands and the dimension
// around it repeats one operand's run (stride 0) while the other steps on (stride inner).
bool is_tile(const broadcast::Plan& p) {
  if (p.rank < 1 || p.a_step != 1 || p.b_step != 1 || p.inner > kTileInnerMax) return false;
  const int d = p.rank - 1;
  return (p.as[d] == 0 && p.bs[d] == p.inner) || (p.bs[d] == 0 && p.as[d] == p.inner);
}

// The output rows [r0, r1) of a tile plan: per index of the dimensions outside the last
// outer one, a block of rows with fixed row strides (one of them 0).
template <typename Rows>
void for_tile_rows(const broadcast::Plan& p, int64_t r0, int64_t r1, Rows&& rows) {
  const int d = p.rank - 1;
  const int64_t n = p.n[d];
  while (r0 < r1) {
    int64_t q = r0 / n;
    const int64_t j = r0 - q * n;
    const int64_t len = std::min(r1 - r0, n - j);
    int64_t a_off = j * p.as[d], b_off = j * p.bs[d];
    for (int e = d - 1; e >= 0; --e) {
      const int64_t idx = q % p.n[e];
      q /= p.n[e];
      a_off += idx * p.as[e];
      b_off += idx * p.bs[e];
    }
    rows(a_off, p.as[d], b_off, p.bs[d], r0 * p.inner, len);
    r0 += len;
  }
}

}  // namespace

void binary(BinaryOp op, const float* a, const float* b, float* c, const BroadcastShape& s, int num_threads, Isa isa) {
  if (broadcast::empty(s)) return;
  const BinaryRunFn run = kernels_for(isa).binary[static_cast<int>(op)];
  const broadcast::Plan p = broadcast::make_plan(s);
  if (is_tile(p)) {
    const bool vector_rows = isa == Isa::kAvx2 && (op == BinaryOp::kAdd || op == BinaryOp::kSub ||
                                                   op == BinaryOp::kMul || op == BinaryOp::kDiv);
    const int64_t inner = p.inner;
    for_ranges(num_threads, p.outer, std::max<int64_t>(1, kStreamGrain / inner), [&](int64_t r0, int64_t r1) {
      for_tile_rows(p, r0, r1, [&](int64_t ao, int64_t as, int64_t bo, int64_t bs, int64_t co, int64_t rows) {
        if (vector_rows) {
          binary_tile_rows_avx2(op, a + ao, as, b + bo, bs, c + co, rows, inner);
          return;
        }
        for (int64_t r = 0; r < rows; ++r) run(a + ao + r * as, 1, b + bo + r * bs, 1, c + co + r * inner, inner);
      });
    });
    return;
  }
  for_ranges(num_threads, p.total(), kStreamGrain,
             [&](int64_t begin, int64_t end) { broadcast::for_each_run(a, b, c, p, begin, end, run); });
}

}  // namespace float_ops
}  // namespace quanta
