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
    case Isa::kAvx512Vnni: return kKernelsAvx512Vnni;
    case Isa::kAvx2: return kKernelsAvx2;
    default: return kKernelsPortable;
  }
}

namespace {

// Elements per thread chunk: large enough that a chunk costs far more than claiming it.
constexpr int64_t kGrain = int64_t{1} << 14;
constexpr int64_t kSoftmaxGrain = int64_t{1} << 12;

// Runs f(begin, end) over [0, n) in chunks of `grain` on up to num_threads threads.
template <typename F>
void for_ranges(int num_threads, int64_t n, int64_t grain, F&& f) {
  if (n <= 0) return;
  const int64_t chunks = (n + grain - 1) / grain;
  if (num_threads <= 1 || chunks == 1) {
    f(int64_t{0}, n);
    return;
  }
  auto body = [&](int64_t c, int) { f(c * grain, std::min(n, (c + 1) * grain)); };
  qgemm::parallel_for(num_threads, chunks, body);
}

// Rows per chunk: about kGrain elements, at least one row.
int64_t row_grain(int64_t d) { return std::max<int64_t>(1, kGrain / std::max<int64_t>(d, 1)); }

}  // namespace

void exp_f32(const float* x, float* y, int64_t n, int num_threads, Isa isa) {
  const ExpRunFn run = kernels_for(isa).exp;
  for_ranges(num_threads, n, kGrain, [&](int64_t begin, int64_t end) { run(x + begin, y + begin, end - begin); });
}

void unary(UnaryOp op, const float* x, float* y, int64_t n, int num_threads, Isa isa) {
  const UnaryRunFn run = kernels_for(isa).unary[static_cast<int>(op)];
  for_ranges(num_threads, n, kGrain, [&](int64_t begin, int64_t end) { run(x + begin, y + begin, end - begin); });
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

void layer_norm(const float* x, float* y, int64_t rows, int64_t d, const float* scale, const float* bias,
                float epsilon, float* mean, float* inv_std, int num_threads, Isa isa) {
  if (d <= 0) return;
  const LayerNormRowsFn fn = kernels_for(isa).layer_norm;
  for_ranges(num_threads, rows, row_grain(d), [&](int64_t begin, int64_t end) {
    fn(x + begin * d, y + begin * d, end - begin, d, scale, bias, epsilon, mean ? mean + begin : nullptr,
       inv_std ? inv_std + begin : nullptr);
  });
}

// ---- binary ops: broadcast iteration --------------------------------------------------------

namespace {

// The broadcast as an odometer over `rank` outer dimensions around an inner run.
struct Plan {
  int rank = 0;  // outer dimensions
  int64_t n[kMaxRank];
  int64_t as[kMaxRank], bs[kMaxRank];  // element strides (0: broadcast)
  int64_t inner = 1;
  int64_t a_step = 0, b_step = 0;  // 1 or 0 within the inner run
  int64_t outer = 1;
};

Plan make_plan(const BroadcastShape& s) {
  int64_t n[kMaxRank], as[kMaxRank], bs[kMaxRank];
  int kept = 0;
  int64_t a_acc = 1, b_acc = 1;  // contiguous strides, innermost first
  int64_t a_str[kMaxRank], b_str[kMaxRank];
  for (int d = s.rank - 1; d >= 0; --d) {
    a_str[d] = s.a_shape[d] == 1 ? 0 : a_acc;
    b_str[d] = s.b_shape[d] == 1 ? 0 : b_acc;
    a_acc *= s.a_shape[d];
    b_acc *= s.b_shape[d];
  }
  for (int d = 0; d < s.rank; ++d) {
    if (s.out_shape[d] == 1) continue;
    // Merge into the previous kept dimension when both inputs continue it contiguously
    // (or both keep repeating): the pair then walks memory as one dimension.
    if (kept > 0 && as[kept - 1] == a_str[d] * s.out_shape[d] && bs[kept - 1] == b_str[d] * s.out_shape[d]) {
      n[kept - 1] *= s.out_shape[d];
      as[kept - 1] = a_str[d];
      bs[kept - 1] = b_str[d];
      continue;
    }
    n[kept] = s.out_shape[d];
    as[kept] = a_str[d];
    bs[kept] = b_str[d];
    ++kept;
  }
  Plan p;
  if (kept == 0) return p;  // one element
  p.inner = n[kept - 1];
  p.a_step = as[kept - 1];
  p.b_step = bs[kept - 1];
  p.rank = kept - 1;
  for (int d = 0; d < p.rank; ++d) {
    p.n[d] = n[d];
    p.as[d] = as[d];
    p.bs[d] = bs[d];
    p.outer *= n[d];
  }
  return p;
}

// run(a, a_step, b, b_step, c, len) over the flat output positions [begin, end).
void broadcast_range(const float* a, const float* b, float* c, const Plan& p, int64_t begin, int64_t end,
                     BinaryRunFn run) {
  int64_t o = begin / p.inner;
  int64_t i0 = begin - o * p.inner;
  int64_t idx[kMaxRank];
  int64_t a_off = 0, b_off = 0;
  for (int d = p.rank - 1; d >= 0; --d) {
    idx[d] = o % p.n[d];
    o /= p.n[d];
    a_off += idx[d] * p.as[d];
    b_off += idx[d] * p.bs[d];
  }
  int64_t pos = begin;
  while (pos < end) {
    const int64_t len = std::min(end - pos, p.inner - i0);
    run(a + a_off + i0 * p.a_step, p.a_step, b + b_off + i0 * p.b_step, p.b_step, c + pos, len);
    pos += len;
    i0 = 0;
    for (int d = p.rank - 1; d >= 0; --d) {  // odometer step over the outer dimensions
      ++idx[d];
      a_off += p.as[d];
      b_off += p.bs[d];
      if (idx[d] < p.n[d]) break;
      a_off -= idx[d] * p.as[d];
      b_off -= idx[d] * p.bs[d];
      idx[d] = 0;
    }
  }
}

}  // namespace

void binary(BinaryOp op, const float* a, const float* b, float* c, const BroadcastShape& s, int num_threads,
            Isa isa) {
  for (int d = 0; d < s.rank; ++d) {
    if (s.out_shape[d] == 0) return;
  }
  const BinaryRunFn run = kernels_for(isa).binary[static_cast<int>(op)];
  const Plan p = make_plan(s);
  for_ranges(num_threads, p.outer * p.inner, kGrain,
             [&](int64_t begin, int64_t end) { broadcast_range(a, b, c, p, begin, end, run); });
}

}  // namespace float_ops
}  // namespace quanta
