// ONNX Runtime's row sums in Eigen's packet order (contract: ort_reduce.h).
#include "tensor_ops/ort_reduce.h"

#include <algorithm>
#include <limits>

#include "qgemm/thread_pool.h"

namespace quanta {
namespace tensor_ops {
namespace {

constexpr int64_t kPacket = 4;  // Eigen's Packet4f (SSE)

struct Packet {
  float v[kPacket];
};

inline Packet load(const float* p) { return Packet{{p[0], p[1], p[2], p[3]}}; }

inline void add_into(Packet& a, const float* p) {
  for (int64_t j = 0; j < kPacket; ++j) a.v[j] += p[j];
}

float eigen_sum(const float* x, int64_t n, int64_t a0) {
  const int64_t k = (n - a0) / kPacket;
  if (k == 0) {  // (ER4)
    float s = x[0];
    for (int64_t i = 1; i < n; ++i) s += x[i];
    return s;
  }
  const float* p = x + a0;
  Packet p0 = load(p);  // (ER2)
  if (k >= 2) {
    Packet p1 = load(p + kPacket);
    for (int64_t j = 1; j < k / 2; ++j) {
      add_into(p0, p + 2 * j * kPacket);
      add_into(p1, p + (2 * j + 1) * kPacket);
    }
    add_into(p0, p1.v);
    if (k % 2 != 0) add_into(p0, p + (k - 1) * kPacket);
  }
  float s = (p0.v[0] + p0.v[2]) + (p0.v[1] + p0.v[3]);  // (ER3)
  for (int64_t i = 0; i < a0; ++i) s += x[i];
  for (int64_t i = a0 + k * kPacket; i < n; ++i) s += x[i];
  return s;
}

}  // namespace

void ort_reduce_rows(const float* x, int64_t rows, int64_t n, bool mean, float* y, int num_threads) {
  if (rows <= 0) return;
  if (n <= 0) {
    std::fill(y, y + rows, mean ? std::numeric_limits<float>::quiet_NaN() : 0.0f);
    return;
  }
  const float count = static_cast<float>(n);
  const int64_t grain = std::max<int64_t>(1, (int64_t{1} << 14) / n);
  qgemm::parallel_ranges(num_threads, rows, grain, [&](int64_t b, int64_t e) {
    for (int64_t d = b; d < e; ++d) {
      // (ER1): the row's offset d·n in floats, modulo the packet
      const int64_t a0 = std::min<int64_t>(((kPacket - (d * n) % kPacket) % kPacket), n);
      const float s = eigen_sum(x + d * n, n, a0);
      y[d] = mean ? s / count : s;
    }
  });
}

void mlas_global_average_rows(const float* x, int64_t rows, int64_t n, float* y, int num_threads) {
  if (rows <= 0) return;
  const float count = static_cast<float>(n);
  const int64_t grain = std::max<int64_t>(1, (int64_t{1} << 14) / std::max<int64_t>(n, 1));
  qgemm::parallel_ranges(num_threads, rows, grain, [&](int64_t b, int64_t e) {
    for (int64_t d = b; d < e; ++d) {
      const float* r = x + d * n;
      float l[4] = {0.0f, 0.0f, 0.0f, 0.0f};  // (GP1): +0, so a lane of −0 elements is +0
      const int64_t blocks = n / 4;
      for (int64_t k = 0; k < blocks; ++k) {
        for (int j = 0; j < 4; ++j) l[j] += r[4 * k + j];
      }
      float s = (l[0] + l[2]) + (l[1] + l[3]);  // (GP2)
      for (int64_t i = 4 * blocks; i < n; ++i) s += r[i];
      y[d] = s / count;  // (GP3); n = 0: 0 / 0 = NaN
    }
  });
}

}  // namespace tensor_ops
}  // namespace quanta
