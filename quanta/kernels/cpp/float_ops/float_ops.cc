// Drivers of the float_ops kernels (contract: float_ops.h): broadcast iteration, thread
// chunks, ISA selection. The per-ISA runs live in float_ops_<isa>.cc.
//
// The broadcast planner is the one of elementwise/elementwise.cc (same rule, float32
// operands); it is private there, hence this copy.
#include "float_ops/float_ops.h"

#include <algorithm>
#include <cstdint>

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

void mlas_softmax(const float* x, float* y, int64_t rows, int64_t d, int num_threads, Isa isa) {
  if (d <= 0) return;
  const SoftmaxRowsFn fn = kernels_for(isa).mlas_softmax;
  const int64_t grain = std::max<int64_t>(1, kSoftmaxGrain / std::max<int64_t>(d, 1));
  for_ranges(num_threads, rows, grain,
             [&](int64_t begin, int64_t end) { fn(x + begin * d, y + begin * d, end - begin, d); });
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

void binary(BinaryOp op, const float* a, const float* b, float* c, const BroadcastShape& s, int num_threads, Isa isa) {
  if (broadcast::empty(s)) return;
  const BinaryRunFn run = kernels_for(isa).binary[static_cast<int>(op)];
  const broadcast::Plan p = broadcast::make_plan(s);
  for_ranges(num_threads, p.total(), kStreamGrain,
             [&](int64_t begin, int64_t end) { broadcast::for_each_run(a, b, c, p, begin, end, run); });
}

}  // namespace float_ops
}  // namespace quanta
