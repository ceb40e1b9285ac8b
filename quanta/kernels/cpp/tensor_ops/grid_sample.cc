// GridSample over 2-D images: contract in grid_sample.h. The positions' corners and
// weights are computed once per image (they do not depend on the channel), then every
// channel plane gathers from them: one plane's reads stay in that plane.
#include "tensor_ops/grid_sample.h"

#include <algorithm>
#include <cmath>
#include <vector>

#include "qgemm/thread_pool.h"

namespace quanta {
namespace tensor_ops {

namespace {

// (GS1), (GS2) for one axis of `size` pixels.
float coordinate(float g, int64_t size, bool align_corners, bool border) {
  float x = align_corners ? ((g + 1.0f) * 0.5f) * static_cast<float>(size - 1)
                          : ((g + 1.0f) * static_cast<float>(size) - 1.0f) * 0.5f;
  if (border) {
    if (std::isnan(x)) x = 0.0f;
    return std::min(std::max(x, 0.0f), static_cast<float>(size - 1));
  }
  if (std::isnan(x)) return x;  // reads zeros
  return std::min(std::max(x, -2.0f), static_cast<float>(size + 1));
}

// The plane offset of pixel (i, j), or -1 when it reads zeros.
int64_t offset(int64_t i, int64_t j, int64_t h, int64_t w, bool border) {
  if (border) return std::clamp<int64_t>(i, 0, h - 1) * w + std::clamp<int64_t>(j, 0, w - 1);
  return (i >= 0 && i < h && j >= 0 && j < w) ? i * w + j : -1;
}

struct Taps {
  std::vector<int64_t> off;  // [4, p]: (y0, x0), (y0, x1), (y1, x0), (y1, x1); nearest: [p]
  std::vector<float> wt;     // [4, p]: wx0, wx1, wy0, wy1 (linear only)
};

void taps_of(const float* grid, int64_t p, int64_t h, int64_t w, bool align_corners, bool nearest, bool border,
             Taps* t) {
  t->off.assign(static_cast<size_t>(nearest ? p : 4 * p), -1);
  if (!nearest) t->wt.assign(static_cast<size_t>(4 * p), 0.0f);
  for (int64_t q = 0; q < p; ++q) {
    float gx = coordinate(grid[2 * q], w, align_corners, border);
    float gy = coordinate(grid[2 * q + 1], h, align_corners, border);
    if (std::isnan(gx) || std::isnan(gy)) gx = gy = -2.0f;  // zeros padding: outside
    if (nearest) {
      t->off[q] =
          offset(static_cast<int64_t>(std::nearbyint(gy)), static_cast<int64_t>(std::nearbyint(gx)), h, w, border);
      continue;
    }
    const float x0 = std::floor(gx), y0 = std::floor(gy);
    const float dx = gx - x0, dy = gy - y0;  // (GS3)
    const auto xi = static_cast<int64_t>(x0), yi = static_cast<int64_t>(y0);
    t->off[q] = offset(yi, xi, h, w, border);
    t->off[p + q] = offset(yi, xi + 1, h, w, border);
    t->off[2 * p + q] = offset(yi + 1, xi, h, w, border);
    t->off[3 * p + q] = offset(yi + 1, xi + 1, h, w, border);
    t->wt[q] = 1.0f - dx;
    t->wt[p + q] = dx;
    t->wt[2 * p + q] = 1.0f - dy;
    t->wt[3 * p + q] = dy;
  }
}

inline float at(const float* plane, int64_t off) { return off < 0 ? 0.0f : plane[off]; }

}  // namespace

void grid_sample_f32(const float* x, const float* grid, int64_t n, int64_t c, int64_t h, int64_t w, int64_t p,
                     bool align_corners, bool nearest, bool border, float* y, int num_threads) {
  if (n == 0 || c == 0 || p == 0) return;
  std::vector<Taps> taps(static_cast<size_t>(n));
  qgemm::parallel_ranges(num_threads, n, 1, [&](int64_t b0, int64_t b1) {
    for (int64_t b = b0; b < b1; ++b) taps_of(grid + b * p * 2, p, h, w, align_corners, nearest, border, &taps[b]);
  });
  const int64_t grain = std::max<int64_t>(1, (int64_t{1} << 14) / p);
  qgemm::parallel_ranges(num_threads, n * c, grain, [&](int64_t r0, int64_t r1) {
    for (int64_t r = r0; r < r1; ++r) {
      const Taps& t = taps[static_cast<size_t>(r / c)];
      const float* plane = x + r * h * w;
      float* out = y + r * p;
      const int64_t* off = t.off.data();
      if (nearest) {
        for (int64_t q = 0; q < p; ++q) out[q] = at(plane, off[q]);
        continue;
      }
      const float* wt = t.wt.data();
      for (int64_t q = 0; q < p; ++q) {  // (GS4)
        const float wx0 = wt[q], wx1 = wt[p + q];
        const float r0 = wx0 * at(plane, off[q]) + wx1 * at(plane, off[p + q]);
        const float r1 = wx0 * at(plane, off[2 * p + q]) + wx1 * at(plane, off[3 * p + q]);
        out[q] = wt[2 * p + q] * r0 + wt[3 * p + q] * r1;
      }
    }
  });
}

}  // namespace tensor_ops
}  // namespace quanta
