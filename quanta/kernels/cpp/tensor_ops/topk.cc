// TopK of float32 rows: contract in topk.h.
#include "tensor_ops/topk.h"

#include <algorithm>
#include <numeric>
#include <vector>

#include "qgemm/thread_pool.h"

namespace quanta {
namespace tensor_ops {

namespace {

// Rows per thread chunk: a chunk selects over at least ~16 k values.
constexpr int64_t kGrainValues = int64_t{1} << 14;

// "a comes before b" in topk.h's order: a strict total order (ties end at the index), as
// std::nth_element and std::sort require.
struct Before {
  const float* row;
  bool largest;
  bool operator()(int64_t a, int64_t b) const {
    const float va = row[a], vb = row[b];
    const bool na = va != va, nb = vb != vb;  // NaN
    if (na != nb) return largest ? na : nb;
    if (!na && va != vb) return largest ? va > vb : va < vb;
    return a < b;
  }
};

}  // namespace

void topk_f32(const float* x, int64_t rows, int64_t n, int64_t k, bool largest, float* values, int64_t* indices,
              int num_threads) {
  if (rows == 0 || k == 0) return;
  const int64_t grain = std::max<int64_t>(1, kGrainValues / std::max<int64_t>(n, 1));
  qgemm::parallel_ranges(num_threads, rows, grain, [&](int64_t r0, int64_t r1) {
    std::vector<int64_t> order(static_cast<size_t>(n));
    for (int64_t r = r0; r < r1; ++r) {
      const float* row = x + r * n;
      std::iota(order.begin(), order.end(), int64_t{0});
      const Before before{row, largest};
      if (k < n) std::nth_element(order.begin(), order.begin() + (k - 1), order.end(), before);
      std::sort(order.begin(), order.begin() + k, before);
      float* v = values + r * k;
      int64_t* ix = indices + r * k;
      for (int64_t j = 0; j < k; ++j) {
        ix[j] = order[static_cast<size_t>(j)];
        v[j] = row[ix[j]];
      }
    }
  });
}

}  // namespace tensor_ops
}  // namespace quanta
