// Driver and scalar rows of col2im_tiles.h. Threads take whole planes, as sgemm::col2im.
#include "sgemm/col2im_tiles.h"

#include <algorithm>

#include "qgemm/thread_pool.h"

namespace quanta {
namespace sgemm {
namespace {

// Planes times output elements below which one thread runs the whole gather.
constexpr int64_t kMinParallelElements = int64_t{1} << 16;

inline float finish(float v, float b, float lo, float hi) {
  v = v + b;
  v = v < lo ? lo : v;
  return v > hi ? hi : v;
}

}  // namespace

void col2im_tiles(const float* cols, int64_t planes, int64_t m, int64_t kh, int64_t kw, int64_t h, int64_t w,
                  int64_t bt, int64_t bl, int64_t oh, int64_t ow, const float* bias, float lo, float hi, float* y,
                  int num_threads, Isa isa) {
  if (planes <= 0 || oh <= 0 || ow <= 0) return;
  const int64_t hw = h * w;
  // The output columns that read the canvas: cx = ox + bl in [0, w·kw).
  const int64_t x0 = std::min(ow, std::max<int64_t>(0, -bl));
  const int64_t x1 = std::max(x0, std::min(ow, w * kw - bl));
  const bool pairs = isa == Isa::kAvx2 && kw == 2;
  const int threads = planes * oh * ow < kMinParallelElements ? 1 : num_threads;
  auto body = [&](int64_t p, int) {
    const float* src = cols + p * kh * kw * hw;
    float* out = y + p * oh * ow;
    const float b = bias ? bias[p % m] : 0.0f;
    const float empty = finish(0.0f, b, lo, hi);
    for (int64_t oy = 0; oy < oh; ++oy) {
      float* row = out + oy * ow;
      const int64_t cy = oy + bt;
      if (cy < 0 || cy >= h * kh) {
        std::fill(row, row + ow, empty);
        continue;
      }
      const float* s = src + (cy % kh) * kw * hw + (cy / kh) * w;  // (ky, kx = 0) at iy
      std::fill(row, row + x0, empty);
      std::fill(row + x1, row + ow, empty);
      int64_t ox = x0;
      if (pairs) {
        // from an even canvas column on, whole (kx = 0, kx = 1) pairs
        if (ox < x1 && (ox + bl) % 2) {
          row[ox] = finish(0.0f + s[hw + (ox + bl) / 2], b, lo, hi);
          ++ox;
        }
        const int64_t n = (x1 - ox) / 2;
        interleave2_avx2(s + (ox + bl) / 2, s + hw + (ox + bl) / 2, n, b, lo, hi, row + ox);
        ox += 2 * n;
      }
      for (; ox < x1; ++ox) {
        const int64_t cx = ox + bl;
        row[ox] = finish(0.0f + s[(cx % kw) * hw + cx / kw], b, lo, hi);
      }
    }
  };
  if (threads <= 1 || planes == 1) {
    for (int64_t p = 0; p < planes; ++p) body(p, 0);
  } else {
    qgemm::parallel_for(threads, planes, body);
  }
}

}  // namespace sgemm
}  // namespace quanta
